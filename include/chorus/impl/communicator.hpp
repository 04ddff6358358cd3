#pragma once
// Bodies of Communicator<Transport>; included at the bottom of communicator.hpp.

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <thread>
#include <sstream>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "chorus/algo/channel.hpp"
#include "chorus/algo/direct.hpp"
#include "chorus/algo/double_tree.hpp"
#include "chorus/algo/flight_recorder.hpp"
#include "chorus/algo/ipc.hpp"
#include "chorus/algo/one_shot.hpp"
#include "chorus/algo/ring.hpp"
#include "chorus/algo/select.hpp"
#include "chorus/algo/tree.hpp"
#include "chorus/bootstrap/rendezvous.hpp"
#include "chorus/detail/dump.hpp"
#include "chorus/detail/group_model.hpp"
#include "chorus/detail/log.hpp"
#include "chorus/detail/serial_executor.hpp"
#include "chorus/exec/device.hpp"
#include "chorus/exec/host.hpp"
#include "chorus/mismatch/cross_check.hpp"
#include "chorus/mismatch/herald.hpp"
#include "chorus/core/tag.hpp"

namespace chorus {

namespace detail {

inline void check_p2p_args(int rank, int size, int peer, int tag, const char* verb) {
  if (peer < 0 || peer >= size)
    throw Error(ErrorCode::invalid_argument, ErrorContext{rank, peer, std::string(verb) + " tag " + std::to_string(tag)},
                "peer " + std::to_string(peer) + " is not a rank of this communicator (size " + std::to_string(size) + ")");
  if (tag < 0)
    throw Error(ErrorCode::invalid_argument, ErrorContext{rank, peer, std::string(verb) + " tag " + std::to_string(tag)},
                "tags must be non-negative");
}

/// Rejects, before anything is sent (so every rank that gets the same bad call fails alike and
/// the communicator stays usable), what the type-erased API cannot check by its types: a DataType
/// or ReduceOp outside its enumeration, an op that does not apply to the dtype, a count whose
/// buffer size overflows, a null buffer that must hold count > 0 elements on this rank.
inline void check_collective_args(algo::CollectiveKind kind, const void* in, const void* out, std::size_t count,
                                  DataType dt, ReduceOp op, int root, int rank, int size) {
  const auto fail = [&](const std::string& why) {
    throw Error(ErrorCode::invalid_argument, ErrorContext{rank, -1, std::string(algo::to_string(kind))}, why);
  };
  if (kind == algo::CollectiveKind::barrier) return;
  if (std::find(kAllDataTypes.begin(), kAllDataTypes.end(), dt) == kAllDataTypes.end())
    fail("data type " + std::to_string(static_cast<int>(dt)) + " is not a chorus::DataType");
  const bool reduces = kind == algo::CollectiveKind::all_reduce || kind == algo::CollectiveKind::reduce ||
                       kind == algo::CollectiveKind::reduce_scatter;
  if (reduces) {
    if (to_string(op) == "unknown") fail("reduce op " + std::to_string(static_cast<int>(op)) + " is not a chorus::ReduceOp");
    if (!is_valid_op(dt, op))
      fail(std::string(to_string(op)) + " does not apply to " + std::string(to_string(dt)) +
           " (bitwise ops take integer types)");
  }
  // The largest buffer of the call holds count elements per rank for the collectives that
  // gather, scatter or exchange: count * size must not overflow, nor exceed what a message can.
  const bool per_rank = kind == algo::CollectiveKind::all_gather || kind == algo::CollectiveKind::gather ||
                        kind == algo::CollectiveKind::scatter || kind == algo::CollectiveKind::reduce_scatter ||
                        kind == algo::CollectiveKind::all_to_all;
  const std::uint64_t per_elem = size_of(dt) * static_cast<std::uint64_t>(per_rank ? size : 1);
  if (count > kMaxMessageBytes / per_elem)
    fail("count " + std::to_string(count) + " of " + std::string(to_string(dt)) + (per_rank ? " per rank" : "") +
         " is larger than a call can move (2^46 bytes)");
  if (count == 0) return;
  const bool is_root = rank == root;
  bool need_in = true, need_out = true;
  if (kind == algo::CollectiveKind::reduce || kind == algo::CollectiveKind::gather) need_out = is_root;
  if (kind == algo::CollectiveKind::scatter) need_in = is_root;
  if (kind == algo::CollectiveKind::broadcast) need_in = need_out = true;  // one buffer, in == out
  if (need_in && in == nullptr) fail("the input buffer is null but count is " + std::to_string(count));
  if (need_out && out == nullptr) fail("the output buffer is null but count is " + std::to_string(count));
}

/// The lock a collective holds while it takes its sequence number and its place in the executor
/// (a few instructions, or a few microseconds to queue an async call): one atomic exchange to take
/// it and a plain store to give it back, where a std::mutex costs two locked instructions on the
/// latency path; a waiter yields.
class CallLock {
 public:
  void lock() {
    while (taken_.exchange(true, std::memory_order_acquire)) std::this_thread::yield();
  }
  void unlock() { taken_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> taken_{false};
};

}  // namespace detail

template <Transport T>
struct Communicator<T>::State {
  Bootstrap boot;                   ///< of the job (shared by sub-communicators)
  std::shared_ptr<T> transport;     ///< shared with sub-communicators
  algo::Group<T> group;
  algo::TransportModel model = T::kModel;  ///< the group's slowest link's, set once the group is known (cost_model())
  algo::Overrides overrides;
  /// Every peer is reached over shm and this communicator owns the transport: all_reduce of up
  /// to one_shot_max_bytes goes through the links' mailboxes (algo/one_shot.hpp).
  bool mailboxes = false;
  /// mailboxes, and every peer's device memory can be mapped (cuda_ipc): collectives on device
  /// buffers read the peers' IPC windows directly (algo/ipc.hpp).
  bool ipc = false;
  std::size_t ipc_slot_bytes = 0;  ///< CHORUS_CUDA_IPC_SLOT_BYTES, read at creation where ipc
  exec::HostExecutor host_exec;  ///< copies, reductions and scratch of host buffers
  std::shared_ptr<algo::ChannelMemory> channel_memory;  ///< reused by each call's Channel
  /// host_exec's and device_exec's bytes() and channel_memory->bytes() after the last call (memory_stats() reads them
  /// from any thread; the call's thread owns the buffers).
  std::atomic<std::size_t> scratch_bytes{0}, channel_bytes{0}, window_bytes{0};

