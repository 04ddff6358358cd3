// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// device::SimRuntime (testing/sim_runtime.hpp): the work enqueued on a stream. Copies, fills and
/// the reduction kernels (run by the kernel bodies of reduce/cuda under the grid emulator): checked
/// and queued at the call, checked again and run by the stream's worker.

#include <cstring>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <utility>

#include "chorus/testing/grid_emulator.hpp"
#include "chorus/testing/sim_runtime.hpp"

namespace chorus::device {

namespace detail {

/// The kernel bodies the simulated launches run: reduce/cuda's, under the grid emulator.
namespace sim_kernels = chorus::device;

/// The runtime call each simulated operation stands for (CudaRuntime's names).
constexpr std::string_view sim_call_name(std::string_view call) noexcept {
  if (call == "copy") return "cudaMemcpyAsync";
  if (call == "fill") return "cudaMemsetAsync";
  if (call == "reduce") return "reduce_async";
  if (call == "reduce_many") return "reduce_many_async";
  if (call == "finalize_avg") return "finalize_avg_async";
  if (call == "premul") return "premul_async";
  if (call == "wait_flag" || call == "write_value" || call == "wait_value" || call == "collective") return "cudaLaunchKernel";
  if (call == "alloc_device") return "cudaMalloc";
  if (call == "free_device_async") return "cudaFreeAsync";
  if (call == "alloc_pinned") return "cudaHostAlloc";
  if (call == "create_stream") return "cudaStreamCreateWithFlags";
  if (call == "create_event") return "cudaEventCreateWithFlags";
  return call;
}
}  // namespace detail

// --- work enqueued on a stream -------------------------------------------------------------------

CHORUS_DETAIL_SIM_INLINE void SimRuntime::load_kernels() {
  std::lock_guard lk(mu_);
  kernels_loaded_ = true;
}

CHORUS_DETAIL_SIM_INLINE void SimRuntime::load_on_launch(const Op& op, std::string_view call) {
  if (kernels_loaded_) return;
  std::uint32_t key = static_cast<std::uint32_t>(op.kind) << 16;
  const bool per_op = op.kind == OpKind::reduce || op.kind == OpKind::reduce_many || op.kind == OpKind::collective;
  if (per_op)  // avg and premul_sum reduce with the sum kernel
    key |= static_cast<std::uint32_t>(op.op == ReduceOp::avg || op.op == ReduceOp::premul_sum ? ReduceOp::sum : op.op) << 8;
  if (per_op || op.kind == OpKind::finalize_avg || op.kind == OpKind::premul) key |= static_cast<std::uint32_t>(op.dt);
  if (loaded_.count(key) != 0) return;
  auto holds = [](const std::shared_ptr<StreamState>& st) { return st->holds > 0; };
  bool held = holds(default_stream_);
  for (const auto& [k, st] : streams_) held = held || holds(st);
  if (held)
    throw detail::cuda_error(detail::sim_call_name(call), detail::kCudaLaunchFailure,
                             "the first launch of the " + std::string(call) +
                                 " kernel loads it (lazy loading), which waits for the device, while a wait_flag "
                                 "or wait_value holds a stream until the host or a peer releases it: a deadlock "
                                 "on a GPU (load the kernels first: Runtime::load_kernels)");
  loaded_.insert(key);
}

CHORUS_DETAIL_SIM_INLINE void SimRuntime::enqueue(Stream s, std::string_view call, Op op) {
  std::lock_guard lk(mu_);
  auto st = stream_of(s, detail::sim_call_name(call));
  throw_if_failed(*st);
  if (op.kind != OpKind::copy && op.kind != OpKind::fill && op.kind != OpKind::free_memory)
    load_on_launch(op, call);
  if (holds_stream(op.kind)) ++st->holds;
  op.inject = take_injection(call);
  if (auto it = stalls_.find(call); it != stalls_.end() && --it->second.first == 0) {
    op.stall = it->second.second;
    stalls_.erase(it);
  }
  st->queue.push_back(std::move(op));
  ++st->enqueued;
  st->cv.notify_one();
}

CHORUS_DETAIL_SIM_INLINE void SimRuntime::copy(void* dst, const void* src, std::size_t bytes, Stream s) {
  if (bytes == 0) return;
  Op op(OpKind::copy);
  op.dst = dst;
  op.a = src;
  op.bytes = bytes;
  enqueue(s, "copy", std::move(op));
}

CHORUS_DETAIL_SIM_INLINE void SimRuntime::fill(void* dst, int byte, std::size_t bytes, Stream s) {
  if (bytes == 0) return;
  Op op(OpKind::fill);
  op.dst = dst;
  op.value = byte;
  op.bytes = bytes;
  enqueue(s, "fill", std::move(op));
}

CHORUS_DETAIL_SIM_INLINE void SimRuntime::reduce(ReduceOp rop, DataType dt, void* out, const void* a, const void* b,
                               std::size_t count, Stream s) {
  const std::size_t size = size_of(dt);
  if (size == 0 || !is_valid_op(dt, rop) || count > SIZE_MAX / size)
    throw detail::cuda_error("reduce_async", detail::kCudaInvalidValue,
                             "op " + std::to_string(static_cast<int>(rop)) + " on DataType " +
                                 std::to_string(static_cast<int>(dt)) + ", count " + std::to_string(count));
  if (count == 0) return;
  Op op(OpKind::reduce);
  op.dst = out;
  op.a = a;
  op.b = b;
  op.bytes = count;
  op.op = rop;
  op.dt = dt;
  enqueue(s, "reduce", std::move(op));
}

CHORUS_DETAIL_SIM_INLINE void SimRuntime::reduce_many(ReduceOp rop, DataType dt, void* out, const void* const* srcs, int n,
                                    std::size_t count, Stream s) {
  check_reduce_many_inputs(srcs, n, "reduce_many");
  const std::size_t size = size_of(dt);
  if (size == 0 || !is_valid_op(dt, rop) || count > SIZE_MAX / size)
    throw detail::cuda_error("reduce_many_async", detail::kCudaInvalidValue,
                             "op " + std::to_string(static_cast<int>(rop)) + " on DataType " +
                                 std::to_string(static_cast<int>(dt)) + ", count " + std::to_string(count));
  if (count == 0) return;
  Op op(OpKind::reduce_many);
  op.dst = out;
  for (int k = 0; k < n; ++k) op.srcs[static_cast<std::size_t>(k)] = srcs[k];  // read now: the caller's array may go
  op.value = n;
  op.bytes = count;
  op.op = rop;
  op.dt = dt;
  enqueue(s, "reduce_many", std::move(op));
}

CHORUS_DETAIL_SIM_INLINE void SimRuntime::finalize_avg(DataType dt, void* data, std::size_t count, int world_size, Stream s) {
  const std::size_t size = size_of(dt);
  if (size == 0 || world_size <= 0 || count > SIZE_MAX / size)
    throw detail::cuda_error("finalize_avg_async", detail::kCudaInvalidValue,
                             "DataType " + std::to_string(static_cast<int>(dt)) + ", world size " +
                                 std::to_string(world_size) + ", count " + std::to_string(count));
  if (count == 0) return;
  Op op(OpKind::finalize_avg);
  op.dst = data;
  op.bytes = count;
  op.dt = dt;
  op.value = world_size;
  enqueue(s, "finalize_avg", std::move(op));
}

CHORUS_DETAIL_SIM_INLINE void SimRuntime::premul(DataType dt, void* out, const void* in, std::size_t count, const void* scalar,
                                               bool scalar_on_device, Stream s) {
  const std::size_t size = size_of(dt);
  if (!is_valid_op(dt, ReduceOp::premul_sum) || scalar == nullptr || count > SIZE_MAX / size)
    throw detail::cuda_error("premul_async", detail::kCudaInvalidValue,
                             "DataType " + std::to_string(static_cast<int>(dt)) + ", scalar " +
                                 (scalar == nullptr ? "null" : "given") + ", count " + std::to_string(count));
  if (count == 0) return;
  Op op(OpKind::premul);
  op.dst = out;
  op.a = in;
  op.bytes = count;
  op.dt = dt;
  if (scalar_on_device) op.b = scalar;  // read when the stream runs it, as the kernel reads it
  else std::memcpy(&op.word_value, scalar, size);  // read now (host memory)
  enqueue(s, "premul", std::move(op));
}

// --- run by the stream's worker ------------------------------------------------------------------

CHORUS_DETAIL_SIM_INLINE void SimRuntime::execute(StreamState& st, Op& op, std::unique_lock<std::mutex>& lk) {
  switch (op.kind) {
    case OpKind::record:
      if (op.event->generation == op.generation) {
        op.event->when = std::chrono::steady_clock::now();
        op.event->stamped = true;
      }
      return;
    case OpKind::wait_event: {
      auto& t = *op.target;
      progress_.wait(lk, [&] { return stopping_ || t.completed >= op.position || t.exited; });
      return;
    }
    case OpKind::wait_flag:
      if (op.inject != 0) {
        st.error = StreamError{op.inject, detail::cuda_error_text("cudaLaunchKernel", op.inject, "injected")};
        return;
      }
      wait_for_flag(st, op, lk);
      return;
    case OpKind::collective:
      if (op.inject != 0) {
        st.error = StreamError{op.inject, detail::cuda_error_text("cudaLaunchKernel", op.inject, "injected")};
        return;
      }
      run_collective(st, op, lk);
      return;
    case OpKind::free_memory:
      if (op.inject != 0) {
        st.error = StreamError{op.inject, detail::cuda_error_text("cudaFreeAsync", op.inject, "injected")};
        return;
      }
      free_in_stream(st, op.dst, lk);
      return;
    case OpKind::write_value:
    case OpKind::wait_value:
      if (op.inject != 0) {
        st.error = StreamError{op.inject, detail::cuda_error_text("cudaLaunchKernel", op.inject, "injected")};
        return;
      }
      if (op.kind == OpKind::write_value)
        store_word(st, op, lk);
      else
        wait_for_value(st, op, lk);
      return;
    default: execute_memory(st, op, lk); return;
  }
}

CHORUS_DETAIL_SIM_INLINE void SimRuntime::execute_memory(StreamState& st, Op& op, std::unique_lock<std::mutex>& lk) {
  std::string_view call;
  switch (op.kind) {
    case OpKind::copy: call = "cudaMemcpyAsync"; break;
    case OpKind::fill: call = "cudaMemsetAsync"; break;
    case OpKind::reduce: call = "reduce_async"; break;
    case OpKind::reduce_many: call = "reduce_many_async"; break;
    case OpKind::premul: call = "premul_async"; break;
    default: call = "finalize_avg_async"; break;
  }
  if (op.inject != 0) {
    st.error = StreamError{op.inject, detail::cuda_error_text(call, op.inject, "injected")};
    return;
  }
  // Lock order: memory_rw_ before mu_. Held shared while the bytes move, so that no free
  // returns the memory under this operation.
  lk.unlock();
  std::shared_lock rd(memory_rw_);
  lk.lock();
  std::string why;
  int code = detail::kCudaInvalidValue;
  if (op.kind == OpKind::copy) {
    why = check_any_range(op.dst, op.bytes, "destination");
    if (why.empty()) why = check_any_range(op.a, op.bytes, "source");
  } else if (op.kind == OpKind::fill) {
    why = check_any_range(op.dst, op.bytes, "destination");
  } else {
    code = detail::kCudaIllegalAddress;
    const std::size_t bytes = op.bytes * size_of(op.dt);
    why = check_device_range(op.dst, bytes, op.kind == OpKind::finalize_avg ? "data" : "out");
    if (why.empty() && op.kind == OpKind::reduce) why = check_device_range(op.a, bytes, "a");
    if (why.empty() && op.kind == OpKind::reduce) why = check_device_range(op.b, bytes, "b");
    if (why.empty() && op.kind == OpKind::premul) why = check_device_range(op.a, bytes, "in");
    if (why.empty() && op.kind == OpKind::premul && op.b != nullptr) why = check_device_range(op.b, size_of(op.dt), "scalar");
    for (int k = 0; why.empty() && op.kind == OpKind::reduce_many && k < op.value; ++k)
      why = check_device_range(op.srcs[static_cast<std::size_t>(k)], bytes, "srcs[" + std::to_string(k) + "]");
  }
  if (!why.empty()) {
    st.error = StreamError{code, detail::cuda_error_text(call, code, why)};
    return;
  }
  lk.unlock();
  std::optional<std::string> failed;
  try {
    switch (op.kind) {
      case OpKind::copy: std::memmove(op.dst, op.a, op.bytes); break;
      case OpKind::fill: std::memset(op.dst, op.value, op.bytes); break;
      case OpKind::reduce: detail::sim_kernels::emulate_reduce(op.op, op.dt, op.dst, op.a, op.b, op.bytes); break;
      case OpKind::reduce_many:
        detail::sim_kernels::emulate_reduce_many(op.op, op.dt, op.dst, op.srcs.data(), op.value, op.bytes);
        break;
      case OpKind::premul:
        detail::sim_kernels::emulate_premul(op.dt, op.dst, op.a, op.bytes, op.b != nullptr ? op.b : &op.word_value,
                                            op.b != nullptr);
        break;
      default: detail::sim_kernels::emulate_finalize_avg(op.dt, op.dst, op.bytes, op.value); break;
    }
  } catch (const std::exception& e) {
    failed = e.what();
  }
  rd.unlock();
  lk.lock();
  if (failed) st.error = StreamError{detail::kCudaInvalidValue, detail::cuda_error_text(call, 1, *failed)};
}

}  // namespace chorus::device
