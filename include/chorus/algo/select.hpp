// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// The cost model that picks an algorithm and a slice size per call. Each algorithm costs
/// (messages on the critical path) x alpha + (bytes on the critical path) x beta, with alpha and
/// beta per transport (TransportModel). CHORUS_ALGO forces an algorithm, CHORUS_CHUNK_BYTES the
/// slice size; both are validated, and the choice is logged at INFO.
///
/// CHORUS_ALGO forces an algorithm: a bare name for every collective ("ring"), or a list of
/// collective:algorithm pairs for some ("all_reduce:hierarchical,broadcast:chain", ';' separates
/// too); a bare name and pairs may be mixed, the pairs win. The algorithms of each collective:
///   all_reduce      ring, tree, recursive_doubling, hierarchical, one_shot (the communicator
///                   runs one_shot itself), two_shot (device buffers over cuda_ipc only,
///                   algo/intranode/ipc.hpp)
///   broadcast       binomial, chain, hierarchical (tree: the binomial tree)
///   reduce          binomial, ring, hierarchical (tree: the binomial tree)
///   all_gather, reduce_scatter   ring, hierarchical
///   gather, scatter direct; all_to_all pairwise; barrier dissemination
/// Forcing a collective to an algorithm it lacks is an invalid_argument error that names the
/// collective and its algorithms (check_forced); so is forcing one that the communicator's layout
/// cannot run (hierarchical without two hosts, one of them with two ranks: algo/plan.hpp). The
/// library's own calls (split's all_gather and barrier) take no override.

#include <algorithm>
#include <array>
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
                       ipc, hierarchical, kernel };

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
    case Algorithm::hierarchical: return "hierarchical";
    case Algorithm::kernel: return "kernel";
  }
  return "unknown";
}

inline Algorithm parse_algorithm(std::string_view s, std::string_view what) {
  for (Algorithm a : {Algorithm::automatic, Algorithm::ring, Algorithm::tree, Algorithm::recursive_doubling,
                      Algorithm::binomial, Algorithm::chain, Algorithm::direct, Algorithm::pairwise, Algorithm::dissemination,
                      Algorithm::one_shot, Algorithm::two_shot, Algorithm::hierarchical})
    if (s == to_string(a)) return a;
  throw Error(ErrorCode::invalid_argument,
              std::string(what) + "='" + std::string(s) +
                  "' is not one of auto, ring, tree, recursive_doubling, binomial, chain, direct, pairwise, "
                  "dissemination, one_shot, two_shot, hierarchical");
}

/// The models themselves live with their transports (T::kModel, core/cost_model.hpp).
using TransportModel = chorus::TransportModel;

/// Host reduction speed per byte of buffer: float32 sum of 64 MiB runs at ~30 GB/s of traffic
/// (3 bytes moved per byte reduced) on a busy 2-core machine (bench/micro/reduce_bench).
inline constexpr double kReduceSecondsPerByte = 1.0 / 10e9;

struct Choice {
  Algorithm algorithm;
  std::size_t slice_bytes;
  double seconds = 0;    ///< the model's time for it (0 where the model has none)
  bool latency = false;  ///< hierarchical: the small-message form (algo/hierarchical.hpp)
};

/// The collectives a CHORUS_ALGO pair may name (split is the library's own).
inline constexpr CollectiveKind kForcibleKinds[] = {
    CollectiveKind::all_reduce, CollectiveKind::broadcast, CollectiveKind::reduce, CollectiveKind::scatter,
    CollectiveKind::gather, CollectiveKind::all_gather, CollectiveKind::reduce_scatter, CollectiveKind::all_to_all,
    CollectiveKind::barrier};

/// What the caller forced (Options::algorithm, Options::chunk_bytes, filled from CHORUS_ALGO and
/// CHORUS_CHUNK_BYTES by Options::apply_env).
struct Overrides {
  Algorithm algorithm = Algorithm::automatic;  ///< a bare name: every collective
  std::array<Algorithm, 16> per_kind{};        ///< by CollectiveKind; automatic: the bare name's
  std::size_t slice_bytes = 0;                 ///< 0: the model's

