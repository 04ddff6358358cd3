// --device cuda: the CUDA runtime behind the device::Runtime seam (device/cuda_runtime.hpp), the
// one translation unit of the *_perf programs that nvcc compiles.
#include <memory>

#include "chorus/device/cuda_runtime.hpp"
#include "coll/common/driver.hpp"

std::unique_ptr<chorus::device::Runtime> chorus::bench::make_cuda_runtime() {
  return std::make_unique<chorus::device::CudaRuntime>();
}
