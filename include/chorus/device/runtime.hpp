// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// The seam between chorus and a GPU runtime: every CUDA runtime call the device data path makes
/// goes through one `device::Runtime`. Two implementations exist:
/// * `device::CudaRuntime` (device/cuda_runtime.hpp): the CUDA runtime itself, and the kernels of
///   reduce/cuda. Compiled only by nvcc (a translation unit that includes it is a .cu file).
/// * `device::SimRuntime` (testing/sim_runtime.hpp): a host implementation for machines without a
///   GPU, used by the test suite: "device" memory comes from an arena of its own, streams are
///   ordered queues run by one host thread each, events mark queue positions, and kernel launches
///   run the kernel bodies of reduce/cuda under the grid emulator (testing/grid_emulator.hpp); IPC
///   handles are memfds shared between real processes. It does not model copy engines running
///   beside kernels, several devices, or device faults.
///
/// Streams and events are opaque handles with the CUDA runtime's own types (`cudaStream_t` is
/// `CUstream_st*`), so a user's stream passes through unchanged; SimRuntime hands out pointers to
/// objects of its own under the same names. A null stream is the runtime's default (legacy)
/// stream.
///
/// Errors: a call that fails throws chorus::Error with ErrorCode::system (ErrorCode::unsupported
/// when there is no device), whose text names the runtime call and the CUDA error (name and number,
/// e.g. "cudaMemcpyAsync: cudaErrorInvalidValue (1)"). An error inside a stream's work (a fault, a
/// kernel that could not run) surfaces at the next query, synchronize or launch, as in CUDA.

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "chorus/core/buffer.hpp"
#include "chorus/core/error.hpp"
#include "chorus/core/types.hpp"
#include "chorus/device/collective.hpp"
#include "chorus/reduce/cuda/kernels.hpp"  // kMaxReduceInputs

struct CUstream_st;  // the CUDA runtime's stream type (cudaStream_t is CUstream_st*)
struct CUevent_st;   // the CUDA runtime's event type (cudaEvent_t is CUevent_st*)

namespace chorus::device {

using Stream = CUstream_st*;
using Event = CUevent_st*;

/// CUDA runtime error numbers chorus reads (cudaError_t values).
enum class CudaError : int {
  success = 0,
  invalid_value = 1,
  memory_allocation = 2,
  insufficient_driver = 35,
  no_device = 100,
  not_ready = 600,
  launch_failure = 719,
};
/// "No GPU here": cudaErrorInsufficientDriver (35), cudaErrorNoDevice (100), and
/// cudaErrorStubLibrary (34, a CUDA stub library with no driver behind it).
constexpr bool means_no_gpu(int cuda_error) noexcept { return cuda_error == 35 || cuda_error == 34 || cuda_error == 100; }

/// A device allocation exported to other processes of the host (cudaIpcMemHandle_t: 64 opaque
/// bytes, sent as they are; only the runtime that made it reads them).
struct IpcHandle {
  std::array<std::byte, 64> bytes{};
  friend bool operator==(const IpcHandle&, const IpcHandle&) = default;
};

class Runtime {
 public:
  virtual ~Runtime() = default;

  /// "cuda" or "simulated".
  virtual std::string_view name() const noexcept = 0;

  // --- devices -------------------------------------------------------------------------------
  /// Devices this process can use (0 when none; never throws for "no GPU").
  virtual int device_count() = 0;
  /// The calling thread's current device (cudaSetDevice / cudaGetDevice).
  virtual void set_device(int device) = 0;
  virtual int current_device() = 0;

  // --- memory --------------------------------------------------------------------------------
  /// Where `p` lives (cudaPointerGetAttributes): device for device or managed memory, host for
  /// pageable, pinned or unknown memory.
  virtual MemoryKind kind_of(const void* p) = 0;
  virtual void* alloc_device(std::size_t bytes) = 0;  ///< cudaMalloc; bytes 0 gives a valid unique pointer
  virtual void free_device(void* p) = 0;              ///< null is a no-op
  /// Stream-ordered memory (cudaMallocAsync, cudaFreeAsync): alloc_device_async's memory is usable
  /// by the work issued on `s` from now on, and free_device_async frees it once the work issued on
  /// `s` before it has run, without waiting for the device (free_device waits for all of it, which
  /// ranks as threads of one device must not do while a peer's call may wait for them). The
  /// defaults: alloc_device, and free_device after synchronize(s).
  virtual void* alloc_device_async(std::size_t bytes, Stream s) {
    (void)s;
    return alloc_device(bytes);
  }
  virtual void free_device_async(void* p, Stream s) {
    if (p == nullptr) return;
    synchronize(s);
    free_device(p);
  }
  /// Page-locked host memory, mapped into the device's address space (cudaHostAlloc with
  /// cudaHostAllocPortable | cudaHostAllocMapped): staging buffers and flags live here.
  virtual void* alloc_pinned(std::size_t bytes) = 0;
  virtual void free_pinned(void* p) = 0;
  /// The address kernels use for pinned memory at `p` (from alloc_pinned; cudaHostGetDevicePointer):
  /// asked once per allocation, so that a launch need not. The default: `p` itself.
  virtual void* device_address(void* p) { return p; }

