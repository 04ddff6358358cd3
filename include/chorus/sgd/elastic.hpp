// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// Elastic data-parallel SGD: what the ranks need to go on with one model and one epoch order
/// after Communicator::shrink() took failed ranks out or grow() let new ones in
/// (examples/02_train_fashion_mnist --elastic; docs/sgd.md, "Elastic training").
///
///   catch (const chorus::Error& e) {                  // a step's all-reduce failed
///     if (e.code() != chorus::ErrorCode::peer_failure) throw;
///     const int old_size = comm.size();
///     comm = comm.shrink();                           // the survivors, renumbered
///     auto at = chorus::sgd::furthest(comm, done);    // done: steps this rank completed
///     chorus::sgd::broadcast_parameters(comm, state, at.rank);  // its weights and momentum
///     step = chorus::sgd::resume_step(at.position, old_size, comm.size());
///     sampler = chorus::sgd::DistributedSampler(n, comm.rank(), comm.size(), true, seed);
///   }
///
/// Why the furthest rank. A step's all-reduce can complete on some ranks and fail on others (a
/// ring's last chunk reached rank a, then rank b's predecessor died), so after a fault the
/// survivors stand at most one step apart: a rank that completed step s applied it, the others
/// did not. No rank is two steps ahead, since step s + 1's all-reduce cannot complete without the
/// ranks that failed in step s. The weights of a rank that completed s steps are those after step
/// s (a failed step applies nothing), so the furthest rank's state is every rank's next state.
///
/// Why resume_step. DistributedSampler gives rank r the positions r, r + W, r + 2W, ... of the
/// epoch's order (the same on every rank and every world size W: it depends on seed and epoch
/// only). After s full steps of B samples per rank, the ranks have visited exactly the positions
/// [0, s·B·W). With W' ranks, s' steps cover [0, s'·B·W'); resuming at s' = floor(s·W / W')
/// skips nothing and repeats fewer than B·W' samples of the epoch.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "chorus/core/error.hpp"
#include "chorus/core/types.hpp"
#include "chorus/sgd/parameters.hpp"

namespace chorus::sgd {

/// The furthest position of any rank and the lowest rank standing there.
struct Furthest {
  std::int64_t position = 0;
  int rank = 0;
};

namespace detail {
inline constexpr int kRankBits = 20;  // furthest() packs (position, rank) in one int64
}  // namespace detail

/// Collective: the largest `position` (>= 0, < 2^42) over the ranks and the lowest rank that
/// holds it; every rank gets the same answer. One all-reduce of one int64.
template <Collectives Comm>
Furthest furthest(Comm& comm, std::int64_t position) {
  constexpr std::int64_t kRanks = std::int64_t{1} << detail::kRankBits;
  if (position < 0 || position >= (std::int64_t{1} << (62 - detail::kRankBits)) || comm.size() > kRanks)
    throw Error(ErrorCode::invalid_argument, ErrorContext{comm.rank(), -1, "sgd::furthest"},
                "position " + std::to_string(position) + " is outside [0, 2^42) or the communicator has over 2^20 ranks");
  // max(position, then the complement of the rank): the furthest, and of those the lowest rank.
  std::int64_t key = position * kRanks + (kRanks - 1 - comm.rank());
  comm.all_reduce_async(&key, &key, 1, DataType::int64, ReduceOp::max).wait();
  return {key / kRanks, static_cast<int>(kRanks - 1 - key % kRanks)};
}

/// Where an epoch goes on, in steps of the new world size, after `steps_done` full steps with
/// `old_world` ranks: floor(steps_done · old_world / new_world) (see the top of this file).
constexpr std::size_t resume_step(std::size_t steps_done, int old_world, int new_world) {
  return new_world < 1 ? 0 : steps_done * static_cast<std::size_t>(old_world) / static_cast<std::size_t>(new_world);
}

/// Collective over a communicator made by shrink(): `old_rank` is this rank in the communicator
/// it was shrunk from, of `old_size` ranks. Returns the old ranks that are not here any more,
/// ascending (the same list on every rank). One all-reduce of old_size int32.
template <Collectives Comm>
std::vector<int> lost_ranks(Comm& comm, int old_rank, int old_size) {
  if (old_rank < 0 || old_rank >= old_size)
    throw Error(ErrorCode::invalid_argument, ErrorContext{comm.rank(), -1, "sgd::lost_ranks"},
                "old rank " + std::to_string(old_rank) + " is not in [0, " + std::to_string(old_size) + ")");
  std::vector<std::int32_t> here(static_cast<std::size_t>(old_size), 0);
  here[static_cast<std::size_t>(old_rank)] = 1;
  comm.all_reduce_async(here.data(), here.data(), here.size(), DataType::int32, ReduceOp::sum).wait();
  std::vector<int> lost;
  for (int r = 0; r < old_size; ++r)
    if (here[static_cast<std::size_t>(r)] == 0) lost.push_back(r);
  return lost;
}

}  // namespace chorus::sgd
