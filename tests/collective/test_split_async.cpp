// SPDX-License-Identifier: BSD-3-Clause
// Sub-communicators (split) and collectives in flight at once (*_async), over inproc and tcp with
// ranks as threads:
//   - the two halves of a split (color = rank % 2) run different collectives at the same time;
//   - key = -rank reverses the order: sub.rank(), and a broadcast from sub-rank 0 comes from the
//     last parent rank;
//   - a split of a split;
//   - ranks that join no group (kSplitNoColor) take part in the call and get a communicator that
//     is not valid(), whose calls throw invalid_argument; later splits still match up;
//   - a sub-communicator and its parent used at the same time from two threads of each rank, and
//     from one thread with async calls on both;
//   - subset (MPI_Comm_create_group): called by the members only, numbered in the order given,
//     overlapping subsets at once, no new socket; bad lists are invalid_argument;
//   - several collectives in flight on one communicator, waited in reverse order: they run (and
//     complete) in posting order; a blocking call after async ones.
// Every result is checked bit for bit against support/fill.hpp's reference.
#include <doctest/doctest.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <utility>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "chorus/communicator.hpp"
#include "support/communicators.hpp"
#include "chorus/transport/inproc/transport.hpp"
#include "chorus/transport/tcp/transport.hpp"
#include "support/fill.hpp"
#include "support/spawn.hpp"

