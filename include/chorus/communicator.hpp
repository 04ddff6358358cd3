// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// Communicator<Transport>: a group of ranks and the public API on it.
///
///   auto comm = chorus::Communicator<chorus::tcp::Transport>::create(chorus::Options::from_env());
///   std::vector<float> v(1024);
///   if (comm.rank() == 0) comm.send(v, /*peer=*/1, /*tag=*/7);
///   else if (comm.rank() == 1) comm.recv(v, 0, 7);
///   comm.barrier();
///
/// Messages between two ranks arrive in order per (peer, tag); receives may be posted for tags
/// in any order. A receive must be posted with exactly the size that was sent (else mismatch).
/// Every blocking call and every Request::wait() is bounded by Options::timeout; a timeout
/// aborts the communicator (like NCCL's watchdog) so no buffer is written after the call threw.
/// A dead peer or broken link fails every pending and later operation with that peer with
/// peer_failure, promptly. Destruction never waits for peers: operations still pending fail with
/// `aborted` here (and their peers with peer_failure); finalize() waits for them first.
///
/// Threads: every call may come from any thread, also at once. Collectives (and split) run one
/// at a time, in the order in which their calls took their sequence numbers: calls racing on
/// one rank may take them in any order, so the ranks must agree on an order (else `mismatch`, or
/// results paired with the wrong calls where the calls look alike). Point-to-point calls need
/// no order. abort() may come from any thread at any time.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <ranges>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "chorus/core/buffer.hpp"
#include "chorus/core/concepts.hpp"
#include "chorus/core/error.hpp"
#include "chorus/core/ranges.hpp"
#include "chorus/core/request.hpp"
#include "chorus/core/types.hpp"
#include "chorus/device/default.hpp"
#include "chorus/exec/device.hpp"
#include "chorus/algo/channel.hpp"
#include "chorus/algo/common.hpp"
#include "chorus/algo/select.hpp"
#include "chorus/algo/descriptor.hpp"
#include "chorus/options.hpp"
#include "chorus/persistent.hpp"

namespace chorus {

namespace detail { struct GroupItem; class CallLock; }  // impl/group_items.hpp, impl/state.hpp
namespace algo { struct Plan; }  // algo/plan.hpp

/// What a communicator holds besides the caller's buffers (Communicator::memory_stats()). Each part
/// has a cap or shrinks (docs/design.md, "Memory"); the transport's part is shared with the
/// communicators split from the same parent.
struct MemoryStats {
  std::size_t scratch_bytes = 0;    ///< the algorithms' scratch: given back after a burst of large calls
  std::size_t channel_bytes = 0;    ///< descriptor staging of the calls' first messages
  std::size_t recorder_bytes = 0;   ///< the flight recorder (CHORUS_FLIGHT_RECORDER_ENTRIES)
  std::size_t transport_bytes = 0;  ///< links: segments, buffers, eager messages waiting for receives
  /// This rank's IPC window in device memory (cuda_ipc: the direct collectives), 0 where none was made.
  std::size_t ipc_window_bytes = 0;
  /// This rank's collective-kernel area in device memory (flags, LL lines, its window), 0 where none was made.
  std::size_t kernel_area_bytes = 0;
  std::size_t total() const {
    return scratch_bytes + channel_bytes + recorder_bytes + transport_bytes + ipc_window_bytes + kernel_area_bytes;
  }
  /// "total 2.1 MiB: scratch 1.0 MiB, channel 68.2 KiB, recorder 4.6 KiB, transport 1.0 MiB"
  std::string to_string() const;
};

/// The color of a rank that joins no group in Communicator::split (NCCL_SPLIT_NOCOLOR,
/// MPI_UNDEFINED): it takes part in the call and gets back a communicator that is not valid().
inline constexpr int kSplitNoColor = -1;

/// The collectives a Call can name (algo::CollectiveKind; `split` is not one).
using CallKind = algo::CollectiveKind;

/// One collective as plain data (chorus/call.hpp): what Communicator::start issues. What a kind
/// reads: broadcast uses `out` only (in place); barrier nothing; `op` applies to all_reduce, reduce
/// and reduce_scatter, `root` to broadcast, reduce, gather and scatter (elsewhere both are
/// ignored). `count` is in elements per rank as the pointer-form methods count it. `scalar`: op
/// premul_sum's factor, one element of `dtype` in host (read when the call runs) or device memory.
struct Call {
  CallKind kind = CallKind::barrier;
  const void* in = nullptr;
  void* out = nullptr;
  std::size_t count = 0;
  DataType dtype = DataType::uint8;
  ReduceOp op = ReduceOp::sum;
  int root = -1;
  const void* scalar = nullptr;
};

/// How Communicator::start issues a call: `blocking` returns when this rank's part is done (on
/// the calling thread when nothing is queued before it); `async` returns a Request at once.
enum class CallMode { blocking, async };

template <class T>
class Communicator {
  // The concept is checked here rather than in the template head, so that chorus/fwd.hpp can
  // declare Communicator and a header can name Communicator<DefaultTransport> (an incomplete
  // type there) without chorus.hpp.
  static_assert(Transport<T>, "Communicator<T>: T must model chorus::Transport (core/concepts.hpp)");

