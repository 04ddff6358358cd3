// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// Communicator<T>::State: what one communicator owns (its group, transport, executors, call
// queue, recorder, windows, the mismatch watch and the hang diagnosis), and the failure path of
// a call (failed(), spread()). Included by impl/communicator.hpp.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "chorus/algo/channel.hpp"
#include "chorus/algo/descriptor.hpp"
#include "chorus/algo/intranode/kernel_path.hpp"
#include "chorus/algo/intranode/window_owner.hpp"
#include "chorus/algo/plan.hpp"
#include "chorus/bootstrap/rendezvous.hpp"
#include "chorus/bootstrap/store_gather.hpp"
#include "chorus/core/tag.hpp"
#include "chorus/detail/env.hpp"
#include "chorus/detail/log.hpp"
#include "chorus/diag/dump.hpp"
#include "chorus/diag/flight_recorder.hpp"
#include "chorus/diag/hang.hpp"
#include "chorus/diag/herald.hpp"
#include "chorus/exec/device.hpp"
#include "chorus/exec/host.hpp"
#include "chorus/impl/call_queue.hpp"
#include "chorus/impl/group_items.hpp"
#include "chorus/impl/standby.hpp"
#include "chorus/topology/hosts.hpp"
#include "chorus/transport/peer_info.hpp"
#include "chorus/version.hpp"

namespace chorus {

namespace detail {

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

template <class T>
struct Communicator<T>::State {
  Bootstrap boot;                   ///< of the job (shared by sub-communicators)
  std::shared_ptr<T> transport;     ///< shared with sub-communicators
  algo::Group<T> group;
  /// What each call is planned from (algo/plan.hpp): the group's slowest link's model, the
  /// overrides, whether every peer has mailboxes (shm) and mapped device memory (cuda_ipc).
  algo::PlanInputs plan_inputs;
  std::size_t ipc_slot_bytes = 0;  ///< CHORUS_CUDA_IPC_SLOT_BYTES, read at creation where ipc
  /// Calls the library makes itself (split's all_gather and barrier) run while this is above 0:
  /// they take no forced algorithm (algo/plan.hpp). Only the thread that runs split raises it.
  std::atomic<int> internal_calls{0};

  /// Which ranks share a host, and the models of the links inside and between hosts, alike on
  /// every rank: each rank publishes its host identity (Options::host_id, else detail::host_id) in
  /// the communicator's store and reads the others' (store_all_gather: O(n) requests); then its own
  /// links' models, of which every rank takes the slowest (algo::HostModels::combine).
  void exchange_layout() {
    algo::PlanInputs& in = plan_inputs;
    const int n = group.size();
    in.hosts = topology::Hosts(n);
    in.links = algo::host_models(*transport, group, in.hosts, algo::net_bandwidth_from_env());
    if (n <= 1) return;
    auto all = [&](const std::string& what, const std::string& mine) {
      return store_all_gather(*boot.store, "topology/" + what, group.rank, n, mine,
                              boot.options.setup_bound());
    };
    const std::vector<std::string> ids =
        all("host", boot.options.host_id.empty() ? chorus::detail::host_id(ctx(-1, "init")) : "id:" + boot.options.host_id);
    in.hosts = topology::Hosts::from_keys(std::span<const std::string>(ids));
    const algo::HostModels mine = algo::host_models(*transport, group, in.hosts, algo::net_bandwidth_from_env());
    algo::HostModels combined;
    for (const std::string& text : all("links", mine.encode())) combined.combine(algo::HostModels::decode(text));
    in.links = combined;
  }
  /// This rank's standby store and every rank's standby address (impl/standby.hpp): where the
  /// survivors meet in shrink(). Shared with sub-communicators (indexed by transport rank).
  std::shared_ptr<detail::Standby> standby;
  std::uint64_t shrink_seq = 0;  ///< shrinks of this group begun (alike on every rank; under call_mu)
  std::atomic<bool> left_shrinks{false};  ///< abort() was called: no shrink here (leave_shrinks)
  /// The store keys of this group's shrink number `seq` (impl/standby.hpp).
  std::string shrink_prefix(std::uint64_t seq) const {
    return "shrink/c" + std::to_string(group.context >> detail::kContextShift) + "/s" + std::to_string(seq) +
           "/";
  }
  /// The user aborted this communicator: it joins no later shrink, and says so where the next one
  /// looks (Standby::leave; best effort, never throws).
  void leave_shrinks() noexcept {
    left_shrinks = true;
    try {
      std::uint64_t seq = 0;
      {
        std::lock_guard lk(call_mu);
        seq = shrink_seq;
      }
      if (standby) standby->leave(shrink_prefix(seq), group.rank);
    } catch (...) {  // a store that is gone: the survivors wait shrink_wait instead
    }
  }