  /// After call `seq` on executor `x`: records how it ended, waits for the executor's work (a
  /// device stream) and lets scratch shrink after a burst, updates the gauges. A failing stream
  /// fails the call: returns that error (never throws).
  std::optional<Error> end_call(std::uint64_t seq, bool ok, exec::Executor& x) {
    std::optional<Error> stream_error;
    try {
      x.end_call();
    } catch (const Error& e) {
      stream_error = e;
      ok = false;
    }
    recorder->finished(seq, ok);
    scratch_bytes.store(host_exec.bytes() + device_bytes(), std::memory_order_relaxed);
    channel_bytes.store(channel_memory ? channel_memory->bytes() : 0, std::memory_order_relaxed);
    return stream_error;
  }
  std::size_t device_bytes() const { return device_exec ? device_exec->bytes() : 0; }

  // ---- device buffers ----
  device::Runtime* runtime = nullptr;  ///< tells device memory apart; null: everything is host memory
  /// Created at the first call on device buffers, with the pool of its stream tickets; declared
  /// before `exec`, which is joined before they go.
  std::unique_ptr<exec::DeviceExecutor> device_exec;
  std::unique_ptr<exec::TicketPool> tickets;
  /// The IPC windows (transport/cuda_ipc/window.hpp), made at the first direct collective;
  /// closed by a failed one, released before the executor and the runtime go.
  std::unique_ptr<cuda_ipc::Windows> windows;
  cuda_ipc::Windows& ipc_windows() {
    if (!windows) {
      windows = std::make_unique<cuda_ipc::Windows>(*runtime, group.rank, group.size(), ipc_slot_bytes);
      window_bytes.store(windows->bytes(), std::memory_order_relaxed);
    }
    return *windows;
  }
  /// Unmaps the peers' IPC windows, if any (they are not used again); a failure to is logged,
  /// never thrown: the caller is already failing or aborting.
  void close_windows() {
    if (!windows) return;
    try {
      windows->close();
    } catch (const Error& e) {
      detail::log(detail::LogLevel::warn, group.rank, "closing the IPC windows: ", e.what());
    }
  }
  /// At destruction with no call in flight: the last mailbox exchange (the peers' reads of this
  /// rank's window are over once they post theirs), then the windows go; a window whose peers
  /// did not answer within kGoodbye is left to the process (window.hpp), as after a failure.
  void release_windows() {
    if (!windows) return;
    bool quiet = false;
    if constexpr (requires(T& t) { t.link(0).cuda_ipc(); }) {
      if (windows->ready() && !aborted.load()) {
        try {
          algo::CollectiveDesc bye;
          bye.seq = coll_seq;
          algo::mailbox_post(group, bye, 0, [](std::byte*) {});
          algo::mailbox_wait(group, bye, 0, std::min(boot.options.timeout, cuda_ipc::kGoodbye),
                             [](const algo::CollectiveDesc&) {});
          quiet = true;
        } catch (const Error& e) {
          detail::log(detail::LogLevel::info, group.rank, "the IPC window stays allocated (a peer may still read it): ",
                      e.what());
        }
      }
    }
    if (quiet) windows->set_quiet();
    windows.reset();
  }
  mutable std::mutex async_mu;
  std::optional<Error> async_error;  ///< the first failure of a call nobody was waiting on (under async_mu)

  void note_async_error(const Error& e) {
    std::lock_guard g(async_mu);
    if (!async_error) async_error = e;
  }
  /// The memory kind of a call's buffers (null or unused ones aside); mixing kinds is an error.
  MemoryKind kind_of(const void* in, const void* out, const algo::CollectiveDesc& d) const {
    if (!runtime) return MemoryKind::host;
    const bool has_in = in != nullptr, has_out = out != nullptr;
    const MemoryKind ki = has_in ? runtime->kind_of(in) : MemoryKind::host;
    const MemoryKind ko = has_out ? runtime->kind_of(out) : MemoryKind::host;
    if (has_in && has_out && ki != ko)
      throw Error(ErrorCode::invalid_argument, ctx(-1, algo::describe(d)),
                  std::string("the input is in ") + (ki == MemoryKind::device ? "device" : "host") + " memory and the output in " +
                      (ko == MemoryKind::device ? "device" : "host") + " memory: one call takes buffers of one kind");
    return has_in ? ki : ko;
  }
  /// Point-to-point calls move host memory only (yet): device buffers are refused, not misread.
  void refuse_device(const void* p, std::size_t n, int peer, const char* verb) const {
    if (runtime && n != 0 && runtime->kind_of(p) == MemoryKind::device)
      throw Error(ErrorCode::unsupported, ctx(peer, verb),
                  "send and recv take host buffers; this one is in device memory (the collectives take device buffers)");
  }
  exec::DeviceExecutor& device_executor() {
    if (!device_exec) {
      device_exec = std::make_unique<exec::DeviceExecutor>(*runtime, boot.options.timeout);
      tickets = std::make_unique<exec::TicketPool>(*runtime);
    }
    return *device_exec;
  }