 public:
  using transport_type = T;

  /// Rendezvous through the store named by the options (or the environment) and open links.
  static Communicator create(Options options);

  Communicator(Communicator&& o) noexcept;
  Communicator& operator=(Communicator&& o) noexcept;
  ~Communicator();

  /// False for what split(kSplitNoColor, key) returns (like MPI_COMM_NULL, or the null
  /// communicator of ncclCommSplit) and for a communicator moved from: every call on it but
  /// valid(), abort() and finalize() (which do nothing) throws invalid_argument.
  bool valid() const noexcept { return s_ != nullptr; }

  int rank() const;
  int size() const;
  /// This rank among the ranks of its host (in rank order), and how many ranks its host has, in
  /// this communicator (a split communicator counts its own members): as torchrun's LOCAL_RANK
  /// and LOCAL_WORLD_SIZE, from the host identities the ranks exchange at creation
  /// (Options::host_id, CHORUS_HOST_ID). host_count(): the hosts the communicator spans.
  int local_rank() const;
  int local_size() const;
  int host_count() const;
  const Options& options() const;

  /// Point-to-point. tag must be in [0, 2^31). Blocking forms wait for completion.
  template <ByteRange R>
  void send(const R& data, int peer, int tag = 0) { done_unless_grouped(isend(data, peer, tag)); }
  template <WritableByteRange R>
  void recv(R&& data, int peer, int tag = 0) { done_unless_grouped(irecv(std::forward<R>(data), peer, tag)); }
  template <ByteRange R>
  Request isend(const R& data, int peer, int tag = 0) {
    return isend_bytes(ConstBytes{reinterpret_cast<const std::byte*>(std::ranges::data(data)),
                                  std::ranges::size(data) * sizeof(std::ranges::range_value_t<R>)},
                       peer, tag);
  }
  template <WritableByteRange R>
  Request irecv(R&& data, int peer, int tag = 0) {
    return irecv_bytes(MutableBytes{reinterpret_cast<std::byte*>(std::ranges::data(data)),
                                    std::ranges::size(data) * sizeof(std::ranges::range_value_t<R>)},
                       peer, tag);
  }
  Request isend_bytes(ConstBytes data, int peer, int tag);
  Request irecv_bytes(MutableBytes data, int peer, int tag);

  /// Receive from any source (MPI_ANY_SOURCE, gloo's recvFromAny): takes the first message with `tag` that
  /// reaches this rank from any other rank of the communicator, and Request::source() names its sender once
  /// the request is complete (-1 before); recv_any returns it. Each message goes to exactly one receive:
  /// messages from one rank still match in the order they were sent, and on one link the receives for a tag,
  /// ordinary and from any source, take them in the order they were posted. Between ranks there is no order:
  /// when several have sent, any of them may be taken first. A message of another size fails it with mismatch
  /// naming the sender; like every request it is bounded by the timeout (which aborts the communicator). It
  /// fails with peer_failure (`aborted` after this rank's abort()) once no rank is left that could send it:
  /// when the communicator is aborted, or the links to every other rank have broken; one rank's failure or
  /// leaving alone does not end it, since another may still send. Host buffers only, as send and recv; a
  /// communicator of one rank, or a negative tag, is invalid_argument. Every transport has it (inproc, tcp,
  /// shm, rdma, the default transport's mix).
  ///   const int from = comm.recv_any(v, /*tag=*/3);  // whichever rank's message came first
  template <WritableByteRange R>
  int recv_any(R&& data, int tag = 0) {
    Request r = irecv_any(std::forward<R>(data), tag);
    r.wait();
    return r.source();
  }
  template <WritableByteRange R>
  Request irecv_any(R&& data, int tag = 0) {
    return irecv_any_bytes(MutableBytes{reinterpret_cast<std::byte*>(std::ranges::data(data)),
                                        std::ranges::size(data) * sizeof(std::ranges::range_value_t<R>)},
                           tag);
  }
  Request irecv_any_bytes(MutableBytes data, int tag);

