// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// The collective kernel (device/collective.hpp) as CUDA code: one `__global__` per (op, dtype),
/// every block running kernel::collective_block with the block's threads, and its launcher.
/// Compiled only by nvcc (__CUDACC__); a host compiler sees an empty header.

#include "chorus/config.hpp"

#if defined(__CUDACC__)

#include <cuda_runtime.h>

#include "chorus/device/collective.hpp"
#include "chorus/device/collective_body.hpp"
#include "chorus/reduce/cuda/kernels.hpp"

namespace chorus::device {

namespace detail {

/// How the threads of a block run collective_block on the GPU: every thread calls it.
struct DeviceBlockExec {
  unsigned index;
  template <class F>
  CHORUS_HOST_DEVICE void single(F&& f) {
#if defined(__CUDA_ARCH__)
    if (threadIdx.x == 0) f();
    __syncthreads();
#else
    (void)f;
#endif
  }
  template <class F>
  CHORUS_HOST_DEVICE void each(F&& f) {
#if defined(__CUDA_ARCH__)
    f(threadIdx.x, blockDim.x);
    __syncthreads();
#else
    (void)f;
#endif
  }
};

template <class Op, class T>
__global__ void __launch_bounds__(kKernelThreads) collective_kernel(CollectiveLaunch a) {
  __shared__ kernel::BlockShared sh;
  DeviceBlockExec ex{blockIdx.x};
  kernel::collective_block<Op, T>(a, sh, ex);
}

}  // namespace detail

/// Enqueues `a` on `stream` (a.abort and a.report already device addresses of their pinned
/// memory). cudaErrorInvalidValue for a DataType or ReduceOp the kernels lack; else the launch's.
inline cudaError_t launch_collective_async(const CollectiveLaunch& a, cudaStream_t stream) {
  if (!reduce_kernel_exists(a.op, a.dtype) || a.blocks == 0 || a.blocks > kMaxKernelBlocks) return cudaErrorInvalidValue;
  return visit_reduce_kernel(a.op, a.dtype, [&]<class Op, class T>() -> cudaError_t {
    detail::collective_kernel<Op, T><<<a.blocks, kKernelThreads, 0, stream>>>(a);
    return cudaGetLastError();
  });
}

/// Loads every collective kernel (each op and dtype) on the current device (see load_reduce_kernels).
inline cudaError_t load_collective_kernels() {
  cudaError_t first = cudaSuccess;
  auto load = [&](ReduceOp op, DataType dt) {
    if (!reduce_kernel_exists(op, dt)) return;
    visit_reduce_kernel(op, dt, [&]<class Op, class T>() {
      cudaFuncAttributes attr;
      const cudaError_t e = cudaFuncGetAttributes(&attr, detail::collective_kernel<Op, T>);
      if (first == cudaSuccess) first = e;
    });
  };
  for (DataType dt : kAllDataTypes) {
    for (ReduceOp op : kAllReduceOps) load(op, dt);
    for (ReduceOp op : kBitwiseReduceOps) load(op, dt);
  }
  return first;
}

}  // namespace chorus::device

#endif  // defined(__CUDACC__)