  // --- memory of other processes (CUDA IPC) -------------------------------------------------
  /// Whether `device` can map and access `peer_device`'s memory (cudaDeviceCanAccessPeer; a device
  /// and itself: true).
  virtual bool can_access_peer(int device, int peer_device) = 0;
  /// The handle of the device allocation that starts at `base` (cudaIpcGetMemHandle), for another
  /// process of this host to open. The same allocation gives the same handle.
  virtual IpcHandle ipc_export(void* base) = 0;
  /// Maps another process's exported allocation into this one (cudaIpcOpenMemHandle with
  /// cudaIpcMemLazyEnablePeerAccess) and returns its device address here; a handle of this
  /// process's own runtime, of an allocation since freed or of a process that exited throws.
  virtual void* ipc_open(const IpcHandle& h) = 0;
  /// Unmaps what ipc_open mapped (cudaIpcCloseMemHandle); waits for the work enqueued before it.
  virtual void ipc_close(void* p) = 0;

  // --- kernels -------------------------------------------------------------------------------
  /// Loads, on the current device, every kernel this runtime launches, so that none is loaded at
  /// its first launch. CUDA loads kernels lazily by default (CUDA_MODULE_LOADING=LAZY since 12.2),
  /// and loading one may wait until the whole device is idle: a call's first reduction kernel would
  /// then wait for the wait_flag kernel that holds the caller's stream until that very call is
  /// over, a deadlock. The communicator calls this before its first call on device buffers; it is
  /// cheap after the first time on a device. The default does nothing (nothing loads lazily).
  virtual void load_kernels() {}

  // --- streams and events --------------------------------------------------------------------
  virtual Stream create_stream() = 0;  ///< cudaStreamCreateWithFlags(cudaStreamNonBlocking)
  virtual void destroy_stream(Stream s) = 0;
  /// cudaEventCreateWithFlags: cudaEventDisableTiming unless `timing`.
  virtual Event create_event(bool timing = false) = 0;
  virtual void destroy_event(Event e) = 0;
  virtual void record(Event e, Stream s) = 0;
  /// True once the stream has reached the event's record (cudaEventQuery; not_ready is false).
  virtual bool query(Event e) = 0;
  virtual void synchronize(Event e) = 0;
  virtual void synchronize(Stream s) = 0;
  /// Work enqueued on `s` after this waits for `e` (cudaStreamWaitEvent).
  virtual void wait(Stream s, Event e) = 0;
  /// Milliseconds between two timing events that have completed (cudaEventElapsedTime).
  virtual float elapsed_ms(Event start, Event end) = 0;

  // --- work enqueued on a stream -------------------------------------------------------------
  /// cudaMemcpyAsync(cudaMemcpyDefault): any of host, pinned and device memory on either side.
  virtual void copy(void* dst, const void* src, std::size_t bytes, Stream s) = 0;
  virtual void fill(void* dst, int byte, std::size_t bytes, Stream s) = 0;  ///< cudaMemsetAsync
  /// out[i] = op(a[i], b[i]) for `count` elements in device memory (the reduce/cuda kernel; avg
  /// reduces as sum). out may equal a or b. Bitwise the host's chorus::reduce.
  virtual void reduce(ReduceOp op, DataType dt, void* out, const void* a, const void* b, std::size_t count,
                      Stream s) = 0;
  /// out[i] = op(...op(op(srcs[0][i], srcs[1][i]), srcs[2][i])..., srcs[n-1][i]) for `count`
  /// elements in device memory, in one kernel (reduce/cuda's reduce_many; avg reduces as sum):
  /// bitwise the n-1 chained calls out = op(srcs[0], srcs[1]), out = op(out, srcs[2]), ... of
  /// reduce. out may equal one of the inputs (no partial overlap). `srcs` is a host array of n
  /// device pointers, read at the call (it may go once this returns). n outside 2 to
  /// kMaxReduceInputs (reduce/cuda/kernels.hpp), or srcs null, throws Error(invalid_argument) at
  /// the call; a DataType or ReduceOp that reduce refuses fails as it does there.
  virtual void reduce_many(ReduceOp op, DataType dt, void* out, const void* const* srcs, int n, std::size_t count,
                           Stream s) = 0;
  /// data[i] /= world_size for avg (the finalize_avg kernel). Bitwise the host's chorus::finalize_avg.
  virtual void finalize_avg(DataType dt, void* data, std::size_t count, int world_size, Stream s) = 0;
  /// premul_sum's first step: out[i] = in[i] * scalar for `count` elements of dt (a floating type)
  /// in device memory (the premul kernel; bitwise the host's chorus::premul). `scalar` is one
  /// element of dt: in host memory read at the call, or in device memory (`scalar_on_device`) read
  /// when the stream runs the kernel. out may equal in. A runtime without the kernel throws
  /// Error(unsupported).
  virtual void premul(DataType dt, void* out, const void* in, std::size_t count, const void* scalar, bool scalar_on_device,
                      Stream s) {
    (void)dt, (void)out, (void)in, (void)count, (void)scalar, (void)scalar_on_device, (void)s;
    throw Error(ErrorCode::unsupported, std::string(name()) + ": no premul kernel (premul_sum on device buffers)");
  }
  /// Work enqueued on `s` after this waits until `*flag` (in memory from alloc_pinned) is not 0,
  /// which the host sets with a release store; after `timeout_ns` it gives up and lets the stream
  /// go on (the caller reports the failure another way: the flag is never a silent hang).
  virtual void wait_flag(Stream s, const std::uint32_t* flag, std::uint64_t timeout_ns) = 0;

