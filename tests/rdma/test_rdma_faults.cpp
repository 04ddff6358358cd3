// SPDX-License-Identifier: BSD-3-Clause
// Faults injected into the fake verbs provider (CHORUS_IB_FAKE_FAULT, testing/fake_verbs.hpp) of
// one rank: each ends in a clear error on every rank (peer_failure, or system where the faulty
// rank's own call failed), never a hang and never the timeout; the faulty rank's error names the
// peer and the verbs status. A legal but unusual provider behaviour (completions handed out one
// at a time) changes nothing in the results.
#include <doctest/doctest.h>

#include <stdlib.h>

#include <chrono>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "chorus/communicator.hpp"
#include "chorus/transport/rdma/transport.hpp"
#include "rdma/fabric.hpp"
#include "support/communicators.hpp"
#include "support/spawn.hpp"

namespace rdma_test_rdma_faults {

namespace {

using namespace std::chrono_literals;
using chorus::test::expect;
using chorus::test::FakeFabric;
using Comm = chorus::Communicator<chorus::rdma::Transport>;

/// Collectives large (RDMA writes) and small (eager), until one fails.
void workload(Comm& comm) {
  for (int round = 0; round < 20; ++round) {
    std::vector<float> big((std::size_t(1) << 20) + 3, 1.0f);
    comm.all_reduce(std::span<float>(big), chorus::ReduceOp::sum);
    std::vector<int> small(5, comm.rank());
    comm.all_reduce(std::span<int>(small), chorus::ReduceOp::max);
  }
}

/// World `world`, the fault `spec` in rank `victim`: every rank's workload must fail, with
/// peer_failure or system (not timeout), and the victim's message must contain `victim_says`
/// (when given: at world 2 every request of the victim is on the link the fault broke, so its
/// error is the fault's; with more ranks a consequence elsewhere may reach it first).
template <class Work>
void expect_everyone_fails(int world, int victim, const std::string& spec, const std::string& victim_says, Work work) {
  FakeFabric fabric;
  chorus::test::run_processes(
      world,
      [&](int rank, chorus::Options o) {
        if (rank == victim) ::setenv("CHORUS_IB_FAKE_FAULT", spec.c_str(), 1);
        Comm comm = Comm::create(o);
        try {
          work(comm);
        } catch (const chorus::Error& e) {
          const std::string what = e.what();
          expect(e.code() == chorus::ErrorCode::peer_failure || e.code() == chorus::ErrorCode::system,
                 "rank " + std::to_string(rank) + " failed with peer_failure or system, not: " + what);
          expect(what.find("rank " + std::to_string(rank)) != std::string::npos, "the error names the rank: " + what);
          if (rank == victim && !victim_says.empty())
            expect(what.find(victim_says) != std::string::npos, "the faulty rank's error says '" + victim_says + "': " + what);
          return;
        }
        throw chorus::test::Failure("rank " + std::to_string(rank) + ": the workload succeeded despite " + spec);
      },
      fabric.options(120s, 30s));
}

}  // namespace

TEST_CASE("rdma faults: a remote access error on an RDMA write") {
  expect_everyone_fails(2, 1, "rem_access@1", "remote access error", workload);
}

TEST_CASE("rdma faults: a remote access error reaches every rank of three") {
  expect_everyone_fails(3, 1, "rem_access@1", "", workload);
}

TEST_CASE("rdma faults: transport retries exceeded") {
  expect_everyone_fails(2, 0, "retry_exceeded@7", "transport retry counter exceeded", workload);
}

TEST_CASE("rdma faults: ENOMEM from a registration") {
  // The first registration is the transport's own slots (at creation); the second a user buffer.
  expect_everyone_fails(2, 0, "reg_enomem@2", "Cannot allocate memory", workload);
}

TEST_CASE("rdma faults: a queue pair goes to the error state") {
  expect_everyone_fails(3, 1, "qp_error@5", "", workload);
}

TEST_CASE("rdma faults: a completion queue overrun") {
  // Capacity 1: two completions waiting at once break the CQ. Bursts of 64 eager messages (all the
  // credits) land in the victim's CQ faster than it polls; the loop ends at the first failure.
  expect_everyone_fails(2, 1, "cq_overflow@1", "completion queue failed", [](Comm& comm) {
    std::vector<std::vector<int>> bufs(64, std::vector<int>(3, 0));
    std::vector<int> ack(1);
    for (int round = 0; round < 1000; ++round) {
      std::vector<chorus::Request> reqs;
      for (std::size_t m = 0; m < bufs.size(); ++m)
        reqs.push_back(comm.rank() == 0 ? comm.isend(std::span<const int>(bufs[m]), 1, static_cast<int>(m))
                                        : comm.irecv(std::span<int>(bufs[m]), 0, static_cast<int>(m)));
      for (auto& r : reqs) r.wait();
      if (comm.rank() == 0)
        comm.recv(std::span<int>(ack), 1, 100);
      else
        comm.send(std::span<const int>(ack), 0, 100);
    }
  });
}

TEST_CASE("rdma faults: completions handed out one at a time change nothing") {
  FakeFabric fabric;
  chorus::test::run_processes(
      3,
      [&](int rank, chorus::Options o) {
        ::setenv("CHORUS_IB_FAKE_FAULT", "partial_poll", 1);
        Comm comm = Comm::create(o);
        for (std::size_t n : {std::size_t(1), std::size_t(1000), (std::size_t(1) << 20) + 3}) {
          std::vector<float> v(n, static_cast<float>(rank + 1));
          comm.all_reduce(std::span<float>(v), chorus::ReduceOp::sum);
          for (float x : v) expect(x == 6.0f, "all_reduce of " + std::to_string(n) + " floats");
        }
      },
      fabric.options(120s, 30s));
}

TEST_CASE("rdma faults: a bad CHORUS_IB_FAKE_FAULT is refused by name") {
  FakeFabric fabric;
  chorus::test::run_processes(
      1,
      [&](int, chorus::Options o) {
        ::setenv("CHORUS_IB_FAKE_FAULT", "no_such_fault@3", 1);
        const auto e = chorus::test::expect_error(chorus::ErrorCode::unsupported, [&] { (void)Comm::create(o); },
                                                  "an unknown fault");
        expect(std::string(e.what()).find("no_such_fault") != std::string::npos, std::string("names it: ") + e.what());
      },
      fabric.options(60s, 20s));
}

}  // namespace rdma_test_rdma_faults
