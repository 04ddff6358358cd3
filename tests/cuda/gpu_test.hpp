// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// Shared support of the GPU tests (tests/cuda/): a test main that skips without a GPU, and small
/// helpers for device memory in tests.
///
/// Adding a GPU test: write tests/cuda/test_<name>.cu (or .cpp for host code on the CUDA runtime)
/// with doctest TEST_CASEs, include "cuda/gpu_test.hpp" (tests/ is on the include path), and
/// tests/CMakeLists.txt builds it as its own executable cuda_test_<name>, linked with chorus::cuda
/// and the main below (chorus_gpu_test_main, gpu_main.cpp). Each doctest case becomes a ctest test
/// "cuda.<case>" with the label `gpu`.
///
/// The main (gpu_main.cpp) decides before any test runs, with gpu_skip_reason():
///   * a GPU is usable: the doctest cases run as usual;
///   * no GPU (cudaGetDeviceCount fails with an error device::means_no_gpu accepts: 35, 34 or
///     100, or reports 0 devices): it prints why and exits with kSkipExitCode (77), which ctest
///     reports as skipped (SKIP_RETURN_CODE), unless the environment sets REQUIRE_GPU=1, which
///     makes the same situation a failure (exit 1): for machines that are meant to have a GPU;
///   * any other cudaGetDeviceCount error: a failure.
/// Listing the cases (--list-test-cases, used at build time to register them) needs no GPU.
///
/// The host test main (chorus_test_main) is not linked here: it carries doctest's own main. A GPU
/// test that needs the rank launchers of tests/support (spawn.hpp, communicators.hpp) adds their
/// .cpp files to its executable's sources in tests/CMakeLists.txt instead.
///
/// ```cpp
/// #include "cuda/gpu_test.hpp"
/// TEST_CASE("my kernel") {
///   chorus::test::gpu::DeviceMemory d(1024);            // cudaMalloc, freed at scope exit
///   chorus::test::gpu::cuda_require(cudaMemset(d.get(), 0, 1024), "cudaMemset");
/// }
/// ```

#include <cuda_runtime_api.h>

#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>

namespace chorus::test::gpu {

/// ctest's SKIP_RETURN_CODE for the GPU tests.
inline constexpr int kSkipExitCode = 77;

/// "cudaXxx: cudaErrorName (N)" for a failed call.
inline std::string cuda_error_text(cudaError_t status, std::string_view call) {
  return std::string(call) + ": " + cudaGetErrorName(status) + " (" + std::to_string(static_cast<int>(status)) + ")";
}

/// Throws std::runtime_error (a failed test case under doctest) unless status is cudaSuccess.
inline void cuda_require(cudaError_t status, std::string_view call) {
  if (status != cudaSuccess) throw std::runtime_error(cuda_error_text(status, call));
}

/// Why the GPU tests cannot run here ("" when a GPU is usable); `fatal` is set when that is an
/// error (a CUDA failure that does not mean "no GPU") rather than a plain absence of GPUs.
std::string gpu_skip_reason(bool& fatal);

/// Device memory for a test: cudaMalloc'ed, freed on destruction; not copyable.
class DeviceMemory {
 public:
  explicit DeviceMemory(std::size_t bytes) { cuda_require(cudaMalloc(&p_, bytes != 0 ? bytes : 1), "cudaMalloc"); }
  ~DeviceMemory() { (void)cudaFree(p_); }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;

  void* get() const noexcept { return p_; }
  /// The address `offset` bytes in (for misaligned operands).
  unsigned char* at(std::size_t offset) const noexcept { return static_cast<unsigned char*>(p_) + offset; }

 private:
  void* p_ = nullptr;
};

}  // namespace chorus::test::gpu