  /// Returns when every rank has entered the barrier.
  void barrier() { start({.kind = CallKind::barrier}, CallMode::blocking); }
  Request barrier_async() { return start({.kind = CallKind::barrier}, CallMode::async); }

  /// Group calls, as ncclGroupStart/End (chorus/group.hpp: scope, rules, fusion): what this thread issues
  /// on this communicator in between, blocking forms too, returns at once and runs at the outermost
  /// group_end(), which returns when it is done (calls on a stream are issued on it then).
  void group_start();
  void group_end();
  /// Drops the open group: its requests fail, nothing is sent (an exception's path out of a scope).
  void group_abandon();
  bool in_group() const;  ///< a group is open on this thread
  template <class F>
  void group(F&& f) {
    group_start();
    try {
      f();
    } catch (...) {
      group_abandon();
      throw;
    }
    group_end();
  }

  // ---- Collectives ----------------------------------------------------------------------------
  // Every rank calls the same collectives in the same order with matching sizes, dtypes, ops and
  // roots; a rank that does not gets `mismatch` (naming both ranks and both calls) on every rank.
  // Sizes are in elements. Blocking forms return when this rank's part is done; *_async forms
  // return a Request and run in the order they were called. Buffers must stay valid (and inputs
  // unchanged) until then. Results are bitwise identical on every rank.

  /// out[i] = op over ranks of in[i]; in place with one range.
  template <WritableElementRange R>
  void all_reduce(R&& inout, ReduceOp op) { start(all_reduce_call(inout, inout, op), CallMode::blocking); }
  template <ElementRange In, WritableElementRange Out>
  void all_reduce(const In& in, Out&& out, ReduceOp op) { start(all_reduce_call(in, out, op), CallMode::blocking); }
  template <WritableElementRange R>
  Request all_reduce_async(R&& inout, ReduceOp op) { return start(all_reduce_call(inout, inout, op), CallMode::async); }
  template <ElementRange In, WritableElementRange Out>
  Request all_reduce_async(const In& in, Out&& out, ReduceOp op) { return start(all_reduce_call(in, out, op), CallMode::async); }

  /// root's buf goes to every rank's buf.
  template <WritableElementRange R>
  void broadcast(R&& buf, int root) { start(broadcast_call(buf, root), CallMode::blocking); }
  template <WritableElementRange R>
  Request broadcast_async(R&& buf, int root) { return start(broadcast_call(buf, root), CallMode::async); }

  /// root's out = op over ranks of in; out is used on the root only (may be empty elsewhere).
  template <ElementRange In, WritableElementRange Out>
  void reduce(const In& in, Out&& out, ReduceOp op, int root) { start(reduce_call(in, out, op, root), CallMode::blocking); }
  template <ElementRange In, WritableElementRange Out>
  Request reduce_async(const In& in, Out&& out, ReduceOp op, int root) { return start(reduce_call(in, out, op, root), CallMode::async); }

  /// Block p of root's in (size() blocks of out.size()) goes to rank p's out.
  template <ElementRange In, WritableElementRange Out>
  void scatter(const In& in, Out&& out, int root) { start(scatter_call(in, out, root), CallMode::blocking); }
  template <ElementRange In, WritableElementRange Out>
  Request scatter_async(const In& in, Out&& out, int root) { return start(scatter_call(in, out, root), CallMode::async); }

