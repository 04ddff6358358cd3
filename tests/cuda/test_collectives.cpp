// SPDX-License-Identifier: BSD-3-Clause
// The GPU suite's collective matrix: support/device_matrix.hpp on real device buffers through the
// CUDA runtime (device/cuda_runtime.hpp, built by nvcc once, in cmake/instances/cuda_runtime_instance.cu; this
// file is host code), ranks as processes over shm and tcp at worlds 2 and 3 sharing the GPUs
// (rank r on device r % device_count()), and over cuda_ipc at worlds 2 to 4 with every rank on
// device 0 (CUDA IPC handles work between processes of one device): the collective kernel through
// the areas' windows, and the IPC windows' collectives (scatter, gather, all_to_all), each rank
// reading the others' memory through real IPC mappings (4 KiB windows: many chunks per call); and
// ranks as threads of this process on device 0 (the collective kernel with plain pointers).
// Without a GPU the GPU tests' main exits 77 (skipped);
// with REQUIRE_GPU=1 that is a failure instead (cuda/gpu_test.hpp).
#include <doctest/doctest.h>

#include <chrono>
#include <memory>
#include <sstream>

#include "chorus/communicator.hpp"
#include "chorus/device/default.hpp"
#include "chorus/device/runtime.hpp"
#include "chorus/transport/cuda_ipc/transport.hpp"
#include "cuda_runtime_instance.hpp"
#include "support/communicators.hpp"
#include "support/device_matrix.hpp"
#include "support/spawn.hpp"

namespace cuda_test_collectives {

namespace {

using namespace std::chrono_literals;

template <class Comm>
void matrix(int world) {
  chorus::test::ProcessOptions p;
  p.timeout = 280s;
  p.comm_timeout = 60s;
  chorus::test::device_matrix::run_in_processes<Comm>(world, "CUDA", p, [](int rank) {
    auto rt = chorus::instances::make_cuda_runtime();
    rt->set_device(rank % rt->device_count());
    return rt;
  });
}

/// The matrix over cuda_ipc, every rank on device 0; the direct path must have run (a window).
void ipc_matrix(int world) {
  chorus::test::ProcessOptions p;
  p.timeout = 280s;
  p.comm_timeout = 60s;
  p.env = {{"CHORUS_CUDA_IPC_SLOT_BYTES", "4096"}};
  chorus::test::run_processes(
      world,
      [&](int, chorus::Options o) {
        auto rt = chorus::instances::make_cuda_runtime();
        rt->set_device(0);
        chorus::device::set_default_runtime(rt.get());  // the transport reads it
        using Comm = chorus::Communicator<chorus::cuda_ipc::Transport>;
        {
          Comm comm = Comm::create(o);
          std::ostringstream where;
          where << "(cuda_ipc, world " << world << ", CUDA)";
          chorus::test::device_matrix::run_all(comm, *rt, where.str());
          chorus::test::expect(comm.memory_stats().ipc_window_bytes == 2 * 4096 + chorus::cuda_ipc::kFlagBytes,
                               "the direct path ran (an IPC window)");
        }
        chorus::device::set_default_runtime(nullptr);
      },
      p);
}

/// The matrix with ranks as threads of this process on device 0 (inproc): the collective kernel
/// with plain device pointers, every rank on a stream of its own, one CUDA runtime.
void threads_matrix(int world) {
  auto rt = chorus::instances::make_cuda_runtime();
  rt->set_device(0);
  chorus::test::ThreadOptions t;
  t.timeout = 60s;
  chorus::test::run_threads(
      world,
      [&](int, chorus::Options o) {
        rt->set_device(0);  // (this thread's current device)
        using Comm = chorus::Communicator<chorus::inproc::Transport>;
        Comm comm = Comm::create(o);
        std::ostringstream where;
        where << "(inproc, ranks as threads, world " << world << ", CUDA)";
        chorus::test::device_matrix::run_all(comm, *rt, where.str(), /*threads=*/true);
        chorus::test::expect(comm.memory_stats().kernel_area_bytes != 0, "the collective kernel ran (an area)");
      },
      t);
}

using ShmComm = chorus::Communicator<chorus::shm::Transport>;
using TcpComm = chorus::Communicator<chorus::tcp::Transport>;

}  // namespace

TEST_CASE("gpu: collectives on device buffers over shm, world 2") { matrix<ShmComm>(2); }
TEST_CASE("gpu: collectives on device buffers over shm, world 3") { matrix<ShmComm>(3); }
TEST_CASE("gpu: collectives on device buffers over tcp, world 2") { matrix<TcpComm>(2); }
TEST_CASE("gpu: collectives on device buffers over cuda_ipc, world 2") { ipc_matrix(2); }
TEST_CASE("gpu: collectives on device buffers over cuda_ipc, world 3") { ipc_matrix(3); }
TEST_CASE("gpu: collectives on device buffers over cuda_ipc, world 4") { ipc_matrix(4); }
TEST_CASE("gpu: collectives on device buffers, ranks as threads on one device, world 2") { threads_matrix(2); }
TEST_CASE("gpu: collectives on device buffers, ranks as threads on one device, world 4") { threads_matrix(4); }

}  // namespace cuda_test_collectives
