// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// device::CudaRuntime: device::Runtime (device/runtime.hpp) on the CUDA runtime API, with the
/// reduction kernels of reduce/cuda. Compiled only by nvcc (__CUDACC__): a translation unit that
/// uses it is a .cu file linked with chorus::cuda; a host compiler sees an empty header, so
/// headers that include it stay host-compilable.
///
/// ```cpp
/// chorus::device::CudaRuntime rt;
/// if (rt.device_count() == 0) return;              // no GPU: never throws for that
/// void* d = rt.alloc_device(bytes);
/// chorus::device::Stream s = rt.create_stream();
/// rt.copy(d, host_ptr, bytes, s);
/// rt.reduce(chorus::ReduceOp::sum, chorus::DataType::float32, d, d, other, count, s);
/// rt.synchronize(s);
/// ```
///
/// Errors: every failing runtime call throws chorus::Error, ErrorCode::system (unsupported when
/// the error means there is no GPU, device::means_no_gpu), with the text "cudaXxx: cudaErrorName (N)".

#include "chorus/config.hpp"

#if defined(__CUDACC__)

#include <cuda.h>  // driver API types only: the driver's functions come through cudaGetDriverEntryPointByVersion
#include <cuda_runtime.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "chorus/core/error.hpp"
#include "chorus/device/collective.cuh"
#include "chorus/device/runtime.hpp"
#include "chorus/reduce/cuda/reduce.cuh"

