// SPDX-License-Identifier: BSD-3-Clause
// The elastic SGD helpers (include/chorus/sgd/elastic.hpp):
//   - resume_step: after s steps with W ranks, going on at resume_step(s, W, W') with W' ranks
//     (the epoch re-sharded by DistributedSampler) skips no sample of the epoch and repeats fewer
//     than B·W', for growing and shrinking worlds, awkward dataset sizes and batches;
//   - furthest: the largest position and the lowest rank holding it, the same on every rank;
//   - lost_ranks: the ranks of the old communicator that are not in the new one;
//   - bad arguments are invalid_argument.
// The whole path (shrink, grow, a SIGKILLed rank and a replacement) is integration.elastic_train.
#include "chorus/sgd/elastic.hpp"

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <set>
#include <vector>

#include "chorus/sgd/sampler.hpp"
#include "support/communicators.hpp"  // Communicator<inproc>: instantiated once, in the test main
#include "support/spawn.hpp"

// This file's own names: the files of tests/sgd/ are compiled together (unity build).
namespace sgd_test_elastic {

namespace {

using chorus::sgd::DistributedSampler;
using chorus::test::expect;
using chorus::test::expect_eq;
using Inproc = chorus::Communicator<chorus::inproc::Transport>;

/// The dataset indices of world `w`'s shards, steps [first, last) of B samples (clipped to the
/// shard), for the epoch `epoch`.
std::multiset<std::size_t> visited(std::size_t n, int w, std::size_t batch, std::size_t first, std::size_t last,
                                   std::uint64_t epoch) {
  std::multiset<std::size_t> out;
  for (int r = 0; r < w; ++r) {
    DistributedSampler s(n, r, w, /*shuffle=*/true, /*seed=*/5);
    s.set_epoch(epoch);
    const auto idx = s.indices();
    for (std::size_t k = first * batch; k < std::min(last * batch, idx.size()); ++k) out.insert(idx[k]);
  }
  return out;
}

TEST_CASE("resume_step: the re-sharded epoch skips no sample and repeats fewer than B*W'") {
  struct Change {
    int from, to;
  };
  for (std::size_t n : {1000, 1001, 451}) {
    for (std::size_t batch : {1, 8, 64}) {
      for (Change c : {Change{4, 3}, Change{3, 4}, Change{4, 2}, Change{2, 5}, Change{5, 1}, Change{1, 3}}) {
        CAPTURE(n);
        CAPTURE(batch);
        CAPTURE(c.from);
        CAPTURE(c.to);
        const std::size_t per_old = (n + std::size_t(c.from) - 1) / std::size_t(c.from);
        const std::size_t per_new = (n + std::size_t(c.to) - 1) / std::size_t(c.to);
        const std::size_t steps_old = (per_old + batch - 1) / batch, steps_new = (per_new + batch - 1) / batch;
        for (std::size_t s = 0; s <= steps_old; s += 1 + steps_old / 13) {
          const std::size_t resumed = std::min(chorus::sgd::resume_step(s, c.from, c.to), steps_new);
          auto seen = visited(n, c.from, batch, 0, s, 3);
          const auto rest = visited(n, c.to, batch, resumed, steps_new, 3);
          seen.insert(rest.begin(), rest.end());
          std::size_t missing = 0;
          for (std::size_t i = 0; i < n; ++i) missing += seen.count(i) == 0 ? 1 : 0;
          CHECK(missing == 0);
          // Padding repeats up to W-1 samples in each world; the resumption fewer than B*W'.
          CHECK(seen.size() < n + batch * std::size_t(c.to) + std::size_t(c.from + c.to));
        }
      }
    }
  }
  CHECK(chorus::sgd::resume_step(100, 4, 3) == 133);
  CHECK(chorus::sgd::resume_step(100, 3, 4) == 75);
  CHECK(chorus::sgd::resume_step(7, 3, 0) == 0);
}

TEST_CASE("furthest and lost_ranks: the same answer on every rank; bad arguments") {
  chorus::test::run_threads(4, [](int rank, chorus::Options o) {
    auto comm = Inproc::create(std::move(o));
    const std::int64_t positions[] = {5, 7, 7, 6};
    const auto f = chorus::sgd::furthest(comm, positions[rank]);
    expect_eq(f.position, std::int64_t{7}, "furthest position");
    expect_eq(f.rank, 1, "the lowest rank at the furthest position");
    const auto big = chorus::sgd::furthest(comm, (std::int64_t{1} << 41) + rank);
    expect_eq(big.position, (std::int64_t{1} << 41) + 3, "a large position");
    expect_eq(big.rank, 3, "its rank");
    // As if these four were ranks 0, 2, 3 and 6 of a communicator of 7.
    const int old_ranks[] = {0, 2, 3, 6};
    const auto lost = chorus::sgd::lost_ranks(comm, old_ranks[rank], 7);
    expect(lost == std::vector<int>{1, 4, 5}, "lost ranks 1, 4, 5");
    bool threw = false;
    try {
      (void)chorus::sgd::furthest(comm, -1);
    } catch (const chorus::Error& e) {
      threw = e.code() == chorus::ErrorCode::invalid_argument;
    }
    expect(threw, "a negative position is invalid_argument");
    threw = false;
    try {
      (void)chorus::sgd::lost_ranks(comm, 7, 7);
    } catch (const chorus::Error& e) {
      threw = e.code() == chorus::ErrorCode::invalid_argument;
    }
    expect(threw, "an old rank outside the old size is invalid_argument");
  });
}

}  // namespace

}  // namespace sgd_test_elastic
