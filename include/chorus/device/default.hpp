// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// The process's default device runtime, which every communicator created afterwards uses to tell
/// device memory from host memory: none unless one is set. Including chorus/cuda.hpp from a
/// translation unit compiled by nvcc sets the CUDA runtime; tests and benchmarks on machines
/// without a GPU set a device::SimRuntime. Communicator::set_device_runtime overrides it per
/// communicator.

#include <atomic>

#include "chorus/device/runtime.hpp"

namespace chorus::device {

namespace detail {
inline std::atomic<Runtime*>& default_slot() {
  static std::atomic<Runtime*> slot{nullptr};
  return slot;
}
}  // namespace detail

/// The default runtime (not owned; it must outlive the communicators that use it), or null.
inline Runtime* default_runtime() { return detail::default_slot().load(std::memory_order_acquire); }
inline void set_default_runtime(Runtime* rt) { detail::default_slot().store(rt, std::memory_order_release); }

}  // namespace chorus::device