namespace chorus::device {

namespace detail {

/// Throws for any status but cudaSuccess; `call` names the runtime function.
inline void cuda_check(cudaError_t status, std::string_view call) {
  if (status == cudaSuccess) return;
  const int n = static_cast<int>(status);
  throw Error(means_no_gpu(n) ? ErrorCode::unsupported : ErrorCode::system,
              std::string(call) + ": " + cudaGetErrorName(status) + " (" + std::to_string(n) + ")");
}

/// The device's nanosecond clock (%globaltimer; its resolution is about a microsecond).
__device__ __forceinline__ std::uint64_t global_timer_ns() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

/// One thread spins until *flag != 0 or timeout_ns have passed. The loads are volatile, so each
/// one reads the mapped host memory again (the host writes it through PCIe or NVLink-C2C). A
/// template only so that every translation unit may define it (Flag: const volatile uint32_t*).
template <class Flag>
__global__ void wait_flag_kernel(Flag flag, std::uint64_t timeout_ns) {
  const std::uint64_t start = global_timer_ns();
  while (*flag == 0) {
    if (global_timer_ns() - start >= timeout_ns) return;
  }
  // What the host wrote before its release store is visible to the work after this kernel.
  __threadfence_system();
}

/// Stores `value` into *word once every write before it is visible system-wide (the work enqueued
/// before the kernel on its stream is complete when it starts).
template <class Word>
__global__ void write_value_kernel(Word word, std::uint64_t value) {
  __threadfence_system();
  *word = value;
  __threadfence_system();
}

/// One thread spins until *word >= value (a peer's step counter, read through its IPC mapping),
/// *abort != 0 (the host gave up), or timeout_ns have passed; on the timeout it stores on_timeout
/// into *abort, so later waits give up at once and the host learns which wait timed out.
template <class Word, class Abort>
__global__ void wait_value_kernel(Word word, std::uint64_t value, Abort abort, std::uint32_t on_timeout,
                                  std::uint64_t timeout_ns) {
  const std::uint64_t start = global_timer_ns();
  while (*word < value) {
    if (*abort != 0) return;
    if (global_timer_ns() - start >= timeout_ns) {
      *abort = on_timeout;
      __threadfence_system();
      return;
    }
  }
  // The peer's writes before its store of `value` are visible to the work after this kernel.
  __threadfence_system();
}

// --- device memory for an RDMA NIC (dma-buf) -------------------------------------------------------

/// The driver API functions export_dmabuf needs, resolved once per process through the runtime
/// (cudaGetDriverEntryPointByVersion), so that nothing links libcuda itself. A null member: the
/// driver does not have it.
struct DmabufDriver {
  decltype(&cuDeviceGet) device_get = nullptr;
  decltype(&cuDeviceGetAttribute) device_attribute = nullptr;
  decltype(&cuMemGetAddressRange) address_range = nullptr;
  decltype(&cuMemGetHandleForAddressRange) range_handle = nullptr;
  cudaError_t status = cudaSuccess;  ///< of the first lookup that failed
};

/// The ABI version asked of every entry point: CUDA 12.0's (all four exist since 11.7 with these
/// signatures).
inline constexpr unsigned kDmabufDriverAbi = 12000;

template <class Fn>
void driver_entry(const char* symbol, Fn& out, cudaError_t& status) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t e = cudaGetDriverEntryPointByVersion(symbol, &fn, kDmabufDriverAbi, cudaEnableDefault, &found);
  if (e == cudaSuccess && found == cudaDriverEntryPointSuccess && fn != nullptr) {
    out = reinterpret_cast<Fn>(fn);
  } else if (status == cudaSuccess) {
    status = e != cudaSuccess ? e : cudaErrorSymbolNotFound;
    (void)cudaGetLastError();
  }
}

inline const DmabufDriver& dmabuf_driver() {
  static const DmabufDriver d = [] {
    DmabufDriver r;
    driver_entry("cuDeviceGet", r.device_get, r.status);
    driver_entry("cuDeviceGetAttribute", r.device_attribute, r.status);
    driver_entry("cuMemGetAddressRange", r.address_range, r.status);
    driver_entry("cuMemGetHandleForAddressRange", r.range_handle, r.status);
    return r;
  }();
  return d;
}

/// Throws for any CUresult but CUDA_SUCCESS (unsupported for CUDA_ERROR_NOT_SUPPORTED and the
/// errors that mean no GPU); `call` names the driver function.
inline void cu_check(CUresult status, std::string_view call) {
  if (status == CUDA_SUCCESS) return;
  const int n = static_cast<int>(status);
  const bool unsupported = status == CUDA_ERROR_NOT_SUPPORTED || status == CUDA_ERROR_NO_DEVICE ||
                           status == CUDA_ERROR_STUB_LIBRARY || status == CUDA_ERROR_NOT_INITIALIZED;
  throw Error(unsupported ? ErrorCode::unsupported : ErrorCode::system,
              std::string(call) + ": CUresult " + std::to_string(n));
}

// --- end of device memory for an RDMA NIC (dma-buf) ------------------------------------------------

}  // namespace detail

class CudaRuntime final : public Runtime {
 public:
  std::string_view name() const noexcept override { return "cuda"; }

  int device_count() override {
    int n = 0;
    const cudaError_t status = cudaGetDeviceCount(&n);
    if (status != cudaSuccess && means_no_gpu(static_cast<int>(status))) {
      (void)cudaGetLastError();  // not sticky, but leave nothing behind for the next check
      return 0;
    }
    detail::cuda_check(status, "cudaGetDeviceCount");
    return n;
  }
  void set_device(int device) override { detail::cuda_check(cudaSetDevice(device), "cudaSetDevice"); }
  int current_device() override {
    int d = 0;
    detail::cuda_check(cudaGetDevice(&d), "cudaGetDevice");
    return d;
  }