  /// Every rank's in goes to block r of root's out (size() blocks of in.size()).
  template <ElementRange In, WritableElementRange Out>
  void gather(const In& in, Out&& out, int root) { start(gather_call(in, out, root), CallMode::blocking); }
  template <ElementRange In, WritableElementRange Out>
  Request gather_async(const In& in, Out&& out, int root) { return start(gather_call(in, out, root), CallMode::async); }

  /// Every rank's in goes to block r of every rank's out (size() blocks of in.size()).
  template <ElementRange In, WritableElementRange Out>
  void all_gather(const In& in, Out&& out) { start(all_gather_call(in, out), CallMode::blocking); }
  template <ElementRange In, WritableElementRange Out>
  Request all_gather_async(const In& in, Out&& out) { return start(all_gather_call(in, out), CallMode::async); }

  /// out (in.size() / size() elements) = op over ranks of block r of in.
  template <ElementRange In, WritableElementRange Out>
  void reduce_scatter(const In& in, Out&& out, ReduceOp op) { start(reduce_scatter_call(in, out, op), CallMode::blocking); }
  template <ElementRange In, WritableElementRange Out>
  Request reduce_scatter_async(const In& in, Out&& out, ReduceOp op) { return start(reduce_scatter_call(in, out, op), CallMode::async); }

  /// Block p of in (size() equal blocks) goes to rank p, arriving as block r of its out.
  template <ElementRange In, WritableElementRange Out>
  void all_to_all(const In& in, Out&& out) { start(all_to_all_call(in, out), CallMode::blocking); }
  template <ElementRange In, WritableElementRange Out>
  Request all_to_all_async(const In& in, Out&& out) { return start(all_to_all_call(in, out), CallMode::async); }

  /// The one entry of every collective above and below: `call` issued as `mode` says (blocking
  /// returns a completed Request), or, with a `stream`, ordered on it as the stream forms below
  /// are (they pass CallMode::async: start returns at once; blocking also waits for the Request).
  /// The fields `call`'s kind does not read are ignored (Call); a kind that is not a collective
  /// (split, or a value outside the enumeration) is invalid_argument naming the rank and
  /// "run(Call)" (blocking) or "start(Call)". chorus::run and chorus::start (chorus/call.hpp)
  /// take a communicator and a Call the same way.
  ///
  ///   comm.start({.kind = chorus::CallKind::barrier}, chorus::CallMode::blocking);
  Request start(const Call& call, CallMode mode, std::optional<device::Stream> stream = std::nullopt);

  // Type-erased forms, for callers that hold raw buffers. `count` is elements per rank as above:
  // all_reduce, broadcast, reduce: the buffer; scatter: out; gather, all_gather: in;
  // reduce_scatter: out; all_to_all: one block.
  Request all_reduce_async(const void* in, void* out, std::size_t count, DataType dt, ReduceOp op) { return start({CallKind::all_reduce, in, out, count, dt, op}, CallMode::async); }
  Request broadcast_async(void* buf, std::size_t count, DataType dt, int root) { return start({CallKind::broadcast, buf, buf, count, dt, ReduceOp::sum, root}, CallMode::async); }
  Request reduce_async(const void* in, void* out, std::size_t count, DataType dt, ReduceOp op, int root) { return start({CallKind::reduce, in, out, count, dt, op, root}, CallMode::async); }
  Request scatter_async(const void* in, void* out, std::size_t count, DataType dt, int root) { return start({CallKind::scatter, in, out, count, dt, ReduceOp::sum, root}, CallMode::async); }
  Request gather_async(const void* in, void* out, std::size_t count, DataType dt, int root) { return start({CallKind::gather, in, out, count, dt, ReduceOp::sum, root}, CallMode::async); }
  Request all_gather_async(const void* in, void* out, std::size_t count, DataType dt) { return start({CallKind::all_gather, in, out, count, dt}, CallMode::async); }
  Request reduce_scatter_async(const void* in, void* out, std::size_t count, DataType dt, ReduceOp op) { return start({CallKind::reduce_scatter, in, out, count, dt, op}, CallMode::async); }
  Request all_to_all_async(const void* in, void* out, std::size_t count, DataType dt) { return start({CallKind::all_to_all, in, out, count, dt}, CallMode::async); }
  // ... and blocking (run on the calling thread when nothing is queued before them).
  void all_reduce(const void* in, void* out, std::size_t count, DataType dt, ReduceOp op) { start({CallKind::all_reduce, in, out, count, dt, op}, CallMode::blocking); }
  void broadcast(void* buf, std::size_t count, DataType dt, int root) { start({CallKind::broadcast, buf, buf, count, dt, ReduceOp::sum, root}, CallMode::blocking); }
  void reduce(const void* in, void* out, std::size_t count, DataType dt, ReduceOp op, int root) { start({CallKind::reduce, in, out, count, dt, op, root}, CallMode::blocking); }
  void scatter(const void* in, void* out, std::size_t count, DataType dt, int root) { start({CallKind::scatter, in, out, count, dt, ReduceOp::sum, root}, CallMode::blocking); }
  void gather(const void* in, void* out, std::size_t count, DataType dt, int root) { start({CallKind::gather, in, out, count, dt, ReduceOp::sum, root}, CallMode::blocking); }
  void all_gather(const void* in, void* out, std::size_t count, DataType dt) { start({CallKind::all_gather, in, out, count, dt}, CallMode::blocking); }
  void reduce_scatter(const void* in, void* out, std::size_t count, DataType dt, ReduceOp op) { start({CallKind::reduce_scatter, in, out, count, dt, op}, CallMode::blocking); }
  void all_to_all(const void* in, void* out, std::size_t count, DataType dt) { start({CallKind::all_to_all, in, out, count, dt}, CallMode::blocking); }