// This file's own names: the files of tests/collective/ are compiled together (unity build).
namespace collective_test_split_async {

namespace {

using namespace std::chrono_literals;
using chorus::ReduceOp;
using chorus::test::check_equal;
using chorus::test::expect;
using chorus::test::expect_eq;
using chorus::test::expected_all_reduce;
using chorus::test::input;
using chorus::test::pattern;
using chorus::test::seed_of;

using Inproc = chorus::inproc::Transport;
using Tcp = chorus::tcp::Transport;

constexpr auto kTimeout = 30s;

template <class Transport, class Body>
void run_world(int n, const Body& body) {
  chorus::test::ThreadOptions topt;
  topt.timeout = kTimeout;
  chorus::test::run_threads(
      n,
      [&](int rank, chorus::Options o) {
        o.chunk_bytes = 256;  // several slices even for a few hundred floats
        auto comm = chorus::Communicator<Transport>::create(std::move(o));
        body(rank, comm);
      },
      topt);
}

// ---- checked collectives: fill, call, compare (on any communicator) ------------------------

/// all_reduce of `count` elements of T with op; `tag` makes the seed unique per call.
template <class T, class C>
void checked_all_reduce(C& c, std::uint64_t tag, std::size_t count, ReduceOp op, const std::string& what) {
  const std::uint64_t seed = seed_of(tag, count, op);
  std::vector<T> v(count);
  for (std::size_t i = 0; i < count; ++i) v[i] = input<T>(seed, c.size(), c.rank(), i, op);
  c.all_reduce(std::span<T>(v), op);
  check_equal<T>(
      v, [&](std::size_t i) { return expected_all_reduce<T>(seed, c.size(), i, op); }, what, c.rank());
}

template <class T, class C>
void checked_all_gather(C& c, std::uint64_t tag, std::size_t count, const std::string& what) {
  const std::uint64_t seed = seed_of(tag, count, 0xA11);
  std::vector<T> in(count), out(count * c.size());
  for (std::size_t i = 0; i < count; ++i) in[i] = pattern<T>(seed, c.rank(), i);
  c.all_gather(std::span<const T>(in), std::span<T>(out));
  check_equal<T>(
      out, [&](std::size_t j) { return pattern<T>(seed, static_cast<int>(j / count), j % count); }, what,
      c.rank());
}

/// The parent ranks of a communicator's members, in its rank order (an all_gather).
template <class C>
std::vector<std::int32_t> members(C& c, int parent_rank) {
  std::vector<std::int32_t> mine = {parent_rank}, all(c.size());
  c.all_gather(std::span<const std::int32_t>(mine), std::span<std::int32_t>(all));
  return all;
}

/// Runs f on a second thread and joins it; rethrows what it threw.
template <class F>
std::thread start(F f, std::exception_ptr& error) {
  return std::thread([f = std::move(f), &error]() mutable {
    try {
      f();
    } catch (...) {
      error = std::current_exception();
    }
  });
}

}  // namespace

// ---- split ----------------------------------------------------------------------------------

TEST_CASE_TEMPLATE("split: the halves run different collectives at the same time", T, Inproc, Tcp) {
  for (int n : {2, 4, 5}) {
    CAPTURE(n);
    run_world<T>(n, [n](int rank, auto& comm) {
      auto sub = comm.split(rank % 2, rank);
      const int expect_size = rank % 2 == 0 ? (n + 1) / 2 : n / 2;
      expect_eq(sub.size(), expect_size, "sub.size()");
      expect_eq(sub.rank(), rank / 2, "sub.rank()");
      const std::vector<std::int32_t> m = members(sub, rank);
      for (int k = 0; k < sub.size(); ++k) expect_eq(m[k], 2 * k + rank % 2, "member " + std::to_string(k));
      // Even ranks all_reduce while odd ranks all_gather, for a while, on the same links.
      for (std::uint64_t round = 0; round < 30; ++round) {
        const std::size_t count = 1 + (round * 37) % 700;
        const std::string what = "round " + std::to_string(round) + " color " + std::to_string(rank % 2);
        if (rank % 2 == 0)
          checked_all_reduce<float>(sub, round, count, ReduceOp::sum, "all_reduce " + what);
        else
          checked_all_gather<chorus::bfloat16>(sub, round, count, "all_gather " + what);
      }
      // The parent still works, and is not confused by what the groups did.
      checked_all_reduce<std::int32_t>(comm, 99, 333, ReduceOp::max, "parent all_reduce after the split");
    });
  }
}

TEST_CASE_TEMPLATE("split: key = -rank reverses the order", T, Inproc, Tcp) {
  for (int n : {2, 3, 5}) {
    CAPTURE(n);
    run_world<T>(n, [n](int rank, auto& comm) {
      auto sub = comm.split(0, -rank);
      expect_eq(sub.size(), n, "sub.size()");
      expect_eq(sub.rank(), n - 1 - rank, "sub.rank()");
      // A broadcast from sub-rank 0 comes from parent rank n - 1.
      std::vector<std::int64_t> v(17, -1);
      if (sub.rank() == 0)
        for (std::size_t i = 0; i < v.size(); ++i) v[i] = 1000 * rank + static_cast<std::int64_t>(i);
      sub.broadcast(std::span<std::int64_t>(v), 0);
      for (std::size_t i = 0; i < v.size(); ++i)
        expect_eq(v[i], 1000 * (n - 1) + static_cast<std::int64_t>(i),
                  "broadcast from sub-rank 0, element " + std::to_string(i));
      // Sub-rank order everywhere: all_gather lists the parent ranks reversed.
      const std::vector<std::int32_t> m = members(sub, rank);
      for (int k = 0; k < n; ++k) expect_eq(m[k], n - 1 - k, "member " + std::to_string(k));
      // Equal keys: ordered by parent rank.
      auto same = comm.split(0, 7);
      expect_eq(same.rank(), rank, "rank with equal keys");
      // And a reduction with a sub-rank-dependent input still matches the reference.
      checked_all_reduce<double>(sub, 5, 100, ReduceOp::avg, "all_reduce on the reversed communicator");
    });
  }
}

/// The sockets this process holds (/proc/self/fd entries that are sockets).
int sockets_open() {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    const auto target = std::filesystem::read_symlink(e.path(), ec);
    if (!ec && target.string().rfind("socket:", 0) == 0) ++n;
  }
  return n;
}