  MemoryStats memory_stats() const {
    MemoryStats m;
    m.scratch_bytes = scratch_bytes.load(std::memory_order_relaxed);
    m.channel_bytes = channel_bytes.load(std::memory_order_relaxed);
    m.recorder_bytes = recorder ? recorder->bytes() : 0;
    m.ipc_window_bytes = window_bytes.load(std::memory_order_relaxed);
    if constexpr (requires(const T& t) { t.memory_bytes(); }) m.transport_bytes = transport->memory_bytes();
    return m;
  }
  /// A collective takes its sequence number and its place in the executor under this lock, so
  /// calls from several threads run one at a time in the order of their numbers.
  detail::CallLock call_mu;
  std::uint64_t coll_seq = 0;       ///< collectives called so far (identical on every rank; under call_mu)
  std::atomic<std::uint64_t> split_seq{0};
  mismatch::Watch<T> watch;  ///< the notices of a mismatch found elsewhere, and the herald that spreads one
  std::atomic<bool> aborted{false};
  /// The last calls (at least 16; CHORUS_FLIGHT_RECORDER_ENTRIES): dumped on a failure, and
  /// published for the cross-check through the store when a wait stalls.
  std::shared_ptr<algo::FlightRecorder> recorder;
  std::atomic<bool> dumped{false};  ///< the recorder was dumped for a failure (once per communicator)
  /// The stall cross-check of the running call: its sequence number and when it may run next
  /// (200 ms after the stall began, then at doubling gaps up to 5 s: a long hang costs the store
  /// a write per rank every 5 s, not every 200 ms). Used by the thread that runs the call.
  std::uint64_t stall_seq = ~std::uint64_t(0);
  std::chrono::steady_clock::time_point stall_next{};
  std::chrono::milliseconds stall_gap{0};
  detail::SerialExecutor exec;      ///< declared last: joined first, before anything it uses goes

  ErrorContext ctx(int peer, std::string op) const { return {group.rank, peer, std::move(op)}; }

  /// The flight recorder, once the group is known; registered for CHORUS_DUMP_ON_SIGNAL.
  void make_recorder() {
    const auto n = detail::env_int("CHORUS_FLIGHT_RECORDER_ENTRIES", 16, 1 << 20).value_or(64);
    recorder = std::make_shared<algo::FlightRecorder>(static_cast<std::size_t>(n), group.rank, group.members,
                                                      group.context >> detail::kContextShift);
    detail::DumpRegistry::instance().add(recorder);
  }

  /// Posts the receives that learn of a mismatch another rank detected (mismatch::Watch).
  void watch_for_errors() { watch = mismatch::Watch<T>::start(transport, group); }

  /// The store key where group rank `rank` publishes `what` (its history or its progress).
  std::string published_key(std::string_view what, int rank) const {
    return "chorus/" + std::string(what) + "/" + std::to_string(group.context >> detail::kContextShift) + "/" +
           std::to_string(group.members[rank]);
  }
  std::string history_key(int rank) const { return published_key("history", rank); }
  std::string progress_key(int rank) const { return published_key("progress", rank); }

  /// Wall-clock milliseconds since the epoch (the times published in the store).
  static std::int64_t epoch_ms() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
  }

  /// A wait stalled (called every kStallCheck while it does): now and then, publish this rank's
  /// progress and cross-check the call (see stall_next).
  void stall(const algo::CollectiveDesc& mine) {
    using namespace std::chrono_literals;
    const auto now = std::chrono::steady_clock::now();
    if (mine.seq != stall_seq) {
      stall_seq = mine.seq;
      stall_gap = 200ms;
    } else if (now < stall_next) {
      return;
    } else {
      stall_gap = std::min<std::chrono::milliseconds>(stall_gap * 2, 5s);
    }
    stall_next = now + stall_gap;
    cross_check(mine);  // publishes this rank's progress too
  }

  /// "entered E completed C at T": calls this rank has started and completed, and the wall time
  /// in milliseconds since the epoch; read by a rank that times out (late_ranks()).
  void publish_progress() {
    boot.store->set_within(progress_key(group.rank), "entered " + std::to_string(recorder->entered()) + " completed " +
                                                  std::to_string(recorder->completed()) + " at " + std::to_string(epoch_ms()),
                           failure_bound());
  }

  /// The bound of each call on a failure path (store calls, notices): a few seconds, never more
  /// than the timeout.
  std::chrono::milliseconds failure_bound() const {
    return std::min<std::chrono::milliseconds>(boot.options.timeout, std::chrono::seconds(3));
  }

  /// A call that stalled has completed: its progress is published again, so that a rank that
  /// later times out waiting for this one learns where it is (never throws).
  void republish_progress() {
    try {
      publish_progress();
    } catch (const std::exception& e) {
      detail::log(detail::LogLevel::info, group.rank, "cannot publish progress: ", e.what());
    }
  }

