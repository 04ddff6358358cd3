// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// Runs the reduction kernels of reduce/cuda on the host: the kernel bodies of
/// reduce/cuda/kernels.hpp, called once for every thread of every block of the grid the CUDA
/// launcher would use (reduce_launch_shape, finalize_avg_launch_shape). Host code only; the
/// simulated runtime (testing/sim_runtime.hpp) launches "kernels" through it, and tests compare it
/// with the host loops of reduce/host.hpp, so the code each GPU thread runs is tested without a GPU.
///
/// ```cpp
/// chorus::device::emulate_reduce(chorus::ReduceOp::sum, chorus::DataType::float32, out, a, b, n);
/// const void* inputs[] = {x0, x1, x2};
/// chorus::device::emulate_reduce_many(chorus::ReduceOp::sum, chorus::DataType::float32, out, inputs, 3, n);
/// chorus::device::emulate_finalize_avg(chorus::DataType::float32, out, n, world_size);
/// ```
///
/// Order: threads run one after another, block by block, each to the end of its grid-stride loop.
/// Every element belongs to exactly one thread and no thread reads another's elements, so the
/// order does not change a result (as on the GPU, out may equal an input but must not partly
/// overlap one). It does keep memory access linear: thread t takes packs t, t + stride, ... and thread
/// t + 1 the packs next to them, so a large buffer is walked as a few cache-resident streams, and
/// buffers below one grid's reach (16 MiB of each operand) in address order.

#include <cstddef>
#include <cstring>
#include <string>
#include <string_view>

#include "chorus/core/error.hpp"
#include "chorus/core/types.hpp"
#include "chorus/reduce/cuda/kernels.hpp"

namespace chorus::device {

namespace detail {

/// Calls body(GridCoord) for every thread of `shape`, block by block.
template <class Body>
void run_grid(LaunchShape shape, Body&& body) {
  for (unsigned block = 0; block < shape.blocks; ++block) {
    for (unsigned thread = 0; thread < shape.threads; ++thread) {
      body(GridCoord{block, shape.threads, shape.blocks, thread});
    }
  }
}

/// Throws Error(invalid_argument), its text starting with `who`, unless the reduce kernel exists
/// for (op, dt).
inline void check_reduce_kernel(ReduceOp op, DataType dt, std::string_view who) {
  if (reduce_kernel_exists(op, dt)) return;
  std::string what = std::string(who) + ": ";
  if (size_of(dt) == 0) {
    what += "DataType value " + std::to_string(static_cast<int>(dt)) + " is not a valid DataType";
  } else if (to_string(op) == "unknown") {
    what += "ReduceOp value " + std::to_string(static_cast<int>(op)) + " is not a valid ReduceOp";
  } else {
    what += std::string(to_string(op)) + " does not apply to " + std::string(to_string(dt)) +
            " (bitwise ops take integer types)";
  }
  throw Error(ErrorCode::invalid_argument, what);
}

}  // namespace detail

/// out[i] = op(a[i], b[i]) as the reduce kernel computes it (avg reduces as sum). out may equal a
/// or b. Throws Error(invalid_argument) for a DataType or ReduceOp outside its enumeration, or a
/// bitwise op on a floating-point type, as chorus::reduce does.
inline void emulate_reduce(ReduceOp op, DataType dt, void* out, const void* a, const void* b, std::size_t count) {
  detail::check_reduce_kernel(op, dt, "emulate_reduce");
  if (count == 0) return;  // the launcher launches nothing
  visit_reduce_kernel(op, dt, [&]<class Op, class T>() {
    const DeviceReduceArgs<T> args{static_cast<T*>(out), static_cast<const T*>(a), static_cast<const T*>(b), count};
    const ReduceBody<Op, T> body{};
    detail::run_grid(reduce_launch_shape<T>(count), [&](GridCoord g) { body(args, g); });
  });
}

/// out[i] = op(...op(op(srcs[0][i], srcs[1][i]), srcs[2][i])..., srcs[n-1][i]) as the reduce_many
/// kernel computes it: the bits of n-1 chained emulate_reduce calls (avg reduces as sum). out may
/// equal one of the inputs. Throws Error(invalid_argument) where emulate_reduce does, and for srcs
/// null or n outside 2 to kMaxReduceInputs.
inline void emulate_reduce_many(ReduceOp op, DataType dt, void* out, const void* const* srcs, int n,
                                std::size_t count) {
  detail::check_reduce_kernel(op, dt, "emulate_reduce_many");
  check_reduce_many_inputs(srcs, n, "emulate_reduce_many");
  if (count == 0) return;  // the launcher launches nothing
  visit_reduce_kernel(op, dt, [&]<class Op, class T>() {
    DeviceReduceManyArgs<T> args{static_cast<T*>(out), {}, n, count};
    for (int k = 0; k < n; ++k) args.src[k] = static_cast<const T*>(srcs[k]);
    const ReduceManyBody<Op, T> body{};
    detail::run_grid(reduce_launch_shape<T>(count), [&](GridCoord g) { body(args, g); });
  });
}

/// data[i] = avg_divide(data[i], world_size) as the finalize_avg kernel computes it. Throws
/// Error(invalid_argument) for world_size < 1 or an invalid DataType, as chorus::finalize_avg does.
/// premul_async's kernel on the host: out[i] = in[i] * scalar (PreMulBody), `scalar` one element
/// of dt (read as the kernel reads it, from device memory where `scalar_on_device`: here the same).
inline void emulate_premul(DataType dt, void* out, const void* in, std::size_t count, const void* scalar,
                           bool scalar_on_device) {
  if (!is_valid_op(dt, ReduceOp::premul_sum) || scalar == nullptr)
    throw Error(ErrorCode::invalid_argument, "emulate_premul: " + std::string(to_string(dt)) + " with a " +
                                                 (scalar == nullptr ? "null" : "given") + " scalar");
  dispatch(dt, [&]<class T>(std::type_identity<T>) {
    if (count == 0) return;
    DevicePreMulArgs<T> args{static_cast<T*>(out), static_cast<const T*>(in), count, T{}, nullptr};
    if (scalar_on_device) args.scalar_device = static_cast<const T*>(scalar);
    else std::memcpy(&args.scalar, scalar, sizeof(T));
    const PreMulBody<T> body{};
    detail::run_grid(finalize_avg_launch_shape(count), [&](GridCoord g) { body(args, g); });
  });
}

inline void emulate_finalize_avg(DataType dt, void* data, std::size_t count, int world_size) {
  if (world_size < 1) {
    throw Error(ErrorCode::invalid_argument,
                "emulate_finalize_avg: world size " + std::to_string(world_size) + " is not positive");
  }
  dispatch(dt, [&]<class T>(std::type_identity<T>) {
    if (count == 0) return;
    const DeviceAvgArgs<T> args{static_cast<T*>(data), count, world_size};
    const FinalizeAvgBody<T> body{};
    detail::run_grid(finalize_avg_launch_shape(count), [&](GridCoord g) { body(args, g); });
  });
}

}  // namespace chorus::device