  /// What `kind` is forced to (automatic: nothing).
  Algorithm forced(CollectiveKind kind) const {
    const Algorithm a = per_kind[static_cast<std::size_t>(kind)];
    return a != Algorithm::automatic ? a : algorithm;
  }
  /// The same overrides without any forced algorithm (the library's own calls).
  Overrides slices_only() const {
    Overrides o;
    o.slice_bytes = slice_bytes;
    return o;
  }

  static Overrides from(const Options& o) {
    Overrides r;
    r.slice_bytes = o.chunk_bytes;
    const std::string_view text = o.algorithm;
    const auto what = "the algorithm (CHORUS_ALGO)";
    std::size_t at = 0;
    while (at <= text.size() && !text.empty()) {
      const std::size_t end = std::min(text.find_first_of(",;", at), text.size());
      const std::string_view item = text.substr(at, end - at);
      at = end + 1;
      if (item.empty()) {
        if (end == text.size()) break;
        throw Error(ErrorCode::invalid_argument, std::string(what) + "='" + std::string(text) + "' has an empty item");
      }
      const std::size_t colon = item.find(':');
      if (colon == std::string_view::npos) {
        r.algorithm = parse_algorithm(item, what);
        continue;
      }
      const std::string_view kind = item.substr(0, colon);
      bool known = false;
      for (CollectiveKind k : kForcibleKinds)
        if (kind == to_string(k)) {
          r.per_kind[static_cast<std::size_t>(k)] = parse_algorithm(item.substr(colon + 1), what);
          known = true;
        }
      if (!known)
        throw Error(ErrorCode::invalid_argument,
                    std::string(what) + "='" + std::string(text) + "': '" + std::string(kind) +
                        "' is not a collective (all_reduce, broadcast, reduce, scatter, gather, all_gather, "
                        "reduce_scatter, all_to_all, barrier)");
    }
    return r;
  }
};

/// The algorithms `kind` can be forced to (see the top of this file).
inline std::span<const Algorithm> forcible_algorithms(CollectiveKind kind) noexcept {
  static constexpr Algorithm kAllReduce[] = {Algorithm::ring,         Algorithm::tree,     Algorithm::recursive_doubling,
                                             Algorithm::hierarchical, Algorithm::one_shot, Algorithm::two_shot};
  static constexpr Algorithm kBroadcast[] = {Algorithm::binomial, Algorithm::chain, Algorithm::hierarchical, Algorithm::tree};
  static constexpr Algorithm kReduce[] = {Algorithm::binomial, Algorithm::ring, Algorithm::hierarchical, Algorithm::tree};
  static constexpr Algorithm kRing[] = {Algorithm::ring, Algorithm::hierarchical};
  static constexpr Algorithm kDirect[] = {Algorithm::direct};
  static constexpr Algorithm kPairwise[] = {Algorithm::pairwise};
  static constexpr Algorithm kDissemination[] = {Algorithm::dissemination};
  switch (kind) {
    case CollectiveKind::all_reduce: return kAllReduce;
    case CollectiveKind::broadcast: return kBroadcast;
    case CollectiveKind::reduce: return kReduce;
    case CollectiveKind::all_gather:
    case CollectiveKind::reduce_scatter: return kRing;
    case CollectiveKind::gather:
    case CollectiveKind::scatter: return kDirect;
    case CollectiveKind::all_to_all: return kPairwise;
    case CollectiveKind::barrier:
    case CollectiveKind::split: return kDissemination;
  }
  return {};
}