TEST_CASE_TEMPLATE("subset: only the members call it, in the order given; overlapping subsets; no new socket", T,
                   Inproc, Tcp) {
  run_world<T>(5, [](int rank, auto& comm) {
    comm.barrier();
    const int before = rank == 0 ? sockets_open() : 0;
    comm.barrier();
    // Ranks 4, 1, 2 make one communicator (4 first); ranks 0 and 3 another, at the same time.
    const std::vector<int> a = {4, 1, 2}, b = {3, 0}, c = {1, 2};
    const std::vector<int>& mine = rank == 0 || rank == 3 ? b : a;
    auto sub = comm.subset(mine);
    expect_eq(sub.size(), static_cast<int>(mine.size()), "sub.size()");
    const std::vector<std::int32_t> m = members(sub, rank);
    for (std::size_t k = 0; k < mine.size(); ++k) expect_eq(m[k], mine[k], "member " + std::to_string(k));
    for (std::uint64_t round = 0; round < 5; ++round) {
      checked_all_reduce<float>(sub, round, 1 + round * 97, ReduceOp::sum, "subset all_reduce");
      checked_all_gather<std::int64_t>(sub, round, 13, "subset all_gather");
    }
    // {1, 2} overlaps {4, 1, 2}; made twice (each its own context).
    if (rank == 1 || rank == 2) {
      auto pair = comm.subset(c);
      auto again = comm.subset(c);
      expect_eq(pair.rank(), rank - 1, "pair.rank()");
      checked_all_reduce<std::int32_t>(pair, 7, 100, ReduceOp::max, "pair all_reduce");
      checked_all_reduce<std::int32_t>(again, 8, 100, ReduceOp::min, "second pair all_reduce");
    }
    checked_all_reduce<double>(sub, 9, 50, ReduceOp::avg, "the first subsets after the pairs");
    comm.barrier();
    if (rank == 0) expect_eq(sockets_open(), before, "sockets after five subsets (their links are the parent's)");
    checked_all_reduce<float>(comm, 99, 333, ReduceOp::sum, "parent all_reduce after the subsets");
  });
}

TEST_CASE_TEMPLATE("subset: an empty list, a rank twice or out of range, a list without the caller: invalid_argument",
                   T, Inproc, Tcp) {
  run_world<T>(3, [](int rank, auto& comm) {
    using V = std::vector<int>;
    for (const auto& [list, why] : {std::pair{V{}, "empty"}, std::pair{V{0, 1, 1}, "twice"},
                                    std::pair{V{0, 3}, "not a rank"}, std::pair{V{(rank + 1) % 3}, "not in the list"}}) {
      const auto e = chorus::test::expect_error(
          chorus::ErrorCode::invalid_argument, [&] { (void)comm.subset(list); }, why);
      expect(std::string(e.what()).find(why) != std::string::npos, std::string("the error says why: ") + e.what());
    }
    checked_all_reduce<float>(comm, 1, 10, ReduceOp::sum, "all_reduce after the refused subsets");
  });
}

TEST_CASE_TEMPLATE("split: a split of a split", T, Inproc, Tcp) {
  run_world<T>(8, [](int rank, auto& comm) {
    auto half = comm.split(rank % 2, rank);  // {0,2,4,6}, {1,3,5,7}
    expect_eq(half.size(), 4, "half.size()");
    auto quarter = half.split(half.rank() / 2, -half.rank());  // {2,0}, {6,4}, {3,1}, {7,5}
    expect_eq(quarter.size(), 2, "quarter.size()");
    expect_eq(quarter.rank(), 1 - half.rank() % 2, "quarter.rank()");
    const std::vector<std::int32_t> m = members(quarter, rank);
    const int base = (rank % 2) + 4 * (half.rank() / 2);  // the pair's lower parent rank
    expect_eq(m[0], base + 2, "quarter member 0");
    expect_eq(m[1], base, "quarter member 1");
    // All three levels in turn, each checked.
    for (std::uint64_t round = 0; round < 5; ++round) {
      checked_all_reduce<float>(quarter, round, 129, ReduceOp::sum, "quarter all_reduce");
      checked_all_reduce<std::int64_t>(half, round, 257, ReduceOp::prod, "half all_reduce");
      checked_all_gather<std::uint8_t>(comm, round, 31, "world all_gather");
    }
  });
}

