// SPDX-License-Identifier: BSD-3-Clause
// Communicator::shrink(): the survivors of a failure (or the ranks not excluded) agree on one set
// and go on in a new communicator whose collectives are checked against a reference computed from
// the survivors' inputs. Ranks as threads (a shared MemoryStore: the first to arrive coordinates)
// and as processes (the parent's TcpStore: every rank serves a standby, the lowest reachable
// leads; a killed rank 0 is survived).
#include "chorus/communicator.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <csignal>
#include <cstdint>
#include <numeric>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "support/modes.hpp"
#include "support/spawn.hpp"

namespace transport_test_shrink {

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using chorus::ErrorCode;
using chorus::test::expect;
using chorus::test::expect_eq;

/// The survivors' ranks in the old communicator, ascending.
std::vector<int> survivors(int n, const std::set<int>& gone) {
  std::vector<int> v;
  for (int r = 0; r < n; ++r)
    if (!gone.count(r)) v.push_back(r);
  return v;
}

/// Checks the shrunk communicator: its size and this rank's new number, then an all_reduce
/// (odd count), a broadcast from its last rank and an all_gather of the old ranks.
template <class Comm>
void check_shrunk(Comm& c, int old_rank, const std::vector<int>& alive) {
  const int m = static_cast<int>(alive.size());
  expect(c.valid(), "the shrunk communicator is valid");
  expect_eq(c.size(), m, "size after shrink");
  const int want_rank = static_cast<int>(std::find(alive.begin(), alive.end(), old_rank) - alive.begin());
  expect_eq(c.rank(), want_rank, "rank after shrink (old rank " + std::to_string(old_rank) + ")");
  std::vector<std::int64_t> v(1009);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = old_rank * 1000 + static_cast<std::int64_t>(i);
  c.all_reduce(std::span(v), chorus::ReduceOp::sum);
  std::int64_t base = 0;
  for (int r : alive) base += r * 1000;
  for (std::size_t i = 0; i < v.size(); ++i) expect_eq(v[i], base + m * static_cast<std::int64_t>(i), "all_reduce");
  std::vector<std::int32_t> b(17, c.rank() == m - 1 ? 4242 : -1);
  c.broadcast(std::span(b), m - 1);
  for (auto x : b) expect_eq(x, 4242, "broadcast");
  std::vector<std::int32_t> mine{old_rank}, all(static_cast<std::size_t>(m));
  c.all_gather(std::span<const std::int32_t>(mine), std::span(all));
  for (int i = 0; i < m; ++i) expect_eq(all[static_cast<std::size_t>(i)], alive[static_cast<std::size_t>(i)], "all_gather");
}

}  // namespace

// Every rank calls shrink with the same exclude list: the excluded get a communicator that is not
// valid, the others one of their own, renumbered in order. Also after a split.
TEST_CASE_TEMPLATE("shrink: ranks excluded on purpose", M, chorus::test::InprocThreads, chorus::test::TcpThreads) {
  chorus::test::run_world<M>(5, [](auto& comm, chorus::Store&) {
    const int r = comm.rank();
    const std::vector<int> out{1, 3};
    auto c = comm.shrink(out);
    if (r == 1 || r == 3) {
      expect(!c.valid(), "an excluded rank gets no communicator");
      return;
    }
    check_shrunk(c, r, survivors(5, {1, 3}));
    // A second shrink of the shrunk communicator, excluding its rank 0 (old rank 0).
    const int old = r;
    const std::vector<int> first{0};
    auto d = c.shrink(first);
    if (old == 0) {
      expect(!d.valid(), "excluded again");
      return;
    }
    expect_eq(d.size(), 2, "size after the second shrink");
    std::vector<int> v{old};
    d.all_reduce(std::span(v), chorus::ReduceOp::sum);
    expect_eq(v[0], 2 + 4, "all_reduce after two shrinks");
  });
}