/// Throws invalid_argument when `o` forces `kind` to an algorithm it does not have, e.g.
/// "CHORUS_ALGO (Options::algorithm) = ring: broadcast has no ring algorithm; it has binomial,
/// chain, hierarchical, tree (or auto)".
inline void check_forced(CollectiveKind kind, const Overrides& o) {
  const Algorithm forced = o.forced(kind);
  if (forced == Algorithm::automatic) return;
  const auto have = forcible_algorithms(kind);
  if (std::find(have.begin(), have.end(), forced) != have.end()) return;
  std::string names;
  for (Algorithm a : have) names += (names.empty() ? "" : ", ") + std::string(to_string(a));
  throw Error(ErrorCode::invalid_argument, "CHORUS_ALGO (Options::algorithm) = " + std::string(to_string(forced)) +
                                               ": " + std::string(to_string(kind)) + " has no " +
                                               std::string(to_string(forced)) + " algorithm; it has " + names +
                                               " (or auto; force one collective with " + std::string(to_string(kind)) +
                                               ":<algorithm>)");
}

/// Slices: the transport's (TransportModel::slice), or the override.
inline std::size_t slice_bytes(const TransportModel& m, const Overrides& o) { return o.slice_bytes != 0 ? o.slice_bytes : m.slice; }

/// The algorithms each collective has, and the model's pick; a forced algorithm that `kind` lacks
/// throws (check_forced).
inline Choice select(CollectiveKind kind, std::size_t bytes, int n, const TransportModel& m, const Overrides& o) {
  check_forced(kind, o);
  const Algorithm forced = o.forced(kind);
  const double P = n, B = static_cast<double>(bytes);
  Algorithm pick = Algorithm::automatic;
  double seconds = 0;
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
      if (forced == Algorithm::ring || forced == Algorithm::recursive_doubling || forced == Algorithm::tree)
        pick = forced;
      seconds = pick == Algorithm::ring ? ring : pick == Algorithm::tree ? tree : rd;
      break;
    }
    case CollectiveKind::broadcast: {
      // binomial: ceil(log P) steps of B; chain: P-1 hops plus one step per slice of B/S.
      const double slice = static_cast<double>(slice_bytes(m, o));
      const double binomial = std::ceil(std::log2(P)) * (m.alpha + B * m.beta);
      const double slices = std::max(1.0, std::ceil(B / slice));
      const double chain = (P - 1 + slices - 1) * (m.alpha + std::min(slice, B) * m.beta);
      pick = chain < binomial ? Algorithm::chain : Algorithm::binomial;
      if (forced == Algorithm::chain || forced == Algorithm::binomial) pick = forced;
      if (forced == Algorithm::tree) pick = Algorithm::binomial;
      seconds = pick == Algorithm::chain ? chain : binomial;
      break;
    }
    case CollectiveKind::reduce: {
      // binomial: ceil(log P) steps of B (+ a reduction each); ring: reduce-scatter (P-1 steps of
      // B/P) then one gather step of B/P per rank at the root.
      const double binomial = std::ceil(std::log2(P)) * (m.alpha + B * (m.beta + kReduceSecondsPerByte));
      const double ring = (P - 1) * (m.alpha + B / P * m.beta) + m.alpha + (P - 1) / P * B * m.beta;
      pick = ring < binomial ? Algorithm::ring : Algorithm::binomial;
      if (forced == Algorithm::ring || forced == Algorithm::binomial) pick = forced;
      if (forced == Algorithm::tree) pick = Algorithm::binomial;
      seconds = pick == Algorithm::ring ? ring : binomial;
      break;
    }
    case CollectiveKind::all_gather:
    case CollectiveKind::reduce_scatter:
      // P-1 steps of one block (bytes is the block).
      pick = Algorithm::ring;
      seconds = (P - 1) * (m.alpha + B * m.beta) + (kind == CollectiveKind::reduce_scatter ? (P - 1) * B * kReduceSecondsPerByte : 0);
      break;
    case CollectiveKind::gather:
    case CollectiveKind::scatter: pick = Algorithm::direct; break;
    case CollectiveKind::all_to_all: pick = Algorithm::pairwise; break;
    case CollectiveKind::barrier:
    case CollectiveKind::split: pick = Algorithm::dissemination; break;
  }
  const std::size_t slice = slice_bytes(m, o);
  return {pick, slice, seconds};
}