TEST_CASE_TEMPLATE("split: a negative color other than kSplitNoColor is invalid_argument and the communicator goes on",
                   T, Inproc, Tcp) {
  static_assert(chorus::kSplitNoColor == -1);  // as NCCL_SPLIT_NOCOLOR
  run_world<T>(3, [](int, auto& comm) {
    chorus::test::expect_error(
        chorus::ErrorCode::invalid_argument, [&] { (void)comm.split(-2, 0); }, "split(-2, 0)");
    checked_all_reduce<float>(comm, 1, 10, ReduceOp::sum, "all_reduce after the failed split");
  });
}

TEST_CASE_TEMPLATE("split: ranks with kSplitNoColor join no group and get a communicator that is not valid", T,
                   Inproc, Tcp) {
  run_world<T>(5, [](int rank, auto& comm) {
    // Ranks 1 and 3 join no group; 0, 2 and 4 form one, in reverse order.
    const bool none = rank == 1 || rank == 3;
    auto sub = comm.split(none ? chorus::kSplitNoColor : 0, -rank);
    expect_eq(sub.valid(), !none, "sub.valid()");
    if (none) {
      using chorus::ErrorCode;
      auto e = chorus::test::expect_error(ErrorCode::invalid_argument, [&] { (void)sub.rank(); }, "rank() on no group");
      expect(std::string(e.what()).find("kSplitNoColor") != std::string::npos, e.what());
      chorus::test::expect_error(ErrorCode::invalid_argument, [&] { (void)sub.size(); }, "size() on no group");
      chorus::test::expect_error(ErrorCode::invalid_argument, [&] { sub.barrier(); }, "barrier() on no group");
      std::vector<float> v(8, 1.0f);
      chorus::test::expect_error(ErrorCode::invalid_argument, [&] { sub.all_reduce(std::span<float>(v), ReduceOp::sum); },
                                 "all_reduce on no group");
      chorus::test::expect_error(ErrorCode::invalid_argument, [&] { (void)sub.isend(v, 0, 0); }, "isend on no group");
      chorus::test::expect_error(ErrorCode::invalid_argument, [&] { (void)sub.split(0, 0); }, "split on no group");
      sub.finalize();  // nothing to wait for
      sub.abort();     // nothing to abort
    } else {
      expect_eq(sub.size(), 3, "sub.size()");
      expect_eq(sub.rank(), (4 - rank) / 2, "sub.rank()");
      const std::vector<std::int32_t> m = members(sub, rank);
      for (int k = 0; k < 3; ++k) expect_eq(m[k], 4 - 2 * k, "member " + std::to_string(k));
      checked_all_reduce<float>(sub, 7, 301, ReduceOp::sum, "all_reduce on the group");
    }
    // Every rank in no group: all get one that is not valid.
    auto nobody = comm.split(chorus::kSplitNoColor, rank);
    expect(!nobody.valid(), "every rank with kSplitNoColor");
    // Later splits still pair up (the ranks in no group counted the splits too), and the parent works.
    auto all = comm.split(0, rank);
    expect_eq(all.size(), 5, "all.size() after splits with kSplitNoColor");
    checked_all_gather<std::int32_t>(all, 8, 13, "all_gather after splits with kSplitNoColor");
    checked_all_reduce<double>(comm, 9, 57, ReduceOp::max, "parent all_reduce after the splits");
  });
}

