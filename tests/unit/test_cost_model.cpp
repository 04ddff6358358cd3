// SPDX-License-Identifier: BSD-3-Clause
// The cost model's view of ranks on several hosts (algo/select.hpp, algo/plan.hpp's choose): the
// flat all_reduce algorithms as the hosts' links see them, a flow held to its own NIC's rate
// (flow_beta), and the choices that follow, against figures worked out by hand.
#include "chorus/algo/plan.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <vector>

// This file's own names: the files of tests/unit/ are compiled together (unity build).
namespace unit_test_cost_model {

namespace algo = chorus::algo;
using algo::Algorithm;
using algo::CollectiveKind;
using chorus::TransportModel;

namespace {

/// H hosts of L ranks, numbered host by host.
chorus::topology::Hosts hosts(int H, int L) {
  std::vector<int> keys;
  for (int h = 0; h < H; ++h)
    for (int l = 0; l < L; ++l) keys.push_back(h);
  return chorus::topology::Hosts::from_keys(std::span<const int>(keys));
}

algo::PlanInputs inputs(int H, int L, TransportModel intra, TransportModel inter, double flow_beta, double reduce_beta) {
  algo::PlanInputs in;
  in.size = H * L;
  in.hosts = hosts(H, L);
  in.links.intra = intra;
  in.links.inter = inter;
  in.links.have_intra = L > 1;
  in.links.have_inter = H > 1;
  in.model = inter;
  in.flow_beta = flow_beta;
  in.reduce_beta = reduce_beta;
  return in;
}

}  // namespace

TEST_CASE("cost model: flat all_reduce across hosts, bytes through the hosts' links") {
  // 4 hosts x 2 ranks; only the inter-host bytes cost anything.
  const algo::HostShape shape{4, 2, 2};
  const TransportModel intra{0, 0, 1 << 20}, inter{0, 1e-9, 1 << 20};
  const double B = 1 << 20;
  const auto t = algo::flat_all_reduce_across_hosts(1 << 20, 8, shape, intra, inter, 1 << 20, 0, 0);
  // recursive doubling over 8 ranks: 3 steps, the first (partner at distance 1) inside a host, the
  // other two with both ranks of a host sending B out at once.
  CHECK(t.recursive_doubling == doctest::Approx(2 * 2 * B * 1e-9));
  // ring: 2 (P - 1) steps of B / P, one flow per host link.
  CHECK(t.ring == doctest::Approx(2 * 7 * B / 8 * 1e-9));
  // A flow held to 1/4 of the host's rate (a NIC per rank): the ring slows 4x; recursive doubling,
  // whose 2 flows per host share the host's link already, to max(2 beta, 4 beta) per step.
  const auto capped = algo::flat_all_reduce_across_hosts(1 << 20, 8, shape, intra, inter, 1 << 20, 4e-9, 0);
  CHECK(capped.ring == doctest::Approx(4 * t.ring));
  CHECK(capped.recursive_doubling == doctest::Approx(2 * B * 4e-9));
  // double tree over 4 ranks of 2 hosts, 8 MiB in slices of 1 MiB (4 per tree): one level inside
  // the hosts (free here), one across, each passed up and down, then 3 further slices at the link
  // between hosts; 4 slices per step through a host's link.
  const auto tree = algo::flat_all_reduce_across_hosts(8 << 20, 4, algo::HostShape{2, 2, 2}, intra, inter, 1 << 20, 0, 0);
  CHECK(tree.tree == doctest::Approx((2 + 3) * 4 * B * 1e-9));
  // With a NIC per rank at 1/4 of the host's rate: 3 slices per step through it.
  const auto tree_nic = algo::flat_all_reduce_across_hosts(8 << 20, 4, algo::HostShape{2, 2, 2}, intra, inter, 1 << 20, 4e-9, 0);
  CHECK(tree_nic.tree == doctest::Approx((2 + 3) * 3 * B * 4e-9));
}

TEST_CASE("cost model: a NIC per rank (flow_beta) steers large all_reduce away from the flat tree") {
  // 128 hosts x 8 ranks, 450 GB/s inside a host, 8 NICs of 50 GB/s per host (400 GB/s together).
  const TransportModel intra{5e-6, 1 / 450e9, 1 << 20}, inter{7e-6, 1 / 400e9, 1 << 20};
  const auto without = inputs(128, 8, intra, inter, 0, 1 / 1e12);
  const auto with = inputs(128, 8, intra, inter, 1 / 50e9, 1 / 1e12);
  // Seen as one 400 GB/s link per flow, a host's leader moves 2 MiB fast enough for the latency
  // form; held to 50 GB/s, recursive doubling (all 8 NICs of a host busy) is cheaper than it and
  // than the tree (3 slices per step through one rank's NIC), as the
  // simulation of this layout finds (docs/performance.md).
  const auto at2m_without = algo::choose(CollectiveKind::all_reduce, 2 << 20, without, {});
  CHECK(at2m_without.algorithm == Algorithm::hierarchical);
  CHECK(at2m_without.latency);
  CHECK(algo::choose(CollectiveKind::all_reduce, 2 << 20, with, {}).algorithm == Algorithm::recursive_doubling);
  // 512 MiB: the flat tree for one 400 GB/s link per flow; the hierarchical bandwidth form (a rail
  // on each NIC) where a flow has one NIC.
  CHECK(algo::choose(CollectiveKind::all_reduce, std::size_t{512} << 20, without, {}).algorithm == Algorithm::tree);
  const auto at512m = algo::choose(CollectiveKind::all_reduce, std::size_t{512} << 20, with, {});
  CHECK(at512m.algorithm == Algorithm::hierarchical);
  CHECK_FALSE(at512m.latency);
  // Small messages choose by latency alone, either way.
  CHECK(algo::choose(CollectiveKind::all_reduce, 8, with, {}).algorithm == Algorithm::recursive_doubling);
}

TEST_CASE("cost model: 2 and 4 hosts of 2 ranks keep the hierarchical forms (1 Gbit/s links)") {
  // The namespace hosts of scripts/hosts-bench: shm inside, tcp at 1 Gbit/s between.
  const TransportModel intra{3e-6, 1 / 5e9, 256 << 10}, inter{50e-6, 1 / 1.25e8, 512 << 10};
  for (int H : {2, 4}) {
    CAPTURE(H);
    const auto in = inputs(H, 2, intra, inter, 0, algo::kReduceSecondsPerByte);
    const auto small = algo::choose(CollectiveKind::all_reduce, 8, in, {});
    CHECK(small.algorithm == Algorithm::hierarchical);
    CHECK(small.latency);
    const auto large = algo::choose(CollectiveKind::all_reduce, 64 << 20, in, {});
    CHECK(large.algorithm == Algorithm::hierarchical);
    CHECK_FALSE(large.latency);
    // Forced flat algorithms stay forced.
    algo::Overrides o;
    o.per_kind[static_cast<std::size_t>(CollectiveKind::all_reduce)] = Algorithm::tree;
    CHECK(algo::choose(CollectiveKind::all_reduce, 64 << 20, in, o).algorithm == Algorithm::tree);
  }
}

}  // namespace unit_test_cost_model
