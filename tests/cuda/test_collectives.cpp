// The GPU suite's collective matrix: support/device_matrix.hpp on real device buffers through the
// CUDA runtime (device/cuda_runtime.hpp, built by nvcc in tests/cuda/support/cuda_runtime.cu; this
// file is host code), ranks as processes over shm and tcp at worlds 2 and 3 sharing the GPUs
// (rank r on device r % device_count()). Without a GPU the GPU tests' main exits 77 (skipped);
// with REQUIRE_GPU=1 that is a failure instead (cuda/gpu_test.hpp).
#include <doctest/doctest.h>

#include <chrono>
#include <memory>

#include "chorus/communicator.hpp"
#include "chorus/device/runtime.hpp"
#include "support/communicators.hpp"
#include "support/device_matrix.hpp"
#include "support/spawn.hpp"

namespace chorus::test {
/// The CUDA runtime (tests/cuda/support/cuda_runtime.cu).
std::unique_ptr<chorus::device::Runtime> make_cuda_runtime();
}  // namespace chorus::test

namespace cuda_test_collectives {

namespace {

using namespace std::chrono_literals;

template <class Comm>
void matrix(int world) {
  chorus::test::ProcessOptions p;
  p.timeout = 280s;
  p.comm_timeout = 60s;
  chorus::test::device_matrix::run_in_processes<Comm>(world, "CUDA", p, [](int rank) {
    auto rt = chorus::test::make_cuda_runtime();
    rt->set_device(rank % rt->device_count());
    return rt;
  });
}

using ShmComm = chorus::Communicator<chorus::shm::Transport>;
using TcpComm = chorus::Communicator<chorus::tcp::Transport>;

}  // namespace

TEST_CASE("gpu: collectives on device buffers over shm, world 2") { matrix<ShmComm>(2); }
TEST_CASE("gpu: collectives on device buffers over shm, world 3") { matrix<ShmComm>(3); }
TEST_CASE("gpu: collectives on device buffers over tcp, world 2") { matrix<TcpComm>(2); }

}  // namespace cuda_test_collectives