/// The host layout as the model reads it (topology/hosts.hpp).
struct HostShape {
  int hosts = 1;
  int local = 1;  ///< ranks of the largest host
  int rails = 1;  ///< ranks of the smallest host
};

/// The collectives that have a hierarchical form (algo/hierarchical.hpp).
constexpr bool has_hierarchical(CollectiveKind k) {
  return k == CollectiveKind::all_reduce || k == CollectiveKind::reduce_scatter || k == CollectiveKind::all_gather ||
         k == CollectiveKind::broadcast || k == CollectiveKind::reduce;
}

/// The double tree's slices per pipeline step through the links between hosts: 4 through a host's
/// one link (select's 4: both trees, a node's two children), 3 through one rank's own NIC (a
/// node's up and two down edges); the simulation at 1,024 ranks agrees within a few percent.
inline constexpr double kTreeSlicesHost = 4, kTreeSlicesNic = 3;

/// The flat all_reduce algorithms over ranks on several hosts (ranks numbered host by host), where
/// select() sees one link for all. The latency terms stay select's (every step at the latency
/// between hosts: small messages choose as before); the bytes terms see the hosts' links:
/// * ring: one flow per host crosses each host boundary; 2(P-1) steps of B/P at the slowest link;
/// * recursive doubling: the steps whose partners are nearer than the host's size stay inside it;
///   in the others all L ranks of a host send B out at once (L B through the host's link);
/// * double binary tree: its fill and drain level by level (the levels nearest the leaves inside a
///   host), then a step per further slice at the slower link (kTreeSlicesHost, kTreeSlicesNic).
/// `flow_beta`: the time per byte of one flow between hosts where it cannot have the host's whole
/// link (a NIC per rank: 1 / the rank's NIC rate); 0 where one flow can (one NIC per host).
/// `red`: reduction time per byte.
struct FlatAcrossHosts {
  double ring = 0, tree = 0, recursive_doubling = 0;
};
inline FlatAcrossHosts flat_all_reduce_across_hosts(std::size_t bytes, int n, const HostShape& s, const TransportModel& intra,
                                                    const TransportModel& inter, std::size_t slice_bytes, double flow_beta = 0,
                                                    double red = kReduceSecondsPerByte) {
  const double P = n, B = static_cast<double>(bytes), L = s.local, slice = static_cast<double>(slice_bytes);
  const double alpha = inter.alpha;
  const double beta = std::max({intra.beta, inter.beta, flow_beta});  // a step's slowest link
  FlatAcrossHosts t;
  t.ring = 2 * (P - 1) * (alpha + B / P * beta);
  const int steps = static_cast<int>(std::floor(std::log2(P)));
  const double folds = (n & (n - 1)) ? 2 : 0;  // to and from a neighbour: inside a host
  int inside = 0;
  while (inside < steps && (1 << inside) < s.local) ++inside;
  t.recursive_doubling = (steps + folds) * alpha + B * ((inside + folds) * (intra.beta + red) +
                                                        (steps - inside) * (std::max(L * inter.beta, flow_beta) + red));
  // The tree's fill and drain: the levels whose edges stay inside a host (the ceil(log2 L) nearest
  // the leaves, ranks numbered host by host) at the host's link, 4 slices per step; the others at
  // the link between hosts (kTreeSlicesHost through a host's link, kTreeSlicesNic through a NIC).
  // Then a step per further slice at the slower of the two.
  const double per_tree = std::max(1.0, std::ceil(B / 2 / slice)), sl = std::min(slice, B / 2);
  const double levels = std::ceil(std::log2(P)), near = std::min(levels, std::ceil(std::log2(L)));
  const double step_in = intra.alpha + 4 * sl * intra.beta;
  const double step_out = alpha + sl * std::max(kTreeSlicesHost * inter.beta, kTreeSlicesNic * flow_beta);
  t.tree = 2 * near * step_in + 2 * (levels - near) * step_out + (per_tree - 1) * std::max(step_in, step_out);
  return t;
}

