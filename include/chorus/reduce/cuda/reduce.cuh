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
/// Layers, each apart (CUB style): reduce_async (launcher: validation, grid size, dispatch on
/// dtype and op) -> reduce_kernel (grid-stride loop over packs, then the tail) -> reduce_pack (one
/// thread, one 16-byte pack: kPackBytes / sizeof(T) elements). Launch constants live in
/// DeviceReduceTuning, nowhere else.

#include "chorus/config.hpp"

#if defined(__CUDACC__)

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "chorus/core/types.hpp"
#include "chorus/reduce/ops.hpp"

namespace chorus {

/// Launch constants for the reduction kernels.
struct DeviceReduceTuning {
  static constexpr int kThreadsPerBlock = 256;
  /// Grid-size cap; the kernels loop (grid stride) over what one grid does not cover.
  static constexpr int kMaxBlocks = 4096;
  /// Bytes one thread loads from each input per step when out, a and b are all this aligned
  /// (one 128-bit load and store per operand), else one element at a time.
  static constexpr int kPackBytes = 16;
};

/// Arguments of reduce_kernel, passed by value: plain pointers and a count, nothing owned.
template <class T>
struct DeviceReduceArgs {
  T* out;      ///< may equal a or b (each element is read before it is written, by one thread)
  const T* a;  ///< first operand of every op(a[i], b[i])
  const T* b;
  std::size_t count;
};

/// Arguments of finalize_avg_kernel.
template <class T>
struct DeviceAvgArgs {
  T* data;
  std::size_t count;
  int world_size;
};

static_assert(std::is_trivially_copyable_v<DeviceReduceArgs<float>> &&
              std::is_trivially_copyable_v<DeviceReduceArgs<float16>> &&
              std::is_trivially_copyable_v<DeviceAvgArgs<bfloat16>>);

/// out[i] = op(a[i], b[i]) for `count` elements of dt in device memory, enqueued on `stream`; avg
/// reduces as sum (finish with finalize_avg_async). out may be a or b. Returns
/// cudaErrorInvalidValue for a DataType or ReduceOp outside its enumeration, otherwise the launch
/// status (cudaGetLastError); count 0 launches nothing.
inline cudaError_t reduce_async(ReduceOp op, DataType dt, void* out, const void* a, const void* b,
                                std::size_t count, cudaStream_t stream);

/// data[i] = avg_divide(data[i], world_size) on the device. cudaErrorInvalidValue for world_size < 1
/// or an invalid DataType.
inline cudaError_t finalize_avg_async(DataType dt, void* data, std::size_t count, int world_size,
                                      cudaStream_t stream);

namespace detail {

template <class T>
inline constexpr int kElementsPerPack = DeviceReduceTuning::kPackBytes / static_cast<int>(sizeof(T));

/// kElementsPerPack<T> elements, aligned so that a copy is one vector load or store.
template <class T>
struct alignas(DeviceReduceTuning::kPackBytes) DevicePack {
  T v[kElementsPerPack<T>];
};

/// One thread's step on one pack.
template <class Op, class T>
__device__ __forceinline__ void reduce_pack(DevicePack<T>* out, const DevicePack<T>* a,
                                            const DevicePack<T>* b) {
  DevicePack<T> x = *a;
  const DevicePack<T> y = *b;
#pragma unroll
  for (int k = 0; k < kElementsPerPack<T>; ++k) x.v[k] = Op{}(x.v[k], y.v[k]);
  *out = x;
}

template <class Op, class T>
__global__ void __launch_bounds__(DeviceReduceTuning::kThreadsPerBlock)
    reduce_kernel(DeviceReduceArgs<T> args) {
  const std::size_t first = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  constexpr auto kAlign = static_cast<std::uintptr_t>(DeviceReduceTuning::kPackBytes);
  const bool aligned =
      ((reinterpret_cast<std::uintptr_t>(args.out) | reinterpret_cast<std::uintptr_t>(args.a) |
        reinterpret_cast<std::uintptr_t>(args.b)) &
       (kAlign - 1)) == 0;
  std::size_t done = 0;
  if (aligned) {
    const std::size_t packs = args.count / kElementsPerPack<T>;
    auto* out = reinterpret_cast<DevicePack<T>*>(args.out);
    const auto* a = reinterpret_cast<const DevicePack<T>*>(args.a);
    const auto* b = reinterpret_cast<const DevicePack<T>*>(args.b);
    for (std::size_t p = first; p < packs; p += stride) reduce_pack<Op>(out + p, a + p, b + p);
    done = packs * kElementsPerPack<T>;
  }
  for (std::size_t i = done + first; i < args.count; i += stride) args.out[i] = Op{}(args.a[i], args.b[i]);
}

template <class T>
__global__ void __launch_bounds__(DeviceReduceTuning::kThreadsPerBlock)
    finalize_avg_kernel(DeviceAvgArgs<T> args) {
  const std::size_t first = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = first; i < args.count; i += stride)
    args.data[i] = avg_divide(args.data[i], args.world_size);
}

/// Blocks for `work` items of one thread each, capped (grid stride covers the rest).
inline unsigned grid_for(std::size_t work) {
  constexpr std::size_t kThreads = DeviceReduceTuning::kThreadsPerBlock;
  const std::size_t blocks = (work + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < DeviceReduceTuning::kMaxBlocks ? (blocks > 0 ? blocks : 1)
                                                                       : DeviceReduceTuning::kMaxBlocks);
}

template <class Op, class T>
cudaError_t launch_reduce(T* out, const T* a, const T* b, std::size_t count, cudaStream_t stream) {
  static_assert(std::is_trivially_copyable_v<DeviceReduceArgs<T>>);
  const DeviceReduceArgs<T> args{out, a, b, count};
  // Sized for the packed path; the unaligned path loops over the same grid.
  const unsigned blocks = grid_for((count + kElementsPerPack<T> - 1) / kElementsPerPack<T>);
  reduce_kernel<Op, T><<<blocks, DeviceReduceTuning::kThreadsPerBlock, 0, stream>>>(args);
  return cudaGetLastError();
}

inline bool valid(DataType dt) { return size_of(dt) != 0; }
inline bool valid(ReduceOp op) { return to_string(op) != "unknown"; }

}  // namespace detail

