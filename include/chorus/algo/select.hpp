// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// The cost model that picks an algorithm and a slice size per call. Each algorithm costs
/// (messages on the critical path) x alpha + (bytes on the critical path) x beta, with alpha and
/// beta per transport (TransportModel). CHORUS_ALGO forces an algorithm, CHORUS_CHUNK_BYTES the
/// slice size; both are validated, and the choice is logged at INFO.
///
/// A forced algorithm chooses among the algorithms of the collectives that have several:
///   all_reduce  ring, tree, recursive_doubling, one_shot (the communicator runs one_shot itself),
///               two_shot (device buffers over cuda_ipc only, algo/intranode/ipc.hpp)
///   broadcast   binomial, chain (tree: the binomial tree)
///   reduce      binomial, ring (tree: the binomial tree)
/// Forcing one of these collectives to an algorithm it lacks is an invalid_argument error that
/// names the collective and its algorithms (check_forced). The other collectives have one
/// algorithm each and run it whatever is forced: all_gather and reduce_scatter ring, gather and
/// scatter direct, all_to_all pairwise, barrier and split dissemination. The library calls some of
/// them itself (split runs an all_gather and a barrier), so a job-wide CHORUS_ALGO must not fail them.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>
#include <string>
#include <string_view>

#include "chorus/algo/descriptor.hpp"
#include "chorus/core/cost_model.hpp"
#include "chorus/detail/env.hpp"
#include "chorus/options.hpp"
#include "chorus/topology/tree.hpp"

namespace chorus::algo {

enum class Algorithm { automatic, ring, tree, recursive_doubling, binomial, chain, direct, pairwise, dissemination, one_shot, two_shot,
                       ipc };

constexpr std::string_view to_string(Algorithm a) noexcept {
  switch (a) {
    case Algorithm::automatic: return "auto";
    case Algorithm::ring: return "ring";
    case Algorithm::tree: return "tree";
    case Algorithm::recursive_doubling: return "recursive_doubling";
    case Algorithm::binomial: return "binomial";
    case Algorithm::chain: return "chain";
    case Algorithm::direct: return "direct";
    case Algorithm::pairwise: return "pairwise";
    case Algorithm::dissemination: return "dissemination";
    case Algorithm::one_shot: return "one_shot";
    case Algorithm::two_shot: return "two_shot";
    case Algorithm::ipc: return "ipc";
  }
  return "unknown";
}

inline Algorithm parse_algorithm(std::string_view s, std::string_view what) {
  for (Algorithm a : {Algorithm::automatic, Algorithm::ring, Algorithm::tree, Algorithm::recursive_doubling,
                      Algorithm::binomial, Algorithm::chain, Algorithm::direct, Algorithm::pairwise, Algorithm::dissemination,
                      Algorithm::one_shot, Algorithm::two_shot})
    if (s == to_string(a)) return a;
  throw Error(ErrorCode::invalid_argument,
              std::string(what) + "='" + std::string(s) +
                  "' is not one of auto, ring, tree, recursive_doubling, binomial, chain, direct, pairwise, "
                  "dissemination, one_shot, two_shot");
}

/// The models themselves live with their transports (T::kModel, core/cost_model.hpp).
using TransportModel = chorus::TransportModel;

/// Host reduction speed per byte of buffer: float32 sum of 64 MiB runs at ~30 GB/s of traffic
/// (3 bytes moved per byte reduced) on a busy 2-core machine (bench/micro/reduce_bench).
inline constexpr double kReduceSecondsPerByte = 1.0 / 10e9;

struct Choice {
  Algorithm algorithm;
  std::size_t slice_bytes;
};

/// What the caller forced (Options::algorithm, Options::chunk_bytes, filled from CHORUS_ALGO and
/// CHORUS_CHUNK_BYTES by Options::apply_env).
struct Overrides {
  Algorithm algorithm = Algorithm::automatic;
  std::size_t slice_bytes = 0;  ///< 0: the model's

