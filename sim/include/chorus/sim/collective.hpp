// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// One collective call simulated on every virtual rank: the call's buffers in the arena, each
/// rank's sim::Channel and sim::Executor, and algo::run(), the same switch from (collective,
/// algorithm) to the algorithm's code that the communicator runs. Also what the cost model
/// (algo/plan.hpp's choose) would pick for the layout, with the network model's parameters as
/// its inputs, and the algorithms each collective can run there.

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include "chorus/algo/descriptor.hpp"
#include "chorus/algo/plan.hpp"
#include "chorus/algo/run.hpp"
#include "chorus/sim/channel.hpp"
#include "chorus/sim/engine.hpp"
#include "chorus/sim/executor.hpp"
#include "chorus/topology/hosts.hpp"

namespace chorus::sim {

/// A call: `count` as the collective defines it (reduce_scatter, all_gather: the block per rank).
struct Call {
  algo::CollectiveKind kind = algo::CollectiveKind::all_reduce;
  DataType dtype = DataType::float32;
  ReduceOp op = ReduceOp::sum;
  std::size_t count = 0;
  int root = 0;
};

struct Result {
  double seconds = 0;      ///< the last rank's finish (every rank starts at 0); see simulate's `calls`
  double first_done = 0;   ///< the first rank's finish
  int finished = 0;        ///< ranks that returned
  std::uint64_t events = 0, messages = 0;
};

/// An algorithm as the simulator names it: the hierarchical forms are two rows.
struct Candidate {
  algo::Algorithm algorithm;
  bool latency = false;  ///< hierarchical: the small-message form
  std::string name() const {
    if (algorithm == algo::Algorithm::hierarchical) return latency ? "hier_latency" : "hierarchical";
    return std::string(algo::to_string(algorithm));
  }
};

inline topology::Hosts hosts_of(const Layout& l) {
  std::vector<int> keys(static_cast<std::size_t>(l.ranks()));
  for (int r = 0; r < l.ranks(); ++r) keys[static_cast<std::size_t>(r)] = l.host_of(r);
  return topology::Hosts::from_keys(std::span<const int>(keys));
}

/// What a communicator of this layout over this network would plan with (algo/plan.hpp).
inline algo::PlanInputs plan_inputs(const NetworkModel& m, const Layout& l) {
  algo::PlanInputs in;
  in.rank = 0;
  in.size = l.ranks();
  in.hosts = hosts_of(l);
  in.links.intra = m.intra_model();
  in.links.inter = m.inter_model(l.ranks_per_host);
  in.links.have_intra = l.ranks_per_host > 1;
  in.links.have_inter = l.hosts > 1;
  in.model = l.hosts > 1 ? in.links.inter : in.links.intra;
  // With a NIC per rank one flow has that NIC, not the host's links together; the reduction rate.
  if (m.nic_per_rank) in.flow_beta = 1.0 / m.inter.bandwidth;
  in.reduce_beta = 1.0 / m.reduce_rate;
  return in;
}

/// The algorithms `kind` can run at this layout (hierarchical: with two hosts or more, one of
/// them with two ranks or more).
inline std::vector<Candidate> candidates(algo::CollectiveKind kind, const Layout& l) {
  using algo::Algorithm;
  std::vector<Candidate> c;
  switch (kind) {
    case algo::CollectiveKind::all_reduce:
      c = {{Algorithm::ring}, {Algorithm::tree}, {Algorithm::recursive_doubling}};
      break;
    case algo::CollectiveKind::broadcast: c = {{Algorithm::binomial}, {Algorithm::chain}}; break;
    case algo::CollectiveKind::reduce: c = {{Algorithm::binomial}, {Algorithm::ring}}; break;
    case algo::CollectiveKind::all_gather:
    case algo::CollectiveKind::reduce_scatter: c = {{Algorithm::ring}}; break;
    default:
      throw Error(ErrorCode::invalid_argument, "sim: " + std::string(algo::to_string(kind)) +
                                                   " is not simulated (all_reduce, reduce_scatter, all_gather, "
                                                   "broadcast, reduce)");
  }
  if (algo::has_hierarchical(kind) && l.hosts >= 2 && l.ranks_per_host >= 2) {
    c.push_back({Algorithm::hierarchical, false});
    if (kind != algo::CollectiveKind::all_gather && kind != algo::CollectiveKind::reduce_scatter)
      c.push_back({Algorithm::hierarchical, true});
  }
  return c;
}

/// The plan of a call forced to `c` (its slice as the communicator would take it).
inline algo::Choice choice_for(const Candidate& c, algo::CollectiveKind kind, std::size_t bytes, const algo::PlanInputs& in) {
  algo::Overrides o;
  if (c.algorithm == algo::Algorithm::hierarchical)
    return algo::Choice{algo::Algorithm::hierarchical, algo::slice_bytes(in.links.inter, o), 0, c.latency};
  o.per_kind[static_cast<std::size_t>(kind)] = c.algorithm;
  return algo::choose(kind, bytes, in, o);
}

/// The cost model's own pick (nothing forced).
inline algo::Choice model_choice(algo::CollectiveKind kind, std::size_t bytes, const algo::PlanInputs& in) {
  return algo::choose(kind, bytes, in, algo::Overrides{});
}

/// Bytes of the call's input and output buffers per rank.
inline std::size_t in_bytes(const Call& c, int n) {
  const std::size_t b = c.count * size_of(c.dtype);
  return c.kind == algo::CollectiveKind::reduce_scatter ? b * static_cast<std::size_t>(n) : b;
}
inline std::size_t out_bytes(const Call& c, int n) {
  const std::size_t b = c.count * size_of(c.dtype);
  return c.kind == algo::CollectiveKind::all_gather ? b * static_cast<std::size_t>(n) : b;
}

/// Runs `call` with `choice` on every rank of `e`, all starting at virtual time 0.
///
/// `calls` > 1 runs that many of the same call back to back on every rank, each rank going on to
/// the next as soon as its own part of the previous is done (as all_reduce_perf's timed loop
/// does), and the result is the last call's: its seconds are the last rank's finish less the
/// last rank's finish of the call before. What one call leaves behind (a NIC still sending, a
/// token bucket refilled by a rank's idle tail) then shows in the time as it does in a loop of
/// measured calls. The events and messages are the whole run's.
inline Result simulate(Engine& e, const Arena& arena, const Call& call, const algo::Choice& choice, int calls = 1) {
  if (calls < 1)
    throw Error(ErrorCode::invalid_argument, "sim: calls " + std::to_string(calls) + " is not a positive count");
  const int n = e.size();
  const topology::Hosts hosts = hosts_of(e.layout());
  algo::CollectiveDesc desc;
  desc.kind = call.kind;
  desc.dtype = call.dtype;
  desc.op = call.op;
  desc.root = call.root;
  desc.count = call.count;
  std::byte* in = arena.at(Arena::in, in_bytes(call, n));
  std::byte* out = call.kind == algo::CollectiveKind::broadcast ? in : arena.at(Arena::out, out_bytes(call, n));
  // Each rank's clock when it starts the last call (0 with one call).
  std::vector<double> last_start(static_cast<std::size_t>(n), 0.0);
  e.run([&](int r) {
    Channel ch(e, r);
    Executor x(e, r, arena);
    algo::Args a;
    a.in = in;
    a.out = out;
    a.count = call.count;
    a.dtype = call.dtype;
    a.op = call.op;
    a.root = call.root;
    a.slice_bytes = choice.slice_bytes;
    a.exec = &x;
    for (int c = 0; c < calls; ++c) {
      if (c == calls - 1) last_start[static_cast<std::size_t>(r)] = e.clock(r);
      algo::run(ch, desc, a, choice, n, hosts);
      ch.finish();
    }
  });
  Result res;
  const double origin = *std::max_element(last_start.begin(), last_start.end());
  res.first_done = e.clock(0);
  for (int r = 0; r < n; ++r) {
    res.seconds = std::max(res.seconds, e.clock(r));
    res.first_done = std::min(res.first_done, e.clock(r));
    res.finished += e.finished(r) ? 1 : 0;
  }
  res.seconds -= origin;
  res.first_done = std::max(0.0, res.first_done - origin);
  res.events = e.events();
  res.messages = e.messages();
  return res;
}

}  // namespace chorus::sim
