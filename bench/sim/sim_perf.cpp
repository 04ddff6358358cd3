// SPDX-License-Identifier: BSD-3-Clause
/// sim_perf: chorus's own collective algorithms, run for H hosts x L virtual ranks over a
/// simulated network (include/chorus/sim/), printed as nccl-tests rows with the simulated time.
///
///   sim_perf --preset bench/sim/presets/namespace-hosts-1gbit.json --hosts 8 --ranks-per-host 8
///            --collective all_reduce -b 8 -e 1G -f 4 [--algo all] [-J out.json]
///
/// For every size: a row per algorithm that can run the collective at that layout (--algo all,
/// the default), or only the one named, or only the cost model's pick (--algo auto); then a line
/// with the cost model's pick (algo/plan.hpp's choose, fed the preset's parameters as
/// TransportModel alpha/beta/slice and the layout as HostShape), its simulated time, and the best
/// simulated algorithm. size is the whole buffer as nccl-tests counts it (reduce_scatter's
/// input, all_gather's output); algbw = size / time, busbw = algbw x the factor of bench/coll
/// (all_reduce 2(n-1)/n, reduce_scatter and all_gather (n-1)/n, broadcast and reduce 1).
/// At the end: wall time and peak RSS. scripts/sim-plot draws busbw against size from -J.

#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "chorus/detail/env.hpp"
#include "chorus/sim/collective.hpp"
#include "sim/common/preset.hpp"

namespace {

using chorus::algo::CollectiveKind;

CollectiveKind parse_kind(const std::string& s) {
  for (CollectiveKind k : {CollectiveKind::all_reduce, CollectiveKind::reduce_scatter, CollectiveKind::all_gather,
                           CollectiveKind::broadcast, CollectiveKind::reduce})
    if (s == chorus::algo::to_string(k)) return k;
  throw CLI::ValidationError("--collective", "'" + s + "' is not one of all_reduce, reduce_scatter, all_gather, broadcast, reduce");
}

double bus_factor(CollectiveKind k, int n) {
  switch (k) {
    case CollectiveKind::all_reduce: return 2.0 * (n - 1) / n;
    case CollectiveKind::reduce_scatter:
    case CollectiveKind::all_gather: return static_cast<double>(n - 1) / n;
    default: return 1.0;
  }
}

std::string choice_name(const chorus::algo::Choice& c) {
  return chorus::sim::Candidate{c.algorithm, c.latency}.name();
}

}  // namespace