  /// Starts this rank's standby and learns every rank's standby address (none with a store every
  /// rank shares, which serves instead).
  void make_standby() {
    standby = detail::Standby::make(boot);
    if (standby->shared()) return;
    standby->set_addresses(store_all_gather(*boot.store, "standby", boot.rank, boot.size, standby->address(),
                                            boot.options.setup_bound()));
  }
  exec::HostExecutor host_exec;  ///< copies, reductions and scratch of host buffers
  std::shared_ptr<algo::ChannelMemory> channel_memory;  ///< reused by each call's Channel
  /// host_exec's and device_exec's bytes() and channel_memory->bytes() after the last call (memory_stats() reads them
  /// from any thread; the call's thread owns the buffers).
  std::atomic<std::size_t> scratch_bytes{0}, channel_bytes{0};
  std::atomic<std::size_t> kernel_bytes{0};  ///< the collective kernel's area (memory_stats())

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
  /// The IPC windows (algo/intranode/window_owner.hpp): made at the first direct collective,
  /// closed by a failed one, released before the executor and the runtime go.
  algo::WindowOwner<T> windows;
  cuda_ipc::Windows& ipc_windows() { return windows.get(*runtime, group.rank, group.size(), ipc_slot_bytes); }
  /// Every peer is a thread of this process (inproc): the collective kernel addresses their device
  /// memory with plain pointers.
  bool kernel_in_process = false;
  /// The collective kernel's path (algo/intranode/kernel_path.hpp): made at the first call it takes
  /// (impl/kernel_call.hpp), released at destruction.
  std::shared_ptr<algo::KernelPath<T>> kernels;
  std::string kernel_key() const { return "kernel/" + std::to_string(group.context); }
  /// Whether the plan of `d` on device buffers is the collective kernel.
  bool takes_kernel(const algo::CollectiveDesc& d) const {
    return algo::plan<T>(d, d.count * size_of(d.dtype), true, plan_inputs, [] { return std::size_t(0); }, internal_calls > 0).kernel;
  }
  void release_kernels() {
    if (kernels)
      kernels->release(boot.store.get(), kernel_key(), aborted.load(), std::min<std::chrono::milliseconds>(boot.options.timeout, cuda_ipc::kGoodbye));
  }
  void close_windows() { windows.close(group.rank); }
  void release_windows() { windows.release(group, coll_seq, aborted.load(), boot.options.timeout); }
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
      runtime->load_kernels();  // before any ticket holds a stream: see device::Runtime::load_kernels
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
    m.ipc_window_bytes = windows.bytes();
    m.kernel_area_bytes = kernel_bytes.load(std::memory_order_relaxed);
    if constexpr (TransportWithMemoryBytes<T>) m.transport_bytes = transport->memory_bytes();
    return m;
  }
  /// The info line of a communicator made (CHORUS_DEBUG=INFO): what it runs on.
  void log_ready() const {
    if (detail::log_enabled(detail::LogLevel::info, detail::LogSubsys::init))
      detail::log(
          detail::LogLevel::info, detail::LogSubsys::init, boot.rank, "communicator ready (chorus ",
          version().string, "): ", boot.size, " ranks over ", T::kName, " on ", plan_inputs.hosts.describe(),
          " (local rank ", plan_inputs.hosts.local_rank(group.rank), " of ",
          plan_inputs.hosts.local_size(group.rank), ")", "; device buffers: ",
          plan_inputs.kernel
              ? (kernel_in_process
                     ? "one collective kernel per call, peers' memory read directly (threads of this process)"
                     : "one collective kernel per call, peers' memory read directly (cuda_ipc)")
              : "staged through pinned host memory",
          "; memory: ", memory_stats().to_string());
  }
  /// A collective takes its sequence number and its place in the executor under this lock, so
  /// calls from several threads run one at a time in the order of their numbers.
  detail::CallLock call_mu;
  std::uint64_t coll_seq = 0;       ///< collectives called so far (identical on every rank; under call_mu)
  // ---- a group of calls (impl/group_calls.hpp) ----
  std::atomic<std::thread::id> group_owner{};         ///< the thread whose group is open (none: no group)
  int group_depth = 0;                                ///< group_start() nesting (the owner's)
  std::vector<detail::GroupItem> group_items;         ///< what the open group recorded (the owner's)
  std::shared_ptr<detail::GroupGuard> group_guard;    ///< its requests' driver while it is open
  bool grouping() const { return group_owner.load(std::memory_order_relaxed) == std::this_thread::get_id(); }
  /// split, shrink, grow and recv from any source are not recorded by a group: refused inside one.
  void outside_group(std::string_view op) const {
    if (grouping())
      throw Error(ErrorCode::invalid_argument, ctx(-1, std::string(op)),
                  "cannot be called inside a group (between group_start() and group_end() on this thread)");
  }
  // ---- persistent operations (impl/persistent.hpp) ----
  Communicator* self = nullptr;  ///< the Communicator that holds this state (kept by its moves)
  std::shared_ptr<const int> life = std::make_shared<const int>(0);  ///< expires with the state
  std::atomic<std::uint64_t> split_seq{0};
  std::mutex subset_mu;
  std::map<std::string, std::uint64_t> subset_seq;  ///< subsets made per list of ranks (under subset_mu)
  mismatch::Watch<T> watch;  ///< the notices of a mismatch found elsewhere, and the herald that spreads one
  std::atomic<bool> aborted{false};
  /// The last calls (at least 16; CHORUS_FLIGHT_RECORDER_ENTRIES): dumped on a failure, and
  /// published for the cross-check through the store when a wait stalls.
  std::shared_ptr<algo::FlightRecorder> recorder;
  std::atomic<bool> dumped{false};  ///< the recorder was dumped for a failure (once per communicator)
  diag::HangWatch hang;  ///< stall cross-checks and late ranks (diag/hang.hpp), set with the recorder
  detail::CallQueue exec;      ///< declared last: joined first, before anything it uses goes