  // ---- Persistent collectives (chorus/persistent.hpp): checked (host: planned) once, started many times
  Persistent<T> persistent(const Call& call);
  template <WritableElementRange R> Persistent<T> all_reduce_init(R&& inout, ReduceOp op) { return persistent(all_reduce_call(inout, inout, op)); }
  template <ElementRange In, WritableElementRange Out> Persistent<T> all_reduce_init(const In& in, Out&& out, ReduceOp op) { return persistent(all_reduce_call(in, out, op)); }
  template <WritableElementRange R> Persistent<T> broadcast_init(R&& buf, int root) { return persistent(broadcast_call(buf, root)); }
  template <ElementRange In, WritableElementRange Out> Persistent<T> reduce_init(const In& in, Out&& out, ReduceOp op, int root) { return persistent(reduce_call(in, out, op, root)); }
  template <ElementRange In, WritableElementRange Out> Persistent<T> scatter_init(const In& in, Out&& out, int root) { return persistent(scatter_call(in, out, root)); }
  template <ElementRange In, WritableElementRange Out> Persistent<T> gather_init(const In& in, Out&& out, int root) { return persistent(gather_call(in, out, root)); }
  template <ElementRange In, WritableElementRange Out> Persistent<T> all_gather_init(const In& in, Out&& out) { return persistent(all_gather_call(in, out)); }
  template <ElementRange In, WritableElementRange Out> Persistent<T> reduce_scatter_init(const In& in, Out&& out, ReduceOp op) { return persistent(reduce_scatter_call(in, out, op)); }
  template <ElementRange In, WritableElementRange Out> Persistent<T> all_to_all_init(const In& in, Out&& out) { return persistent(all_to_all_call(in, out)); }
  Persistent<T> barrier_init() { return persistent({.kind = CallKind::barrier}); }