  MemoryKind kind_of(const void* p) override {
    cudaPointerAttributes attr{};
    const cudaError_t status = cudaPointerGetAttributes(&attr, p);
    if (status == cudaErrorInvalidValue) {  // memory CUDA never saw (older drivers say so)
      (void)cudaGetLastError();
      return MemoryKind::host;
    }
    detail::cuda_check(status, "cudaPointerGetAttributes");
    return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged ? MemoryKind::device
                                                                                      : MemoryKind::host;
  }
  void* alloc_device(std::size_t bytes) override {
    void* p = nullptr;
    // cudaMalloc(0) gives null: one byte keeps the pointer valid and unique.
    detail::cuda_check(cudaMalloc(&p, bytes != 0 ? bytes : 1), "cudaMalloc");
    return p;
  }
  void free_device(void* p) override {
    if (p != nullptr) detail::cuda_check(cudaFree(p), "cudaFree");
  }
  void* alloc_device_async(std::size_t bytes, Stream s) override {
    void* p = nullptr;
    detail::cuda_check(cudaMallocAsync(&p, bytes != 0 ? bytes : 1, s), "cudaMallocAsync");
    return p;
  }
  void free_device_async(void* p, Stream s) override {
    if (p != nullptr) detail::cuda_check(cudaFreeAsync(p, s), "cudaFreeAsync");
  }
  void* alloc_pinned(std::size_t bytes) override {
    void* p = nullptr;
    detail::cuda_check(cudaHostAlloc(&p, bytes != 0 ? bytes : 1, cudaHostAllocPortable | cudaHostAllocMapped),
                       "cudaHostAlloc");
    return p;
  }
  void free_pinned(void* p) override {
    if (p != nullptr) detail::cuda_check(cudaFreeHost(p), "cudaFreeHost");
  }

  bool can_access_peer(int device, int peer_device) override {
    if (device == peer_device) return true;
    int ok = 0;
    detail::cuda_check(cudaDeviceCanAccessPeer(&ok, device, peer_device), "cudaDeviceCanAccessPeer");
    return ok != 0;
  }
  IpcHandle ipc_export(void* base) override {
    static_assert(sizeof(cudaIpcMemHandle_t) == sizeof(IpcHandle::bytes));
    cudaIpcMemHandle_t h;
    detail::cuda_check(cudaIpcGetMemHandle(&h, base), "cudaIpcGetMemHandle");
    IpcHandle out;
    std::memcpy(out.bytes.data(), &h, sizeof h);
    return out;
  }
  void* ipc_open(const IpcHandle& h) override {
    cudaIpcMemHandle_t c;
    std::memcpy(&c, h.bytes.data(), sizeof c);
    void* p = nullptr;
    detail::cuda_check(cudaIpcOpenMemHandle(&p, c, cudaIpcMemLazyEnablePeerAccess), "cudaIpcOpenMemHandle");
    return p;
  }
  void ipc_close(void* p) override { detail::cuda_check(cudaIpcCloseMemHandle(p), "cudaIpcCloseMemHandle"); }

  void load_kernels() override {
    const int device = current_device();
    {
      std::lock_guard g(loaded_mu_);
      if (device < static_cast<int>(loaded_.size()) && loaded_[static_cast<std::size_t>(device)]) return;
    }
    detail::cuda_check(load_reduce_kernels(), "cudaFuncGetAttributes");
    detail::cuda_check(load_collective_kernels(), "cudaFuncGetAttributes");
    cudaFuncAttributes attr;
    detail::cuda_check(cudaFuncGetAttributes(&attr, detail::wait_flag_kernel<const volatile std::uint32_t*>),
                       "cudaFuncGetAttributes");
    detail::cuda_check(cudaFuncGetAttributes(&attr, detail::write_value_kernel<volatile std::uint64_t*>),
                       "cudaFuncGetAttributes");
    detail::cuda_check(
        cudaFuncGetAttributes(&attr, detail::wait_value_kernel<const volatile std::uint64_t*, volatile std::uint32_t*>),
        "cudaFuncGetAttributes");
    std::lock_guard g(loaded_mu_);
    if (device >= static_cast<int>(loaded_.size())) loaded_.resize(static_cast<std::size_t>(device) + 1, false);
    loaded_[static_cast<std::size_t>(device)] = true;
  }

