// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// device::SimRuntime: device::Runtime (device/runtime.hpp) on the host, for machines without a
/// GPU. The device data path (staging, chunk pipelining, stream order, error surfacing) runs on it
/// in CI, in real processes, and it checks what compute-sanitizer would.
///
/// ```cpp
/// chorus::device::SimRuntime rt;
/// void* d = rt.alloc_device(bytes);
/// chorus::device::Stream s = rt.create_stream();
/// rt.copy(d, host_ptr, bytes, s);
/// rt.reduce(chorus::ReduceOp::sum, chorus::DataType::float32, d, d, other, count, s);
/// const void* inputs[] = {d, other, third};
/// rt.reduce_many(chorus::ReduceOp::sum, chorus::DataType::float32, d, inputs, 3, count, s);
/// rt.synchronize(s);                      // throws the first error of the stream's work
/// rt.fail_after("copy", 3, 700);          // the 3rd copy from now fails inside its stream
/// ```
///
/// The model:
/// * Device memory: a reservation of address space of its own per object (PROT_NONE, committed
///   per allocation, a guard page after each). Addresses are handed out next-fit, so a freed
///   range is reused only after the arena has wrapped around: a stale pointer stays detectably
///   dead for long. kind_of says device exactly for pointers inside live device allocations.
/// * IPC (ipc_export / ipc_open): exporting moves the allocation's pages into a memfd, mapped
///   shared at the same address (the contents are copied once); the handle names the process, the
///   descriptor and the memfd's unique name. ipc_open in another process (or another SimRuntime of
///   the same process, which stands for one) opens /proc/<pid>/fd/<fd>, checks the name, and maps
///   it into its own arena, where it is device memory like its own allocations: the kernels of
///   either process read and write the same pages, as CUDA IPC mappings do. A handle of the opening
///   runtime itself, of a freed allocation or of an exited process fails with
///   cudaErrorInvalidValue; a mapping outlives the exporter's free or exit (the memfd stays until
///   the last mapping goes), where on a GPU that is undefined.
/// * dma-buf (export_dmabuf): a dup of the memfd IPC export makes (made the same way the first
///   time), with the pointer's offset in it; the fake verbs register the device address after
///   checking the fd's size, and write the memfd's pages through it.
/// * Pinned memory: page-aligned host memory, tracked, so that wait_flag on memory that is not
///   pinned, or a copy that runs past the end of a pinned buffer, is detected.
/// * Streams: an ordered queue each, run by one worker thread per stream; the null stream is a
///   stream that always exists. Events mark queue positions: an event is complete once its
///   stream's worker has passed its record (timing events take the clock there).
/// * Checks, at run time in the stream like compute-sanitizer: a copy or fill whose device side
///   is not inside one live device allocation, or whose host side is null or runs past a pinned
///   buffer, fails with cudaErrorInvalidValue (1); a kernel (reduce, reduce_many, finalize_avg, premul) whose
///   operands are not inside live device allocations fails with cudaErrorIllegalAddress (700). Arguments
///   wrong at the call itself (unknown handles, a DataType or ReduceOp out of range, a flag not in
///   pinned memory) throw at the call.
/// * Errors in a stream's work are sticky for that stream: the failing operation and everything
///   enqueued on the stream after it are skipped (their positions still pass, so nothing waits
///   forever), and every later query, synchronize and launch on the stream, or on an event
///   recorded on it, throws chorus::Error(system) "<call>: cudaErrorXxx (N): <what>".
/// * free_device and free_pinned wait for the work enqueued before them, as cudaFree does;
///   free_device_async frees when its stream reaches it (cudaFreeAsync), waiting for nothing else.
/// * Kernels load lazily, as CUDA's do by default (CUDA_MODULE_LOADING=LAZY): until load_kernels(),
///   the first launch of each kernel (reduce and reduce_many per op and dtype, finalize_avg per
///   dtype, wait_flag, write_value, wait_value) loads it, and a load may wait for the whole device.
///   A first launch while a wait_flag or wait_value is still holding a stream throws at the call
///   (cudaErrorLaunchFailure, naming the kernel): on a GPU that load would wait for the waiting
///   kernel, which waits for the host or a peer, which may wait for this launch (on an H200 a
///   wait_flag's and a reduction's first launches did, until the wait's timeout).
///   CUDA_MODULE_LOADING=EAGER in the environment loads every kernel at construction, as in CUDA.
/// * The collective kernel (launch_collective): each block on a host thread of its own, so that
///   its barriers, LL lines, abort and descriptor checks run as on a GPU against the peers'
///   kernels (threads of this process, or other processes through IPC mappings).
/// * Destruction drops queued work (the operation running finishes, a wait_flag gives up, a
///   collective kernel's abort word is set), joins the workers and releases the memory.
/// * Fault injection: fail_after(call, n, error), or CHORUS_SIM_FAIL="call:n:error[,...]" read by
///   the constructor (docs/environment.md).
///
/// Thread safety: every method may be called from any thread.
/// Lock order: memory_rw_ (shared by work that touches memory, unique while memory is returned
/// to the system) before mu_ (everything else). A worker sleeps only on condition variables.

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "chorus/core/error.hpp"
#include "chorus/core/types.hpp"
#include "chorus/device/runtime.hpp"
#include "chorus/testing/sim_runtime/errors.hpp"