  /// For a timed-out call `mine`: which ranks have not entered it, from what each published when
  /// its own waits stalled. Store errors are reported in the text, never thrown.
  std::string late_ranks(const algo::CollectiveDesc& mine) {
    const std::string call = std::string(algo::to_string(mine.kind)) + " #" + std::to_string(mine.seq);
    std::vector<int> inside;
    std::string late;
    try {
      publish_progress();
      const std::int64_t now_ms = epoch_ms();
      for (int p = 0; p < group.size(); ++p) {
        if (p == group.rank) continue;
        std::uint64_t entered = 0, completed = 0;
        std::int64_t at = 0;
        bool known = false;
        if (boot.store->check_within({progress_key(p)}, failure_bound())) {
          std::istringstream in(boot.store->get(progress_key(p), failure_bound()));
          std::string w1, w2, w3;
          known = static_cast<bool>(in >> w1 >> entered >> w2 >> completed >> w3 >> at) && w1 == "entered";
        }
        if (known && entered > mine.seq) {
          inside.push_back(p);
          continue;
        }
        late += "; rank " + std::to_string(p) + " has not entered " + call;
        if (!known)
          late += " (it published no progress: a rank publishes when one of its calls stalls)";
        else
          late += "; its last completed call is " + (completed == 0 ? std::string("none") : "#" + std::to_string(completed - 1)) +
                  " (as it published " + std::to_string((now_ms - at) / 1000) + " s ago" +
                  (entered > completed ? ", inside #" + std::to_string(entered - 1) : std::string()) + ")";
      }
    } catch (const std::exception& e) {
      late += std::string("; the store could not tell which ranks are late: ") + e.what();
    }
    std::string s = late.empty() ? "; every rank has entered " + call + " (a link may be stuck)" : late;
    if (!inside.empty()) {
      s += inside.size() > 1 ? "; in it: ranks" : "; in it: rank";
      for (std::size_t i = 0; i < inside.size(); ++i) {
        s += i ? ", " : " ";
        s += std::to_string(inside[i]);
      }
    }
    return s;
  }

  /// Dumps the flight recorder once per communicator (later failures are consequences).
  void dump_once(std::string_view reason) {
    if (!dumped.exchange(true)) detail::write_dump(recorder->dump(reason));
  }

  /// A call failed with `e`: tell every rank of a mismatch; dump the recorder; a timeout is
  /// thrown again naming the ranks that have not entered the call.
  void failed(const algo::CollectiveDesc& d, const Error& e) {
    if (e.code() == ErrorCode::mismatch) return spread(e);
    if (e.code() == ErrorCode::timeout) {
      const std::string late = late_ranks(d);
      dump_once(std::string("timeout in ") + algo::describe(d));
      throw Error::from_text(e.code(), e.what() + late, e.rank(), e.peer());
    }
    if (e.code() == ErrorCode::peer_failure || e.code() == ErrorCode::aborted)
      dump_once(std::string(to_string(e.code())) + " in " + algo::describe(d) + ": " + e.what());
  }

  /// A wait stalled: publish this rank's progress and recent collectives in the store and
  /// compare the current one with what the others published for it (mismatch::cross_check).
  void cross_check(const algo::CollectiveDesc& mine) {
    std::vector<algo::CollectiveDesc> recent;
    for (const auto& r : recorder->snapshot()) recent.push_back(r.desc);
    mismatch::cross_check(*boot.store, recent, mine, group.rank, group.size(),
                          [this](int p) { return history_key(p); }, failure_bound(),
                          [this] { publish_progress(); });
  }