/// The model's time for the hierarchical form of `kind` (`latency`: the small-message one), with
/// `intra` the links inside a host and `inter` those between hosts (its beta: the host's network
/// link, shared by the rails: R rails each moving 1/R of the data at 1/R of the rate). `bytes` as
/// for select (the block for all_gather and reduce_scatter).
inline double hierarchical_seconds(CollectiveKind kind, std::size_t bytes, int n, const HostShape& s,
                                   const TransportModel& intra, const TransportModel& inter, bool latency,
                                   double red = kReduceSecondsPerByte, double flow_beta = 0) {
  const double B = static_cast<double>(bytes), H = s.hosts, L = s.local, S = B * n;
  const double lg_l = std::ceil(std::log2(L)), lg_h = std::ceil(std::log2(H));
  switch (kind) {
    case CollectiveKind::all_reduce:
      if (latency)  // reduce to the leader, recursive doubling among the leaders, broadcast inside
        return lg_l * (intra.alpha + B * (intra.beta + red)) +
               lg_h * (inter.alpha + B * (std::max(inter.beta, flow_beta) + red)) + lg_l * (intra.alpha + B * intra.beta);
    {
      // host reduce-scatter, each rail all-reducing its part across the hosts, host all-gather,
      // in k segments pipelined (algo/hierarchical.hpp: a segment is R x H rail messages of
      // 64 KiB, at most 1,024 segments, 4 in flight): the first segment passes the three stages one
      // after the other, each later one adds the slowest stage, whose latency the segments in
      // flight share. A rail is one flow between hosts: R of them share the host's link, and each
      // has at most its own NIC's rate where a rank has one (flow_beta).
      const double R = s.rails;
      const double k = std::clamp(std::floor(B / (65536.0 * R * H)), 1.0, 1024.0), seg = B / k;
      const double rail_beta = std::max(inter.beta, flow_beta / R);
      const double a1 = (L - 1) * intra.alpha, b1 = (L - 1) / L * seg * (intra.beta + red);
      const double a2 = 2 * (H - 1) * inter.alpha, b2 = 2 * (H - 1) / H * seg * rail_beta + (H - 1) / H * seg / R * red;
      const double a3 = (L - 1) * intra.alpha, b3 = (L - 1) / L * seg * intra.beta;
      constexpr double window = 4;
      const double slowest = std::max({a1 / window + b1, a2 / window + b2, a3 / window + b3});
      return a1 + b1 + a2 + b2 + a3 + b3 + (k - 1) * slowest;
    }
    case CollectiveKind::reduce_scatter:
    case CollectiveKind::all_gather:
      // host phase over the whole buffer and the blocks copied into rail order and back (one
      // pass over S), beside the rail phase over 1/R of it per rail (pipelined, as all_reduce)
      return (L - 1) * intra.alpha + (H - 1) * inter.alpha +
             std::max((L - 1) * S / L * intra.beta + S * red, (H - 1) * S / H * inter.beta);
    case CollectiveKind::broadcast:
      if (latency) return lg_h * (inter.alpha + B * inter.beta) + lg_l * (intra.alpha + B * intra.beta);
      {  // the chain: one hop per rank, one step per slice at the slowest hop
        const double slice = static_cast<double>(inter.slice);
        const double slices = std::max(1.0, std::ceil(B / slice));
        return (n - 1) * inter.alpha + (slices - 1) * (inter.alpha + std::min(slice, B) * inter.beta) +
               std::min(slice, B) * inter.beta;
      }
    case CollectiveKind::reduce:
      if (latency)
        return lg_l * (intra.alpha + B * (intra.beta + red)) + lg_h * (inter.alpha + B * (inter.beta + red));
      return (L - 1) * (intra.alpha + B / L * intra.beta) + (H - 1) * (inter.alpha + B / H * inter.beta) + inter.alpha +
             B / H * inter.beta + intra.alpha + B / L * intra.beta;
    default: return 0;
  }
}

}  // namespace chorus::algo
