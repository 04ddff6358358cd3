// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// The CUDA runtime for chorus's own programs (tests/cuda, the *_perf programs' --device cuda),
/// compiled once by nvcc (cuda_runtime_instance.cu, target chorus_cuda_runtime_instance): the one
/// translation unit of this build that instantiates the CUDA runtime's kernels, for every
/// architecture, instead of one per program. Host code includes only this declaration.
#include <memory>

#include "chorus/device/runtime.hpp"

namespace chorus::instances {
/// A new device::CudaRuntime (device/cuda_runtime.hpp).
std::unique_ptr<device::Runtime> make_cuda_runtime();
}  // namespace chorus::instances
