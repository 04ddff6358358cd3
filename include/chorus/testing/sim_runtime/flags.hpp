// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// device::SimRuntime (testing/sim_runtime.hpp): the stream operations on flag words. wait_flag
/// polls a word of pinned memory that the host sets; write_value and wait_value store and poll a
/// 64-bit word of device memory, its own or a peer's mapped by ipc_open (cuda_ipc's step flags).

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <utility>

#include "chorus/testing/sim_runtime.hpp"

namespace chorus::device {

// --- enqueued on a stream ------------------------------------------------------------------------

CHORUS_DETAIL_SIM_INLINE void SimRuntime::wait_flag(Stream s, const std::uint32_t* flag, std::uint64_t timeout_ns) {
  {
    std::lock_guard lk(mu_);
    const auto* pin = pinned_allocation(flag);
    if (flag == nullptr || reinterpret_cast<std::uintptr_t>(flag) % alignof(std::uint32_t) != 0 || pin == nullptr ||
        reinterpret_cast<std::uintptr_t>(flag) + sizeof(std::uint32_t) > pin->first + pin->second)
      throw detail::cuda_error("cudaHostGetDevicePointer", detail::kCudaInvalidValue,
                               "the flag " + detail::hex(flag) + " is not an aligned word of pinned memory");
  }
  Op op(OpKind::wait_flag);
  op.a = flag;
  op.timeout_ns = timeout_ns;
  enqueue(s, "wait_flag", std::move(op));
}

CHORUS_DETAIL_SIM_INLINE void SimRuntime::write_value(Stream s, std::uint64_t* word, std::uint64_t value) {
  {
    std::lock_guard lk(mu_);
    const std::string why = check_device_word(word, sizeof *word, "write_value: the word");
    if (!why.empty()) throw detail::cuda_error("cudaLaunchKernel", detail::kCudaInvalidValue, why);
  }
  Op op(OpKind::write_value);
  op.dst = word;
  op.word_value = value;
  enqueue(s, "write_value", std::move(op));
}

CHORUS_DETAIL_SIM_INLINE void SimRuntime::wait_value(Stream s, const std::uint64_t* word, std::uint64_t value, std::uint32_t* abort,
                                   std::uint32_t on_timeout, std::uint64_t timeout_ns) {
  {
    std::lock_guard lk(mu_);
    std::string why = check_device_word(word, sizeof *word, "wait_value: the word");
    const auto* pin = pinned_allocation(abort);
    if (why.empty() && (abort == nullptr || reinterpret_cast<std::uintptr_t>(abort) % alignof(std::uint32_t) != 0 ||
                        pin == nullptr ||
                        reinterpret_cast<std::uintptr_t>(abort) + sizeof(std::uint32_t) > pin->first + pin->second))
      why = "wait_value: the abort word " + detail::hex(abort) + " is not an aligned word of pinned memory";
    if (why.empty() && on_timeout == 0) why = "wait_value: on_timeout is 0";
    if (!why.empty()) throw detail::cuda_error("cudaLaunchKernel", detail::kCudaInvalidValue, why);
  }
  Op op(OpKind::wait_value);
  op.a = word;
  op.b = abort;
  op.word_value = value;
  op.value = static_cast<int>(on_timeout);
  op.timeout_ns = timeout_ns;
  enqueue(s, "wait_value", std::move(op));
}

// --- run by the stream's worker ------------------------------------------------------------------

CHORUS_DETAIL_SIM_INLINE void SimRuntime::wait_for_flag(StreamState& st, const Op& op, std::unique_lock<std::mutex>& lk) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::nanoseconds(op.timeout_ns);
  auto pause = std::chrono::duration_cast<std::chrono::nanoseconds>(kFlagPollMin);
  auto* word = const_cast<std::uint32_t*>(static_cast<const std::uint32_t*>(op.a));
  for (;;) {
    if (stopping_) return;
    // Under mu_: the flag's pinned buffer cannot be freed between this check and the load.
    if (pinned_allocation(word) == nullptr) {
      st.error = StreamError{detail::kCudaIllegalAddress,
                             detail::cuda_error_text("cudaLaunchKernel", detail::kCudaIllegalAddress,
                                                     "wait_flag: the flag's pinned memory was freed")};
      return;
    }
    if (std::atomic_ref<std::uint32_t>(*word).load(std::memory_order_acquire) != 0) return;
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return;  // gives up; the caller reports the failure its own way
    const auto step = std::min<std::chrono::nanoseconds>(pause, deadline - now);
    st.cv.wait_for(lk, step, [&] { return stopping_; });
    pause = std::min<std::chrono::nanoseconds>(pause * 2, kFlagPollMax);
  }
}

CHORUS_DETAIL_SIM_INLINE void SimRuntime::store_word(StreamState& st, const Op& op, std::unique_lock<std::mutex>& lk) {
  // Under mu_: the allocation cannot be unmapped between the check and the store. The work
  // before it on this stream is done (one worker runs the stream in order): the release store
  // publishes its writes to the processes that map the word.
  const std::string why = check_device_word(op.dst, sizeof(std::uint64_t), "write_value: the word");
  if (!why.empty()) {
    st.error = StreamError{detail::kCudaIllegalAddress,
                           detail::cuda_error_text("cudaLaunchKernel", detail::kCudaIllegalAddress, why)};
    return;
  }
  (void)lk;
  std::atomic_ref<std::uint64_t>(*static_cast<std::uint64_t*>(op.dst)).store(op.word_value, std::memory_order_release);
}

CHORUS_DETAIL_SIM_INLINE void SimRuntime::wait_for_value(StreamState& st, const Op& op, std::unique_lock<std::mutex>& lk) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::nanoseconds(op.timeout_ns);
  auto pause = std::chrono::duration_cast<std::chrono::nanoseconds>(kFlagPollMin);
  auto* word = const_cast<std::uint64_t*>(static_cast<const std::uint64_t*>(op.a));
  auto* abort = const_cast<std::uint32_t*>(static_cast<const std::uint32_t*>(op.b));
  for (;;) {
    if (stopping_) return;
    // Under mu_: neither the word's mapping nor the abort word can go between these checks and
    // the loads.
    std::string why = check_device_word(word, sizeof *word, "wait_value: the word");
    if (why.empty() && pinned_allocation(abort) == nullptr) why = "wait_value: the abort word's pinned memory was freed";
    if (!why.empty()) {
      st.error = StreamError{detail::kCudaIllegalAddress,
                             detail::cuda_error_text("cudaLaunchKernel", detail::kCudaIllegalAddress, why)};
      return;
    }
    if (std::atomic_ref<std::uint64_t>(*word).load(std::memory_order_acquire) >= op.word_value) return;
    std::atomic_ref<std::uint32_t> gave_up(*abort);
    if (gave_up.load(std::memory_order_acquire) != 0) return;
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      gave_up.store(static_cast<std::uint32_t>(op.value), std::memory_order_release);
      return;
    }
    const auto step = std::min<std::chrono::nanoseconds>(pause, deadline - now);
    st.cv.wait_for(lk, step, [&] { return stopping_; });
    pause = std::min<std::chrono::nanoseconds>(pause * 2, kValuePollMax);
  }
}

}  // namespace chorus::device
