// SPDX-License-Identifier: BSD-3-Clause
/// sim_startup: a communicator's creation and shrink() at many ranks, simulated
/// (sim/include/chorus/sim/startup.hpp: what it models and how), against measurements.
///
///   sim_startup --preset sim/presets/this-machine-startup.json --ranks 16,64,256,1024,4096
///               [--measured sim/measured/startup-threads.txt] [--fit 8]
///
/// Prints a row per rank count: the simulated creation and shrink (ms), the store requests and
/// wake-ups the model counts, and, where --measured has that rank count (lines of
/// `startup_perf --threads N`; the median per N is taken), the measured figures and
/// simulated/measured. --fit K first fits rank_us, wake_us and teardown_us to the measured rank
/// counts of at most K (least squares of log(simulated/measured), a coordinate search from the
/// preset's values) and prints the fitted values; the larger rank counts are then a validation.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "chorus/sim/startup.hpp"

namespace {

using chorus::sim::startup::Params;

struct Measured {
  double create_ms = 0, shrink_ms = 0;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[(v.size() - 1) / 2];
}

/// The median per rank count of `startup_perf --threads N` lines.
std::map<int, Measured> read_measured(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::map<int, std::vector<std::map<std::string, double>>> rows;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string first;
    int n = 0;
    if (!(words >> first >> n) || first != "threads") continue;
    std::map<std::string, double> row;
    std::string k;
    double v = 0;
    while (words >> k >> v) row[k] = v;
    rows[n].push_back(row);
  }
  std::map<int, Measured> out;
  for (auto& [n, rs] : rows) {
    auto col = [&](const char* k) {
      std::vector<double> v;
      for (auto& r : rs) v.push_back(r[k]);
      return median(v);
    };
    out[n] = {col("create_ms"), col("shrink_ms")};
  }
  return out;
}

Params read_preset(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path);
  const auto j = nlohmann::json::parse(in);
  Params p;
  p.cores = j.at("cores").get<int>();
  p.rank_us = j.at("rank_us").get<double>();
  p.request_us = j.at("request_us").get<double>();
  p.wake_us = j.at("wake_us").get<double>();
  p.teardown_us = j.at("teardown_us").get<double>();
  p.gathers = j.at("gathers").get<int>();
  p.extra_requests = j.at("extra_requests").get<int>();
  return p;
}

/// The sum over the measured rank counts up to `most` of log(simulated/measured)², creation and
/// shrink both.
double misfit(const Params& p, const std::map<int, Measured>& m, int most) {
  double e = 0;
  for (const auto& [n, x] : m) {
    if (n > most) continue;
    const auto r = chorus::sim::startup::simulate(p, n, true);
    e += std::pow(std::log(r.create_ms / x.create_ms), 2);
    if (x.shrink_ms > 0 && r.shrink_ms > 0) e += std::pow(std::log(r.shrink_ms / x.shrink_ms), 2);
  }
  return e;
}

/// A coordinate search of rank_us, wake_us and teardown_us (factors of 2 down to 1.01).
Params fit(Params p, const std::map<int, Measured>& m, int most) {
  double best = misfit(p, m, most);
  for (double step = 2.0; step > 1.005; step = std::sqrt(step)) {
    for (bool better = true; better;) {
      better = false;
      for (double* v : {&p.rank_us, &p.wake_us, &p.teardown_us})
        for (double f : {step, 1 / step}) {
          const double old = *v;
          *v = old * f;
          const double e = misfit(p, m, most);
          if (e < best - 1e-12) {
            best = e;
            better = true;
          } else {
            *v = old;
          }
        }
    }
  }
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  std::string preset, measured_path, ranks_arg = "16,64,256,1024,4096";
  int fit_most = 0;
  CLI::App app{"chorus creation and shrink at many ranks, simulated"};
  app.add_option("--preset", preset, "the model's parameters (JSON)")->required();
  app.add_option("--ranks", ranks_arg, "rank counts, comma-separated");
  app.add_option("--measured", measured_path, "startup_perf --threads lines to compare with");
  app.add_option("--fit", fit_most, "fit to the measured rank counts of at most this many first");
  CLI11_PARSE(app, argc, argv);
  try {
    Params p = read_preset(preset);
    std::map<int, Measured> measured;
    if (!measured_path.empty()) measured = read_measured(measured_path);
    if (fit_most > 0) {
      if (measured.empty()) throw std::runtime_error("--fit needs --measured");
      p = fit(p, measured, fit_most);
      std::printf(
          "# fitted to the measured rank counts up to %d: rank_us %.1f wake_us %.3f teardown_us %.1f\n",
          fit_most, p.rank_us, p.wake_us, p.teardown_us);
    }
    std::vector<int> ranks;
    std::stringstream list(ranks_arg);
    for (std::string item; std::getline(list, item, ',');) ranks.push_back(std::stoi(item));
    std::printf(
        "| ranks | creation, simulated (ms) | measured | sim/meas | shrink, simulated (ms) | measured | "
        "sim/meas | store requests, creation | shrink's | wake-ups, creation | shrink's |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (int n : ranks) {
      const auto r = chorus::sim::startup::simulate(p, n, true);
      const auto it = measured.find(n);
      auto fmt = [](double v) {
        char b[32];
        std::snprintf(b, sizeof b, "%.0f", v);
        return std::string(b);
      };
      auto ratio = [](double s, double m) {
        char b[32];
        std::snprintf(b, sizeof b, "%.2f", s / m);
        return m > 0 ? std::string(b) : std::string("");
      };
      const Measured x = it == measured.end() ? Measured{} : it->second;
      const bool have = it != measured.end();
      std::printf("| %d | %s | %s | %s | %s | %s | %s | %ld | %ld | %ld | %ld |\n", n,
                  fmt(r.create_ms).c_str(), have ? fmt(x.create_ms).c_str() : "",
                  have ? ratio(r.create_ms, x.create_ms).c_str() : "", fmt(r.shrink_ms).c_str(),
                  have ? fmt(x.shrink_ms).c_str() : "", have ? ratio(r.shrink_ms, x.shrink_ms).c_str() : "",
                  r.create.requests, r.shrink.requests, r.create.wakeups, r.shrink.wakeups);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sim_startup: %s\n", e.what());
    return 2;
  }
}