  ErrorContext ctx(int peer, std::string op) const { return {group.rank, peer, std::move(op)}; }

  /// The flight recorder, once the group is known; registered for CHORUS_DUMP_ON_SIGNAL.
  void make_recorder() {
    const auto n = detail::env_int("CHORUS_FLIGHT_RECORDER_ENTRIES", 16, 1 << 20).value_or(64);
    recorder = std::make_shared<algo::FlightRecorder>(static_cast<std::size_t>(n), group.rank, group.members,
                                                      group.context >> detail::kContextShift);
    detail::DumpRegistry::instance().add(recorder);
    hang = diag::HangWatch(boot.store, group.rank, group.members, group.context, recorder, boot.options.timeout);
  }

  /// Posts the receives that learn of a mismatch another rank detected (mismatch::Watch).
  void watch_for_errors() { watch = mismatch::Watch<T>::start(transport, group); }

  /// Dumps the flight recorder once per communicator (later failures are consequences).
  void dump_once(std::string_view reason) {
    if (!dumped.exchange(true)) detail::write_dump(recorder->dump(reason));
  }

  /// A call failed with `e`: tell every rank of a mismatch; dump the recorder; a timeout is
  /// thrown again naming the ranks that have not entered the call.
  void failed(const algo::CollectiveDesc& d, const Error& e) {
    if (e.code() == ErrorCode::mismatch) return spread(e);
    if (e.code() == ErrorCode::timeout) {
      const std::string late = hang.late_ranks(d);
      dump_once(std::string("timeout in ") + algo::describe(d));
      throw Error::from_text(e.code(), e.what() + late, e.rank(), e.peer());
    }
    if (e.code() == ErrorCode::peer_failure || e.code() == ErrorCode::aborted)
      dump_once(std::string(to_string(e.code())) + " in " + algo::describe(d) + ": " + e.what());
  }

  /// Tells every peer about `e`, then aborts with it (see Herald). When this rank is already
  /// telling them (a notice reached it first), returns at once: that herald aborts the transport
  /// once its notices have left, and aborting here would cut them off.
  void spread(const Error& e) {
    if (!watch.herald->start(e)) return;
    watch.herald->wait(std::chrono::steady_clock::now() + hang.failure_bound());
    transport->abort(e);  // so that it has happened before the caller throws (abort is idempotent)
  }
};

}  // namespace chorus
