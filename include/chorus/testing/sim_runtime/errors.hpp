// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// The CUDA errors of device::SimRuntime (testing/sim_runtime.hpp): the numbers it produces, their
/// names, and the text CudaRuntime gives for the same failure, so that a test on the simulation
/// sees what a run on a GPU would print.

#include <cstdio>
#include <string>
#include <string_view>

#include "chorus/core/error.hpp"
#include "chorus/device/runtime.hpp"

namespace chorus::device {

namespace detail {

/// cudaGetErrorName for the numbers the simulation produces or a test injects.
constexpr std::string_view cuda_error_name(int e) noexcept {
  switch (e) {
    case 0: return "cudaSuccess";
    case 1: return "cudaErrorInvalidValue";
    case 2: return "cudaErrorMemoryAllocation";
    case 3: return "cudaErrorInitializationError";
    case 34: return "cudaErrorStubLibrary";
    case 35: return "cudaErrorInsufficientDriver";
    case 100: return "cudaErrorNoDevice";
    case 101: return "cudaErrorInvalidDevice";
    case 400: return "cudaErrorInvalidResourceHandle";
    case 600: return "cudaErrorNotReady";
    case 700: return "cudaErrorIllegalAddress";
    case 702: return "cudaErrorLaunchTimeout";
    case 710: return "cudaErrorAssert";
    case 719: return "cudaErrorLaunchFailure";
    case 999: return "cudaErrorUnknown";
    default: return "unrecognized error code";
  }
}

/// "<call>: cudaErrorXxx (N)[: what]", the text CudaRuntime gives for the same failure.
inline std::string cuda_error_text(std::string_view call, int e, std::string_view what = {}) {
  std::string s(call);
  s += ": ";
  s += cuda_error_name(e);
  s += " (" + std::to_string(e) + ")";
  if (!what.empty()) {
    s += ": ";
    s += what;
  }
  return s;
}

inline Error cuda_error(std::string_view call, int e, std::string_view what = {}) {
  return Error(means_no_gpu(e) ? ErrorCode::unsupported : ErrorCode::system, cuda_error_text(call, e, what));
}

/// The CUDA error numbers the simulation produces itself.
inline constexpr int kCudaInvalidValue = 1;
inline constexpr int kCudaMemoryAllocation = 2;
inline constexpr int kCudaInvalidDevice = 101;
inline constexpr int kCudaInvalidHandle = 400;
inline constexpr int kCudaNotReady = 600;
inline constexpr int kCudaIllegalAddress = 700;
inline constexpr int kCudaLaunchFailure = 719;

inline std::string hex(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", p);
  return buf;
}

}  // namespace detail

}  // namespace chorus::device