inline cudaError_t reduce_async(ReduceOp op, DataType dt, void* out, const void* a, const void* b,
                                std::size_t count, cudaStream_t stream) {
  if (!detail::valid(dt) || !detail::valid(op)) return cudaErrorInvalidValue;
  if (count == 0) return cudaSuccess;
  return dispatch(dt, [&]<class T>(std::type_identity<T>) -> cudaError_t {
    T* o = static_cast<T*>(out);
    const T* x = static_cast<const T*>(a);
    const T* y = static_cast<const T*>(b);
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::avg:
        return detail::launch_reduce<Sum>(o, x, y, count, stream);
      case ReduceOp::prod:
        return detail::launch_reduce<Prod>(o, x, y, count, stream);
      case ReduceOp::min:
        return detail::launch_reduce<Min>(o, x, y, count, stream);
      case ReduceOp::max:
        return detail::launch_reduce<Max>(o, x, y, count, stream);
      case ReduceOp::band:
      case ReduceOp::bor:
      case ReduceOp::bxor:
        if (!is_valid_op(dt, op)) return cudaErrorInvalidValue;
        if (op == ReduceOp::band) return detail::launch_reduce<BitAnd>(o, x, y, count, stream);
        if (op == ReduceOp::bor) return detail::launch_reduce<BitOr>(o, x, y, count, stream);
        return detail::launch_reduce<BitXor>(o, x, y, count, stream);
    }
    return cudaErrorInvalidValue;
  });
}

inline cudaError_t finalize_avg_async(DataType dt, void* data, std::size_t count, int world_size,
                                      cudaStream_t stream) {
  if (!detail::valid(dt) || world_size < 1) return cudaErrorInvalidValue;
  if (count == 0) return cudaSuccess;
  return dispatch(dt, [&]<class T>(std::type_identity<T>) -> cudaError_t {
    static_assert(std::is_trivially_copyable_v<DeviceAvgArgs<T>>);
    const DeviceAvgArgs<T> args{static_cast<T*>(data), count, world_size};
    detail::finalize_avg_kernel<T>
        <<<detail::grid_for(count), DeviceReduceTuning::kThreadsPerBlock, 0, stream>>>(args);
    return cudaGetLastError();
  });
}

}  // namespace chorus

#endif  // defined(__CUDACC__)