namespace chorus::device {

class SimRuntime final : public Runtime {
 public:
  /// Address space reserved for device memory (committed only as allocations use it).
  static constexpr std::size_t kDefaultArenaBytes = std::size_t(16) << 30;
  /// wait_flag's polling: from kFlagPollMin, doubling up to kFlagPollMax between loads.
  static constexpr std::chrono::microseconds kFlagPollMin{2};
  static constexpr std::chrono::microseconds kFlagPollMax{1000};
  /// wait_value's polling: from kFlagPollMin, doubling up to kValuePollMax (a step of a direct
  /// collective waits on it, so it answers sooner than wait_flag).
  static constexpr std::chrono::microseconds kValuePollMax{100};

  explicit SimRuntime(std::size_t arena_bytes = kDefaultArenaBytes);
  ~SimRuntime() override;
  SimRuntime(const SimRuntime&) = delete;
  SimRuntime& operator=(const SimRuntime&) = delete;

  std::string_view name() const noexcept override { return "simulated"; }

  int device_count() override { return 1; }
  void set_device(int device) override;
  int current_device() override { return 0; }

  MemoryKind kind_of(const void* p) override;
  void* alloc_device(std::size_t bytes) override;
  void free_device(void* p) override;
  void* alloc_device_async(std::size_t bytes, Stream s) override;
  void free_device_async(void* p, Stream s) override;
  void* alloc_pinned(std::size_t bytes) override;
  void free_pinned(void* p) override;

  bool can_access_peer(int device, int peer_device) override;
  IpcHandle ipc_export(void* base) override;
  void* ipc_open(const IpcHandle& h) override;
  void ipc_close(void* p) override;

  Stream create_stream() override;
  void destroy_stream(Stream s) override;
  Event create_event(bool timing = false) override;
  void destroy_event(Event e) override;
  void record(Event e, Stream s) override;
  bool query(Event e) override;
  void synchronize(Event e) override;
  void synchronize(Stream s) override;
  void wait(Stream s, Event e) override;
  float elapsed_ms(Event start, Event end) override;