  /// Tells every peer about `e`, then aborts with it (see Herald). When this rank is already
  /// telling them (a notice reached it first), returns at once: that herald aborts the transport
  /// once its notices have left, and aborting here would cut them off.
  void spread(const Error& e) {
    if (!watch.herald->start(e)) return;
    watch.herald->wait(std::chrono::steady_clock::now() + failure_bound());
    transport->abort(e);  // so that it has happened before the caller throws (abort is idempotent)
  }
};

template <Transport T>
Communicator<T> Communicator<T>::create(Options options) {
  auto s = std::make_unique<State>();
  s->boot = rendezvous(std::move(options));
  s->transport = std::make_shared<T>(s->boot);
  s->group.transport = s->transport.get();
  s->group.rank = s->boot.rank;
  s->group.members.resize(static_cast<std::size_t>(s->boot.size));
  for (int r = 0; r < s->boot.size; ++r) s->group.members[r] = r;
  s->model = detail::group_model(*s->transport, s->group);
  s->overrides = algo::Overrides::from(s->boot.options);
  s->mailboxes = algo::has_mailboxes(s->group);
  s->ipc = s->mailboxes && algo::has_ipc(s->group);
  if (s->ipc) s->ipc_slot_bytes = cuda_ipc::slot_bytes_from_env(s->ctx(-1, "cuda_ipc"));
  if (auto v = detail::env_string("CHORUS_BENCH_NO_DESCRIPTORS")) {
    if (*v != "0" && *v != "1")
      throw Error(ErrorCode::invalid_argument, "CHORUS_BENCH_NO_DESCRIPTORS='" + *v + "' is not 0 or 1");
    s->group.descriptors = *v == "0";
  }
  s->runtime = device::default_runtime();
  s->make_recorder();
  s->watch_for_errors();
  if (detail::log_enabled(detail::LogLevel::info))
    detail::log(detail::LogLevel::info, s->boot.rank, "communicator ready: ", s->boot.size, " ranks over ", T::kName,
                "; device buffers: ",
                s->ipc ? "direct reads of every peer's memory (cuda_ipc)" : "staged through pinned host memory",
                "; memory: ", s->memory_stats().to_string());
  return Communicator(std::move(s));
}

template <Transport T>
Communicator<T>::Communicator(std::unique_ptr<State> s) : s_(std::move(s)) {}

/// Never waits for peers: work still pending is aborted (see communicator.hpp).
template <Transport T>
Communicator<T>::~Communicator() {
  if (!s_) return;  // moved from
  if (detail::log_enabled(detail::LogLevel::info))
    detail::log(detail::LogLevel::info, rank(), "communicator destroyed after ", s_->recorder->entered(),
                " collectives; memory: ", s_->memory_stats().to_string());
  const int pending = s_->exec.pending();
  if (pending == 0) {
    s_->release_windows();
    return;
  }
  detail::log(detail::LogLevel::warn, rank(), "communicator destroyed with ", pending,
              " operation(s) pending: they fail with `aborted` (call finalize() first to wait for them)");
  abort_with(Error(ErrorCode::aborted, s_->ctx(-1, "~Communicator"),
                   "the communicator was destroyed with " + std::to_string(pending) +
                       " operation(s) pending (finalize() waits for them)"));
}

template <Transport T>
void Communicator<T>::abort_with(const Error& why) {
  State& st = *s_;
  if (st.aborted.exchange(true)) return;
  st.exec.cancel(why);  // queued calls fail without running
  st.transport->abort(why);
  st.dump_once(why.what());
  // The peers' IPC windows are unmapped now when no call runs or waits to (a running direct call
  // unmaps them as it fails). call_mu: no call is setting them up meanwhile; the executor held
  // inline: none uses them.
  std::lock_guard lk(st.call_mu);
  if (st.windows && st.exec.try_begin_inline()) {
    st.close_windows();
    st.exec.end_inline();
  }
}

template <Transport T>
void Communicator<T>::finalize() {
  State& st = *s_;
  std::unique_lock lk(st.call_mu);
  if (st.exec.pending() == 0) return;
  // An empty call after every queued one: it runs (or fails, after a cancel) once they are done.
  auto req = std::make_shared<detail::RequestState>(st.ctx(-1, "finalize"), st.boot.options.timeout);
  req->count_from_start();
  st.exec.submit([] {}, req);
  lk.unlock();
  try {
    req->wait();
  } catch (const Error& e) {
    if (e.code() != ErrorCode::aborted) throw;  // the calls themselves report their errors
  }
  // The calls before it have finished; their requests complete a moment after (each once the
  // next call is let go): wait for that too, so that every request is done on return.
  if (!st.exec.wait_settled(std::chrono::steady_clock::now() + st.boot.options.timeout))
    throw Error(ErrorCode::timeout, st.ctx(-1, "finalize"), "the pending calls' requests did not complete");
}

template <Transport T>
int Communicator<T>::rank() const {
  return s_->group.rank;
}

template <Transport T>
int Communicator<T>::size() const {
  return s_->group.size();
}

template <Transport T>
const Options& Communicator<T>::options() const {
  return s_->boot.options;
}

template <Transport T>
void Communicator<T>::set_device_runtime(device::Runtime* runtime) {
  std::lock_guard lk(s_->call_mu);
  if (s_->device_exec && runtime != s_->runtime)
    throw Error(ErrorCode::invalid_argument, s_->ctx(-1, "set_device_runtime"),
                "the communicator has run calls on device buffers with another runtime");
  s_->runtime = runtime;
}
template <Transport T>
device::Runtime* Communicator<T>::device_runtime() const {
  return s_->runtime;
}
template <Transport T>
std::optional<Error> Communicator<T>::async_error() const {
  std::lock_guard g(s_->async_mu);
  return s_->async_error;
}

template <Transport T>
MemoryStats Communicator<T>::memory_stats() const {
  return s_->memory_stats();
}

inline std::string MemoryStats::to_string() const {
  auto fmt = [](std::size_t b) {
    char buf[32];
    if (b >= (std::size_t(1) << 20)) std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(b) / (1 << 20));
    else std::snprintf(buf, sizeof buf, "%.1f KiB", static_cast<double>(b) / (1 << 10));
    return std::string(buf);
  };
  return "total " + fmt(total()) + ": scratch " + fmt(scratch_bytes) + ", channel " + fmt(channel_bytes) + ", recorder " +
         fmt(recorder_bytes) + ", transport " + fmt(transport_bytes) +
         (ipc_window_bytes != 0 ? ", ipc window " + fmt(ipc_window_bytes) : std::string());
}

template <Transport T>
T& Communicator<T>::transport() {
  return *s_->transport;
}

template <Transport T>
algo::TransportModel Communicator<T>::cost_model() const {
  return s_->model;
}

template <Transport T>
Request Communicator<T>::isend_bytes(ConstBytes data, int peer, int tag) {
  detail::check_p2p_args(rank(), size(), peer, tag, "send");
  s_->refuse_device(data.data, data.size, peer, "send");
  return s_->transport->link(s_->group.members[peer]).isend(data, s_->group.context | static_cast<Tag>(tag));
}

template <Transport T>
Request Communicator<T>::irecv_bytes(MutableBytes data, int peer, int tag) {
  detail::check_p2p_args(rank(), size(), peer, tag, "recv");
  s_->refuse_device(data.data, data.size, peer, "recv");
  return s_->transport->link(s_->group.members[peer]).irecv(data, s_->group.context | static_cast<Tag>(tag));
}

template <Transport T>
void Communicator<T>::same_size(std::size_t a, std::size_t b, const char* what) const {
  if (a != b)
    throw Error(ErrorCode::invalid_argument, ErrorContext{rank(), -1, what},
                "sizes differ: " + std::to_string(a) + " vs " + std::to_string(b) + " elements");
}