TEST_CASE("shrink: after a split") {
  chorus::test::run_world<chorus::test::InprocThreads>(6, [](auto& comm, chorus::Store&) {
    const int r = comm.rank();
    auto half = comm.split(r % 2, r);  // evens: 0 2 4, odds: 1 3 5
    const std::vector<int> out{1};     // each half drops its second rank (2 and 3)
    auto c = half.shrink(out);
    if (half.rank() == 1) {
      expect(!c.valid(), "excluded");
      return;
    }
    const std::vector<int> alive = r % 2 == 0 ? std::vector<int>{0, 4} : std::vector<int>{1, 5};
    std::vector<int> v{r};
    c.all_reduce(std::span(v), chorus::ReduceOp::sum);
    expect_eq(v[0], alive[0] + alive[1], "all_reduce in the shrunk half");
    expect_eq(c.size(), 2, "size");
  });
}

// A rank that never calls shrink is left out once shrink_wait has passed.
TEST_CASE("shrink: a rank that does not join is left out after shrink_wait") {
  chorus::test::ThreadOptions t;
  t.timeout = 30s;
  chorus::test::run_threads(
      4,
      [](int rank, chorus::Options o) {
        o.shrink_wait = 500ms;
        auto comm = chorus::Communicator<chorus::inproc::Transport>::create(std::move(o));
        comm.barrier();
        if (rank == 2) return;  // gone silent
        auto c = comm.shrink();
        check_shrunk(c, rank, survivors(4, {2}));
      },
      t);
}

// A rank whose communicator the user aborted (its thread lives on) takes no part in a shrink: the
// others, sharing a store, leave it out at once rather than after shrink_wait (100 s here: the
// shrink returning well before it shows it was not waited out), and its own shrink() is refused.
TEST_CASE("shrink: a rank that called abort() is left out at once; its own shrink is refused") {
  chorus::test::ThreadOptions t;
  t.timeout = 30s;
  chorus::test::run_threads(
      4,
      [](int rank, chorus::Options o) {
        o.shrink_wait = 100s;
        auto store = o.store;
        auto comm = chorus::Communicator<chorus::inproc::Transport>::create(std::move(o));
        comm.barrier();
        if (rank == 1) {
          comm.abort();
          store->set("test/aborted", "1");
          chorus::test::expect_error(
              ErrorCode::invalid_argument, [&] { (void)comm.shrink(); }, "shrink after abort()");
          return;
        }
        store->wait({"test/aborted"}, 20s);
        const auto t0 = Clock::now();
        auto c = comm.shrink();
        expect(Clock::now() - t0 < 100s, "the aborted rank's shrink_wait was not waited out");
        check_shrunk(c, rank, survivors(4, {1}));
      },
      t);
}

// Processes: after a barrier one rank (rank 0 included: the lowest rank leads the agreement) or
// two kill themselves; the others see peer_failure in a loop of all_reduces, shrink and check
// the new communicator against the survivors' inputs.
TEST_CASE_TEMPLATE("shrink: survivors of SIGKILL go on", M, chorus::test::TcpProcesses, chorus::test::AutoProcesses) {
  std::set<int> victims;
  SUBCASE("rank 0 killed") { victims = {0}; }
  SUBCASE("ranks 1 and 2 killed") { victims = {1, 2}; }
  CAPTURE(victims.size());
  chorus::test::ProcessOptions p;
  p.comm_timeout = 60s;
  p.timeout = 120s;
  p.expect_killed = victims;
  chorus::test::run_processes(
      4,
      [&victims](int rank, chorus::Options o) {
        auto store = o.store;
        auto comm = chorus::Communicator<typename M::Transport>::create(std::move(o));
        comm.barrier();
        if (victims.count(rank)) std::raise(SIGKILL);
        // Until the failure shows (bounded by the communicator's timeout).
        bool failed = false;
        for (int i = 0; i < 100000 && !failed; ++i) {
          std::vector<float> v(4096, 1.0f);
          try {
            comm.all_reduce(std::span(v), chorus::ReduceOp::sum);
          } catch (const chorus::Error& e) {
            expect(e.code() == ErrorCode::peer_failure || e.code() == ErrorCode::aborted,
                   std::string("the failure shows as peer_failure: ") + e.what());
            failed = true;
          }
        }
        expect(failed, "the collectives failed after the kill");
        auto c = comm.shrink();
        check_shrunk(c, rank, survivors(4, victims));
      },
      p);
}

