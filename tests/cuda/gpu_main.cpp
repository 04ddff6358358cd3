// SPDX-License-Identifier: BSD-3-Clause
// The main of every GPU test executable (see gpu_test.hpp): skips (exit 77) without a GPU unless
// REQUIRE_GPU=1. Compiled by the host compiler once, with doctest's implementation.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "chorus/device/runtime.hpp"
#include "cuda/gpu_test.hpp"

namespace chorus::test::gpu {

std::string gpu_skip_reason(bool& fatal) {
  fatal = false;
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    fatal = !device::means_no_gpu(static_cast<int>(status));
    return cuda_error_text(status, "cudaGetDeviceCount");
  }
  if (count == 0) return "cudaGetDeviceCount: 0 devices";
  return "";
}

namespace {

/// Whether the command line only asks doctest to list or describe (no test runs, no GPU needed).
bool only_lists(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    while (!arg.empty() && arg.front() == '-') arg.remove_prefix(1);
    if (arg.rfind("dt-", 0) == 0) arg.remove_prefix(3);  // doctest's prefixed spelling, --dt-ltc
    arg = arg.substr(0, arg.find('='));
    if (arg == "list-test-cases" || arg == "ltc" || arg == "list-test-suites" || arg == "lts" ||
        arg == "list-reporters" || arg == "lr" || arg == "help" || arg == "h" || arg == "?" || arg == "version" ||
        arg == "v" || arg == "count" || arg == "c") {
      return true;
    }
  }
  return false;
}

}  // namespace
}  // namespace chorus::test::gpu

int main(int argc, char** argv) {
  namespace gpu = chorus::test::gpu;
  if (!gpu::only_lists(argc, argv)) {
    bool fatal = false;
    const std::string reason = gpu::gpu_skip_reason(fatal);
    if (!reason.empty()) {
      const char* require = std::getenv("REQUIRE_GPU");
      const bool required = require != nullptr && std::string_view(require) == "1";
      if (fatal || required) {
        std::fprintf(stderr, "GPU test: no usable GPU (%s)%s: failing\n", reason.c_str(),
                     fatal ? "" : " and REQUIRE_GPU=1");
        return 1;
      }
      std::printf("GPU test skipped: no GPU here (%s); REQUIRE_GPU=1 makes this a failure\n", reason.c_str());
      return gpu::kSkipExitCode;
    }
  }
  doctest::Context context(argc, argv);
  return context.run();
}