/// Every collective goes through here: pick the algorithm, run it in call order (on this thread
/// when blocking and idle, else on the communicator's worker), spread a mismatch to every rank.
template <Transport T>
Request Communicator<T>::collective(algo::CollectiveDesc desc, algo::Args args, bool async,
                                    exec::TicketRef ticket) {
  State& st = *s_;
  // The sequence number and the place in the executor are taken under one lock: calls from
  // several threads run in the order of their numbers, one at a time. The number is used up
  // once the call is valid.
  std::unique_lock lk(st.call_mu);
  desc.seq = st.coll_seq;
  args.dtype = desc.dtype;
  args.op = desc.op;
  args.root = desc.root;
  args.count = desc.count;
  const int n = size();
  if (desc.root >= n || (desc.root < 0 && (desc.kind == algo::CollectiveKind::broadcast ||
                                           desc.kind == algo::CollectiveKind::reduce ||
                                           desc.kind == algo::CollectiveKind::scatter ||
                                           desc.kind == algo::CollectiveKind::gather)))
    throw Error(ErrorCode::invalid_argument, st.ctx(-1, algo::describe(desc)),
                "root " + std::to_string(desc.root) + " is not a rank of this communicator (size " + std::to_string(n) + ")");
  const std::size_t bytes = args.bytes(desc.count);
  // Device buffers where every peer's memory can be mapped: the direct collectives (algo/ipc.hpp),
  // unless an algorithm of the staged path is forced.
  const bool is_device = args.exec->kind() == MemoryKind::device;
  const algo::Algorithm forced = st.overrides.algorithm;
  const bool direct_forced = forced == algo::Algorithm::one_shot || forced == algo::Algorithm::two_shot;
  const bool direct = is_device && st.ipc && n > 1 &&
                      (forced == algo::Algorithm::automatic || direct_forced ||
                       algo::forcible_algorithms(desc.kind).empty());
  // all_reduce of host buffers through the shm mailboxes where it fits, unless another algorithm
  // is forced; forced, it must fit. (A forced two_shot where the direct path cannot run leaves the
  // choice to the model: it names an algorithm of device buffers only.)
  const bool one_shot_call = desc.kind == algo::CollectiveKind::all_reduce && n > 1;
  const bool one_shot_fits = st.mailboxes && !is_device && bytes <= algo::one_shot_max_bytes<T>();
  const bool one_shot_forced = forced == algo::Algorithm::one_shot;
  if (one_shot_call && one_shot_forced && !one_shot_fits && !direct)
    throw Error(ErrorCode::invalid_argument, st.ctx(-1, algo::describe(desc)),
                "CHORUS_ALGO=one_shot needs every peer on shm, a communicator made by init/create (not split) "
                "and at most " + std::to_string(algo::one_shot_max_bytes<T>()) + " bytes of host memory (or device "
                "buffers over cuda_ipc); this call has " +
                std::to_string(bytes) + " bytes" + (st.mailboxes ? "" : " and no shm mailboxes to every peer"));
  algo::Choice choice{};
  if (direct) {
    algo::check_forced(desc.kind, st.overrides);
    algo::Algorithm a = algo::Algorithm::ipc;
    if (desc.kind == algo::CollectiveKind::all_reduce)
      a = direct_forced ? forced : algo::ipc_all_reduce_algorithm(bytes, n, st.ipc_windows().slot_bytes());
    choice = {a, st.ipc_windows().slot_bytes()};
  } else if (one_shot_call && one_shot_fits && (one_shot_forced || forced == algo::Algorithm::automatic)) {
    choice = {algo::Algorithm::one_shot, 0};
  } else {
    choice = algo::select(desc.kind, bytes, n, st.model, st.overrides);
  }
  args.slice_bytes = choice.slice_bytes;
  if (detail::log_enabled(detail::LogLevel::info))
    detail::log(detail::LogLevel::info, rank(), algo::describe(desc), ": ", algo::to_string(choice.algorithm),
                ", slices of ", choice.slice_bytes, " bytes");

  auto task = [&st, desc, args, choice, ticket, direct] {
    exec::Executor& x = *args.exec;
    st.recorder->started(desc, choice.algorithm);
    auto fail = [&](const Error& e) {
      ticket.release(false);
      // The communicator runs nothing more: unmap the peers' windows now (after the release:
      // unmapping waits for the streams, the user's among them).
      if (direct) st.close_windows();
      // A failed call may leave messages in flight that still read or write the caller's
      // buffers (a peer pulls a large send from them), and peers waiting on this rank: abort
      // before the caller gets the buffers back, so nothing touches them after the throw and the
      // peers learn at once (peer_failure). A mismatch is aborted by spread(), after its notices.
      if (e.code() != ErrorCode::mismatch) st.transport->abort(e);
      try {
        st.failed(desc, e);
      } catch (const Error& richer) {
        st.note_async_error(richer);
        throw;
      }
      st.note_async_error(e);
    };
    try {
      if (ticket) st.device_exec->after(ticket.ready());
      if (direct) {
        if constexpr (requires(T& t) {
                        t.link(0).cuda_ipc();
                        t.link(0).shm_link();
                      }) {  // (direct is false on transports without these: has_ipc)
          const auto on_stall = [&st](const algo::CollectiveDesc& d) { st.stall(d); };
          algo::IpcCollective run(st.group, desc, args, *st.windows, *st.device_exec, st.boot.options.timeout, on_stall);
          run.run(choice.algorithm);
        }
      } else if (choice.algorithm == algo::Algorithm::one_shot) {
        algo::one_shot_all_reduce(st.group, desc, args, st.boot.options.timeout,
                                  [&st](const algo::CollectiveDesc& d) { st.stall(d); });
      } else {
        algo::Channel<T> ch(st.group, desc, st.channel_memory, x, [&st](const algo::CollectiveDesc& d) { st.stall(d); });
        run_algorithm(st, ch, desc, args, choice);
        ch.finish();
      }
    } catch (const Error& e) {
      (void)st.end_call(desc.seq, false, x);
      // Every mismatch is told to every rank here, and this rank's transport aborted: the one this
      // rank found (two descriptors compared, on a message or through the store) and the one that
      // reached it from a peer (a failed message, a notice). A rank further along the ring or
      // tree may be waiting on this one, and must not learn of it only by its timeout.
      fail(e);
      throw;
    }
    if (auto stream_error = st.end_call(desc.seq, true, x)) {
      fail(*stream_error);
      throw *stream_error;
    }
    ticket.release(true);
    if (st.stall_seq == desc.seq) st.republish_progress();
  };
  ++st.coll_seq;
  // A blocking call with nothing queued before it runs here and now, and needs no request state
  // (nothing to allocate: the call's own messages carry the timeouts).
  auto run_here = [&lk, &task] {
    lk.unlock();  // the executor is held: a call queued meanwhile waits for this one
    task();
  };
  if (!async && st.exec.try_run(run_here)) return Request();
  auto req = std::make_shared<detail::RequestState>(st.ctx(-1, algo::describe(desc)), st.boot.options.timeout);
  // Its timeout counts from when it starts running, not while it waits behind earlier calls; the
  // call's own waits time out first (within the timeout of their start) and name the late ranks.
  req->count_from_start(std::min<std::chrono::milliseconds>(st.boot.options.timeout, std::chrono::seconds(5)));
  std::weak_ptr<T> weak = st.transport;
  req->set_on_timeout([weak](const Error& e) {
    if (auto t = weak.lock()) t->abort(e);
  });
  if (ticket) req->then([ticket] { ticket.release(false); });  // cancelled: let the stream go
  st.recorder->queued(desc, choice.algorithm);
  st.exec.submit(task, req);
  lk.unlock();
  if (!async) req->wait();
  return Request(req);
}

