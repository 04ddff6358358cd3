// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// The plan of one call: which algorithm runs it and in what slices, every choice in one place.
///
///   0. Device buffers where every peer's device memory is reachable (ranks as threads of one
///      process, or cuda_ipc to every peer), for all_reduce, reduce_scatter, all_gather, broadcast
///      and reduce, up to kMaxKernelRanks ranks, nothing forced: one collective kernel per rank
///      (algo/intranode/kernel_path.hpp).
///   1. Device buffers where every peer's device memory is mapped (cuda_ipc): the direct
///      collectives through the IPC windows (algo/intranode/ipc.hpp): all_reduce one-shot or
///      two-shot by their model, the others their one direct form; unless an algorithm of the
///      staged path is forced.
///   2. all_reduce of host buffers small enough for the shm mailboxes of every peer: one-shot
///      (algo/intranode/one_shot.hpp); forced where it does not fit, an invalid_argument error.
///   3. Otherwise the cost model (algo/select.hpp): the flat algorithms over the group's slowest
///      link, and where the group spans hosts (two or more, one with two ranks or more) the
///      hierarchical forms (algo/hierarchical.hpp) with the links inside a host and those between
///      hosts; the cheapest runs. Or what CHORUS_ALGO / CHORUS_CHUNK_BYTES force: a forced
///      algorithm the collective lacks, or hierarchical without a hierarchy, is invalid_argument.

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <exception>
#include <utility>
#include <string>

#include "chorus/algo/channel.hpp"
#include "chorus/algo/descriptor.hpp"
#include "chorus/algo/intranode/ipc.hpp"
#include "chorus/algo/intranode/kernel_path.hpp"
#include "chorus/algo/intranode/one_shot.hpp"
#include "chorus/algo/select.hpp"
#include "chorus/core/concepts.hpp"
#include "chorus/core/cost_model.hpp"
#include "chorus/core/error.hpp"
#include "chorus/detail/env.hpp"
#include "chorus/topology/hosts.hpp"

namespace chorus::algo {

/// The model of a group's slowest link (by latency): per peer where the transport says which
/// model serves each (link_model, hybrid), else the transport's own T::kModel.
template <Transport T>
TransportModel group_model(T& t, const Group<T>& g) {
  if constexpr (TransportWithPeerModels<T>) {
    if (g.size() <= 1) return T::kModel;
    const int first = g.rank == 0 ? 1 : 0;
    TransportModel m = t.link_model(g.members[static_cast<std::size_t>(first)]);
    for (int i = first + 1; i < g.size(); ++i) {
      if (i == g.rank) continue;
      const TransportModel k = t.link_model(g.members[static_cast<std::size_t>(i)]);
      if (k.alpha > m.alpha) m = k;
    }
    return m;
  } else {
    return T::kModel;
  }
}

/// The rate of the links between hosts, bytes per second, from CHORUS_NET_BANDWIDTH ("1gbit",
/// "10gbit", "100mbit", or bytes per second with K, M, G suffixes); 0 where unset.
inline double net_bandwidth_from_env() {
  const auto v = chorus::detail::env_string("CHORUS_NET_BANDWIDTH");
  if (!v || v->empty()) return 0;
  const std::string& t = *v;
  for (auto [unit, bits] : {std::pair<const char*, double>{"gbit", 1e9}, {"mbit", 1e6}, {"kbit", 1e3}})
    if (t.size() > std::strlen(unit) && t.compare(t.size() - std::strlen(unit), std::string::npos, unit) == 0) {
      try {
        std::size_t used = 0;
        const double x = std::stod(t.substr(0, t.size() - std::strlen(unit)), &used);
        if (used == t.size() - std::strlen(unit) && x > 0) return x * bits / 8;
      } catch (const std::exception&) {
      }
      throw Error(ErrorCode::invalid_argument, "CHORUS_NET_BANDWIDTH='" + t + "' is not a positive rate (1gbit, 25gbit, 800mbit or bytes per second)");
    }
  const std::uint64_t b = chorus::detail::parse_bytes(t, "CHORUS_NET_BANDWIDTH");
  if (b == 0) throw Error(ErrorCode::invalid_argument, "CHORUS_NET_BANDWIDTH='" + t + "' is not a positive rate");
  return static_cast<double>(b);
}

/// The slowest links of this rank inside its host and to other hosts (by latency), per peer where
/// the transport says which model serves each (link_model), else T::kModel; between hosts beta is
/// the model's remote_beta, or 1 / `net_bandwidth` where that is given. Every rank plans from the
/// combination of all ranks' (HostModels::combine, exchanged at creation: impl/state.hpp), never
/// from its own alone: ranks must choose alike.
struct HostModels {
  TransportModel intra{};
  TransportModel inter{};
  bool have_intra = false, have_inter = false;  ///< whether this rank has a link of the kind

