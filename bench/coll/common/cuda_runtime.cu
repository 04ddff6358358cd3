// SPDX-License-Identifier: BSD-3-Clause
// --device cuda: the CUDA runtime behind the device::Runtime seam (device/cuda_runtime.hpp), the
// one translation unit of the *_perf programs that nvcc compiles. It includes no more of chorus
// than that (nvcc's front end cannot compile Boost.Asio): the declaration is driver.hpp's.
#include <memory>

#include "chorus/device/cuda_runtime.hpp"

namespace chorus::bench {
std::unique_ptr<device::Runtime> make_cuda_runtime();
}  // namespace chorus::bench

std::unique_ptr<chorus::device::Runtime> chorus::bench::make_cuda_runtime() {
  return std::make_unique<chorus::device::CudaRuntime>();
}
