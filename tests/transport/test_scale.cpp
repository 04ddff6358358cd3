// SPDX-License-Identifier: BSD-3-Clause
// Many ranks on this machine (issue: start-up at thousands of ranks): 64 processes over tcp, whose
// sockets stay few with links made on first use (a ring or a tree all_reduce: at most 12 per rank,
// the store's and the standby's included); and 256 ranks as threads over tcp through creation, an
// all_reduce, a barrier, one communicator aborted, shrink, and a timeout that names the late rank.
// The sanitizer builds run 16 processes and 32 threads (kSanitized: the volume shrinks, never the
// code paths). `ctest -R '64 processes|256 ranks'` selects both.
#include <dirent.h>
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "chorus/communicator.hpp"
#include "chorus/transport/tcp/transport.hpp"
#include "support/communicators.hpp"
#include "support/sanitized.hpp"
#include "support/spawn.hpp"

// This file's own names: the files of tests/transport/ are compiled together (unity build).
namespace transport_test_scale {

using namespace std::chrono_literals;
using chorus::ErrorCode;
using chorus::test::expect;
using chorus::test::expect_eq;
using chorus::test::store_barrier;
using Comm = chorus::Communicator<chorus::tcp::Transport>;
using Clock = std::chrono::steady_clock;

namespace {

/// Open file descriptors of this process that are sockets.
int sockets_held() {
  int n = 0;
  DIR* d = ::opendir("/proc/self/fd");
  if (d == nullptr) return -1;
  while (const dirent* e = ::readdir(d)) {
    char target[256];
    const std::string path = std::string("/proc/self/fd/") + e->d_name;
    const ssize_t k = ::readlink(path.c_str(), target, sizeof target);
    if (k > 0 && std::string_view(target, static_cast<std::size_t>(k)).starts_with("socket:")) ++n;
  }
  ::closedir(d);
  return n;
}

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

/// An 8 B all_reduce (2 float32) whose sum every rank can check.
void all_reduce_8b(Comm& comm, int who) {
  std::vector<float> in{float(who + 1), 1.0f}, out(2, 0.0f);
  comm.all_reduce(std::span<const float>(in), std::span(out), chorus::ReduceOp::sum);
  expect(out[1] == float(comm.size()), "the 8 B all_reduce's count");
}

}  // namespace

TEST_CASE("scale: 64 processes over tcp: ring and tree all_reduce hold at most 12 sockets per rank") {
  const int n = chorus::test::kSanitized ? 16 : 64;
  chorus::test::ProcessOptions popt;
  popt.timeout = 300s;
  popt.comm_timeout = 120s;
  chorus::test::run_processes(
      n,
      [n](int rank, chorus::Options o) {
        for (const std::string algo : {"ring", "tree"}) {
          const int before = sockets_held();
          chorus::Options mine = o;
          mine.algorithm = "all_reduce:" + algo;
          auto comm = Comm::create(mine);
          const int created = sockets_held() - before;
          for (int i = 0; i < 3; ++i) {
            std::vector<float> in{float(rank + 1), 1.0f}, out(2, 0.0f);
            comm.all_reduce(std::span<const float>(in), std::span(out), chorus::ReduceOp::sum);
            expect(out[0] == float(n) * float(n + 1) / 2 && out[1] == float(n), "the 8 B all_reduce's sums");
          }
          const int after = sockets_held() - before;
          // (Peers that finished creation first may have connected already.)
          expect(created <= 12, algo + ": sockets after creation: " + std::to_string(created));
          expect(after <= 12, algo + ": sockets after three all_reduces: " + std::to_string(after));
          if (rank == 0)
            std::printf("%s: %d sockets after creation, %d after the all_reduces\n", algo.c_str(), created,
                        after);
        }
      },
      popt);
}

TEST_CASE(
    "scale: 256 ranks as threads over tcp: creation, all_reduce, barrier, an aborted rank and shrink, a late "
    "rank named") {
  const int n = chorus::test::kSanitized ? 32 : 256;
  const int victim = n * 3 / 10;  // the rank whose communicator is aborted
  const int late_rank = n / 2;    // in the shrunk world: the rank that does not enter the call
  struct Times {
    double create = 0, first = 0, steady = 0, barrier = 0, failed = 0, shrink = 0, after = 0,
           after_steady = 0, late = 0;
  };
  std::vector<Times> times(static_cast<std::size_t>(n));
  std::atomic<int> named{0}, timeouts{0};
  chorus::test::ThreadOptions topt;
  topt.timeout = 120s;
  chorus::test::run_threads(
      n,
      [&](int rank, chorus::Options o) {
        Times& t = times[static_cast<std::size_t>(rank)];
        auto store = o.store;
        o.shrink_wait = 100s;  // not waited out: the aborted rank says it will not join
        auto t0 = Clock::now();
        auto comm = Comm::create(o);
        t.create = ms_since(t0);
        store_barrier(*store, "created", rank, n);  // the calls' times without the creations' skew
        t0 = Clock::now();
        all_reduce_8b(comm, rank);
        t.first = ms_since(t0);
        t0 = Clock::now();
        all_reduce_8b(comm, rank);
        t.steady = ms_since(t0);
        t0 = Clock::now();
        comm.barrier();
        t.barrier = ms_since(t0);

        // One communicator is aborted (its thread lives on): the others' next call fails with
        // peer_failure, the failure spreading over the links the calls made, not at the timeout.
        if (rank == victim) {
          comm.abort();
          store->set("test/aborted", "1");
          return;
        }
        store->wait({"test/aborted"}, 60s);
        t0 = Clock::now();
        const auto e = chorus::test::expect_error(
            ErrorCode::peer_failure, [&] { all_reduce_8b(comm, rank); }, "the call after a rank's abort");
        (void)e;
        t.failed = ms_since(t0);
        t0 = Clock::now();
        auto c = comm.shrink();  // the aborted rank is left out at once (Communicator::abort())
        t.shrink = ms_since(t0);
        expect(t.shrink < 100000, "shrink did not wait out shrink_wait for the aborted rank");
        expect_eq(c.size(), n - 1, "the shrunk size");
        expect_eq(c.rank(), rank < victim ? rank : rank - 1, "the shrunk rank");
        store_barrier(*store, "shrunk", rank, n, victim);
        t0 = Clock::now();
        std::vector<std::int64_t> v{rank}, sum(1);
        c.all_reduce(std::span<const std::int64_t>(v), std::span(sum), chorus::ReduceOp::sum);
        expect_eq(sum[0], std::int64_t(n) * (n - 1) / 2 - victim, "the shrunk world's sum");
        t.after = ms_since(t0);
        t0 = Clock::now();
        c.all_reduce(std::span<const std::int64_t>(v), std::span(sum), chorus::ReduceOp::sum);
        t.after_steady = ms_since(t0);

        // A communicator of the survivors with a short timeout: one rank does not enter its call;
        // the others fail naming it (timeout where they wait on it, peer_failure where a peer that
        // timed out aborted first).
        chorus::Options lo;
        lo.rank = c.rank();
        lo.world_size = c.size();
        lo.store = std::make_shared<chorus::PrefixStore>("late/", store);
        lo.setup_timeout = 120s;
        lo.timeout = 4s;
        auto late = Comm::create(lo);
        std::vector<std::string> reported;
        for (int r = 0; r < late.size(); ++r)
          if (r != late_rank) reported.push_back("test/late_failed/" + std::to_string(r));
        if (late.rank() == late_rank) {  // alive, its links answering, but in no call
          store->wait(reported, 60s);
          return;
        }
        t0 = Clock::now();
        try {
          all_reduce_8b(late, late.rank());
          expect(false, "the call without rank " + std::to_string(late_rank) + " returned");
        } catch (const chorus::Error& err) {
          const std::string m = err.what();
          if (err.code() == ErrorCode::timeout) {
            ++timeouts;
            if (m.find("rank " + std::to_string(late_rank) + " has not entered all_reduce") !=
                std::string::npos)
              ++named;
          } else {
            expect(err.code() == ErrorCode::peer_failure, "timeout or peer_failure: " + m);
          }
        }
        t.late = ms_since(t0);
        store->set("test/late_failed/" + std::to_string(late.rank()), "1");
      },
      topt);
  CHECK(timeouts.load() >= 1);
  CHECK(named.load() == timeouts.load());
  auto most = [&](double Times::*f) {
    double m = 0;
    for (const Times& t : times) m = std::max(m, t.*f);
    return m;
  };
  MESSAGE(n << " ranks as threads over tcp, slowest rank (ms): creation " << most(&Times::create)
            << ", first 8 B all_reduce " << most(&Times::first) << ", steady " << most(&Times::steady)
            << ", barrier " << most(&Times::barrier) << ", the call after the abort fails in "
            << most(&Times::failed) << ", shrink " << most(&Times::shrink) << ", all_reduce after it "
            << most(&Times::after) << " (then " << most(&Times::after_steady)
            << "), the call without the late rank fails in " << most(&Times::late) << " (timeout 4000)");
}

}  // namespace transport_test_scale
