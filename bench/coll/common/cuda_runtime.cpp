// SPDX-License-Identifier: BSD-3-Clause
// --device cuda: the CUDA runtime behind the device::Runtime seam, from the build's one nvcc
// translation unit that compiles it (cmake/instances/cuda_runtime_instance.cu, shared with the
// GPU tests).
#include "coll/common/driver.hpp"
#include "cuda_runtime_instance.hpp"

std::unique_ptr<chorus::device::Runtime> chorus::bench::make_cuda_runtime() {
  return chorus::instances::make_cuda_runtime();
}