template <Transport T>
void Communicator<T>::run_algorithm(State& st, algo::Channel<T>& ch, const algo::CollectiveDesc& desc,
                                     const algo::Args& args, const algo::Choice& choice) {
  {
    if (st.group.size() == 1) {  // nothing to exchange; the algorithms' local steps still apply
      algo::Args a = args;
      a.root = 0;
      switch (desc.kind) {
        case algo::CollectiveKind::barrier: return;
        case algo::CollectiveKind::reduce_scatter:
        case algo::CollectiveKind::all_reduce:
        case algo::CollectiveKind::reduce:
        case algo::CollectiveKind::all_gather:
        case algo::CollectiveKind::gather:
        case algo::CollectiveKind::scatter:
        case algo::CollectiveKind::all_to_all:
        case algo::CollectiveKind::broadcast:
          a.x().copy(a.out, a.in, a.bytes(a.count));
          return;  // avg over one rank is the identity
        case algo::CollectiveKind::split: return;
      }
    }
    switch (desc.kind) {
      case algo::CollectiveKind::all_reduce:
        if (choice.algorithm == algo::Algorithm::ring) return algo::ring_all_reduce(ch, args);
        if (choice.algorithm == algo::Algorithm::tree) return algo::double_tree_all_reduce(ch, args);
        return algo::recursive_doubling_all_reduce(ch, args);
      case algo::CollectiveKind::broadcast:
        if (choice.algorithm == algo::Algorithm::chain) return algo::chain_broadcast(ch, args);
        return algo::binomial_broadcast(ch, args);
      case algo::CollectiveKind::reduce:
        if (choice.algorithm == algo::Algorithm::ring) return algo::ring_reduce(ch, args);
        return algo::binomial_reduce(ch, args);
      case algo::CollectiveKind::scatter: return algo::direct_scatter(ch, args);
      case algo::CollectiveKind::gather: return algo::direct_gather(ch, args);
      case algo::CollectiveKind::all_gather: return algo::ring_all_gather(ch, args);
      case algo::CollectiveKind::reduce_scatter: return algo::ring_reduce_scatter(ch, args);
      case algo::CollectiveKind::all_to_all: return algo::pairwise_all_to_all(ch, args);
      case algo::CollectiveKind::barrier:
      case algo::CollectiveKind::split: return algo::dissemination_barrier(ch);
    }
  }
}

template <Transport T>
Request Communicator<T>::start(algo::CollectiveKind kind, const void* in, void* out, std::size_t count, DataType dt,
                               ReduceOp op, int root, bool async, const device::Stream* stream) {
  detail::check_collective_args(kind, in, out, count, dt, op, root, rank(), size());
  algo::CollectiveDesc d;
  d.kind = kind;
  d.count = count;
  d.dtype = dt;
  d.op = op;
  d.root = root;
  State& st = *s_;
  algo::Args a;
  a.in = static_cast<const std::byte*>(in);
  a.out = static_cast<std::byte*>(out);
  a.exec = &st.host_exec;
  if (stream && !st.runtime)
    throw Error(ErrorCode::unsupported, st.ctx(-1, algo::describe(d)),
                "a call on a stream needs a device runtime (include chorus/cuda.hpp from a .cu file, or "
                "set one with device::set_default_runtime or set_device_runtime)");
  const MemoryKind kind_found = st.kind_of(in, out, d);
  if (stream && kind_found == MemoryKind::host && (in != nullptr || out != nullptr))
    throw Error(ErrorCode::invalid_argument, st.ctx(-1, algo::describe(d)),
                "a call on a stream takes device buffers; these are in host memory (use the calls without a stream)");
  if (!stream && kind_found == MemoryKind::host) return collective(d, a, async);
  // Device buffers: the call is ordered on the stream (the default one without a stream).
  {
    std::lock_guard g(st.async_mu);
    if (st.async_error) throw *st.async_error;
  }
  std::unique_lock lk(st.call_mu);  // the executor and its tickets are made and issued in call order
  a.exec = &st.device_executor();
  if (st.exec.pending() == 0) st.device_exec->collect();  // no call in flight: no stream held by a flag
  auto ticket = st.tickets->issue(stream ? *stream : nullptr, st.boot.options.timeout);
  lk.unlock();
  return collective(d, a, async || stream != nullptr, std::move(ticket));
}