  // ---- Device buffers on a stream (NCCL style) -------------------------------------------------
  // The same collectives on device memory, ordered on a CUDA stream: each call enqueues on
  // `stream` and returns at once; the collective starts when the stream reaches the call and the
  // results are ready for work enqueued on the stream after it. The Request completes then too;
  // a failure surfaces on it, on the next call, and through async_error() (like
  // ncclCommGetAsyncError), and aborts the communicator. Both buffers must be in device memory
  // (device_runtime()->kind_of, i.e. cudaPointerGetAttributes); host buffers take the calls above.
  // Device buffers given to the calls above (no stream) run on the default stream and block.
  Request all_reduce(const void* in, void* out, std::size_t count, DataType dt, ReduceOp op, device::Stream stream) { return start({CallKind::all_reduce, in, out, count, dt, op}, CallMode::async, stream); }
  Request broadcast(void* buf, std::size_t count, DataType dt, int root, device::Stream stream) { return start({CallKind::broadcast, buf, buf, count, dt, ReduceOp::sum, root}, CallMode::async, stream); }
  Request reduce(const void* in, void* out, std::size_t count, DataType dt, ReduceOp op, int root, device::Stream stream) { return start({CallKind::reduce, in, out, count, dt, op, root}, CallMode::async, stream); }
  Request scatter(const void* in, void* out, std::size_t count, DataType dt, int root, device::Stream stream) { return start({CallKind::scatter, in, out, count, dt, ReduceOp::sum, root}, CallMode::async, stream); }
  Request gather(const void* in, void* out, std::size_t count, DataType dt, int root, device::Stream stream) { return start({CallKind::gather, in, out, count, dt, ReduceOp::sum, root}, CallMode::async, stream); }
  Request all_gather(const void* in, void* out, std::size_t count, DataType dt, device::Stream stream) { return start({CallKind::all_gather, in, out, count, dt}, CallMode::async, stream); }
  Request reduce_scatter(const void* in, void* out, std::size_t count, DataType dt, ReduceOp op, device::Stream stream) { return start({CallKind::reduce_scatter, in, out, count, dt, op}, CallMode::async, stream); }
  Request all_to_all(const void* in, void* out, std::size_t count, DataType dt, device::Stream stream) { return start({CallKind::all_to_all, in, out, count, dt}, CallMode::async, stream); }
  /// Typed forms (std::span over device memory, ...), with the size checks of the host forms.
  template <ElementRange In, WritableElementRange Out> Request all_reduce(const In& in, Out&& out, ReduceOp op, device::Stream stream) { return start(all_reduce_call(in, out, op), CallMode::async, stream); }
  template <WritableElementRange R> Request broadcast(R&& buf, int root, device::Stream stream) { return start(broadcast_call(buf, root), CallMode::async, stream); }
  template <ElementRange In, WritableElementRange Out> Request reduce(const In& in, Out&& out, ReduceOp op, int root, device::Stream stream) { return start(reduce_call(in, out, op, root), CallMode::async, stream); }
  template <ElementRange In, WritableElementRange Out> Request scatter(const In& in, Out&& out, int root, device::Stream stream) { return start(scatter_call(in, out, root), CallMode::async, stream); }
  template <ElementRange In, WritableElementRange Out> Request gather(const In& in, Out&& out, int root, device::Stream stream) { return start(gather_call(in, out, root), CallMode::async, stream); }
  template <ElementRange In, WritableElementRange Out> Request all_gather(const In& in, Out&& out, device::Stream stream) { return start(all_gather_call(in, out), CallMode::async, stream); }
  template <ElementRange In, WritableElementRange Out> Request reduce_scatter(const In& in, Out&& out, ReduceOp op, device::Stream stream) { return start(reduce_scatter_call(in, out, op), CallMode::async, stream); }
  template <ElementRange In, WritableElementRange Out> Request all_to_all(const In& in, Out&& out, device::Stream stream) { return start(all_to_all_call(in, out), CallMode::async, stream); }

  /// The runtime that tells device memory from host memory and runs the device data path: the
  /// process default (device::default_runtime()) at creation; null when there is none (every
  /// buffer is host memory then). Set it before the first call on device buffers.
  void set_device_runtime(device::Runtime* runtime);
  device::Runtime* device_runtime() const;
  /// The first error of a call that failed without anyone waiting for it yet (a call on a
  /// stream, an async call), or none; like ncclCommGetAsyncError.
  std::optional<Error> async_error() const;

  /// A sub-group, like MPI_Comm_split / ncclCommSplit: ranks with the same color (>= 0) form one
  /// communicator, ordered by (key, rank). Collective over this communicator: every rank calls
  /// it, a rank that joins no group too, with color kSplitNoColor; that rank gets back a
  /// communicator that is not valid() (see there). Another negative color is invalid_argument.
  /// The new communicator shares this one's links and runs concurrently with it without
  /// interference.
  ///
  ///   // The first four ranks form a group; the others join none.
  ///   auto first4 = comm.split(comm.rank() < 4 ? 0 : chorus::kSplitNoColor, comm.rank());
  ///   if (first4.valid()) first4.all_reduce(v, chorus::ReduceOp::sum);
  Communicator split(int color, int key);

