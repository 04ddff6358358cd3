// SPDX-License-Identifier: BSD-3-Clause
// Ranks that call different collectives, or the same one with different counts, dtypes, ops or
// roots, must all get chorus::Error with code mismatch, promptly (within 1 s; the timeout is 30 s,
// so an error that only comes from the timeout does not pass), with a message that names both
// calls. Over inproc, tcp and shm with ranks as threads, and over shm and the default transport
// (auto: shm on this host) with ranks as processes (support/modes.hpp); world sizes 2, 3 and 4;
// the last rank is the odd one out, after one matched collective (so the mismatch is not at
// sequence number 0).
//
// When a rank's part of the mismatched call only sends (a broadcast root, say), it may return
// before anyone has seen the mismatch: it must then get the error from its next call (a barrier
// here), still within the second.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <latch>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "chorus/communicator.hpp"
#include "support/forced.hpp"
#include "support/communicators.hpp"
#include "support/modes.hpp"
#include "support/spawn.hpp"

// This file's own names: the files of tests/collective/ are compiled together (unity build).
namespace collective_test_mismatch {

namespace {

using namespace std::chrono_literals;
using chorus::ReduceOp;
using Clock = std::chrono::steady_clock;

constexpr auto kPrompt = 1s;
constexpr auto kTimeout = 30s;
constexpr int kWorldSizes[] = {2, 3, 4};

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

/// What one rank ended with: its error, if any, how long it took, and the call that raised it.
struct Verdict {
  std::optional<chorus::Error> err;
  long long ms = 0;
  std::string from;
};

/// Runs body(comm, rank, verdict.from) on n ranks (threads or processes, as Mode says; one
/// communicator each, created with `algorithm`), timed from the communicator's creation, then
/// judge(rank, verdict) on each rank. The communicators live until every rank has its verdict
/// (a latch between threads, the store between processes); a rank that throws, even from
/// create(), still arrives, so no rank waits on another for ever.
template <class Mode, class Body, class Judge>
void run_ranks(int n, std::chrono::seconds timeout, const std::string& algorithm, const Body& body,
               const Judge& judge) {
  using Comm = chorus::Communicator<typename Mode::Transport>;
  std::latch done(n);
  // Body and verdict of one rank; `arrived` is called once the verdict is in, `wait_all` then
  // waits for the other ranks'.
  auto rank_main = [&](int rank, chorus::Options o, const auto& arrived, const auto& wait_all) {
    Verdict v;
    {
      struct Arrive {
        const std::remove_cvref_t<decltype(arrived)>& f;
        ~Arrive() { f(); }
      };
      std::optional<Arrive> arrive(std::in_place, arrived);
      o.algorithm = chorus::test::forced_where_it_applies(algorithm);
      auto comm = Comm::create(std::move(o));
      const auto t0 = Clock::now();
      try {
        body(comm, rank, v.from);
      } catch (const chorus::Error& e) {
        v.err = e;
      }
      v.ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
      arrive.reset();
      wait_all();
    }
    judge(rank, v);
  };
  if constexpr (Mode::kProcesses) {
    chorus::test::ProcessOptions popt;
    popt.comm_timeout = timeout;
    popt.timeout = timeout + std::chrono::seconds(30);
    chorus::test::run_processes(
        n,
        [&](int rank, chorus::Options o) {
          auto store = o.store;
          std::vector<std::string> all;
          for (int r = 0; r < n; ++r) all.push_back("test/verdict/" + std::to_string(r));
          rank_main(
              rank, std::move(o), [&] { store->set(all[static_cast<std::size_t>(rank)], "1"); },
              [&] { store->wait(all, timeout); });
        },
        popt);
  } else {
    chorus::test::ThreadOptions topt;
    topt.timeout = timeout;
    chorus::test::run_threads(
        n,
        [&](int rank, chorus::Options o) {
          rank_main(rank, std::move(o), [&] { done.count_down(); }, [&] { done.wait(); });
        },
        topt);
  }
}

/// Throws unless `v` is a mismatch that surfaced within kPrompt with every one of `parts` in its
/// message. `who` starts each failure's text.
void expect_prompt_mismatch(const std::string& who, const Verdict& v, std::initializer_list<std::string> parts) {
  const std::string from = " (from " + v.from + ")";
  chorus::test::expect(v.err.has_value(), who + "no error" + from);
  const std::string msg = v.err->what();
  chorus::test::expect(v.err->code() == chorus::ErrorCode::mismatch, who + "expected a mismatch error, got: " + msg +
                                                                         from + ", after " + std::to_string(v.ms) + " ms");
  chorus::test::expect(v.ms < std::chrono::duration_cast<std::chrono::milliseconds>(kPrompt).count(),
                       who + "the mismatch took " + std::to_string(v.ms) + " ms to surface" + from + ": " + msg);
  for (const auto& part : parts)
    chorus::test::expect(contains(msg, part), who + "the message should name '" + part + "': " + msg);
}

/// Runs `call(comm, odd)` on every rank of a world of n (odd: the last rank) and checks that
/// every rank gets mismatch within kPrompt, from the call or from a barrier right after it, with
/// a message containing both `a` (what the others called) and `b` (what the odd rank called).
template <class Mode, class Call>
void expect_mismatch(int n, const Call& call, const std::string& a, const std::string& b,
                     const std::string& algorithm) {
  const std::string where = std::string("(") + std::string(Mode::Transport::kName) +
                            (Mode::kProcesses ? " processes" : " threads") + ", world " + std::to_string(n) +
                            (algorithm.empty() ? "" : ", " + algorithm) + ")";
  run_ranks<Mode>(
      n, kTimeout, algorithm,
      [&](auto& comm, int rank, std::string& from) {
        // One matched collective first: an all_gather, which has one algorithm whatever is forced
        // (a forced chain would refuse an all_reduce). A rank still finishing it when the others
        // have already met the mismatch may get the error here (the communicator is aborted):
        // that counts.
        from = "the matched all_gather before the mismatched call";
        std::vector<std::int32_t> warm(static_cast<std::size_t>(n), -1);
        const std::int32_t mine = rank;
        comm.all_gather(std::span<const std::int32_t>(&mine, 1), std::span<std::int32_t>(warm));
        chorus::test::expect(warm[static_cast<std::size_t>(n - 1)] == n - 1,
                             "the matched all_gather before the mismatch " + where);
        from = "the mismatched call";
        call(comm, rank == n - 1);
        from = "the barrier after the mismatched call (which returned)";
        comm.barrier();
      },
      [&](int rank, const Verdict& v) {
        expect_prompt_mismatch("rank " + std::to_string(rank) + (rank == n - 1 ? " (the odd one) " : " ") + where + ": ",
                               v, {a, b});
      });
}

/// Every world size (and, for some, forced algorithms as well as the default).
template <class Mode, class Call>
void expect_mismatch_everywhere(const Call& call, const std::string& a, const std::string& b,
                                std::vector<std::string> algorithms = {""}) {
  for (const auto& algo : algorithms)
    for (int n : kWorldSizes) {
      CAPTURE(n);
      CAPTURE(algo);
      expect_mismatch<Mode>(n, call, a, b, algo);
    }
}

using chorus::test::AutoProcesses;
using chorus::test::InprocThreads;
using chorus::test::ShmProcesses;
using chorus::test::ShmThreads;
using chorus::test::TcpThreads;

}  // namespace

// Every case here spends most of its time waiting (about 0.3 s for a mismatch to surface where a
// rank only waits on a peer that called something else; 88 cases, 34 s of wall and 7 CPU-s in
// all, release build, one at a time): the doctest suite "waits", which gives them the ctest label
// `waits` (cmake/ChorusDoctestAddTests.cmake), run beside the other tests (scripts/run-tests).
TEST_SUITE_BEGIN("waits");

// ---- different collectives ----------------------------------------------------------------------

TEST_CASE_TEMPLATE("mismatch: all_reduce vs broadcast", T, InprocThreads, TcpThreads, ShmThreads, ShmProcesses, AutoProcesses) {
  expect_mismatch_everywhere<T>(
      [](auto& c, bool odd) {
        std::vector<float> v(16, 1.0f);
        if (odd)
          c.broadcast(std::span<float>(v), 0);
        else
          c.all_reduce(std::span<float>(v), ReduceOp::sum);
      },
      "all_reduce", "broadcast", {"", "tree"});  // tree: the one algorithm both have
}

TEST_CASE_TEMPLATE("mismatch: all_reduce vs all_gather", T, InprocThreads, TcpThreads, ShmThreads, ShmProcesses, AutoProcesses) {
  expect_mismatch_everywhere<T>(
      [](auto& c, bool odd) {
        std::vector<float> v(16, 1.0f), out(16 * c.size());
        if (odd)
          c.all_gather(std::span<const float>(v), std::span<float>(out));
        else
          c.all_reduce(std::span<float>(v), ReduceOp::sum);
      },
      "all_reduce", "all_gather", {"", "ring"});
}

TEST_CASE_TEMPLATE("mismatch: barrier vs all_reduce", T, InprocThreads, TcpThreads, ShmThreads, ShmProcesses, AutoProcesses) {
  expect_mismatch_everywhere<T>(
      [](auto& c, bool odd) {
        std::vector<float> v(16, 1.0f);
        if (odd)
          c.all_reduce(std::span<float>(v), ReduceOp::sum);
        else
          c.barrier();
      },
      "barrier", "all_reduce");
}

TEST_CASE_TEMPLATE("mismatch: reduce_scatter vs all_to_all", T, InprocThreads, TcpThreads, ShmThreads, ShmProcesses, AutoProcesses) {
  expect_mismatch_everywhere<T>(
      [](auto& c, bool odd) {
        std::vector<std::int32_t> in(4 * c.size(), 1), out(4 * c.size());
        if (odd)
          c.all_to_all(std::span<const std::int32_t>(in), std::span<std::int32_t>(out));
        else
          c.reduce_scatter(std::span<const std::int32_t>(in), std::span<std::int32_t>(out).first(4),
                           ReduceOp::sum);
      },
      "reduce_scatter", "all_to_all");
}

// ---- same collective, different parameters ---------------------------------------------------

TEST_CASE_TEMPLATE("mismatch: all_reduce counts 10 vs 20", T, InprocThreads, TcpThreads, ShmThreads, ShmProcesses, AutoProcesses) {
  expect_mismatch_everywhere<T>(
      [](auto& c, bool odd) {
        std::vector<float> v(odd ? 20 : 10, 1.0f);
        c.all_reduce(std::span<float>(v), ReduceOp::sum);
      },
      "count 10", "count 20", {"", "ring", "tree", "recursive_doubling"});
}

// One side's first messages are small enough to carry the descriptor in front of their data,
// the other's are not (a separate descriptor precedes them; above the links' eager size too).
TEST_CASE_TEMPLATE("mismatch: all_reduce counts 10 vs 100000 (stamped vs separate descriptor)", T, InprocThreads, TcpThreads, ShmThreads, ShmProcesses, AutoProcesses) {
  expect_mismatch_everywhere<T>(
      [](auto& c, bool odd) {
        std::vector<float> v(odd ? 100000 : 10, 1.0f);
        c.all_reduce(std::span<float>(v), ReduceOp::sum);
      },
      "count 10", "count 100000", {"", "ring", "tree", "recursive_doubling"});
}

TEST_CASE_TEMPLATE("mismatch: broadcast counts 7 vs 100000 (stamped vs separate descriptor)", T, InprocThreads, TcpThreads, ShmThreads, ShmProcesses, AutoProcesses) {
  expect_mismatch_everywhere<T>(
      [](auto& c, bool odd) {
        std::vector<std::uint8_t> v(odd ? 100000 : 7, 3);
        c.broadcast(std::span<std::uint8_t>(v), 0);
      },
      "count 7", "count 100000", {"", "chain"});
}

TEST_CASE_TEMPLATE("mismatch: all_gather counts 3 vs 5", T, InprocThreads, TcpThreads, ShmThreads, ShmProcesses, AutoProcesses) {
  expect_mismatch_everywhere<T>(
      [](auto& c, bool odd) {
        const std::size_t k = odd ? 5 : 3;
        std::vector<double> in(k, 2.0), out(k * c.size());
        c.all_gather(std::span<const double>(in), std::span<double>(out));
      },
      "count 3", "count 5");
}

TEST_CASE_TEMPLATE("mismatch: broadcast counts 100 vs 7", T, InprocThreads, TcpThreads, ShmThreads, ShmProcesses, AutoProcesses) {
  expect_mismatch_everywhere<T>(
      [](auto& c, bool odd) {
        std::vector<std::uint8_t> v(odd ? 7 : 100, 3);
        c.broadcast(std::span<std::uint8_t>(v), 0);
      },
      "count 100", "count 7");
}

TEST_CASE_TEMPLATE("mismatch: all_reduce float32 vs int32 (same bytes)", T, InprocThreads, TcpThreads, ShmThreads, ShmProcesses, AutoProcesses) {
  expect_mismatch_everywhere<T>(
      [](auto& c, bool odd) {
        if (odd) {
          std::vector<std::int32_t> v(16, 1);
          c.all_reduce(std::span<std::int32_t>(v), ReduceOp::sum);
        } else {
          std::vector<float> v(16, 1.0f);
          c.all_reduce(std::span<float>(v), ReduceOp::sum);
        }
      },
      "float32", "int32", {"", "ring"});
}

TEST_CASE_TEMPLATE("mismatch: all_reduce float32 vs bfloat16", T, InprocThreads, TcpThreads, ShmThreads, ShmProcesses, AutoProcesses) {
  expect_mismatch_everywhere<T>(
      [](auto& c, bool odd) {
        if (odd) {
          std::vector<chorus::bfloat16> v(16, chorus::bfloat16(1.0f));
          c.all_reduce(std::span<chorus::bfloat16>(v), ReduceOp::sum);
        } else {
          std::vector<float> v(16, 1.0f);
          c.all_reduce(std::span<float>(v), ReduceOp::sum);
        }
      },
      "float32", "bfloat16");
}

TEST_CASE_TEMPLATE("mismatch: all_reduce sum vs max", T, InprocThreads, TcpThreads, ShmThreads, ShmProcesses, AutoProcesses) {
  expect_mismatch_everywhere<T>(
      [](auto& c, bool odd) {
        std::vector<float> v(16, 1.0f);
        c.all_reduce(std::span<float>(v), odd ? ReduceOp::max : ReduceOp::sum);
      },
      "sum", "max", {"", "ring", "tree", "recursive_doubling"});
}

TEST_CASE_TEMPLATE("mismatch: reduce_scatter sum vs prod", T, InprocThreads, TcpThreads, ShmThreads, ShmProcesses, AutoProcesses) {
  expect_mismatch_everywhere<T>(
      [](auto& c, bool odd) {
        std::vector<std::int64_t> in(3 * c.size(), 2), out(3);
        c.reduce_scatter(std::span<const std::int64_t>(in), std::span<std::int64_t>(out),
                         odd ? ReduceOp::prod : ReduceOp::sum);
      },
      "sum", "prod");
}

// ---- different roots -------------------------------------------------------------------------

TEST_CASE_TEMPLATE("mismatch: broadcast roots 0 vs 1", T, InprocThreads, TcpThreads, ShmThreads, ShmProcesses, AutoProcesses) {
  expect_mismatch_everywhere<T>(
      [](auto& c, bool odd) {
        std::vector<float> v(16, 1.0f);
        c.broadcast(std::span<float>(v), odd ? 1 : 0);
      },
      "root 0", "root 1");
}

TEST_CASE_TEMPLATE("mismatch: reduce roots 0 vs 1", T, InprocThreads, TcpThreads, ShmThreads, ShmProcesses, AutoProcesses) {
  expect_mismatch_everywhere<T>(
      [](auto& c, bool odd) {
        const int root = odd ? 1 : 0;
        std::vector<float> in(16, 1.0f), out(16);
        c.reduce(std::span<const float>(in), std::span<float>(out), ReduceOp::sum, root);
      },
      "root 0", "root 1");
}

TEST_CASE_TEMPLATE("mismatch: gather roots 0 vs 1", T, InprocThreads, TcpThreads, ShmThreads, ShmProcesses, AutoProcesses) {
  expect_mismatch_everywhere<T>(
      [](auto& c, bool odd) {
        const int root = odd ? 1 : 0;
        std::vector<float> in(4, 1.0f), out(c.rank() == root ? 4 * c.size() : 0);
        c.gather(std::span<const float>(in), std::span<float>(out), root);
      },
      "root 0", "root 1");
}

TEST_CASE_TEMPLATE("mismatch: scatter roots 0 vs 1", T, InprocThreads, TcpThreads, ShmThreads, ShmProcesses, AutoProcesses) {
  expect_mismatch_everywhere<T>(
      [](auto& c, bool odd) {
        const int root = odd ? 1 : 0;
        std::vector<float> in(c.rank() == root ? 4 * c.size() : 0, 1.0f), out(4);
        c.scatter(std::span<const float>(in), std::span<float>(out), root);
      },
      "root 0", "root 1");
}

// ---- how the error travels -------------------------------------------------------------------
// The cases above cannot choose the order in which ranks find a mismatch and tell each other.
// These two build the orders that once left a rank waiting (rank 2 of 'all_gather counts 3 vs 5',
// world 4, timed out while the others got mismatch): a notice that reaches only some ranks, and a
// rank that learns of the mismatch only from a failed message. In both, a rank that never talks
// to the one that found the mismatch must still get it within kPrompt.

namespace {

constexpr auto kShortTimeout = 5s;  // a rank left waiting fails by its timeout, well after kPrompt

/// Runs body(comm, rank) on n ranks; every rank but rank 0 must get mismatch within kPrompt with
/// a message containing `text`.
template <class Mode, class Body>
void expect_everyone_told(int n, const std::string& text, const Body& body) {
  run_ranks<Mode>(
      n, kShortTimeout, "",
      [&](auto& comm, int rank, std::string& from) {
        from = "the test's calls";
        body(comm, rank);
      },
      [&](int rank, const Verdict& v) {
        if (rank == 0) return;
        expect_prompt_mismatch("rank " + std::to_string(rank) + " (" + std::string(Mode::Transport::kName) + ", world " +
                                   std::to_string(n) + "): ",
                               v, {text});
      });
}

}  // namespace

// Rank 0 tells only rank 1 (as a rank does whose other notices an abort cut off); ranks 1.. wait
// on each other, never on rank 0. Rank 1 must tell the others before it aborts: over tcp its
// abort leaves the connections open (the peers are meant to learn from the notices), so nothing
// else would wake them.
TEST_CASE_TEMPLATE("mismatch: a notice that reaches one rank reaches every rank", T, InprocThreads, TcpThreads) {
  const std::string text = "rank 0: test notice (all_reduce vs broadcast)";
  for (int n : {3, 4}) {
    CAPTURE(n);
    expect_everyone_told<T>(n, text, [&text](auto& comm, int rank) {
      if (rank == 0) {
        const auto notice = chorus::mismatch::ErrorNotice::of(chorus::ErrorCode::mismatch, text);
        const chorus::Tag tag = chorus::mismatch::error_tag(0);  // the world communicator's (context 0)
        comm.transport().link(1).isend(chorus::ConstBytes{reinterpret_cast<const std::byte*>(&notice), sizeof notice}, tag).wait();
        return;
      }
      // Ranks 1..n-1 in a ring of receives that nobody sends: only the notice ends them.
      const int n = comm.size();
      std::vector<std::byte> buf(8);
      comm.recv(std::span<std::byte>(buf), rank == n - 1 ? 1 : rank + 1, 7);
    });
  }
}

// Rank 0 aborts with mismatch without telling anyone, as a rank that found a mismatch looks to
// its inproc peers once a concurrent notice has cut off its own. Ranks 1..3 run a ring
// all_gather: rank 1 fails on its receive from rank 0, and rank 2, which only waits on rank 1,
// must hear of it from rank 1.
TEST_CASE("mismatch: a rank whose message fails with mismatch tells the others") {
  expect_everyone_told<InprocThreads>(4, "rank 0 found", [](auto& comm, int rank) {
    if (rank == 0) {
      comm.transport().abort(chorus::Error(chorus::ErrorCode::mismatch, "rank 0 found a mismatch (test)"));
      return;
    }
    std::vector<double> in(3, 2.0), out(3 * static_cast<std::size_t>(comm.size()));
    comm.all_gather(std::span<const double>(in), std::span<double>(out));
  });
}

TEST_SUITE_END();

}  // namespace collective_test_mismatch
