// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// Bodies of Communicator<Transport>; included at the bottom of communicator.hpp. A collective
// goes down one stack: start() (the one entry: a Call) -> issue() (memory kind, device executor)
// -> collective(): validate (algo/validate.hpp) -> plan (algo/plan.hpp) -> queue
// (impl/call_queue.hpp) -> execute (algo/execute.hpp: the IPC windows, the shm mailboxes, or a
// channel through algo/run.hpp) -> link. What explains a failure is in diag/;
// the communicator's state in impl/state.hpp, split() in impl/split.hpp, shrink() in impl/shrink.hpp.

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <vector>

#include "chorus/algo/channel.hpp"
#include "chorus/algo/execute.hpp"
#include "chorus/algo/intranode/ipc.hpp"
#include "chorus/algo/intranode/kernel_path.hpp"
#include "chorus/algo/intranode/one_shot.hpp"
#include "chorus/algo/plan.hpp"
#include "chorus/algo/validate.hpp"
#include "chorus/bootstrap/creation_notice.hpp"
#include "chorus/bootstrap/rendezvous.hpp"
#include "chorus/detail/log.hpp"
#include "chorus/impl/state.hpp"

namespace chorus {

namespace detail {
/// Frees device memory with free_device_async on `stream` at scope exit: after the call issued in
/// the scope is ordered on the stream, or after it failed to be.
struct FreeBehind {
  device::Runtime* rt;
  void* p;
  device::Stream stream;
  ~FreeBehind() {
    if (p == nullptr) return;
    try {
      rt->free_device_async(p, stream);
    } catch (...) {  // a failed stream: its error reaches the caller through the call
    }
  }
};
}  // namespace detail

template <class T>
Communicator<T> Communicator<T>::create(Options options) {
  auto s = std::make_unique<State>();
  s->boot = rendezvous(std::move(options));
  try {
    s->transport = std::make_shared<T>(s->boot);
    s->group.transport = s->transport.get();
    s->group.rank = s->boot.rank;
    s->group.members.resize(static_cast<std::size_t>(s->boot.size));
    for (int r = 0; r < s->boot.size; ++r) s->group.members[r] = r;
    algo::PlanInputs& in = s->plan_inputs;
    in.rank = s->group.rank;
    in.size = s->group.size();
    in.model = algo::group_model(*s->transport, s->group);
    in.overrides = algo::Overrides::from(s->boot.options);
    s->exchange_layout();
    in.mailboxes = algo::has_mailboxes(s->group);
    in.ipc = in.mailboxes && algo::has_ipc(s->group);
    if (in.ipc) s->ipc_slot_bytes = cuda_ipc::slot_bytes_from_env(s->ctx(-1, "cuda_ipc"));
    s->kernel_in_process = algo::peers_in_process(s->group);
    in.kernel = in.ipc || s->kernel_in_process;
    if (auto v = detail::env_string("CHORUS_BENCH_NO_DESCRIPTORS")) {
      if (*v != "0" && *v != "1")
        throw Error(ErrorCode::invalid_argument, "CHORUS_BENCH_NO_DESCRIPTORS='" + *v + "' is not 0 or 1");
      s->group.descriptors = *v == "0";
    }
    s->runtime = device::default_runtime();
    s->make_standby();
    s->make_recorder();
    s->watch_for_errors();
  } catch (const std::exception& e) {
    publish_creation_failure(s->boot.store.get(), e);  // the others' waits end now (creation_notice.hpp)
    throw;
  }
  s->log_ready();
  return Communicator(std::move(s));
}

template <class T>
Communicator<T>::Communicator(std::unique_ptr<State> s) : s_(std::move(s)) {
  if (s_) s_->self = this;
}
// The state knows its holder (a persistent operation reaches the communicator through it).
template <class T>
Communicator<T>::Communicator(Communicator&& o) noexcept : s_(std::move(o.s_)) {
  if (s_) s_->self = this;
}
template <class T>
Communicator<T>& Communicator<T>::operator=(Communicator&& o) noexcept {
  s_ = std::move(o.s_);
  if (s_) s_->self = this;
  return *this;
}

template <class T>
typename Communicator<T>::State& Communicator<T>::live(std::string_view op) const {
  if (!s_)
    throw Error(ErrorCode::invalid_argument, std::string(op) +
                                                 ": this communicator is not valid (split() with kSplitNoColor gave "
                                                 "it to a rank in no group, or it was moved from)");
  return *s_;
}

/// Never waits for peers: work still pending is aborted (see communicator.hpp).
template <class T>
Communicator<T>::~Communicator() {
  if (!s_) return;  // moved from
  // A group left open: its calls never ran; their requests fail now rather than time out.
  for (detail::GroupItem& it : s_->group_items)
    it.req->fail(ErrorCode::aborted, "not run: the communicator was destroyed with its group open (no group_end())");
  if (detail::log_enabled(detail::LogLevel::info, detail::LogSubsys::init))
    detail::log(detail::LogLevel::info, detail::LogSubsys::init, rank(), "communicator destroyed after ", s_->recorder->entered(),
                " collectives; memory: ", s_->memory_stats().to_string());
  const int pending = s_->exec.pending();
  if (pending == 0) {
    s_->release_windows();
    s_->release_kernels();
    return;
  }
  detail::log(detail::LogLevel::warn, detail::LogSubsys::init, rank(), "communicator destroyed with ", pending,
              " operation(s) pending: they fail with `aborted` (call finalize() first to wait for them)");
  abort_with(Error(ErrorCode::aborted, s_->ctx(-1, "~Communicator"),
                   "the communicator was destroyed with " + std::to_string(pending) +
                       " operation(s) pending (finalize() waits for them)"));
}

template <class T>
void Communicator<T>::abort_with(const Error& why) {
  State& st = *s_;
  if (st.aborted.exchange(true)) return;
  st.exec.cancel(why);  // queued calls fail without running
  if (st.kernels) st.kernels->abort_kernels(&why);  // running kernels give up, and the peers' that wait for them
  st.transport->abort(why);
  st.dump_once(why.what());
  // The peers' IPC windows are unmapped now when no call runs or waits to (a running direct call
  // unmaps them as it fails). call_mu: no call is setting them up meanwhile; the executor held
  // inline: none uses them.
  std::lock_guard lk(st.call_mu);
  if (st.windows.made() && st.exec.try_begin_inline()) {
    st.close_windows();
    st.exec.end_inline();
  }
  if (st.kernels && st.kernels->in_flight() == 0) {
    try {
      st.kernels->close_peers();
    } catch (const Error&) {  // already failing: what stays mapped goes with the process
    }
  }
}

template <class T>
void Communicator<T>::finalize() {
  if (!s_) return;  // not valid(): nothing pending
  State& st = *s_;
  if (st.kernels && !st.kernels->settle(st.boot.options.timeout * 2 + std::chrono::seconds(1)))
    throw Error(ErrorCode::timeout, st.ctx(-1, "finalize"), "the collective kernels in flight did not complete");
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

template <class T>
int Communicator<T>::rank() const {
  return live("rank").group.rank;
}

template <class T>
int Communicator<T>::size() const {
  return live("size").group.size();
}

template <class T>
int Communicator<T>::local_rank() const {
  const State& st = live("local_rank");
  return st.plan_inputs.hosts.local_rank(st.group.rank);
}

template <class T>
int Communicator<T>::local_size() const {
  const State& st = live("local_size");
  return st.plan_inputs.hosts.local_size(st.group.rank);
}

template <class T>
int Communicator<T>::host_count() const {
  return live("host_count").plan_inputs.hosts.host_count();
}

template <class T>
algo::Choice Communicator<T>::planned(algo::CollectiveKind kind, std::size_t bytes) const {
  const State& st = live("planned");
  algo::CollectiveDesc d;
  d.kind = kind;
  return algo::plan<T>(d, bytes, false, st.plan_inputs, [] { return std::size_t(0); }).choice;
}

template <class T>
const Options& Communicator<T>::options() const {
  return live("options").boot.options;
}

template <class T>
void Communicator<T>::set_device_runtime(device::Runtime* runtime) {
  (void)live("set_device_runtime");
  std::lock_guard lk(s_->call_mu);
  if (s_->device_exec && runtime != s_->runtime)
    throw Error(ErrorCode::invalid_argument, s_->ctx(-1, "set_device_runtime"),
                "the communicator has run calls on device buffers with another runtime");
  s_->runtime = runtime;
}
template <class T>
device::Runtime* Communicator<T>::device_runtime() const {
  return live("device_runtime").runtime;
}
template <class T>
std::optional<Error> Communicator<T>::async_error() const {
  (void)live("async_error");
  std::lock_guard g(s_->async_mu);
  return s_->async_error;
}

template <class T>
MemoryStats Communicator<T>::memory_stats() const {
  return live("memory_stats").memory_stats();
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
         (ipc_window_bytes != 0 ? ", ipc window " + fmt(ipc_window_bytes) : std::string()) +
         (kernel_area_bytes != 0 ? ", kernel area " + fmt(kernel_area_bytes) : std::string());
}

template <class T>
T& Communicator<T>::transport() {
  return *live("transport").transport;
}

template <class T>
algo::TransportModel Communicator<T>::cost_model() const {
  return live("cost_model").plan_inputs.model;
}

template <class T>
void Communicator<T>::same_size(std::size_t a, std::size_t b, const char* what) const {
  if (a != b)
    throw Error(ErrorCode::invalid_argument, ErrorContext{rank(), -1, what},
                "sizes differ: " + std::to_string(a) + " vs " + std::to_string(b) + " elements");
}

/// Every collective goes through here: pick the algorithm, run it in call order (on this thread
/// when blocking and idle, else on the communicator's worker), spread a mismatch to every rank.
template <class T>
Request Communicator<T>::collective(algo::CollectiveDesc desc, algo::Args args, bool async,
                                    exec::TicketRef ticket) {
  State& st = *s_;
  // The sequence number and the place in the executor are taken under one lock: calls from
  // several threads run in the order of their numbers, one at a time. The number is used up
  // once the call is valid.
  std::unique_lock lk(st.call_mu);
  args.dtype = desc.dtype;
  args.op = desc.op;
  args.root = desc.root;
  args.count = desc.count;
  detail::check_root(desc, rank(), size());
  const std::size_t bytes = args.bytes(desc.count);
  const bool is_device = args.exec->kind() == MemoryKind::device;
  const algo::Plan plan = algo::plan<T>(desc, bytes, is_device, st.plan_inputs,
                                        [&st] { return st.ipc_windows().slot_bytes(); }, st.internal_calls > 0);
  args.slice_bytes = plan.choice.slice_bytes;
  return planned_call(lk, desc, args, plan, async, std::move(ticket));
}

template <class T>
Request Communicator<T>::planned_call(std::unique_lock<detail::CallLock>& lk, algo::CollectiveDesc desc,
                                      const algo::Args& args, const algo::Plan& plan, bool async,
                                      exec::TicketRef ticket) {
  State& st = *s_;
  desc.seq = st.coll_seq;
  const algo::Choice choice = plan.choice;
  if (detail::log_enabled(detail::LogLevel::info, detail::LogSubsys::coll))
    detail::log(detail::LogLevel::info, detail::LogSubsys::coll, st.group.rank, algo::describe(desc), ": ", algo::to_string(choice.algorithm),
                choice.algorithm == algo::Algorithm::hierarchical ? (choice.latency ? " (latency form)" : " (bandwidth form)") : "",
                ", slices of ", choice.slice_bytes, " bytes");

  auto task = [&st, desc, args, plan, ticket] {
    exec::Executor& x = *args.exec;
    st.recorder->started(desc, plan.choice.algorithm);
    auto fail = [&](const Error& e) {
      ticket.release(false);
      // The peers' collective kernels that wait for this rank give up (its area's abort word).
      if (st.kernels) st.kernels->abort_kernels();
      // The communicator runs nothing more: unmap the peers' windows now (after the release:
      // unmapping waits for the streams, the user's among them).
      if (plan.direct) st.close_windows();
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
      const algo::Plumbing<T> plumbing{st.group, st.plan_inputs.hosts, st.channel_memory, st.windows.made(),
                                       st.device_exec.get(), st.boot.options.timeout};
      algo::execute(plan, desc, args, plumbing, [&st](const algo::CollectiveDesc& d) { st.hang.stall(d); });
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
    if (st.hang.stalled(desc.seq)) st.hang.republish_progress();
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

/// The one entry of every collective: the fields the kind does not read take the values the typed
/// and pointer forms give them (so a Call issues exactly what its kind's method does), then issue().
template <class T>
Call Communicator<T>::normalized(const Call& call, const char* what) const {
  Call c = call;
  switch (c.kind) {
    case CallKind::barrier: c = Call{}; break;
    case CallKind::broadcast: c.in = c.out; c.op = ReduceOp::sum; break;
    case CallKind::reduce: break;
    case CallKind::gather:
    case CallKind::scatter: c.op = ReduceOp::sum; break;
    case CallKind::all_reduce:
    case CallKind::reduce_scatter: c.root = -1; break;
    case CallKind::all_gather:
    case CallKind::all_to_all: c.op = ReduceOp::sum; c.root = -1; break;
    default:
      throw Error(ErrorCode::invalid_argument, ErrorContext{rank(), -1, what},
                  "kind " + std::to_string(static_cast<unsigned>(c.kind)) +
                      " is not a collective a Call can name (broadcast ... barrier; not split)");
  }
  if (c.op != ReduceOp::premul_sum) c.scalar = nullptr;  // only premul_sum reads it
  return c;
}

template <class T>
Request Communicator<T>::start(const Call& call, CallMode mode, std::optional<device::Stream> stream) {
  const Call c = normalized(call, mode == CallMode::blocking ? "run(Call)" : "start(Call)");
  if (s_ && s_->grouping()) return record_call(c, stream);  // runs at group_end(), blocking or not
  Request r = issue(c, mode == CallMode::async, stream ? &*stream : nullptr);
  if (mode == CallMode::blocking) r.wait();
  return r;
}

template <class T>
Request Communicator<T>::issue(const Call& given, bool async, const device::Stream* stream) {
  (void)live(algo::to_string(given.kind));
  detail::check_collective_args(given.kind, given.in, given.out, given.count, given.dtype, given.op, given.root, rank(),
                                size());
  const algo::CollectiveDesc d = detail::desc_of(given);
  State& st = *s_;
  if (stream && !st.runtime)
    throw Error(ErrorCode::unsupported, st.ctx(-1, algo::describe(d)),
                "a call on a stream needs a device runtime (include chorus/cuda.hpp from a .cu file, or "
                "set one with device::set_default_runtime or set_device_runtime)");
  const MemoryKind kind_found = st.kind_of(given.in, given.out, d);
  if (stream && kind_found == MemoryKind::host && (given.in != nullptr || given.out != nullptr))
    throw Error(ErrorCode::invalid_argument, st.ctx(-1, algo::describe(d)),
                "a call on a stream takes device buffers; these are in host memory (use the calls without a stream)");
  // premul_sum: the input scaled first (into the output, or scratch kept until the call is done);
  // the call's descriptor keeps premul_sum, and its steps sum.
  const bool on_device = stream || kind_found == MemoryKind::device;
  if (on_device) {  // a device call after a failure on a stream fails at once
    std::lock_guard g(st.async_mu);
    if (st.async_error) throw *st.async_error;
  }
  Call call = given;
  std::shared_ptr<std::vector<std::byte>> scaled;
  void* device_scratch = nullptr;  // premul_sum's on device buffers: freed behind the call on its stream
  if (call.op == ReduceOp::premul_sum) scaled = prescale(call, kind_found, stream, &device_scratch);
  const auto [kind, in, out, count, dt, op, root, scalar] = call;
  algo::Args a;
  a.in = static_cast<const std::byte*>(in);
  a.out = static_cast<std::byte*>(out);
  a.exec = &st.host_exec;
  if (!on_device) {
    Request r = collective(d, a, async);
    if (scaled) r.on_complete([scaled](std::exception_ptr) {});  // the scratch lives until the call is done
    return r;
  }
  // Device buffers: the call is ordered on the stream (the default one without a stream).
  const detail::FreeBehind scratch_goes{st.runtime, device_scratch, stream ? *stream : device::Stream{}};
  if (st.plan_inputs.kernel && algo::kernel_takes(kind) && st.takes_kernel(d))
    return kernel_call(d, a.in, a.out, stream, async);
  std::unique_lock lk(st.call_mu);  // the executor and its tickets are made and issued in call order
  a.exec = &st.device_executor();
  // No call in flight: no stream held by a flag. Not with ranks as threads, whose kernels may be
  // running on the one device: freeing waits for the whole device, and a peer's kernel may wait for
  // this rank's next call (the memory goes at destruction instead).
  if (st.exec.pending() == 0 && !st.kernel_in_process) st.device_exec->collect();
  // A blocking call without a stream returns once its results are final: the default stream
  // need not be held (only its earlier work waited for).
  const bool returns_early = async || stream != nullptr;
  auto ticket = st.tickets->issue(stream ? *stream : nullptr, st.boot.options.timeout, returns_early);
  lk.unlock();
  return collective(d, a, returns_early, std::move(ticket));
}

template <class T>
void Communicator<T>::abort() {
  if (!s_) return;  // not valid(): nothing to abort
  s_->leave_shrinks();
  abort_with(Error(ErrorCode::aborted, s_->ctx(-1, "abort"), "communicator aborted by the user"));
}

}  // namespace chorus

#include "chorus/impl/typed_calls.hpp"
#include "chorus/impl/kernel_call.hpp"
#include "chorus/impl/p2p.hpp"
#include "chorus/impl/split.hpp"
#include "chorus/impl/shrink.hpp"
#include "chorus/impl/grow.hpp"
#include "chorus/impl/group_calls.hpp"
#include "chorus/impl/persistent.hpp"
#include "chorus/impl/premul.hpp"
