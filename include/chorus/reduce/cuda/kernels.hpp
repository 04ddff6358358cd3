// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// The bodies of the reduction kernels, as plain host+device code: what one CUDA thread does,
/// given its grid coordinates. reduce.cuh wraps them in `__global__` functions and launches them;
/// testing/grid_emulator.hpp runs the very same bodies on the host, thread by thread, so the code
/// that computes each element is tested on machines without a GPU. A host compiler compiles this
/// header as ordinary C++ (CHORUS_HOST_DEVICE is empty there).
///
/// ```cpp
/// using namespace chorus;
/// const DeviceReduceArgs<float> args{out, a, b, count};
/// const LaunchShape shape = reduce_launch_shape<float>(count);
/// // on the device: ReduceBody<Sum, float>{}(args, GridCoord{blockIdx.x, blockDim.x, gridDim.x, threadIdx.x});
/// ```
///
/// Layers (CUB style): the launcher (reduce.cuh: validation, LaunchShape, dispatch on dtype and op
/// through visit_reduce_kernel) -> the `__global__` wrapper (reduce.cuh) -> the body here (a
/// grid-stride loop over 16-byte packs, then the elements the packs do not cover) -> reduce_pack
/// (one thread, one pack). Launch constants live in DeviceReduceTuning, nowhere else.
///
/// ReduceManyBody is the multi-input twin of ReduceBody: one launch folds n inputs in rank order,
/// out[i] = op(...op(op(src[0][i], src[1][i]), src[2][i])..., src[n-1][i]), the bits n-1 chained
/// pairwise reductions give, with one pass over memory instead of n-1.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "chorus/config.hpp"
#include "chorus/core/error.hpp"
#include "chorus/core/types.hpp"
#include "chorus/reduce/ops.hpp"

namespace chorus {

/// Launch constants for the reduction kernels.
struct DeviceReduceTuning {
  static constexpr unsigned kThreadsPerBlock = 256;
  /// Grid-size cap; the kernels loop (grid stride) over what one grid does not cover.
  static constexpr unsigned kMaxBlocks = 4096;
  /// Bytes one thread loads from each input per step when out, a and b are all this aligned
  /// (one 128-bit load and store per operand), else one element at a time.
  static constexpr std::size_t kPackBytes = 16;
};

/// A one-dimensional launch: blocks of threads.
struct LaunchShape {
  unsigned blocks;
  unsigned threads;
};

/// One thread's place in a one-dimensional grid: blockIdx.x, blockDim.x, gridDim.x, threadIdx.x.
struct GridCoord {
  unsigned block;
  unsigned block_dim;
  unsigned grid_dim;
  unsigned thread;