  Stream create_stream() override {
    cudaStream_t s = nullptr;
    detail::cuda_check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    return s;
  }
  void destroy_stream(Stream s) override { detail::cuda_check(cudaStreamDestroy(s), "cudaStreamDestroy"); }
  Event create_event(bool timing) override {
    cudaEvent_t e = nullptr;
    detail::cuda_check(cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming),
                       "cudaEventCreateWithFlags");
    return e;
  }
  void destroy_event(Event e) override { detail::cuda_check(cudaEventDestroy(e), "cudaEventDestroy"); }
  void record(Event e, Stream s) override { detail::cuda_check(cudaEventRecord(e, s), "cudaEventRecord"); }
  bool query(Event e) override {
    const cudaError_t status = cudaEventQuery(e);
    if (status == cudaErrorNotReady) return false;
    detail::cuda_check(status, "cudaEventQuery");
    return true;
  }
  void synchronize(Event e) override { detail::cuda_check(cudaEventSynchronize(e), "cudaEventSynchronize"); }
  void synchronize(Stream s) override { detail::cuda_check(cudaStreamSynchronize(s), "cudaStreamSynchronize"); }
  void wait(Stream s, Event e) override { detail::cuda_check(cudaStreamWaitEvent(s, e, 0), "cudaStreamWaitEvent"); }
  float elapsed_ms(Event start, Event end) override {
    float ms = 0.0f;
    detail::cuda_check(cudaEventElapsedTime(&ms, start, end), "cudaEventElapsedTime");
    return ms;
  }

  void copy(void* dst, const void* src, std::size_t bytes, Stream s) override {
    if (bytes == 0) return;
    detail::cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s), "cudaMemcpyAsync");
  }
  void fill(void* dst, int byte, std::size_t bytes, Stream s) override {
    if (bytes == 0) return;
    detail::cuda_check(cudaMemsetAsync(dst, byte, bytes, s), "cudaMemsetAsync");
  }
  void reduce(ReduceOp op, DataType dt, void* out, const void* a, const void* b, std::size_t count,
              Stream s) override {
    detail::cuda_check(reduce_async(op, dt, out, a, b, count, s), "reduce_async");
  }
  void reduce_many(ReduceOp op, DataType dt, void* out, const void* const* srcs, int n, std::size_t count,
                   Stream s) override {
    check_reduce_many_inputs(srcs, n, "reduce_many");
    detail::cuda_check(reduce_many_async(op, dt, out, srcs, n, count, s), "reduce_many_async");
  }
  void finalize_avg(DataType dt, void* data, std::size_t count, int world_size, Stream s) override {
    detail::cuda_check(finalize_avg_async(dt, data, count, world_size, s), "finalize_avg_async");
  }
  void premul(DataType dt, void* out, const void* in, std::size_t count, const void* scalar, bool scalar_on_device,
              Stream s) override {
    detail::cuda_check(premul_async(dt, out, in, count, scalar, scalar_on_device, s), "premul_async");
  }
  void wait_flag(Stream s, const std::uint32_t* flag, std::uint64_t timeout_ns) override {
    void* mapped = nullptr;
    detail::cuda_check(cudaHostGetDevicePointer(&mapped, const_cast<std::uint32_t*>(flag), 0),
                       "cudaHostGetDevicePointer");
    detail::wait_flag_kernel<<<1, 1, 0, s>>>(static_cast<const volatile std::uint32_t*>(mapped), timeout_ns);
    detail::cuda_check(cudaGetLastError(), "cudaLaunchKernel");
  }
  void write_value(Stream s, std::uint64_t* word, std::uint64_t value) override {
    detail::write_value_kernel<<<1, 1, 0, s>>>(static_cast<volatile std::uint64_t*>(word), value);
    detail::cuda_check(cudaGetLastError(), "cudaLaunchKernel");
  }
  void wait_value(Stream s, const std::uint64_t* word, std::uint64_t value, std::uint32_t* abort,
                  std::uint32_t on_timeout, std::uint64_t timeout_ns) override {
    void* mapped = nullptr;
    detail::cuda_check(cudaHostGetDevicePointer(&mapped, abort, 0), "cudaHostGetDevicePointer");
    detail::wait_value_kernel<<<1, 1, 0, s>>>(static_cast<const volatile std::uint64_t*>(word), value,
                                              static_cast<volatile std::uint32_t*>(mapped), on_timeout, timeout_ns);
    detail::cuda_check(cudaGetLastError(), "cudaLaunchKernel");
  }

  void* device_address(void* p) override {
    void* mapped = nullptr;
    detail::cuda_check(cudaHostGetDevicePointer(&mapped, p, 0), "cudaHostGetDevicePointer");
    return mapped;
  }
  /// a.abort, a.result and a.report are device addresses already (device_address).
  void launch_collective(const CollectiveLaunch& a, Stream s) override {
    detail::cuda_check(launch_collective_async(a, s), "cudaLaunchKernel");
  }
  /// One block per multiprocessor and rank: the blocks of every rank's kernel are resident at
  /// once (a block of 256 threads fits on any multiprocessor beside the others).
  unsigned collective_blocks(int sharing) override {
    int sms = 0;
    detail::cuda_check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, current_device()),
                       "cudaDeviceGetAttribute");
    const int per = sharing > 0 ? sms / sharing : sms;
    return static_cast<unsigned>(per < 1 ? 1 : per > static_cast<int>(kMaxKernelBlocks) ? kMaxKernelBlocks : per);
  }

  // --- device memory for an RDMA NIC (dma-buf) -----------------------------------------------
  /// cuMemGetHandleForAddressRange (CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD) over the whole allocation
  /// that holds p (cuMemGetAddressRange), page-aligned as the driver requires; only where the
  /// current device says CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED (else unsupported).
  DmabufExport export_dmabuf(void* p, std::size_t bytes) override {
    const detail::DmabufDriver& d = detail::dmabuf_driver();
    if (!d.device_get || !d.device_attribute || !d.address_range || !d.range_handle)
      throw Error(ErrorCode::unsupported, std::string("export_dmabuf: no driver entry points for dma-buf export "
                                                      "(cudaGetDriverEntryPointByVersion: ") +
                                              cudaGetErrorName(d.status) + " (" +
                                              std::to_string(static_cast<int>(d.status)) + "))");
    CUdevice dev = 0;
    detail::cu_check(d.device_get(&dev, current_device()), "cuDeviceGet");
    int supported = 0;
    detail::cu_check(d.device_attribute(&supported, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, dev), "cuDeviceGetAttribute");
    if (!supported)
      throw Error(ErrorCode::unsupported, "export_dmabuf: the device does not support dma-buf (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED)");
    CUdeviceptr base = 0;
    std::size_t size = 0;
    const auto at = static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(p));
    detail::cu_check(d.address_range(&base, &size, at), "cuMemGetAddressRange");
    if (at - base > size || bytes > size - (at - base))
      throw Error(ErrorCode::invalid_argument, "export_dmabuf: [p, p + " + std::to_string(bytes) +
                                                   ") runs past the end of its device allocation");
    const long page_size = ::sysconf(_SC_PAGESIZE);
    const CUdeviceptr page = page_size > 0 ? static_cast<CUdeviceptr>(page_size) : 4096;
    const CUdeviceptr first = base / page * page;
    const CUdeviceptr end = (base + size + page - 1) / page * page;
    int fd = -1;
    detail::cu_check(d.range_handle(&fd, first, static_cast<std::size_t>(end - first), CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0),
                     "cuMemGetHandleForAddressRange");
    return {fd, static_cast<std::uint64_t>(at - first)};
  }
  // --- end of device memory for an RDMA NIC (dma-buf) ----------------------------------------

 private:
  std::mutex loaded_mu_;
  std::vector<bool> loaded_;  ///< by device: load_kernels has run there
};

}  // namespace chorus::device

#endif  // defined(__CUDACC__)