  // --- step flags in mapped device memory (algo/intranode/ipc.hpp) ---------------------------
  /// Work enqueued on `s` after this stores `value` into `*word`, a word of device memory (this
  /// process's own, or a peer's mapped by ipc_open), once the work enqueued before it is done and
  /// its writes are visible to every process and device that maps them (a one-thread kernel: a
  /// system-scope fence, then a volatile store).
  virtual void write_value(Stream s, std::uint64_t* word, std::uint64_t value) = 0;
  /// Work enqueued on `s` after this waits until `*word` (device memory, own or mapped) is at least
  /// `value`. It gives up, and lets the stream go on, when `*abort` (a word of alloc_pinned memory)
  /// is not 0, or after `timeout_ns`: then it first stores `on_timeout` (not 0) into `*abort`, so
  /// that every later wait on the same word gives up at once and the host learns which wait it was.
  /// The caller reads `*abort` once the stream is done: a wait that gave up is never silent.
  virtual void wait_value(Stream s, const std::uint64_t* word, std::uint64_t value, std::uint32_t* abort,
                          std::uint32_t on_timeout, std::uint64_t timeout_ns) = 0;

  // --- the collective kernel (device/collective.hpp) ------------------------------------------
  /// Enqueues one rank's collective kernel on `s`: a.blocks blocks of kKernelThreads threads that
  /// synchronise with the same kernel of the peers through their areas. Arguments outside their
  /// ranges throw Error(invalid_argument) at the call; what the kernel meets (a mismatch, a late
  /// peer, an abort) it reports in a.report, and the stream goes on. The default: unsupported.
  virtual void launch_collective(const CollectiveLaunch& a, Stream s) {
    (void)a;
    (void)s;
    throw Error(ErrorCode::unsupported, "launch_collective: the " + std::string(name()) + " runtime has no collective kernel");
  }
  /// The most blocks one collective kernel may have when `sharing` ranks' kernels run on this
  /// device at once (ranks as threads): every block of every one of them must be resident, or a
  /// rank's spinning blocks could keep a peer's from ever running. At least 1.
  virtual unsigned collective_blocks(int sharing) {
    (void)sharing;
    return 1;
  }
  /// The device context this runtime works in: ranks as threads whose runtimes give the same
  /// context address each other's device memory with plain pointers (one CUDA context per
  /// process and device). A decorator (device/counting.hpp) gives its inner runtime's.
  virtual const void* context() const noexcept { return this; }
  /// The library tells the runtime of each host round trip between ranks that a call on device
  /// buffers takes (a mailbox exchange, a staged message): counted by device/counting.hpp.
  virtual void note_round_trip() noexcept {}

  // --- device memory for an RDMA NIC (dma-buf) -----------------------------------------------
  /// What export_dmabuf gives: a dma-buf file descriptor and where the exported pointer lies in it.
  struct DmabufExport {
    int fd = -1;
    std::uint64_t offset = 0;
  };
  /// A dma-buf of the device allocation that holds [p, p + bytes), for ibv_reg_dmabuf_mr
  /// (transport/rdma): `fd` is the caller's to close, and p lies `offset` bytes into it. The
  /// dma-buf may cover more than the range (the whole allocation, page-aligned), never less.
  /// A runtime or device without dma-buf export throws Error(unsupported); a range that is not
  /// inside one live device allocation throws Error(system) naming the runtime call.
  virtual DmabufExport export_dmabuf(void* p, std::size_t bytes) {
    (void)p;
    (void)bytes;
    throw Error(ErrorCode::unsupported, "export_dmabuf: the " + std::string(name()) + " runtime exports no dma-buf");
  }
  // --- end of device memory for an RDMA NIC (dma-buf) ----------------------------------------
};

}  // namespace chorus::device