  /// Text for the store ("intra" and "inter" each: a flag and the four numbers, exact).
  std::string encode() const {
    char buf[256];
    std::snprintf(buf, sizeof buf, "%d %a %a %zu %a %d %a %a %zu %a", have_intra ? 1 : 0, intra.alpha, intra.beta, intra.slice,
                  intra.remote_beta, have_inter ? 1 : 0, inter.alpha, inter.beta, inter.slice, inter.remote_beta);
    return buf;
  }
  static HostModels decode(const std::string& text) {
    HostModels m;
    int hi = 0, he = 0;
    if (std::sscanf(text.c_str(), "%d %la %la %zu %la %d %la %la %zu %la", &hi, &m.intra.alpha, &m.intra.beta, &m.intra.slice,
                    &m.intra.remote_beta, &he, &m.inter.alpha, &m.inter.beta, &m.inter.slice, &m.inter.remote_beta) != 10)
      throw Error(ErrorCode::system, "a rank published the link models '" + text + "', which do not parse");
    m.have_intra = hi != 0;
    m.have_inter = he != 0;
    return m;
  }
  /// The slower of each kind (larger latency and time per byte, smaller slice), so that every
  /// rank that combines the same models plans alike.
  void combine(const HostModels& o) {
    auto one = [](TransportModel& into, bool& have, const TransportModel& k, bool k_have) {
      if (!k_have) return;
      if (!have) {
        into = k;
        have = true;
        return;
      }
      into.alpha = std::max(into.alpha, k.alpha);
      into.beta = std::max(into.beta, k.beta);
      into.remote_beta = std::max(into.remote_beta, k.remote_beta);
      into.slice = std::min(into.slice, k.slice);
    };
    one(intra, have_intra, o.intra, o.have_intra);
    one(inter, have_inter, o.inter, o.have_inter);
  }
};
template <Transport T>
HostModels host_models(T& t, const Group<T>& g, const topology::Hosts& hosts, double net_bandwidth) {
  HostModels m{T::kModel, T::kModel};
  bool& have_intra = m.have_intra;
  bool& have_inter = m.have_inter;
  for (int i = 0; i < g.size(); ++i) {
    if (i == g.rank) continue;
    TransportModel k = T::kModel;
    if constexpr (TransportWithPeerModels<T>) k = t.link_model(g.members[static_cast<std::size_t>(i)]);
    const bool same = hosts.host_of(i) == hosts.host_of(g.rank);
    TransportModel& into = same ? m.intra : m.inter;
    bool& have = same ? have_intra : have_inter;
    if (!have || k.alpha > into.alpha) into = k;
    have = true;
  }
  if (m.inter.remote_beta > 0) m.inter.beta = m.inter.remote_beta;
  if (net_bandwidth > 0) m.inter.beta = 1.0 / net_bandwidth;
  return m;
}

/// What a communicator knows of its group when it plans a call (fixed at its creation).
struct PlanInputs {
  int rank = 0;
  int size = 1;
  bool mailboxes = false;  ///< every peer has shm mailboxes (has_mailboxes)
  bool ipc = false;        ///< every peer's device memory is mapped (has_ipc), mailboxes too
  /// Every peer's device memory is reachable by the collective kernel (algo/intranode/kernel_path.hpp):
  /// ipc, or every peer a thread of this process.
  bool kernel = false;
  TransportModel model{};  ///< the group's slowest link (group_model)
  Overrides overrides;     ///< CHORUS_ALGO, CHORUS_CHUNK_BYTES
  topology::Hosts hosts;   ///< which ranks share a host
  HostModels links;        ///< inside a host and between hosts (host_models)
  /// Time per byte of one flow between hosts where it cannot have its host's whole link (a NIC
  /// per rank); 0: it can (one NIC per host, what the library assumes). The simulator sets it.
  double flow_beta = 0;
  /// Time per byte of a reduction (the simulator sets its model's).
  double reduce_beta = kReduceSecondsPerByte;
};

/// The flat or hierarchical choice for `kind` of `bytes` (see the top), with `o` the overrides
/// that apply to this call.
inline Choice choose(CollectiveKind kind, std::size_t bytes, const PlanInputs& in, const Overrides& o) {
  const Algorithm forced = o.forced(kind);
  const bool spans = in.hosts.host_count() > 1;
  const bool can = has_hierarchical(kind) && in.hosts.hierarchical();
  if (forced == Algorithm::hierarchical && !can) {
    check_forced(kind, o);  // a collective without the algorithm says so first
    throw Error(ErrorCode::invalid_argument, ErrorContext{in.rank, -1, std::string(to_string(kind))},
                "CHORUS_ALGO (Options::algorithm) = hierarchical: this communicator's " + std::to_string(in.size) +
                    " ranks are on " + in.hosts.describe() +
                    ", which has no hierarchy (it needs two hosts or more, one of them with two ranks or more)");
  }
  Overrides flat_o = o;
  if (forced == Algorithm::hierarchical) flat_o.per_kind[static_cast<std::size_t>(kind)] = Algorithm::automatic, flat_o.algorithm = Algorithm::automatic;
  const TransportModel& m = spans ? in.links.inter : in.model;
  const HostShape shape{in.hosts.host_count(), in.hosts.max_local_size(), in.hosts.rails()};
  Choice flat = select(kind, bytes, in.size, m, flat_o);
  if (spans && kind == CollectiveKind::all_reduce && in.links.have_intra) {
    // Across hosts with ranks sharing them: the flat algorithms as the hosts' links see them.
    const auto t = flat_all_reduce_across_hosts(bytes, in.size, shape, in.links.intra, in.links.inter, flat.slice_bytes,
                                                in.flow_beta, in.reduce_beta);
    const Algorithm f = flat_o.forced(kind);
    Algorithm a = Algorithm::ring;
    if (t.recursive_doubling <= t.ring && t.recursive_doubling <= t.tree) a = Algorithm::recursive_doubling;
    else if (t.tree < t.ring) a = Algorithm::tree;
    if (f == Algorithm::ring || f == Algorithm::tree || f == Algorithm::recursive_doubling) a = f;
    flat.algorithm = a;
    flat.seconds = a == Algorithm::ring ? t.ring : a == Algorithm::tree ? t.tree : t.recursive_doubling;
  }
  if (!can || (forced != Algorithm::automatic && forced != Algorithm::hierarchical)) return flat;
  const double bw = hierarchical_seconds(kind, bytes, in.size, shape, in.links.intra, in.links.inter, false, in.reduce_beta, in.flow_beta);
  const bool latency_form = kind == CollectiveKind::all_reduce || kind == CollectiveKind::broadcast || kind == CollectiveKind::reduce;
  const double lat =
      latency_form ? hierarchical_seconds(kind, bytes, in.size, shape, in.links.intra, in.links.inter, true, in.reduce_beta, in.flow_beta) : bw;
  const double best = std::min(bw, lat);
  if (forced != Algorithm::hierarchical && best >= flat.seconds) return flat;
  return Choice{Algorithm::hierarchical, slice_bytes(in.links.inter, o), best, latency_form && lat < bw};
}

struct Plan {
  Choice choice{};
  bool direct = false;  ///< through the IPC windows (algo/intranode/ipc.hpp)
  bool kernel = false;  ///< one collective kernel per rank (algo/intranode/kernel_path.hpp)
};

/// The plan of `desc` moving `bytes` per rank; `device` when its buffers are in device memory.
/// `slot_bytes()` gives the IPC windows' slot size (it makes the windows at the first direct call).
/// `internal`: a call the library makes itself (split's all_gather and barrier): nothing forced.
template <Transport T, class SlotBytes>
Plan plan(const CollectiveDesc& desc, std::size_t bytes, bool device, const PlanInputs& in, SlotBytes&& slot_bytes,
          bool internal = false) {
  const int n = in.size;
  const Overrides o = internal ? in.overrides.slices_only() : in.overrides;
  check_forced(desc.kind, o);
  const Algorithm forced = o.forced(desc.kind);
  const bool direct_forced = forced == Algorithm::one_shot || forced == Algorithm::two_shot;
  // A forced algorithm of the staged path (not the collective's only one) keeps it off the windows.
  const bool staged_forced = forced != Algorithm::automatic && !direct_forced && forcible_algorithms(desc.kind).size() > 1;
  Plan p;
  // The collective kernel, where every peer's memory is reachable and nothing else is forced.
  if (device && in.kernel && n > 1 && n <= device::kMaxKernelRanks && kernel_takes(desc.kind) && forced == Algorithm::automatic) {
    p.kernel = true;
    p.choice = {Algorithm::kernel, 0};
    return p;
  }
  p.direct = device && in.ipc && n > 1 && !staged_forced;
  if (forced == Algorithm::two_shot && !p.direct && n > 1)
    throw Error(ErrorCode::invalid_argument, ErrorContext{in.rank, -1, describe(desc)},
                "CHORUS_ALGO=two_shot runs on device buffers with every peer's memory mapped (cuda_ipc); this call has " +
                    std::string(device ? "device buffers without cuda_ipc to every peer" : "host buffers"));
  // all_reduce of host buffers through the shm mailboxes where it fits, unless another algorithm
  // is forced; forced, it must fit.
  const bool one_shot_call = desc.kind == CollectiveKind::all_reduce && n > 1;
  const bool one_shot_fits = in.mailboxes && !device && bytes <= one_shot_max_bytes<T>();
  const bool one_shot_forced = forced == Algorithm::one_shot;
  if (one_shot_call && one_shot_forced && !one_shot_fits && !p.direct)
    throw Error(ErrorCode::invalid_argument, ErrorContext{in.rank, -1, describe(desc)},
                "CHORUS_ALGO=one_shot needs every peer on shm, a communicator made by init/create (not split) "
                "and at most " + std::to_string(one_shot_max_bytes<T>()) + " bytes of host memory (or device "
                "buffers over cuda_ipc); this call has " +
                std::to_string(bytes) + " bytes" + (in.mailboxes ? "" : " and no shm mailboxes to every peer"));
  if (p.direct) {
    Algorithm a = Algorithm::ipc;
    if (desc.kind == CollectiveKind::all_reduce)
      a = direct_forced ? forced : ipc_all_reduce_algorithm(bytes, n, slot_bytes());
    p.choice = {a, slot_bytes()};
  } else if (one_shot_call && one_shot_fits && (one_shot_forced || forced == Algorithm::automatic)) {
    p.choice = {Algorithm::one_shot, 0};
  } else {
    p.choice = choose(desc.kind, bytes, in, o);
  }
  return p;
}

}  // namespace chorus::algo
