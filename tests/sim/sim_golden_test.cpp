// SPDX-License-Identifier: BSD-3-Clause
/// sim.golden_64: the simulator at 64 virtual ranks (8 hosts x 8) over a fixed preset
/// (testdata/golden-64.json, a frozen copy of presets/namespace-hosts-1gbit.json, given as the
/// first argument). The simulation is deterministic
/// (sim/engine.hpp: events ordered by time and sequence number, nothing read from the host's
/// clock), so each fixed case must give its golden simulated time within 1%; a change to the
/// engine, the network model, the preset or an algorithm that moves one fails here. Also: every
/// rank finishes, and a ring all_reduce of 8 B takes longer at 64 ranks than at 8.
/// Exit status 0 when every check passes, 1 otherwise (each failure printed).

#include <cmath>
#include <cstdio>
#include <string>

#include "chorus/sim/collective.hpp"
#include "chorus/sim/preset.hpp"

namespace {

int failures = 0;

void check(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "ok  " : "FAIL", what.c_str());
  if (!ok) ++failures;
}

}  // namespace

int main(int argc, char** argv) {
  namespace sim = chorus::sim;
  using chorus::algo::Algorithm;
  using chorus::algo::CollectiveKind;
  if (argc != 2) {
    std::fprintf(stderr, "usage: sim_golden_test PRESET.json\n");
    return 2;
  }
  try {
    const sim::NetworkModel model = chorus::sim::load_preset(argv[1]);
    const sim::Layout layout{8, 8};
    const auto in = sim::plan_inputs(model, layout);
    sim::Engine engine(model, layout);
    sim::Arena arena(std::size_t(1) << 30);
    struct Case {
      CollectiveKind kind;
      sim::Candidate algo;
      std::size_t bytes;
      double golden_us;
    };
    // Golden simulated times (us), from this engine at the commit that set them; deterministic.
    const Case cases[] = {
        {CollectiveKind::all_reduce, {Algorithm::ring}, 1 << 20, 16569.072},
        {CollectiveKind::all_reduce, {Algorithm::hierarchical, false}, 1 << 20, 15269.816},
        {CollectiveKind::all_reduce, {Algorithm::hierarchical, true}, 8, 177.207},
        {CollectiveKind::all_reduce, {Algorithm::tree}, 1 << 20, 57245.172},
        {CollectiveKind::all_reduce, {Algorithm::recursive_doubling}, 8, 170.150},
        {CollectiveKind::broadcast, {Algorithm::chain}, 1 << 20, 40812.458},
        {CollectiveKind::reduce_scatter, {Algorithm::hierarchical, false}, 4 << 10, 2002.354},
    };
    for (const Case& c : cases) {
      const sim::Call call{c.kind, chorus::DataType::float32, chorus::ReduceOp::sum, c.bytes / 4, 0};
      const sim::Result r = sim::simulate(engine, arena, call, sim::choice_for(c.algo, c.kind, c.bytes, in));
      const double us = r.seconds * 1e6;
      char line[256];
      std::snprintf(line, sizeof line, "%s %s %zu B: %.3f us simulated, golden %.3f us, %d of 64 ranks finished",
                    std::string(chorus::algo::to_string(c.kind)).c_str(), c.algo.name().c_str(), c.bytes, us, c.golden_us,
                    r.finished);
      check(std::fabs(us - c.golden_us) <= 0.01 * c.golden_us && r.finished == 64, line);
    }
    // More ranks, more ring steps: 8 B over a ring of 64 against a ring of 8 (one host).
    sim::Engine small(model, sim::Layout{1, 8});
    const sim::Call tiny{CollectiveKind::all_reduce, chorus::DataType::float32, chorus::ReduceOp::sum, 2, 0};
    const double t64 = sim::simulate(engine, arena, tiny, sim::choice_for({Algorithm::ring}, tiny.kind, 8, in)).seconds;
    const double t8 =
        sim::simulate(small, arena, tiny, sim::choice_for({Algorithm::ring}, tiny.kind, 8, sim::plan_inputs(model, {1, 8}))).seconds;
    check(t64 > t8, "ring all_reduce 8 B: " + std::to_string(t64 * 1e6) + " us at 64 ranks > " + std::to_string(t8 * 1e6) +
                        " us at 8");
  } catch (const std::exception& e) {
    std::printf("FAIL %s\n", e.what());
    return 1;
  }
  return failures == 0 ? 0 : 1;
}