TEST_CASE_TEMPLATE("split: parent and sub-communicator used at the same time from two threads", T, Inproc,
                   Tcp) {
  run_world<T>(4, [](int rank, auto& comm) {
    auto sub = comm.split(rank % 2, rank);
    std::exception_ptr sub_error;
    // A second thread of this rank drives the sub-communicator; this one drives the parent.
    std::thread t = start(
        [&] {
          for (std::uint64_t round = 0; round < 40; ++round) {
            checked_all_reduce<double>(sub, round, 1 + round * 13, ReduceOp::sum, "sub all_reduce");
            checked_all_gather<std::int32_t>(sub, round, 1 + round * 7, "sub all_gather");
          }
        },
        sub_error);
    std::exception_ptr parent_error;
    try {
      for (std::uint64_t round = 0; round < 40; ++round) {
        checked_all_reduce<float>(comm, 1000 + round, 1 + round * 11, ReduceOp::max, "parent all_reduce");
        comm.barrier();
      }
    } catch (...) {
      parent_error = std::current_exception();
    }
    t.join();
    if (parent_error) std::rethrow_exception(parent_error);
    if (sub_error) std::rethrow_exception(sub_error);
  });
}

TEST_CASE_TEMPLATE("split: async calls on the parent and the sub-communicator at once", T, Inproc, Tcp) {
  run_world<T>(4, [](int rank, auto& comm) {
    auto sub = comm.split(rank / 2, rank);  // {0,1}, {2,3}
    const std::size_t n = (1 << 14) + 3;
    const std::uint64_t s1 = seed_of(1), s2 = seed_of(2);
    std::vector<float> a(n);
    for (std::size_t i = 0; i < n; ++i) a[i] = input<float>(s1, comm.size(), comm.rank(), i, ReduceOp::sum);
    std::vector<std::int64_t> b(n), out(n * sub.size());
    for (std::size_t i = 0; i < n; ++i) b[i] = pattern<std::int64_t>(s2, sub.rank(), i);
    chorus::Request ra = comm.all_reduce_async(std::span<float>(a), ReduceOp::sum);
    chorus::Request rb = sub.all_gather_async(std::span<const std::int64_t>(b), std::span<std::int64_t>(out));
    rb.wait();
    ra.wait();
    check_equal<float>(
        a, [&](std::size_t i) { return expected_all_reduce<float>(s1, comm.size(), i, ReduceOp::sum); },
        "parent all_reduce_async", rank);
    check_equal<std::int64_t>(
        out, [&](std::size_t j) { return pattern<std::int64_t>(s2, static_cast<int>(j / n), j % n); },
        "sub all_gather_async", rank);
  });
}

// ---- async on one communicator ---------------------------------------------------------------

TEST_CASE_TEMPLATE("async: all_reduce then all_gather in flight waited in reverse order", T, Inproc, Tcp) {
  for (int world : {1, 2, 3, 4}) {
    CAPTURE(world);
    run_world<T>(world, [](int rank, auto& comm) {
      for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{1000}, (std::size_t{1} << 16) + 3}) {
        const std::uint64_t s1 = seed_of(n, 1), s2 = seed_of(n, 2);
        std::vector<double> a(n);
        for (std::size_t i = 0; i < n; ++i) a[i] = input<double>(s1, comm.size(), rank, i, ReduceOp::sum);
        std::vector<chorus::float16> in(n), out(n * comm.size());
        for (std::size_t i = 0; i < n; ++i) in[i] = pattern<chorus::float16>(s2, rank, i);
        chorus::Request r1 = comm.all_reduce_async(std::span<double>(a), ReduceOp::sum);
        chorus::Request r2 =
            comm.all_gather_async(std::span<const chorus::float16>(in), std::span<chorus::float16>(out));
        r2.wait();
        // They run in posting order: the all_reduce has completed before the all_gather did.
        expect(r1.test(),
               "the first async call is done when the second is (count " + std::to_string(n) + ")");
        r1.wait();
        check_equal<double>(
            a, [&](std::size_t i) { return expected_all_reduce<double>(s1, comm.size(), i, ReduceOp::sum); },
            "all_reduce_async count " + std::to_string(n), rank);
        check_equal<chorus::float16>(
            out, [&](std::size_t j) { return pattern<chorus::float16>(s2, static_cast<int>(j / n), j % n); },
            "all_gather_async count " + std::to_string(n), rank);
      }
    });
  }
}

