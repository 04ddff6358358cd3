// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// Runs a planned call's algorithm over its channel: the one switch from (collective, algorithm)
/// to the algorithm's function (algo/ring.hpp, tree.hpp, double_tree.hpp, direct.hpp,
/// hierarchical.hpp). A group of
/// one rank exchanges nothing; the algorithms' local step (out = in) still applies.

#include "chorus/algo/channel.hpp"
#include "chorus/algo/common.hpp"
#include "chorus/algo/descriptor.hpp"
#include "chorus/algo/direct.hpp"
#include "chorus/algo/double_tree.hpp"
#include "chorus/algo/hierarchical.hpp"
#include "chorus/algo/ring.hpp"
#include "chorus/algo/select.hpp"
#include "chorus/algo/tree.hpp"

namespace chorus::algo {

/// `Ch`: the communicator's Channel<T>, or any type with its interface (sim::Channel runs the same
/// switch over a simulated network: sim/include/chorus/sim/).
template <class Ch>
void run(Ch& ch, const CollectiveDesc& desc, const Args& args, const Choice& choice, int group_size,
         const topology::Hosts& hosts) {
  if (group_size == 1) {  // nothing to exchange; the algorithms' local steps still apply
    Args a = args;
    a.root = 0;
    switch (desc.kind) {
      case CollectiveKind::barrier: return;
      case CollectiveKind::reduce_scatter:
      case CollectiveKind::all_reduce:
      case CollectiveKind::reduce:
      case CollectiveKind::all_gather:
      case CollectiveKind::gather:
      case CollectiveKind::scatter:
      case CollectiveKind::all_to_all:
      case CollectiveKind::broadcast:
        a.x().copy(a.out, a.in, a.bytes(a.count));
        return;  // avg over one rank is the identity
      case CollectiveKind::split: return;
    }
  }
  if (choice.algorithm == Algorithm::hierarchical) {
    switch (desc.kind) {
      case CollectiveKind::all_reduce: return hierarchical_all_reduce(ch, args, hosts, choice.latency);
      case CollectiveKind::reduce_scatter: return hierarchical_reduce_scatter(ch, args, hosts);
      case CollectiveKind::all_gather: return hierarchical_all_gather(ch, args, hosts);
      case CollectiveKind::broadcast: return hierarchical_broadcast(ch, args, hosts, choice.latency);
      case CollectiveKind::reduce: return hierarchical_reduce(ch, args, hosts, choice.latency);
      default: break;  // (the plan never picks it for the others)
    }
  }
  switch (desc.kind) {
    case CollectiveKind::all_reduce:
      if (choice.algorithm == Algorithm::ring) return ring_all_reduce(ch, args);
      if (choice.algorithm == Algorithm::tree) return double_tree_all_reduce(ch, args);
      return recursive_doubling_all_reduce(ch, args);
    case CollectiveKind::broadcast:
      if (choice.algorithm == Algorithm::chain) return chain_broadcast(ch, args);
      return binomial_broadcast(ch, args);
    case CollectiveKind::reduce:
      if (choice.algorithm == Algorithm::ring) return ring_reduce(ch, args);
      return binomial_reduce(ch, args);
    case CollectiveKind::scatter: return direct_scatter(ch, args);
    case CollectiveKind::gather: return direct_gather(ch, args);
    case CollectiveKind::all_gather: return ring_all_gather(ch, args);
    case CollectiveKind::reduce_scatter: return ring_reduce_scatter(ch, args);
    case CollectiveKind::all_to_all: return pairwise_all_to_all(ch, args);
    case CollectiveKind::barrier:
    case CollectiveKind::split: return dissemination_barrier(ch);
  }
}

}  // namespace chorus::algo