  static Overrides from(const Options& o) {
    Overrides r;
    if (!o.algorithm.empty()) r.algorithm = parse_algorithm(o.algorithm, "the algorithm (CHORUS_ALGO)");
    r.slice_bytes = o.chunk_bytes;
    return r;
  }
};

/// The algorithms `kind` can be forced to, or an empty list where it has one algorithm and takes
/// no override (see the top of this file).
inline std::span<const Algorithm> forcible_algorithms(CollectiveKind kind) noexcept {
  static constexpr Algorithm kAllReduce[] = {Algorithm::ring, Algorithm::tree, Algorithm::recursive_doubling,
                                             Algorithm::one_shot, Algorithm::two_shot};
  static constexpr Algorithm kBroadcast[] = {Algorithm::binomial, Algorithm::chain, Algorithm::tree};
  static constexpr Algorithm kReduce[] = {Algorithm::binomial, Algorithm::ring, Algorithm::tree};
  switch (kind) {
    case CollectiveKind::all_reduce: return kAllReduce;
    case CollectiveKind::broadcast: return kBroadcast;
    case CollectiveKind::reduce: return kReduce;
    default: return {};
  }
}

/// Throws invalid_argument when `o` forces `kind` to an algorithm it does not have, e.g.
/// "CHORUS_ALGO=ring: broadcast has no ring algorithm; it has binomial, chain, tree".
inline void check_forced(CollectiveKind kind, const Overrides& o) {
  if (o.algorithm == Algorithm::automatic) return;
  const auto have = forcible_algorithms(kind);
  if (have.empty() || std::find(have.begin(), have.end(), o.algorithm) != have.end()) return;
  std::string names;
  for (Algorithm a : have) names += (names.empty() ? "" : ", ") + std::string(to_string(a));
  throw Error(ErrorCode::invalid_argument, "CHORUS_ALGO (Options::algorithm) = " + std::string(to_string(o.algorithm)) +
                                               ": " + std::string(to_string(kind)) + " has no " +
                                               std::string(to_string(o.algorithm)) + " algorithm; it has " + names +
                                               " (or auto)");
}

/// Slices: the transport's (TransportModel::slice), or the override.
inline std::size_t slice_bytes(const TransportModel& m, const Overrides& o) { return o.slice_bytes != 0 ? o.slice_bytes : m.slice; }

/// The algorithms each collective has, and the model's pick; a forced algorithm that `kind` lacks
/// throws (check_forced).
inline Choice select(CollectiveKind kind, std::size_t bytes, int n, const TransportModel& m, const Overrides& o) {
  check_forced(kind, o);
  const double P = n, B = static_cast<double>(bytes);
  Algorithm pick = Algorithm::automatic;
  switch (kind) {
    case CollectiveKind::all_reduce: {
      const double slice = static_cast<double>(slice_bytes(m, o));
      // ring: 2(P-1) steps of B/P bytes.
      const double ring = 2 * (P - 1) * (m.alpha + B / P * m.beta);
      // recursive doubling: log P steps (+2 folds when P is not a power of two) of B bytes, each
      // followed by a reduction of B bytes that nothing overlaps (the ring's slices hide theirs).
      const double folds = (n & (n - 1)) ? 2 : 0;
      const double rd = (std::floor(std::log2(P)) + folds) * (m.alpha + B * (m.beta + kReduceSecondsPerByte));
      // double binary tree: each half goes up and down a tree of depth log P in slices; the
      // pipeline takes 2 log P + S - 1 slice-steps, S = slices per half. In a step an inner node
      // moves two slices per tree (two children) and both trees run at once: 4 slices of bytes.
      const double per_tree = std::max(1.0, std::ceil(B / 2 / slice));
      const double tree =
          (2 * std::ceil(std::log2(P)) + per_tree - 1) * (m.alpha + 4 * std::min(slice, B / 2) * m.beta);
      pick = Algorithm::ring;
      if (rd <= ring && rd <= tree) pick = Algorithm::recursive_doubling;
      else if (tree < ring) pick = Algorithm::tree;
      if (o.algorithm == Algorithm::ring || o.algorithm == Algorithm::recursive_doubling || o.algorithm == Algorithm::tree)
        pick = o.algorithm;
      break;
    }
    case CollectiveKind::broadcast: {
      // binomial: ceil(log P) steps of B; chain: P-1 hops plus one step per slice of B/S.
      const double slice = static_cast<double>(slice_bytes(m, o));
      const double binomial = std::ceil(std::log2(P)) * (m.alpha + B * m.beta);
      const double slices = std::max(1.0, std::ceil(B / slice));
      const double chain = (P - 1 + slices - 1) * (m.alpha + std::min(slice, B) * m.beta);
      pick = chain < binomial ? Algorithm::chain : Algorithm::binomial;
      if (o.algorithm == Algorithm::chain || o.algorithm == Algorithm::binomial) pick = o.algorithm;
      if (o.algorithm == Algorithm::tree) pick = Algorithm::binomial;
      break;
    }
    case CollectiveKind::reduce: {
      // binomial: ceil(log P) steps of B (+ a reduction each); ring: reduce-scatter (P-1 steps of
      // B/P) then one gather step of B/P per rank at the root.
      const double binomial = std::ceil(std::log2(P)) * (m.alpha + B * (m.beta + kReduceSecondsPerByte));
      const double ring = (P - 1) * (m.alpha + B / P * m.beta) + m.alpha + (P - 1) / P * B * m.beta;
      pick = ring < binomial ? Algorithm::ring : Algorithm::binomial;
      if (o.algorithm == Algorithm::ring || o.algorithm == Algorithm::binomial) pick = o.algorithm;
      if (o.algorithm == Algorithm::tree) pick = Algorithm::binomial;
      break;
    }
    case CollectiveKind::all_gather:
    case CollectiveKind::reduce_scatter: pick = Algorithm::ring; break;
    case CollectiveKind::gather:
    case CollectiveKind::scatter: pick = Algorithm::direct; break;
    case CollectiveKind::all_to_all: pick = Algorithm::pairwise; break;
    case CollectiveKind::barrier:
    case CollectiveKind::split: pick = Algorithm::dissemination; break;
  }
  const std::size_t slice = slice_bytes(m, o);
  return {pick, slice};
}

}  // namespace chorus::algo