TEST_CASE_TEMPLATE("async: eight collectives of every kind in flight then a blocking one", T, Inproc, Tcp) {
  for (int world : {2, 3, 5}) {
    CAPTURE(world);
    run_world<T>(world, [](int rank, auto& comm) {
      const int n = comm.size();
      const int root = n - 1;
      const std::size_t k = 777;
      const std::uint64_t s = seed_of(n, 8);
      auto seed = [&](int i) { return seed_of(s, i); };
      // 0 all_reduce (prod, int32)
      std::vector<std::int32_t> ar(k);
      for (std::size_t i = 0; i < k; ++i) ar[i] = input<std::int32_t>(seed(0), n, rank, i, ReduceOp::prod);
      // 1 broadcast (from the last rank)
      std::vector<std::uint64_t> bc(k);
      for (std::size_t i = 0; i < k; ++i) bc[i] = rank == root ? pattern<std::uint64_t>(seed(1), root, i) : 0;
      // 2 reduce (min, bfloat16, onto the last rank)
      std::vector<chorus::bfloat16> rin(k), rout(rank == root ? k : 0);
      for (std::size_t i = 0; i < k; ++i)
        rin[i] = input<chorus::bfloat16>(seed(2), n, rank, i, ReduceOp::min);
      // 3 scatter, 4 gather (root 0)
      std::vector<float> sin(rank == 0 ? k * n : 0), sout(k);
      for (std::size_t i = 0; i < sin.size(); ++i) sin[i] = pattern<float>(seed(3), 0, i);
      std::vector<std::int8_t> gin(k), gout(rank == 0 ? k * n : 0);
      for (std::size_t i = 0; i < k; ++i) gin[i] = pattern<std::int8_t>(seed(4), rank, i);
      // 5 reduce_scatter (avg, float16)
      std::vector<chorus::float16> rsin(k * n), rsout(k);
      for (std::size_t i = 0; i < rsin.size(); ++i)
        rsin[i] = input<chorus::float16>(seed(5), n, rank, i, ReduceOp::avg);
      // 6 all_to_all (uint8)
      std::vector<std::uint8_t> ain(k * n), aout(k * n);
      for (std::size_t i = 0; i < ain.size(); ++i) ain[i] = pattern<std::uint8_t>(seed(6), rank, i);
      // 7 barrier

      std::vector<chorus::Request> reqs;
      reqs.push_back(comm.all_reduce_async(std::span<std::int32_t>(ar), ReduceOp::prod));
      reqs.push_back(comm.broadcast_async(std::span<std::uint64_t>(bc), root));
      reqs.push_back(comm.reduce_async(std::span<const chorus::bfloat16>(rin),
                                       std::span<chorus::bfloat16>(rout), ReduceOp::min, root));
      reqs.push_back(comm.scatter_async(std::span<const float>(sin), std::span<float>(sout), 0));
      reqs.push_back(comm.gather_async(std::span<const std::int8_t>(gin), std::span<std::int8_t>(gout), 0));
      reqs.push_back(comm.reduce_scatter_async(std::span<const chorus::float16>(rsin),
                                               std::span<chorus::float16>(rsout), ReduceOp::avg));
      reqs.push_back(
          comm.all_to_all_async(std::span<const std::uint8_t>(ain), std::span<std::uint8_t>(aout)));
      reqs.push_back(comm.barrier_async());
      // A blocking call after them: it runs after all eight (the order of calls is the order of runs).
      const std::uint64_t sb = seed(9);
      std::vector<float> blk(k);
      for (std::size_t i = 0; i < k; ++i) blk[i] = input<float>(sb, n, rank, i, ReduceOp::max);
      comm.all_reduce(std::span<float>(blk), ReduceOp::max);
      for (std::size_t i = 0; i < reqs.size(); ++i)
        expect(reqs[i].test(),
               "async call " + std::to_string(i) + " is done once the blocking call after it returned");
      for (auto it = reqs.rbegin(); it != reqs.rend(); ++it) it->wait();

      check_equal<float>(
          blk, [&](std::size_t i) { return expected_all_reduce<float>(sb, n, i, ReduceOp::max); },
          "blocking all_reduce after eight async calls", rank);
      check_equal<std::int32_t>(
          ar, [&](std::size_t i) { return expected_all_reduce<std::int32_t>(seed(0), n, i, ReduceOp::prod); },
          "all_reduce_async", rank);
      check_equal<std::uint64_t>(
          bc, [&](std::size_t i) { return pattern<std::uint64_t>(seed(1), root, i); }, "broadcast_async",
          rank);
      if (rank == root)
        check_equal<chorus::bfloat16>(
            rout,
            [&](std::size_t i) {
              return expected_all_reduce<chorus::bfloat16>(seed(2), n, i, ReduceOp::min);
            },
            "reduce_async", rank);
      check_equal<float>(
          sout, [&](std::size_t i) { return pattern<float>(seed(3), 0, rank * k + i); }, "scatter_async",
          rank);
      if (rank == 0)
        check_equal<std::int8_t>(
            gout,
            [&](std::size_t j) { return pattern<std::int8_t>(seed(4), static_cast<int>(j / k), j % k); },
            "gather_async", rank);
      check_equal<chorus::float16>(
          rsout,
          [&](std::size_t i) {
            return expected_all_reduce<chorus::float16>(seed(5), n, rank * k + i, ReduceOp::avg);
          },
          "reduce_scatter_async", rank);
      check_equal<std::uint8_t>(
          aout,
          [&](std::size_t j) {
            return pattern<std::uint8_t>(seed(6), static_cast<int>(j / k), rank * k + j % k);
          },
          "all_to_all_async", rank);
    });
  }
}

