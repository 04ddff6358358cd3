// SPDX-License-Identifier: BSD-3-Clause
// The one nvcc translation unit of chorus's own programs that holds the CUDA runtime and its
// kernels (see cuda_runtime_instance.hpp). It includes no more of chorus than that: nvcc's front
// end cannot compile Boost.Asio.
#include "cuda_runtime_instance.hpp"

#include "chorus/device/cuda_runtime.hpp"

std::unique_ptr<chorus::device::Runtime> chorus::instances::make_cuda_runtime() {
  return std::make_unique<chorus::device::CudaRuntime>();
}
