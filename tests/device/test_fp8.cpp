// SPDX-License-Identifier: BSD-3-Clause
// fp8 through every collective: the device-buffer matrix (support/device_matrix.hpp) for
// float8_e4m3 and float8_e5m2 alone, every collective x every op that applies (sum, prod, min, max,
// avg) x counts 0, 1, 13, 1000, in place and out of place; each call on host buffers against
// support/fill.hpp's reference, then on simulated-device buffers on a stream against the host
// result, bit for bit. Ranks as threads over inproc on one simulated device, worlds 1-5 (2 and 3
// under the sanitizers). This runs in every build, the sanitizer ones included, where the dtype
// matrices of the other tests leave fp8 out (support/sanitized.hpp); the element-level rules are the
// unit tests' fp8 cases.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "chorus/communicator.hpp"
#include "support/device_matrix.hpp"
#include "support/device_threads.hpp"
#include "support/sanitized.hpp"

namespace device_test_fp8 {

TEST_CASE(
    "fp8: every collective and op on float8_e4m3 and float8_e5m2, host and simulated-device buffers: ranks "
    "as threads over inproc, worlds 1 to 5") {
  const std::vector<chorus::DataType> fp8 = {chorus::DataType::float8_e4m3, chorus::DataType::float8_e5m2};
  const int first = chorus::test::kSanitized ? 2 : 1, last = chorus::test::kSanitized ? 3 : 5;
  chorus::test::run_device_threads(
      last, [&](auto& c, chorus::device::SimRuntime& rt, chorus::device::Stream) {
        if (c.size() < first) return;
        chorus::test::device_matrix::run_all(
            c, rt, "(inproc threads, world " + std::to_string(c.size()) + ", fp8)", true, fp8);
      });
}

}  // namespace device_test_fp8