  /// A communicator of `ranks` (ranks of this one, numbered in the order given), like
  /// MPI_Comm_create_group: collective over those ranks only (the others need not call it), every
  /// member passing the same list. It shares this one's links (no new connection) and runs
  /// concurrently with it, as split's do (and with its options: the links' timeout is this one's).
  /// An empty list, a rank twice or out of range, or a list without the caller is invalid_argument.
  ///
  ///   auto evens = comm.subset(std::vector<int>{0, 2, 4, 6});  // called by ranks 0, 2, 4, 6 only
  Communicator subset(std::span<const int> ranks);

  /// A new communicator of the ranks that are still alive, like ULFM's MPIX_Comm_shrink and
  /// ncclCommShrink: collective over the survivors, each of which calls it (typically after a
  /// call failed with peer_failure). This communicator is aborted first (its pending calls fail,
  /// its links close). The survivors agree on one set of members, also when more ranks fail
  /// meanwhile (impl/standby.hpp): they meet at the standby store of the lowest rank they can all
  /// reach, so the death of rank 0 or of its host (the job's store with it) is survived; ranks
  /// keep their order and are numbered from 0. A rank that is alive but does not call shrink
  /// within Options::shrink_wait is left out, and so is one cut off from the others; the members
  /// must be a majority of the ranks not known to be dead, else every rank fails with
  /// peer_failure (the two sides of a cut network never both go on). A rank left out fails with
  /// peer_failure. The new communicator has its own links, context and store (the leader's
  /// standby); it works like one from create().
  ///
  ///   try { comm.all_reduce(grad, chorus::ReduceOp::sum); }
  ///   catch (const chorus::Error& e) {
  ///     if (e.code() != chorus::ErrorCode::peer_failure) throw;
  ///     comm = comm.shrink();  // the survivors, renumbered
  ///   }
  Communicator shrink();
  /// The same, leaving out the ranks in `exclude` (ranks of this communicator) on purpose, as
  /// ncclCommShrink's exclude list: every caller passes the same list; a rank in it gets back a
  /// communicator that is not valid() (it need not call shrink at all).
  Communicator shrink(std::span<const int> exclude);

  /// Admits the processes waiting to join (join(), like ncclCommGrow): collective over this
  /// communicator. Returns a new communicator of this one's ranks, numbered as here, followed by
  /// the joiners in the order they knocked, or nullopt when none waits (every rank gets the same
  /// answer: rank 0 counts the knocks and tells the others). This communicator stays as it is.
  ///
  ///   if (auto bigger = comm.grow()) comm = std::move(*bigger);  // e.g. at an epoch's end
  std::optional<Communicator> grow();
  /// Where a new process joins this communicator: "tcp://host:port" of rank 0's standby store,
  /// to give to join() as Options::init_method; "" where the ranks share a store (MemoryStore,
  /// FileStore): a joiner then passes that store as Options::store. Changes with every shrink()
  /// and grow() (each new communicator has its own).
  std::string join_address() const;
  /// Joins a running communicator at its next grow(): `options.init_method` is its
  /// join_address() (or options.store the store its ranks share); rank and world size come from
  /// the admission. Waits for it up to the options' timeout.
  static Communicator join(Options options);

  /// Fails every pending and later operation of this communicator with `aborted` here and
  /// (through the links breaking) with peer_failure on every peer. Dumps the flight recorder.
  /// Idempotent; never blocks for long; may be called from any thread. A split communicator
  /// shares its links with its parent: aborting either aborts both. This rank then takes no part
  /// in a shrink() (refused here; the others leave it out at once where they share a store).
  void abort();

  /// Waits until every operation queued or running on this communicator has finished (each is
  /// bounded by the timeout from when it starts running); their errors are reported by their own
  /// requests. Like ncclCommFinalize: call it before destruction to let pending work complete.
  void finalize();