TEST_CASE_TEMPLATE("async: a blocking call right after an async one", T, Inproc, Tcp) {
  run_world<T>(3, [](int rank, auto& comm) {
    for (std::uint64_t round = 0; round < 20; ++round) {
      const std::size_t n = 1 + round * 101;
      const std::uint64_t s1 = seed_of(round, 1), s2 = seed_of(round, 2);
      std::vector<std::int64_t> a(n);
      for (std::size_t i = 0; i < n; ++i) a[i] = input<std::int64_t>(s1, comm.size(), rank, i, ReduceOp::sum);
      chorus::Request r = comm.all_reduce_async(std::span<std::int64_t>(a), ReduceOp::sum);
      std::vector<float> b(n);
      const int root = static_cast<int>(round % 3);
      for (std::size_t i = 0; i < n; ++i) b[i] = rank == root ? pattern<float>(s2, root, i) : 0.0f;
      comm.broadcast(std::span<float>(b), root);
      expect(r.test(), "the async all_reduce is done when the blocking broadcast after it returned");
      r.wait();
      check_equal<std::int64_t>(
          a,
          [&](std::size_t i) { return expected_all_reduce<std::int64_t>(s1, comm.size(), i, ReduceOp::sum); },
          "all_reduce_async round " + std::to_string(round), rank);
      check_equal<float>(
          b, [&](std::size_t i) { return pattern<float>(s2, root, i); },
          "blocking broadcast round " + std::to_string(round), rank);
    }
  });
}

}  // namespace collective_test_split_async
