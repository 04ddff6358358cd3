// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// CUDA reductions over device memory: out[i] = op(a[i], b[i]), its n-input form reduce_many
/// (one launch for what n-1 chained reductions compute, same bits) and avg's final division, with the
/// functors of reduce/ops.hpp, so a device reduction gives the bits a host reduction gives (NaN
/// results are canonical on both; float16/bfloat16 use the same software conversions).
/// Everything here is compiled only by nvcc (__CUDACC__); a host compiler sees an empty header.
///
/// ```cpp
/// cudaError_t e = chorus::reduce_async(chorus::ReduceOp::sum, chorus::DataType::bfloat16,
///                                      d_out, d_a, d_b, count, stream);
/// const void* inputs[] = {d_x0, d_x1, d_x2};
/// e = chorus::reduce_many_async(chorus::ReduceOp::sum, chorus::DataType::bfloat16, d_out, inputs, 3,
///                               count, stream);
/// e = chorus::finalize_avg_async(chorus::DataType::bfloat16, d_out, count, world_size, stream);
/// ```
///
/// The kernel bodies (what one thread does) are host+device code in reduce/cuda/kernels.hpp, which
/// also holds the launch constants and grid sizes; testing/grid_emulator.hpp runs the same bodies
/// on the host. Here: the `__global__` wrappers and the launchers.

#include "chorus/config.hpp"

#if defined(__CUDACC__)

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "chorus/core/types.hpp"
#include "chorus/reduce/cuda/kernels.hpp"

