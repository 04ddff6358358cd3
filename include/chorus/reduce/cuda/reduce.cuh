#pragma once
/// CUDA reductions over device memory: out[i] = op(a[i], b[i]) and avg's final division, with the
/// functors of reduce/ops.hpp, so a device reduction gives the bits a host reduction gives (NaN
/// results are canonical on both; float16/bfloat16 use the same software conversions).
/// Everything here is compiled only by nvcc (__CUDACC__); a host compiler sees an empty header.
///
/// ```cpp
/// cudaError_t e = chorus::reduce_async(chorus::ReduceOp::sum, chorus::DataType::bfloat16,
///                                      d_out, d_a, d_b, count, stream);
/// e = chorus::finalize_avg_async(chorus::DataType::bfloat16, d_out, count, world_size, stream);
/// ```
///
/// The kernel bodies (what one thread does) are host+device code in reduce/cuda/kernels.hpp, which
/// also holds the launch constants and grid sizes; device/grid_emulator.hpp runs the same bodies
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

/// data[i] = avg_divide(data[i], world_size) on the device. cudaErrorInvalidValue for world_size < 1
/// or an invalid DataType.
inline cudaError_t finalize_avg_async(DataType dt, void* data, std::size_t count, int world_size,
                                      cudaStream_t stream);

namespace detail {

template <class Op, class T>
__global__ void __launch_bounds__(DeviceReduceTuning::kThreadsPerBlock) reduce_kernel(DeviceReduceArgs<T> args) {
  ReduceBody<Op, T>{}(args, GridCoord{blockIdx.x, blockDim.x, gridDim.x, threadIdx.x});
}

template <class T>
__global__ void __launch_bounds__(DeviceReduceTuning::kThreadsPerBlock)
    finalize_avg_kernel(DeviceAvgArgs<T> args) {
  FinalizeAvgBody<T>{}(args, GridCoord{blockIdx.x, blockDim.x, gridDim.x, threadIdx.x});
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

}  // namespace chorus

#endif  // defined(__CUDACC__)