  void copy(void* dst, const void* src, std::size_t bytes, Stream s) override;
  void fill(void* dst, int byte, std::size_t bytes, Stream s) override;
  void reduce(ReduceOp op, DataType dt, void* out, const void* a, const void* b, std::size_t count,
              Stream s) override;
  void reduce_many(ReduceOp op, DataType dt, void* out, const void* const* srcs, int n, std::size_t count,
                   Stream s) override;
  void finalize_avg(DataType dt, void* data, std::size_t count, int world_size, Stream s) override;
  void premul(DataType dt, void* out, const void* in, std::size_t count, const void* scalar, bool scalar_on_device,
              Stream s) override;
  void wait_flag(Stream s, const std::uint32_t* flag, std::uint64_t timeout_ns) override;
  void write_value(Stream s, std::uint64_t* word, std::uint64_t value) override;
  void wait_value(Stream s, const std::uint64_t* word, std::uint64_t value, std::uint32_t* abort,
                  std::uint32_t on_timeout, std::uint64_t timeout_ns) override;
  void load_kernels() override;
  /// Runs each block of the kernel on a host thread of its own (the stream's worker runs block 0),
  /// the threads of a block one after another (device/collective_body.hpp); its own buffers and
  /// every area are checked as a kernel's operands are.
  void launch_collective(const CollectiveLaunch& a, Stream s) override;
  /// kSimMultiprocessors / sharing, at least 1.
  unsigned collective_blocks(int sharing) override;
  /// The simulated device's multiprocessors (collective_blocks).
  static constexpr unsigned kSimMultiprocessors = 8;

  // --- device memory for an RDMA NIC (dma-buf) -----------------------------------------------
  /// A dup of the memfd behind the allocation that holds [p, p + bytes) (made as ipc_export makes
  /// it, the first time), and p's offset in it: the fake verbs (testing/fake_verbs.hpp) check the
  /// fd's size and register the device address, which the memfd's pages back.
  DmabufExport export_dmabuf(void* p, std::size_t bytes) override;
  /// For tests: from now on export_dmabuf throws Error(unsupported), as a runtime or device
  /// without dma-buf export does.
  void refuse_dmabuf() noexcept { refuse_dmabuf_.store(true, std::memory_order_relaxed); }

 private:
  std::atomic<bool> refuse_dmabuf_{false};

 public:
  // --- end of device memory for an RDMA NIC (dma-buf) ----------------------------------------

  // --- for tests -----------------------------------------------------------------------------
  /// Makes the n-th call of `call` from now (n >= 1) fail with `cuda_error`. Calls: alloc_device,
  /// alloc_pinned, create_stream, create_event (they throw at the call) and copy, fill, reduce,
  /// reduce_many, finalize_avg, wait_flag, write_value, wait_value, collective (the operation fails inside its
  /// stream, whose next query or synchronize throws). A later fail_after for the same call replaces the earlier one.
  /// Throws invalid_argument for another call name, n < 1 or cuda_error 0.
  void fail_after(std::string_view call, int n, int cuda_error);
  /// Makes the n-th operation of `call` from now (n >= 1; one of the stream operations above)
  /// hold its stream for `how_long` before it runs, as a slow kernel would: what the waits and
  /// watchdogs of the callers do with a late peer. Throws invalid_argument for another call or
  /// n < 1.
  void stall_after(std::string_view call, int n, std::chrono::milliseconds how_long);