int main(int argc, char** argv) {
  namespace sim = chorus::sim;
  CLI::App app{"sim_perf: chorus's algorithms over a simulated network"};
  std::string preset, collective = "all_reduce", algo = "all", dtype_name = "float32", json_path, min_s = "8", max_s = "1G";
  int hosts = 1, local = 1;
  std::size_t factor = 4, stack_kib = 32;
  app.add_option("--preset", preset, "network model (JSON, bench/sim/presets/)")->required();
  app.add_option("--hosts", hosts, "hosts")->check(CLI::PositiveNumber);
  app.add_option("--ranks-per-host", local, "ranks per host")->check(CLI::PositiveNumber);
  app.add_option("--collective", collective, "all_reduce, reduce_scatter, all_gather, broadcast, reduce")->capture_default_str();
  app.add_option("-b,--minbytes", min_s, "smallest size (K, M, G: powers of 1024)")->capture_default_str();
  app.add_option("-e,--maxbytes", max_s, "largest size")->capture_default_str();
  app.add_option("-f,--stepfactor", factor, "size multiplier between rows")->check(CLI::Range(2, 1024))->capture_default_str();
  app.add_option("--algo", algo, "all, auto (the model's pick only) or one algorithm (ring, tree, recursive_doubling, "
                                  "binomial, chain, hierarchical: both its forms)")->capture_default_str();
  app.add_option("--dtype", dtype_name, "data type")->capture_default_str();
  app.add_option("-J,--output_file", json_path, "JSON output (rows and choices)");
  app.add_option("--stack-kib", stack_kib, "fiber stack per virtual rank, KiB")->check(CLI::Range(16, 8192))->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  const auto wall0 = std::chrono::steady_clock::now();
  try {
    const sim::NetworkModel model = chorus::bench::sim::load_preset(preset);
    const CollectiveKind kind = parse_kind(collective);
    const auto dtype = chorus::parse_data_type(dtype_name);
    if (!dtype) throw CLI::ValidationError("--dtype", "'" + dtype_name + "' is not a data type");
    const std::size_t elem = chorus::size_of(*dtype);
    const std::uint64_t min_b = chorus::detail::parse_bytes(min_s, "-b"), max_b = chorus::detail::parse_bytes(max_s, "-e");
    const sim::Layout layout{hosts, local};
    const int n = layout.ranks();
    const auto all = sim::candidates(kind, layout);
    std::vector<sim::Candidate> run;
    if (algo == "all" || algo == "auto") {
      run = all;
    } else {
      for (const auto& c : all)
        if (std::string(chorus::algo::to_string(c.algorithm)) == algo) run.push_back(c);
      if (run.empty())
        throw CLI::ValidationError("--algo", "'" + algo + "' cannot run " + collective + " on " + std::to_string(hosts) +
                                                 " hosts of " + std::to_string(local) + " ranks");
    }
    const chorus::algo::PlanInputs in = sim::plan_inputs(model, layout);
    sim::Engine engine(model, layout, stack_kib << 10);
    sim::Arena arena(std::max<std::size_t>(std::size_t(64) << 30, 16 * max_b));

    std::printf("# sim_perf: %s over %d hosts x %d ranks (%d ranks), preset '%s' (%s)\n", collective.c_str(), hosts, local, n,
                model.name.c_str(), preset.c_str());
    std::printf("# model: intra %.2f us, %.3g GB/s, overhead %.2f us, eager %zu B; inter %.2f us, %.3g GB/s per %s, overhead "
                "%.2f us, eager %zu B; reduce %.3g GB/s\n",
                model.intra.latency * 1e6, model.intra.bandwidth / 1e9, model.intra.overhead * 1e6, model.intra.eager_bytes,
                model.inter.latency * 1e6, model.inter.bandwidth / 1e9, model.nic_per_rank ? "rank" : "host",
                model.inter.overhead * 1e6, model.inter.eager_bytes, model.reduce_rate / 1e9);
    std::printf("#\n# %12s %12s %8s %6s %14s %12s %8s %8s %10s\n", "size", "count", "type", "redop", "algorithm", "time(us)",
                "algbw", "busbw", "events");
    nlohmann::json out = {{"preset", model.name},    {"preset_file", preset}, {"collective", collective},
                          {"hosts", hosts},          {"ranks_per_host", local}, {"ranks", n},
                          {"dtype", dtype_name},     {"rows", nlohmann::json::array()},
                          {"choices", nlohmann::json::array()}};
    int worst_size = -1;
    double worst = 0;
    for (std::uint64_t size = min_b; size <= max_b; size = size * factor) {
      std::size_t count = size / elem;
      const bool blocks = kind == CollectiveKind::reduce_scatter || kind == CollectiveKind::all_gather;
      if (blocks) count /= static_cast<std::size_t>(n);
      if (count == 0) {
        std::printf("# %12llu: fewer elements than ranks, skipped\n", static_cast<unsigned long long>(size));
        if (size == 0) break;
        continue;
      }
      const std::size_t bytes = count * elem;  // per rank, as the communicator plans
      const std::size_t total = blocks ? bytes * static_cast<std::size_t>(n) : bytes;
      const sim::Call call{kind, *dtype, chorus::ReduceOp::sum, count, 0};
      const chorus::algo::Choice pick = sim::model_choice(kind, bytes, in);
      double best = std::numeric_limits<double>::infinity(), picked = -1;
      std::string best_name;
      for (const auto& c : run) {
        if (algo == "auto" && !(c.algorithm == pick.algorithm && (c.algorithm != chorus::algo::Algorithm::hierarchical || c.latency == pick.latency)))
          continue;
        const chorus::algo::Choice ch = sim::choice_for(c, kind, bytes, in);
        const sim::Result r = sim::simulate(engine, arena, call, ch);
        const double us = r.seconds * 1e6, algbw = static_cast<double>(total) / r.seconds / 1e9, busbw = algbw * bus_factor(kind, n);
        const bool is_pick = c.algorithm == pick.algorithm && (c.algorithm != chorus::algo::Algorithm::hierarchical || c.latency == pick.latency);
        std::printf("  %12zu %12zu %8s %6s %14s %12.2f %8.3f %8.3f %10llu%s\n", total, blocks ? count * n : count, dtype_name.c_str(),
                    "sum", c.name().c_str(), us, algbw, busbw, static_cast<unsigned long long>(r.events), is_pick ? "  <- model" : "");
        std::fflush(stdout);
        out["rows"].push_back({{"size", total}, {"count", count}, {"type", dtype_name}, {"redop", "sum"}, {"algorithm", c.name()},
                               {"time_us", us}, {"algbw", algbw}, {"busbw", busbw}, {"model_pick", is_pick},
                               {"events", r.events}, {"messages", r.messages}, {"ranks_finished", r.finished}});
        if (r.seconds < best) best = r.seconds, best_name = c.name();
        if (is_pick) picked = r.seconds;
      }
      if (run.size() > 1 || algo == "auto") {
        const double ratio = picked > 0 ? picked / best : 0;
        std::printf("# %12zu model picks %s (models %.2f us)%s; best simulated: %s %.2f us%s\n", total, choice_name(pick).c_str(),
                    pick.seconds * 1e6, picked > 0 ? "" : ", not simulated", best_name.c_str(), best * 1e6,
                    picked > 0 ? (" (pick/best " + std::to_string(ratio).substr(0, 5) + ")").c_str() : "");
        out["choices"].push_back({{"size", total}, {"model_pick", choice_name(pick)}, {"model_us", pick.seconds * 1e6},
                                  {"pick_us", picked > 0 ? picked * 1e6 : -1}, {"best", best_name}, {"best_us", best * 1e6}});
        if (picked > 0 && ratio > worst) worst = ratio, worst_size = static_cast<int>(out["choices"].size()) - 1;
      }
      if (size == 0 || size > max_b / factor) break;
    }
    rusage ru{};
    ::getrusage(RUSAGE_SELF, &ru);
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
    if (worst_size >= 0)
      std::printf("# worst pick/best: %.3f at %s bytes\n", worst, out["choices"][static_cast<std::size_t>(worst_size)]["size"].dump().c_str());
    std::printf("# wall time %.2f s, peak RSS %.1f MiB, deepest fiber stack %zu of %zu KiB\n", wall,
                static_cast<double>(ru.ru_maxrss) / 1024.0, engine.stack_high_water() >> 10, stack_kib);
    out["wall_s"] = wall;
    out["peak_rss_kib"] = ru.ru_maxrss;
    if (!json_path.empty()) {
      std::ofstream f(json_path);
      f << out.dump(1) << "\n";
      if (!f) throw chorus::Error(chorus::ErrorCode::system, "cannot write " + json_path);
    }
  } catch (const CLI::Error& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sim_perf: %s\n", e.what());
    return 1;
  }
  return 0;
}