namespace chorus {

/// out[i] = op(a[i], b[i]) for `count` elements of dt in device memory, enqueued on `stream`; avg
/// reduces as sum (finish with finalize_avg_async). out may be a or b. Returns
/// cudaErrorInvalidValue for a DataType or ReduceOp outside its enumeration or a bitwise op on a
/// floating-point type, otherwise the launch status (cudaGetLastError); count 0 launches nothing.
inline cudaError_t reduce_async(ReduceOp op, DataType dt, void* out, const void* a, const void* b,
                                std::size_t count, cudaStream_t stream);

/// out[i] = op(...op(op(srcs[0][i], srcs[1][i]), srcs[2][i])..., srcs[n-1][i]) for `count` elements
/// of dt in device memory, one launch on `stream`: the bits of n-1 chained reduce_async calls (avg
/// reduces as sum). out may be one of the inputs. `srcs` (host memory) is read before this returns.
/// Returns cudaErrorInvalidValue where reduce_async does, and for srcs null or n outside 2 to
/// kMaxReduceInputs; otherwise the launch status; count 0 launches nothing.
inline cudaError_t reduce_many_async(ReduceOp op, DataType dt, void* out, const void* const* srcs, int n,
                                     std::size_t count, cudaStream_t stream);

/// data[i] = avg_divide(data[i], world_size) on the device. cudaErrorInvalidValue for world_size < 1
/// or an invalid DataType.
inline cudaError_t finalize_avg_async(DataType dt, void* data, std::size_t count, int world_size,
                                      cudaStream_t stream);

/// premul_sum's first step: out[i] = in[i] * scalar for `count` elements of dt (a floating type) in
/// device memory, on `stream`: the scalar, one element of dt, is read now from host memory, or by
/// the kernel from device memory where `scalar_on_device`. out may be in. cudaErrorInvalidValue
/// for another dtype or a null scalar; count 0 launches nothing.
inline cudaError_t premul_async(DataType dt, void* out, const void* in, std::size_t count, const void* scalar,
                                bool scalar_on_device, cudaStream_t stream);

/// Loads every reduction kernel above (each op and dtype, reduce, reduce_many and finalize_avg) on
/// the current device (cudaFuncGetAttributes loads a kernel that lazy loading has not loaded yet),
/// so that no launch of them waits to load one. Returns the first failure, or cudaSuccess.
inline cudaError_t load_reduce_kernels();

namespace detail {

template <class Op, class T>
__global__ void __launch_bounds__(DeviceReduceTuning::kThreadsPerBlock) reduce_kernel(DeviceReduceArgs<T> args) {
  ReduceBody<Op, T>{}(args, GridCoord{blockIdx.x, blockDim.x, gridDim.x, threadIdx.x});
}

template <class Op, class T>
__global__ void __launch_bounds__(DeviceReduceTuning::kThreadsPerBlock)
    reduce_many_kernel(DeviceReduceManyArgs<T> args) {
  ReduceManyBody<Op, T>{}(args, GridCoord{blockIdx.x, blockDim.x, gridDim.x, threadIdx.x});
}

template <class T>
__global__ void __launch_bounds__(DeviceReduceTuning::kThreadsPerBlock)
    finalize_avg_kernel(DeviceAvgArgs<T> args) {
  FinalizeAvgBody<T>{}(args, GridCoord{blockIdx.x, blockDim.x, gridDim.x, threadIdx.x});
}

template <class T>
__global__ void __launch_bounds__(DeviceReduceTuning::kThreadsPerBlock) premul_kernel(DevicePreMulArgs<T> args) {
  PreMulBody<T>{}(args, GridCoord{blockIdx.x, blockDim.x, gridDim.x, threadIdx.x});
}

}  // namespace detail

inline cudaError_t reduce_async(ReduceOp op, DataType dt, void* out, const void* a, const void* b,
                                std::size_t count, cudaStream_t stream) {
  if (!reduce_kernel_exists(op, dt)) return cudaErrorInvalidValue;
  if (count == 0) return cudaSuccess;
  return visit_reduce_kernel(op, dt, [&]<class Op, class T>() -> cudaError_t {
    const DeviceReduceArgs<T> args{static_cast<T*>(out), static_cast<const T*>(a), static_cast<const T*>(b), count};
    const LaunchShape shape = reduce_launch_shape<T>(count);
    detail::reduce_kernel<Op, T><<<shape.blocks, shape.threads, 0, stream>>>(args);
    return cudaGetLastError();
  });
}

inline cudaError_t reduce_many_async(ReduceOp op, DataType dt, void* out, const void* const* srcs, int n,
                                     std::size_t count, cudaStream_t stream) {
  if (!reduce_kernel_exists(op, dt) || srcs == nullptr || !reduce_many_inputs_valid(n)) return cudaErrorInvalidValue;
  if (count == 0) return cudaSuccess;
  return visit_reduce_kernel(op, dt, [&]<class Op, class T>() -> cudaError_t {
    DeviceReduceManyArgs<T> args{static_cast<T*>(out), {}, n, count};
    for (int k = 0; k < n; ++k) args.src[k] = static_cast<const T*>(srcs[k]);
    const LaunchShape shape = reduce_launch_shape<T>(count);
    detail::reduce_many_kernel<Op, T><<<shape.blocks, shape.threads, 0, stream>>>(args);
    return cudaGetLastError();
  });
}

inline cudaError_t finalize_avg_async(DataType dt, void* data, std::size_t count, int world_size,
                                      cudaStream_t stream) {
  if (size_of(dt) == 0 || world_size < 1) return cudaErrorInvalidValue;
  if (count == 0) return cudaSuccess;
  return dispatch(dt, [&]<class T>(std::type_identity<T>) -> cudaError_t {
    const DeviceAvgArgs<T> args{static_cast<T*>(data), count, world_size};
    const LaunchShape shape = finalize_avg_launch_shape(count);
    detail::finalize_avg_kernel<T><<<shape.blocks, shape.threads, 0, stream>>>(args);
    return cudaGetLastError();
  });
}

inline cudaError_t premul_async(DataType dt, void* out, const void* in, std::size_t count, const void* scalar,
                                bool scalar_on_device, cudaStream_t stream) {
  if (!is_valid_op(dt, ReduceOp::premul_sum) || scalar == nullptr) return cudaErrorInvalidValue;
  if (count == 0) return cudaSuccess;
  return dispatch(dt, [&]<class T>(std::type_identity<T>) -> cudaError_t {
    DevicePreMulArgs<T> args{static_cast<T*>(out), static_cast<const T*>(in), count, T{}, nullptr};
    if (scalar_on_device) args.scalar_device = static_cast<const T*>(scalar);
    else args.scalar = *static_cast<const T*>(scalar);
    const LaunchShape shape = finalize_avg_launch_shape(count);
    detail::premul_kernel<T><<<shape.blocks, shape.threads, 0, stream>>>(args);
    return cudaGetLastError();
  });
}

inline cudaError_t load_reduce_kernels() {
  cudaError_t first = cudaSuccess;
  auto note = [&first](cudaError_t e) {
    if (first == cudaSuccess) first = e;
  };
  auto load = [&](ReduceOp op, DataType dt) {
    if (!reduce_kernel_exists(op, dt)) return;
    visit_reduce_kernel(op, dt, [&]<class Op, class T>() {  // the launchers' own mapping (avg: Sum)
      cudaFuncAttributes attr;
      note(cudaFuncGetAttributes(&attr, detail::reduce_kernel<Op, T>));
      note(cudaFuncGetAttributes(&attr, detail::reduce_many_kernel<Op, T>));
    });
  };
  for (DataType dt : kAllDataTypes) {
    for (ReduceOp op : kAllReduceOps) load(op, dt);
    for (ReduceOp op : kBitwiseReduceOps) load(op, dt);
    dispatch(dt, [&]<class T>(std::type_identity<T>) {
      cudaFuncAttributes attr;
      note(cudaFuncGetAttributes(&attr, detail::finalize_avg_kernel<T>));
      if (is_valid_op(dt, ReduceOp::premul_sum)) note(cudaFuncGetAttributes(&attr, detail::premul_kernel<T>));
    });
  }
  return first;
}

}  // namespace chorus

#endif  // defined(__CUDACC__)
