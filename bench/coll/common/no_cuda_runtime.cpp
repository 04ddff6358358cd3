// SPDX-License-Identifier: BSD-3-Clause
// --device cuda in a build without CUDA (no nvcc found, or CHORUS_WITH_CUDA=OFF).
#include <memory>

#include "chorus/core/error.hpp"
#include "coll/common/driver.hpp"

std::unique_ptr<chorus::device::Runtime> chorus::bench::make_cuda_runtime() {
  throw chorus::Error(chorus::ErrorCode::unsupported,
                      "--device cuda: these *_perf programs were built without CUDA (configure with nvcc "
                      "present and CHORUS_WITH_CUDA=ON); --device sim runs the device path on the simulated runtime");
}
