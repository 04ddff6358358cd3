// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// DistributedSampler: which samples of a dataset this rank trains on in an epoch, with the
/// semantics of torch.utils.data.distributed.DistributedSampler.
///
///   chorus::sgd::DistributedSampler sampler(train.size(), comm.rank(), comm.size(),
///                                          /*shuffle=*/true, /*seed=*/42);
///   for (int epoch = 0; epoch < epochs; ++epoch) {
///     sampler.set_epoch(epoch);                     // a new order each epoch, the same on all ranks
///     for (std::size_t i : sampler.indices()) ...   // size() indices, disjoint between ranks
///   }
///
/// Every epoch, the indices 0..N-1 are permuted (when shuffling) with a generator seeded from
/// (seed, epoch), identically on every rank. Without drop_last the list is padded, by repeating
/// its beginning, to the next multiple of the world size W, so every rank gets ceil(N / W)
/// samples (a few samples are seen twice per epoch); with drop_last its tail is cut to a multiple
/// of W, so every rank gets floor(N / W). Rank r takes positions r, r + W, r + 2W, ... Sizes,
/// padding and the strided split are torch's; the permutation itself is not torch's randperm
/// (the generator is a std::mt19937_64 with an unbiased Fisher-Yates shuffle, fully specified,
/// so it is the same on every platform and standard library).

#include <cstddef>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "chorus/core/error.hpp"

namespace chorus::sgd {

class DistributedSampler {
 public:
  /// Throws invalid_argument unless world_size >= 1 and 0 <= rank < world_size.
  DistributedSampler(std::size_t dataset_size, int rank, int world_size, bool shuffle = true, std::uint64_t seed = 0,
                     bool drop_last = false)
      : n_(dataset_size), rank_(rank), world_(world_size), shuffle_(shuffle), seed_(seed), drop_last_(drop_last) {
    if (world_size < 1)
      throw Error(ErrorCode::invalid_argument, ErrorContext{rank, -1, "sgd::DistributedSampler"},
                  "world_size " + std::to_string(world_size) + " must be at least 1");
    if (rank < 0 || rank >= world_size)
      throw Error(ErrorCode::invalid_argument, ErrorContext{rank, -1, "sgd::DistributedSampler"},
                  "rank " + std::to_string(rank) + " is not in [0, " + std::to_string(world_size) + ")");
    const auto w = static_cast<std::size_t>(world_size);
    per_rank_ = drop_last ? n_ / w : (n_ + w - 1) / w;
  }

  /// Selects the epoch whose order indices() gives (call it before each epoch, as with torch).
  void set_epoch(std::uint64_t epoch) { epoch_ = epoch; }
  std::uint64_t epoch() const { return epoch_; }

  /// Samples per rank and epoch: ceil(N / W), or floor(N / W) with drop_last.
  std::size_t size() const { return per_rank_; }
  /// Samples per epoch over all ranks: size() * W.
  std::size_t total_size() const { return per_rank_ * static_cast<std::size_t>(world_); }
  std::size_t dataset_size() const { return n_; }
  bool shuffle() const { return shuffle_; }
  bool drop_last() const { return drop_last_; }

  /// This rank's sample indices for the current epoch, in the order to visit them.
  std::vector<std::size_t> indices() const {
    const auto w = static_cast<std::size_t>(world_);
    std::vector<std::size_t> out;
    out.reserve(per_rank_);
    if (per_rank_ == 0) return out;
    std::vector<std::size_t> all = order();
    // Padding (never with drop_last): position p >= N maps to p mod N, which is torch's
    // "indices += indices[:padding]" repeated as often as needed.
    for (std::size_t k = 0; k < per_rank_; ++k) {
      const std::size_t p = static_cast<std::size_t>(rank_) + k * w;
      out.push_back(all[p % n_]);
    }
    return out;
  }

 private:
  /// 0..N-1, shuffled for (seed, epoch) when shuffling.
  std::vector<std::size_t> order() const {
    std::vector<std::size_t> all(n_);
    std::iota(all.begin(), all.end(), std::size_t{0});
    if (!shuffle_) return all;
    std::mt19937_64 gen(mix(seed_, epoch_));
    for (std::size_t i = n_; i > 1; --i) {  // Fisher-Yates: all[i-1] swaps with a uniform j < i
      const std::size_t j = static_cast<std::size_t>(below(gen, i));
      std::swap(all[i - 1], all[j]);
    }
    return all;
  }

  /// A seed from (seed, epoch) such that distinct pairs give unrelated streams (splitmix64).
  static std::uint64_t mix(std::uint64_t seed, std::uint64_t epoch) {
    auto splitmix = [](std::uint64_t x) {
      x += 0x9e3779b97f4a7c15ull;
      x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
      x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
      return x ^ (x >> 31);
    };
    return splitmix(splitmix(seed) ^ epoch);
  }

  /// Uniform in [0, bound), bound >= 1, without modulo bias: draws below 2^64 mod bound are
  /// rejected, so the accepted range is a whole number of copies of [0, bound).
  static std::uint64_t below(std::mt19937_64& gen, std::uint64_t bound) {
    const std::uint64_t reject_under = (0 - bound) % bound;
    for (;;) {
      const std::uint64_t x = gen();
      if (x >= reject_under) return x % bound;
    }
  }

  std::size_t n_;
  int rank_;
  int world_;
  bool shuffle_;
  std::uint64_t seed_;
  bool drop_last_;
  std::uint64_t epoch_ = 0;
  std::size_t per_rank_ = 0;
};

}  // namespace chorus::sgd