 private:
  struct StreamState;
  struct EventState;
  enum class OpKind {
    copy,
    fill,
    reduce,
    reduce_many,
    finalize_avg,
    premul,
    wait_flag,
    write_value,
    wait_value,
    record,
    wait_event,
    collective,
    free_memory  // free_device_async
  };
  struct Op {
    explicit Op(OpKind k) : kind(k) {}
    OpKind kind;
    int inject = 0;  ///< a CUDA error to fail with instead of running (fail_after)
    std::chrono::milliseconds stall{0};  ///< how long to hold the stream before running (stall_after)
    void* dst = nullptr;
    const void* a = nullptr;
    const void* b = nullptr;
    std::array<const void*, kMaxReduceInputs> srcs{};  ///< reduce_many: its inputs, srcs[0..value)
    std::size_t bytes = 0;  ///< copy, fill: bytes; kernels: elements
    int value = 0;          ///< fill: the byte; finalize_avg: the world size; reduce_many: the inputs
    ReduceOp op = ReduceOp::sum;
    DataType dt = DataType::uint8;
    std::uint64_t timeout_ns = 0;
    std::uint64_t word_value = 0;  ///< write_value: what is stored; wait_value: what is waited for; premul: the host scalar's bytes
    std::shared_ptr<EventState> event;    ///< record
    std::uint64_t generation = 0;         ///< record: which record of the event this is
    std::shared_ptr<StreamState> target;  ///< wait_event: the stream waited for ...
    std::uint64_t position = 0;           ///< ... and the position it must pass
    std::shared_ptr<const CollectiveLaunch> launch;  ///< collective
  };
  struct StreamError {
    int cuda_error;
    std::string text;
  };
  struct StreamState {
    std::deque<Op> queue;
    std::uint64_t enqueued = 0;   ///< operations ever enqueued
    std::uint64_t completed = 0;  ///< operations passed (run or skipped), in order
    std::optional<StreamError> error;
    int holds = 0;         ///< wait_flag and wait_value operations enqueued and not yet passed
    bool closing = false;  ///< destroyed: run what is queued, then exit
    bool exited = false;
    std::condition_variable cv;  ///< the worker's: work, closing, stopping
    std::thread worker;
  };
  struct EventState {
    bool timing = false;
    std::shared_ptr<StreamState> stream;  ///< null until recorded
    std::uint64_t position = 0;
    std::uint64_t generation = 0;
    bool stamped = false;
    std::chrono::steady_clock::time_point when{};
  };
  struct Allocation {
    std::size_t bytes;  ///< as asked
    std::size_t span;   ///< arena bytes taken, guard page included
    int fd = -1;        ///< the memfd behind it once exported, or opened from another runtime
    bool imported = false;  ///< opened by ipc_open (freed by ipc_close only)
    std::uint64_t serial = 0;  ///< exported: its number in the handle and the memfd's name
  };
  struct Injection {
    int remaining;
    int cuda_error;
  };

  // All private helpers run with mu_ held unless they say otherwise.
  std::shared_ptr<StreamState> stream_of(Stream s, std::string_view call);
  std::shared_ptr<EventState> event_of(Event e, std::string_view call);
  void throw_if_failed(const StreamState& st);
  int take_injection(std::string_view call);
  void enqueue(Stream s, std::string_view call, Op op);
  std::shared_ptr<StreamState> start_stream();
  void run(const std::shared_ptr<StreamState>& st);  // the worker; takes mu_ itself
  void execute(StreamState& st, Op& op, std::unique_lock<std::mutex>& lk);
  void execute_memory(StreamState& st, Op& op, std::unique_lock<std::mutex>& lk);
  void wait_for_flag(StreamState& st, const Op& op, std::unique_lock<std::mutex>& lk);
  void store_word(StreamState& st, const Op& op, std::unique_lock<std::mutex>& lk);
  void wait_for_value(StreamState& st, const Op& op, std::unique_lock<std::mutex>& lk);
  void run_collective(StreamState& st, const Op& op, std::unique_lock<std::mutex>& lk);
  /// Empty when p is an aligned word of `bytes` inside one live device allocation, else why not.
  std::string check_device_word(const void* p, std::size_t bytes, std::string_view what) const;
  /// Waits until every stream has passed what was enqueued on it before this call.
  void drain(std::unique_lock<std::mutex>& lk);
  void reap_retired();
  bool in_arena(const void* p) const noexcept;
  const std::pair<const std::uintptr_t, Allocation>* device_allocation(const void* p) const;
  const std::pair<const std::uintptr_t, std::size_t>* pinned_allocation(const void* p) const;
  /// Empty when [p, p + bytes) is inside one live device allocation, else why not.
  std::string check_device_range(const void* p, std::size_t bytes, std::string_view what) const;
  /// For either side of a copy or fill: device memory must fit one live allocation; host memory
  /// must not be null nor run past a pinned buffer it starts in.
  std::string check_any_range(const void* p, std::size_t bytes, std::string_view what) const;
  /// The memfd behind the exportable allocation at `base` (an allocation of this runtime or one
  /// ipc_open mapped), making it the first time: its pages move into a new memfd mapped shared at
  /// the same address. Needs memory_rw_ held unique (no operation touches the pages meanwhile).
  int memfd_of(void* base, Allocation& a, std::string_view call);
  std::size_t arena_take(std::size_t span);
  /// Returns an allocation's arena range (span bytes, the guard page included) once it is out of
  /// device_, without mu_ held: its pages go (a memfd's mapping is replaced and `fd` closed), then
  /// the range is free again.
  void release_range(std::size_t off, std::size_t span, int fd);
  void unmap_pages(std::size_t off, std::size_t span, int fd);  ///< memory_rw_ held unique
  void free_in_stream(StreamState& st, void* p, std::unique_lock<std::mutex>& lk);
  void release_deferred(bool wait);
  struct Deferred {
    std::size_t off, span;
    int fd;
  };
  std::vector<Deferred> deferred_;  ///< freed in a stream, pages not returned yet (release_deferred)
  void arena_give(std::size_t offset, std::size_t span);
  void apply_env();