  /// This thread's index in the grid, and the number of threads in the grid (the stride).
  CHORUS_HOST_DEVICE constexpr std::size_t global_thread() const noexcept {
    return static_cast<std::size_t>(block) * block_dim + thread;
  }
  CHORUS_HOST_DEVICE constexpr std::size_t grid_threads() const noexcept {
    return static_cast<std::size_t>(grid_dim) * block_dim;
  }
};

/// Arguments of the reduce kernel, passed by value: plain pointers and a count, nothing owned.
template <class T>
struct DeviceReduceArgs {
  T* out;      ///< may equal a or b (each element is read before it is written, by one thread)
  const T* a;  ///< first operand of every op(a[i], b[i])
  const T* b;
  std::size_t count;
};

/// The most inputs one reduce_many launch folds (the size of DeviceReduceManyArgs::src).
inline constexpr int kMaxReduceInputs = 8;

/// Whether reduce_many takes `n` inputs: 2 to kMaxReduceInputs.
CHORUS_HOST_DEVICE constexpr bool reduce_many_inputs_valid(int n) noexcept { return n >= 2 && n <= kMaxReduceInputs; }

/// Throws Error(invalid_argument), its text starting with `who`, for an input array `srcs` that
/// is null or an input count n that reduce_many does not take. Host code.
inline void check_reduce_many_inputs(const void* srcs, int n, std::string_view who) {
  if (srcs != nullptr && reduce_many_inputs_valid(n)) return;
  throw Error(ErrorCode::invalid_argument, std::string(who) + ": " + std::to_string(n) + " inputs" +
                                               (srcs == nullptr ? " in a null array" : "") + " (it takes 2 to " +
                                               std::to_string(kMaxReduceInputs) + ")");
}

/// Arguments of the reduce_many kernel, passed by value (the source pointers travel in the
/// launch's parameter space, so the caller's array may go as soon as the launch is enqueued).
template <class T>
struct DeviceReduceManyArgs {
  T* out;  ///< may equal one of src[0..n) (each element is read, from every input, before it is written)
  const T* src[kMaxReduceInputs] = {};  ///< src[0..n) in rank order; the rest unused
  int n;                           ///< 2 to kMaxReduceInputs
  std::size_t count;
};

/// Arguments of the finalize_avg kernel.
template <class T>
struct DeviceAvgArgs {
  T* data;
  std::size_t count;
  int world_size;
};

/// premul_sum's first step: out[i] = in[i] * scalar, the scalar read from device memory by every
/// thread when `scalar_device` is set (NCCL's ncclScalarDevice), else `scalar` (ncclScalarHostImmediate).
template <class T>
struct DevicePreMulArgs {
  T* out;
  const T* in;
  std::size_t count;
  T scalar;
  const T* scalar_device;
};

static_assert(std::is_trivially_copyable_v<DeviceReduceArgs<float>> &&
              std::is_trivially_copyable_v<DeviceReduceArgs<float16>> &&
              std::is_trivially_copyable_v<DeviceAvgArgs<bfloat16>> && std::is_trivially_copyable_v<GridCoord> &&
              std::is_trivially_copyable_v<DeviceReduceManyArgs<double>>);

namespace detail {

template <class T>
inline constexpr std::size_t kElementsPerPack = DeviceReduceTuning::kPackBytes / sizeof(T);

/// kElementsPerPack<T> elements, aligned so that a copy is one vector load or store.
template <class T>
struct alignas(DeviceReduceTuning::kPackBytes) DevicePack {
  T v[kElementsPerPack<T>];
};

/// Blocks for `work` items of one thread each, at least 1, capped (grid stride covers the rest).
CHORUS_HOST_DEVICE constexpr unsigned blocks_for(std::size_t work) noexcept {
  constexpr std::size_t kThreads = DeviceReduceTuning::kThreadsPerBlock;
  const std::size_t blocks = (work + kThreads - 1) / kThreads;
  if (blocks == 0) return 1;
  return blocks < DeviceReduceTuning::kMaxBlocks ? static_cast<unsigned>(blocks) : DeviceReduceTuning::kMaxBlocks;
}

/// One thread's step on one pack: loads both packs whole, then stores one (so out may be a or b).
template <class Op, class T>
CHORUS_HOST_DEVICE inline void reduce_pack(DevicePack<T>* out, const DevicePack<T>* a, const DevicePack<T>* b) {
  DevicePack<T> x = *a;
  const DevicePack<T> y = *b;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (std::size_t k = 0; k < kElementsPerPack<T>; ++k) x.v[k] = Op{}(x.v[k], y.v[k]);
  *out = x;
}

/// One thread's step on one pack of n inputs: loads src[0]'s pack, folds in each later input's
/// pack in order (x = Op{}(x, y), as the pairwise chain does), then stores once, so out may be
/// any of the inputs.
template <class Op, class T>
CHORUS_HOST_DEVICE inline void reduce_many_pack(DevicePack<T>* out, const DevicePack<T>* const* src, int n,
                                                std::size_t p) {
  DevicePack<T> x = src[0][p];
  for (int k = 1; k < n; ++k) {
    const DevicePack<T> y = src[k][p];
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (std::size_t e = 0; e < kElementsPerPack<T>; ++e) x.v[e] = Op{}(x.v[e], y.v[e]);
  }
  out[p] = x;
}

/// ReduceManyBody's loop for args.n inputs (a run-time trip count: one kernel per op and dtype,
/// not one per input count, which multiplied nvcc's compile time by seven).
template <class Op, class T>
CHORUS_HOST_DEVICE inline void reduce_many_any(const DeviceReduceManyArgs<T>& args, GridCoord g) {
  const int n = args.n;
  constexpr std::size_t kPer = kElementsPerPack<T>;
  constexpr auto kAlignMask = static_cast<std::uintptr_t>(DeviceReduceTuning::kPackBytes - 1);
  const std::size_t first = g.global_thread();
  const std::size_t stride = g.grid_threads();
  const T* src[kMaxReduceInputs] = {};
  std::uintptr_t addresses = reinterpret_cast<std::uintptr_t>(args.out);
  for (int k = 0; k < n; ++k) {
    src[k] = args.src[k];
    addresses |= reinterpret_cast<std::uintptr_t>(src[k]);
  }
  std::size_t done = 0;
  if ((addresses & kAlignMask) == 0) {
    const std::size_t packs = args.count / kPer;
    auto* out = reinterpret_cast<DevicePack<T>*>(args.out);
    const DevicePack<T>* packed[kMaxReduceInputs] = {};
    for (int k = 0; k < n; ++k) packed[k] = reinterpret_cast<const DevicePack<T>*>(src[k]);
    for (std::size_t p = first; p < packs; p += stride) reduce_many_pack<Op, T>(out, packed, n, p);
    done = packs * kPer;
  }
  for (std::size_t i = done + first; i < args.count; i += stride) {
    T x = Op{}(src[0][i], src[1][i]);
    for (int k = 2; k < n; ++k) x = Op{}(x, src[k][i]);
    args.out[i] = x;
  }
}

}  // namespace detail

/// Grid of the reduce kernel for `count` elements of T: one thread per pack (the unaligned path
/// loops over the same grid).
template <class T>
CHORUS_HOST_DEVICE constexpr LaunchShape reduce_launch_shape(std::size_t count) noexcept {
  constexpr std::size_t kPer = detail::kElementsPerPack<T>;
  return {detail::blocks_for((count + kPer - 1) / kPer), DeviceReduceTuning::kThreadsPerBlock};
}

/// Grid of the finalize_avg kernel: one thread per element.
CHORUS_HOST_DEVICE constexpr LaunchShape finalize_avg_launch_shape(std::size_t count) noexcept {
  return {detail::blocks_for(count), DeviceReduceTuning::kThreadsPerBlock};
}

/// The reduce kernel's body for one thread: out[i] = Op{}(a[i], b[i]). When out, a and b are all
/// 16-byte aligned, the thread takes packs first + k * stride (first = its grid index, stride =
/// the grid's thread count), then the elements past the last whole pack the same way; otherwise
/// it takes elements first + k * stride. So every element belongs to exactly one thread, and
/// adjacent threads touch adjacent memory (coalesced).
template <class Op, class T>
struct ReduceBody {
  CHORUS_HOST_DEVICE void operator()(const DeviceReduceArgs<T>& args, GridCoord g) const {
    constexpr std::size_t kPer = detail::kElementsPerPack<T>;
    constexpr auto kAlignMask = static_cast<std::uintptr_t>(DeviceReduceTuning::kPackBytes - 1);
    const std::size_t first = g.global_thread();
    const std::size_t stride = g.grid_threads();
    const bool aligned = ((reinterpret_cast<std::uintptr_t>(args.out) | reinterpret_cast<std::uintptr_t>(args.a) |
                           reinterpret_cast<std::uintptr_t>(args.b)) &
                          kAlignMask) == 0;
    std::size_t done = 0;
    if (aligned) {
      const std::size_t packs = args.count / kPer;
      auto* out = reinterpret_cast<detail::DevicePack<T>*>(args.out);
      const auto* a = reinterpret_cast<const detail::DevicePack<T>*>(args.a);
      const auto* b = reinterpret_cast<const detail::DevicePack<T>*>(args.b);
      for (std::size_t p = first; p < packs; p += stride) detail::reduce_pack<Op>(out + p, a + p, b + p);
      done = packs * kPer;
    }
    for (std::size_t i = done + first; i < args.count; i += stride) args.out[i] = Op{}(args.a[i], args.b[i]);
  }
};

/// The reduce_many kernel's body for one thread: out[i] = Op{}(...Op{}(Op{}(src[0][i], src[1][i]),
/// src[2][i])..., src[n-1][i]), the same functor applied in the same order as n-1 chained
/// ReduceBody launches, so the same bits. Elements are split among threads as in ReduceBody
/// (packs when out and every input are 16-byte aligned, then the tail; else elements), so its
/// grid is reduce_launch_shape<T>(count). Precondition: reduce_many_inputs_valid(args.n); another
/// n does nothing.
template <class Op, class T>
struct ReduceManyBody {
  CHORUS_HOST_DEVICE void operator()(const DeviceReduceManyArgs<T>& args, GridCoord g) const {
    if (reduce_many_inputs_valid(args.n)) detail::reduce_many_any<Op, T>(args, g);
  }
};
static_assert(kMaxReduceInputs == 8, "ReduceManyBody's switch covers 2 to 8 inputs");

/// The finalize_avg kernel's body for one thread: data[i] = avg_divide(data[i], world_size) for
/// i = first + k * stride.
template <class T>
struct FinalizeAvgBody {
  CHORUS_HOST_DEVICE void operator()(const DeviceAvgArgs<T>& args, GridCoord g) const {
    const std::size_t stride = g.grid_threads();
    for (std::size_t i = g.global_thread(); i < args.count; i += stride)
      args.data[i] = avg_divide(args.data[i], args.world_size);
  }
};

/// The premul kernel's body for one thread: out[i] = Prod{}(in[i], scalar) for i = first + k *
/// stride (the host's chorus::premul, same bits); its grid is finalize_avg_launch_shape(count).
template <class T>
struct PreMulBody {
  CHORUS_HOST_DEVICE void operator()(const DevicePreMulArgs<T>& args, GridCoord g) const {
    const T scalar = args.scalar_device != nullptr ? *args.scalar_device : args.scalar;
    const std::size_t stride = g.grid_threads();
    for (std::size_t i = g.global_thread(); i < args.count; i += stride) args.out[i] = Prod{}(args.in[i], scalar);
  }
};

/// Whether the reduce kernel exists for (op, dt): dt and op inside their enumerations, and the
/// bitwise ops for integer types only (is_valid_op). Host code.
constexpr bool reduce_kernel_exists(ReduceOp op, DataType dt) noexcept {
  return size_of(dt) != 0 && is_valid_op(dt, op);
}

/// Calls `f.template operator()<Op, T>()` (a lambda `[&]<class Op, class T>() {...}`) with the
/// functor and element type of (op, dt), avg and premul_sum mapped to Sum; returns what f returns. Precondition:
/// reduce_kernel_exists(op, dt). The one op-to-functor mapping of the launcher and the emulator.
template <class F>
decltype(auto) visit_reduce_kernel(ReduceOp op, DataType dt, F&& f) {
  return dispatch(dt, [&]<class T>(std::type_identity<T>) -> decltype(auto) {
    switch (op) {
      case ReduceOp::prod:
        return f.template operator()<Prod, T>();
      case ReduceOp::min:
        return f.template operator()<Min, T>();
      case ReduceOp::max:
        return f.template operator()<Max, T>();
      case ReduceOp::band:
        return f.template operator()<BitAnd, T>();
      case ReduceOp::bor:
        return f.template operator()<BitOr, T>();
      case ReduceOp::bxor:
        return f.template operator()<BitXor, T>();
      case ReduceOp::sum:
      case ReduceOp::avg:
      case ReduceOp::premul_sum:  // its inputs were scaled first (premul): the steps sum
        break;
    }
    return f.template operator()<Sum, T>();
  });
}

}  // namespace chorus
