// SPDX-License-Identifier: BSD-3-Clause
// The CUDA runtime for the host-code tests of tests/cuda (test_collectives.cpp): the one place
// that includes device/cuda_runtime.hpp, compiled by nvcc.
#include <memory>

#include "chorus/device/cuda_runtime.hpp"

namespace chorus::test {
std::unique_ptr<chorus::device::Runtime> make_cuda_runtime() { return std::make_unique<chorus::device::CudaRuntime>(); }
}  // namespace chorus::test