  std::shared_mutex memory_rw_;
  std::mutex mu_;
  std::condition_variable progress_;  ///< any stream passed an operation, or a worker exited
  bool stopping_ = false;

  std::byte* arena_ = nullptr;
  std::size_t arena_bytes_ = 0;
  std::size_t page_ = 4096;
  std::map<std::size_t, std::size_t> free_ranges_;  ///< arena offset -> bytes, coalesced
  std::size_t rover_ = 0;                           ///< next-fit starts here
  std::map<std::uintptr_t, Allocation> device_;
  std::map<std::uintptr_t, std::size_t> pinned_;  ///< start -> bytes as asked
  std::uint64_t nonce_ = 0;        ///< random: names this runtime's memfds, tells its handles apart
  std::uint64_t next_serial_ = 1;  ///< of exported allocations

  std::shared_ptr<StreamState> default_stream_;
  std::map<const StreamState*, std::shared_ptr<StreamState>> streams_;
  std::vector<std::shared_ptr<StreamState>> retired_;  ///< destroyed, worker not yet joined
  std::map<const EventState*, std::shared_ptr<EventState>> events_;
  std::map<std::string, Injection, std::less<>> injections_;
  std::map<std::string, std::pair<int, std::chrono::milliseconds>, std::less<>> stalls_;  ///< call -> (n, how long)
  bool kernels_loaded_ = false;        ///< load_kernels() ran, or CUDA_MODULE_LOADING=EAGER
  std::set<std::uint32_t> loaded_;     ///< kernels loaded by a first launch (keyed in load_on_launch)
  /// The abort words of the collective kernels running now: destruction sets them, so their
  /// spins end (under mu_).
  std::multiset<std::uint32_t*> running_aborts_;
  /// The operations that hold their stream until the host or a peer lets them go.
  static bool holds_stream(OpKind k) {
    return k == OpKind::wait_flag || k == OpKind::wait_value || k == OpKind::collective;
  }
  /// Before a kernel's launch is queued (under mu_): its lazy load (see the model above).
  void load_on_launch(const Op& op, std::string_view call);
};

}  // namespace chorus::device

// The bodies (sim_runtime/bodies.hpp), inline here; with CHORUS_SEPARATE_COMPILATION
// (chorus/compiled.hpp) a unit sees the declarations above only, and the bodies are compiled once,
// in chorus::compiled (cmake/compiled/sim_runtime.cpp) or the program's chorus/src.hpp.
#if defined(CHORUS_SEPARATE_COMPILATION)
#define CHORUS_DETAIL_SIM_INLINE
#else
#define CHORUS_DETAIL_SIM_INLINE inline
#include "chorus/testing/sim_runtime/bodies.hpp"
#endif