/// Members call grow() until it admits someone (every rank gets the same answer each time),
/// bounded by `limit`.
template <class Comm>
Comm grow_until_joined(Comm& c, std::chrono::milliseconds limit) {
  const auto t0 = Clock::now();
  for (;;) {
    if (auto g = c.grow()) return std::move(*g);
    expect(Clock::now() - t0 < limit, "nobody joined within the limit");
  }
}

// Three ranks as threads meet through a shared store; a fourth thread joins them through that
// store at a grow() and gets the next rank.
TEST_CASE("grow: a thread joins through the shared store") {
  chorus::test::ThreadOptions t;
  t.timeout = 30s;
  chorus::test::run_threads(
      4,
      [](int rank, chorus::Options o) {
        using Comm = chorus::Communicator<chorus::inproc::Transport>;
        if (rank == 3) {
          o.rank = -1;
          o.world_size = -1;
          auto c = Comm::join(std::move(o));
          expect_eq(c.rank(), 3, "the joiner's rank");
          check_shrunk(c, 3, survivors(4, {}));
          return;
        }
        o.world_size = 3;
        auto comm = Comm::create(std::move(o));
        expect(comm.join_address().empty(), "no join address with a shared store");
        auto c = grow_until_joined(comm, 20s);
        check_shrunk(c, rank, survivors(4, {}));
        std::vector<int> v{1};
        comm.all_reduce(std::span(v), chorus::ReduceOp::sum);  // the old one still works
        expect_eq(v[0], 3, "the old communicator after grow");
      },
      t);
}

// Processes: rank 1 of four is killed, the survivors shrink to three, and a replacement process
// joins them at rank 0's join_address(): four ranks again, checked.
TEST_CASE_TEMPLATE("grow: a replacement joins the survivors of a kill", M, chorus::test::TcpProcesses,
                   chorus::test::AutoProcesses) {
  chorus::test::ProcessOptions p;
  p.comm_timeout = 60s;
  p.timeout = 120s;
  p.expect_killed = {1};
  chorus::test::run_processes(
      5,
      [](int rank, chorus::Options o) {
        using Comm = chorus::Communicator<typename M::Transport>;
        auto store = o.store;
        if (rank == 4) {  // the replacement: joins at the address rank 0 publishes after the shrink
          chorus::Options j;
          j.timeout = o.timeout;
          j.init_method = store->get("test/join", 60s);
          auto c = Comm::join(std::move(j));
          expect_eq(c.rank(), 3, "the replacement's rank");
          check_shrunk(c, 4, std::vector<int>{0, 2, 3, 4});
          return;
        }
        o.world_size = 4;
        auto comm = Comm::create(std::move(o));
        comm.barrier();
        if (rank == 1) std::raise(SIGKILL);
        bool failed = false;
        for (int i = 0; i < 100000 && !failed; ++i) {
          std::vector<float> v(1024, 1.0f);
          try {
            comm.all_reduce(std::span(v), chorus::ReduceOp::sum);
          } catch (const chorus::Error&) {
            failed = true;
          }
        }
        expect(failed, "the collectives failed after the kill");
        auto shrunk = comm.shrink();
        if (shrunk.rank() == 0) {
          const std::string a = shrunk.join_address();
          expect(a.rfind("tcp://", 0) == 0, "join address " + a);
          store->set("test/join", a);
        }
        auto c = grow_until_joined(shrunk, 60s);
        check_shrunk(c, rank, std::vector<int>{0, 2, 3, 4});
      },
      p);
}

}  // namespace transport_test_shrink
