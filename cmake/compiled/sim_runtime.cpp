// SPDX-License-Identifier: BSD-3-Clause
// chorus::compiled (CMakeLists.txt): the simulated device runtime (device::SimRuntime,
// chorus/testing/sim_runtime.hpp), compiled once for the tests, benchmarks and programs that run
// the device path without a GPU.
#include "chorus/testing/sim_runtime.hpp"
#include "chorus/testing/sim_runtime/bodies.hpp"