  /// What this communicator holds now (as of its last completed call for scratch and staging).
  MemoryStats memory_stats() const;

  /// The transport (links to every peer), for algorithms.
  T& transport();

  /// The latency/bandwidth model the algorithm selector uses for this communicator: its slowest
  /// link's (tcp when any member is reached over tcp, else shm or inproc).
  algo::TransportModel cost_model() const;
  /// The algorithm a collective of `bytes` per rank on host buffers would run now (the plan of a
  /// call, algo/plan.hpp); throws as that call would for a forced algorithm that cannot run.
  algo::Choice planned(algo::CollectiveKind kind, std::size_t bytes) const;

 private:
  struct State;
  struct Internal;  // marks the library's own calls (impl/split.hpp)
  friend class Persistent<T>;  template <class> friend struct detail::PersistentState;
  explicit Communicator(std::unique_ptr<State> s);
  /// The state, or invalid_argument naming `op` where this communicator is not valid().
  State& live(std::string_view op) const;

  template <class R>
  static constexpr DataType dtype_of() {
    return data_type_of<std::remove_cv_t<std::ranges::range_value_t<R>>>;
  }
  template <class R>
  static std::size_t count_of(const R& r) { return std::ranges::size(r); }
  void same_size(std::size_t a, std::size_t b, const char* what) const;
  /// Runs a checked Call (Communicator::start): validates, then queues it, or runs it (inline when
  /// blocking and idle). `stream`: null for a call of the host API (host buffers, or device buffers
  /// on the default stream, blocking), else the stream a call on device buffers is ordered on.
  Request issue(const Call& call, bool async, const device::Stream* stream);
  Request collective(algo::CollectiveDesc desc, algo::Args args, bool async,
                     exec::TicketRef ticket = {});
  /// The part of collective() after the plan (a persistent start begins here): `lk` holds call_mu.
  Request planned_call(std::unique_lock<detail::CallLock>& lk, algo::CollectiveDesc desc, const algo::Args& args,
                       const algo::Plan& plan, bool async, exec::TicketRef ticket = {});
  /// `call` with the fields its kind does not read set as its typed form sets them (start()).
  Call normalized(const Call& call, const char* what) const;
  /// premul_sum: scales the input into `call`'s output, returned host scratch or *device_scratch
  /// (impl/premul.hpp).
  std::shared_ptr<std::vector<std::byte>> prescale(Call& call, MemoryKind kind, const device::Stream* stream,
                                                   void** device_scratch);
  /// A call on device buffers that the collective kernel takes (impl/kernel_call.hpp): launched
  /// on `stream` (the default one where null: blocking unless `async`).
  Request kernel_call(algo::CollectiveDesc desc, const std::byte* in, std::byte* out, const device::Stream* stream,
                      bool async);
  void abort_with(const Error& why);
  static Communicator adopt(State& st, const std::vector<int>& parents, const std::string& key_name);
  std::vector<detail::GroupItem> close_group(const char* op);
  Request record_call(const Call& c, std::optional<device::Stream> stream);
  Request record_p2p(bool send, const std::byte* data, std::size_t bytes, int peer, int tag);
  /// send, recv: a group runs them at its end.
  void done_unless_grouped(Request r) {
    if (!in_group()) r.wait();
  }

  // The Call of each typed form, after its size checks (impl/typed_calls.hpp).
  template <class In, class Out>
  Call all_reduce_call(const In& in, Out&& out, ReduceOp op) const;
  template <class R>
  Call broadcast_call(R&& buf, int root) const;
  template <class In, class Out>
  Call reduce_call(const In& in, Out&& out, ReduceOp op, int root) const;
  template <class In, class Out>
  Call scatter_call(const In& in, Out&& out, int root) const;
  template <class In, class Out>
  Call gather_call(const In& in, Out&& out, int root) const;
  template <class In, class Out>
  Call all_gather_call(const In& in, Out&& out) const;
  template <class In, class Out>
  Call reduce_scatter_call(const In& in, Out&& out, ReduceOp op) const;
  template <class In, class Out>
  Call all_to_all_call(const In& in, Out&& out) const;
  std::unique_ptr<State> s_;
};

}  // namespace chorus

#include "chorus/impl/communicator.hpp"
