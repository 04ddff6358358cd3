// SPDX-License-Identifier: BSD-3-Clause
// Communicator::shrink over rdma: on the fake fabric here, on the real device in the Soft-RoCE
// guest (CHORUS_TEST_RDMA_REAL=1, scripts/rdma-guest). One rank of three is killed; the survivors
// see the failure, shrink, and check an all_reduce on the new communicator (new queue pairs). RC
// has no liveness of its own: on the fake fabric a dead process is found by the timeout (short
// here), on a device by the transport's retries once a message to it is outstanding.
#include <doctest/doctest.h>

#include <chrono>
#include <csignal>
#include <cstdint>
#include <span>
#include <vector>

#include "chorus/communicator.hpp"
#include "chorus/transport/rdma/transport.hpp"
#include "rdma/fabric.hpp"
#include "support/spawn.hpp"

namespace rdma_test_rdma_shrink {

using namespace std::chrono_literals;
using chorus::test::expect;
using chorus::test::expect_eq;
using Comm = chorus::Communicator<chorus::rdma::Transport>;

TEST_CASE("rdma: the survivors of a kill shrink and go on" * doctest::test_suite("waits")) {
  chorus::test::FakeFabric fabric;
  auto p = fabric.options(120s, 8s);
  p.expect_killed = {1};
  chorus::test::run_processes(
      3,
      [](int rank, chorus::Options o) {
        Comm comm = Comm::create(o);
        comm.barrier();
        if (rank == 1) std::raise(SIGKILL);
        bool failed = false;
        for (int i = 0; i < 100000 && !failed; ++i) {
          std::vector<float> v((std::size_t(1) << 16) + 3, 1.0f);
          try {
            comm.all_reduce(std::span(v), chorus::ReduceOp::sum);
          } catch (const chorus::Error& e) {
            expect(e.code() == chorus::ErrorCode::peer_failure || e.code() == chorus::ErrorCode::timeout,
                   std::string("peer_failure or timeout: ") + e.what());
            failed = true;
          }
        }
        expect(failed, "the collectives failed after the kill");
        Comm c = comm.shrink();
        expect_eq(c.size(), 2, "size after shrink");
        expect_eq(c.rank(), rank == 0 ? 0 : 1, "rank after shrink");
        std::vector<std::int64_t> v((std::size_t(1) << 18) + 5);
        for (std::size_t i = 0; i < v.size(); ++i) v[i] = rank * 7 + static_cast<std::int64_t>(i % 11);
        c.all_reduce(std::span(v), chorus::ReduceOp::sum);
        for (std::size_t i = 0; i < v.size(); ++i) expect_eq(v[i], 14 + 2 * static_cast<std::int64_t>(i % 11), "all_reduce");
      },
      p);
}

}  // namespace rdma_test_rdma_shrink
