// SPDX-License-Identifier: BSD-3-Clause
// The device data path in real processes, over shm and tcp, on the simulated CUDA runtime
// (testing/sim_runtime.hpp): "device" buffers from its arena, the calls on a stream, staging
// through pinned memory in slices, reductions through the kernel bodies under the grid emulator.
// The matrix (support/device_matrix.hpp): worlds 1-4 x {shm, tcp} x every collective x the twelve
// dtypes x every op that applies x odd counts, each result equal to the host path's bit for bit.
#include <doctest/doctest.h>

#include <chrono>
#include <memory>

#include "chorus/communicator.hpp"
#include "chorus/testing/sim_runtime.hpp"
#include "support/communicators.hpp"
#include "support/device_matrix.hpp"
#include "support/spawn.hpp"

namespace device_test_device_path {

namespace {

using namespace std::chrono_literals;

template <class Comm>
void matrix(int world) {
  chorus::test::ProcessOptions p;
  p.timeout = 240s;
  p.comm_timeout = 30s;
  chorus::test::device_matrix::run_in_processes<Comm>(world, "simulated runtime", p, [](int) {
    return std::make_unique<chorus::device::SimRuntime>();
  });
}

using ShmComm = chorus::Communicator<chorus::shm::Transport>;
using TcpComm = chorus::Communicator<chorus::tcp::Transport>;

}  // namespace

TEST_CASE("device path: shm processes: every collective dtype and op at world 1") { matrix<ShmComm>(1); }
TEST_CASE("device path: shm processes: every collective dtype and op at world 2") { matrix<ShmComm>(2); }
TEST_CASE("device path: shm processes: every collective dtype and op at world 3") { matrix<ShmComm>(3); }
TEST_CASE("device path: shm processes: every collective dtype and op at world 4") { matrix<ShmComm>(4); }
TEST_CASE("device path: tcp processes: every collective dtype and op at world 1") { matrix<TcpComm>(1); }
TEST_CASE("device path: tcp processes: every collective dtype and op at world 2") { matrix<TcpComm>(2); }
TEST_CASE("device path: tcp processes: every collective dtype and op at world 3") { matrix<TcpComm>(3); }
TEST_CASE("device path: tcp processes: every collective dtype and op at world 4") { matrix<TcpComm>(4); }

}  // namespace device_test_device_path