template <Transport T>
Request Communicator<T>::all_reduce_async(const void* in, void* out, std::size_t count, DataType dt, ReduceOp op) {
  return start(algo::CollectiveKind::all_reduce, in, out, count, dt, op, -1, true);
}
template <Transport T>
Request Communicator<T>::broadcast_async(void* buf, std::size_t count, DataType dt, int root) {
  return start(algo::CollectiveKind::broadcast, buf, buf, count, dt, ReduceOp::sum, root, true);
}
template <Transport T>
Request Communicator<T>::reduce_async(const void* in, void* out, std::size_t count, DataType dt, ReduceOp op, int root) {
  return start(algo::CollectiveKind::reduce, in, out, count, dt, op, root, true);
}
template <Transport T>
Request Communicator<T>::scatter_async(const void* in, void* out, std::size_t count, DataType dt, int root) {
  return start(algo::CollectiveKind::scatter, in, out, count, dt, ReduceOp::sum, root, true);
}
template <Transport T>
Request Communicator<T>::gather_async(const void* in, void* out, std::size_t count, DataType dt, int root) {
  return start(algo::CollectiveKind::gather, in, out, count, dt, ReduceOp::sum, root, true);
}
template <Transport T>
Request Communicator<T>::all_gather_async(const void* in, void* out, std::size_t count, DataType dt) {
  return start(algo::CollectiveKind::all_gather, in, out, count, dt, ReduceOp::sum, -1, true);
}
template <Transport T>
Request Communicator<T>::reduce_scatter_async(const void* in, void* out, std::size_t count, DataType dt, ReduceOp op) {
  return start(algo::CollectiveKind::reduce_scatter, in, out, count, dt, op, -1, true);
}
template <Transport T>
Request Communicator<T>::all_to_all_async(const void* in, void* out, std::size_t count, DataType dt) {
  return start(algo::CollectiveKind::all_to_all, in, out, count, dt, ReduceOp::sum, -1, true);
}

template <Transport T>
void Communicator<T>::barrier() {
  start(algo::CollectiveKind::barrier, nullptr, nullptr, 0, DataType::uint8, ReduceOp::sum, -1, false).wait();
}
template <Transport T>
Request Communicator<T>::barrier_async() {
  return start(algo::CollectiveKind::barrier, nullptr, nullptr, 0, DataType::uint8, ReduceOp::sum, -1, true);
}

template <Transport T>
Communicator<T> Communicator<T>::split(int color, int key) {
  State& st = *s_;
  if (color < 0)
    throw Error(ErrorCode::invalid_argument, st.ctx(-1, "split"), "color must be non-negative (got " + std::to_string(color) + ")");
  // 1. Everyone learns everyone's (color, key) through an all-gather on this communicator.
  const int n = size();
  std::vector<std::int64_t> mine = {color, key}, all(2 * static_cast<std::size_t>(n));
  all_gather(mine, all);
  // 2. My group: the ranks of my color, ordered by (key, rank).
  std::vector<std::tuple<std::int64_t, int>> order;
  for (int r = 0; r < n; ++r)
    if (all[2 * r] == color) order.emplace_back(all[2 * r + 1], r);
  std::sort(order.begin(), order.end());
  auto sub = std::make_unique<State>();
  sub->boot = st.boot;
  sub->transport = st.transport;
  sub->group.transport = st.transport.get();
  for (auto& [k, r] : order) {
    if (r == rank()) sub->group.rank = static_cast<int>(sub->group.members.size());
    sub->group.members.push_back(st.group.members[r]);
  }
  sub->model = detail::group_model(*sub->transport, sub->group);
  sub->overrides = st.overrides;
  sub->group.descriptors = st.group.descriptors;
  // 3. A context id unique in the job: the group's first member draws it from the store, the
  //    others read it. Tags carry it, so the groups never see each other's messages.
  const std::string key_name = "split/" + std::to_string(st.group.context >> detail::kContextShift) + "/" +
                               std::to_string(st.split_seq++) + "/" + std::to_string(color);
  std::int64_t id = 0;
  if (sub->group.rank == 0) {
    id = st.boot.store->add("split/next_context", 1);
    st.boot.store->set(key_name, std::to_string(id));
  } else {
    id = std::stoll(st.boot.store->get(key_name, st.boot.options.timeout));
  }
  if (id <= 0 || id >= (1 << 16))
    throw Error(ErrorCode::unsupported, st.ctx(-1, "split"), "more than 65535 sub-communicators in one job");
  sub->group.context = static_cast<Tag>(id) << detail::kContextShift;
  sub->runtime = st.runtime;
  sub->make_recorder();
  sub->watch_for_errors();
  // 4. Nobody uses the new group before everyone has posted its error watch.
  Communicator c(std::move(sub));
  c.barrier();
  return c;
}

template <Transport T>
void Communicator<T>::abort() {
  abort_with(Error(ErrorCode::aborted, s_->ctx(-1, "abort"), "communicator aborted by the user"));
}

}  // namespace chorus
