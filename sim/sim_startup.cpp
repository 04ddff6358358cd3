// SPDX-License-Identifier: BSD-3-Clause
/// sim_startup: a communicator's creation and shrink() at many ranks, simulated
/// (sim/include/chorus/sim/startup.hpp: what it models and how), against measurements.
///
///   sim_startup --preset sim/presets/this-machine-startup.json --ranks 16,64,256,1024,4096
///               [--measured sim/measured/startup-threads.txt] [--fit-on 2,4,8,32,128]
///
/// Prints a row per rank count: the simulated creation and shrink (ms), the store requests and
/// wake-ups the model counts, and, where --measured has that rank count (lines of
/// `startup_perf --threads N`; the median per N is taken), the measured figures and
/// simulated/measured, and the memory the process's links take (the model's n (n - 1) x
/// link_bytes). --fit-on LIST first fits the costs (start_wait_us, rank_us, link_us,
/// link_cached_us, link_after_us, teardown_us, link_teardown_us, teardown_wait_us) to the measured
/// rank counts listed (least squares of log(simulated/measured), creation and shrink, a coordinate
/// search from the preset's values) and prints them; the other measured rank counts are then a
/// validation. --check F: exit 1 where a rank count listed and
/// measured is simulated more than F (0.25: 25%) away from its measurement, creation or shrink.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <tuple>
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
  p.start_wait_us = j.at("start_wait_us").get<double>();
  p.link_us = j.at("link_us").get<double>();
  p.link_cached_us = j.at("link_cached_us").get<double>();
  p.link_after_us = j.at("link_after_us").get<double>();
  p.link_bytes = j.at("link_bytes").get<double>();
  p.cache_bytes = j.at("cache_bytes").get<double>();
  p.link_teardown_us = j.at("link_teardown_us").get<double>();
  p.teardown_wait_us = j.at("teardown_wait_us").get<double>();
  p.request_us = j.at("request_us").get<double>();
  p.wake_us = j.at("wake_us").get<double>();
  p.teardown_us = j.at("teardown_us").get<double>();
  p.gathers = j.at("gathers").get<int>();
  p.extra_requests = j.at("extra_requests").get<int>();
  return p;
}

/// The sum over the measured rank counts in `on` of log(simulated/measured)², creation and shrink.
double misfit(const Params& p, const std::map<int, Measured>& m, const std::vector<int>& on) {
  double e = 0;
  for (const auto& [n, x] : m) {
    if (std::find(on.begin(), on.end(), n) == on.end()) continue;
    const auto r = chorus::sim::startup::simulate(p, n, true);
    e += std::pow(std::log(r.create_ms / x.create_ms), 2);
    if (x.shrink_ms > 0 && r.shrink_ms > 0) e += std::pow(std::log(r.shrink_ms / x.shrink_ms), 2);
  }
  return e;
}

/// A coordinate search of the CPU costs (factors of 2 down to 1.005) from the preset's values.
Params fit(Params p, const std::map<int, Measured>& m, const std::vector<int>& on) {
  double best = misfit(p, m, on);
  for (double step = 2.0; step > 1.005; step = std::sqrt(step)) {
    for (bool better = true; better;) {
      better = false;
      for (double* v : {&p.start_wait_us, &p.rank_us, &p.link_us, &p.link_cached_us, &p.link_after_us,
                        &p.teardown_us, &p.link_teardown_us, &p.teardown_wait_us})
        for (double f : {step, 1 / step}) {
          const double old = *v;
          *v = old * f;
          const double e = misfit(p, m, on);
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

std::vector<int> int_list(const std::string& text) {
  std::vector<int> v;
  std::stringstream list(text);
  for (std::string item; std::getline(list, item, ',');) v.push_back(std::stoi(item));
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  std::string preset, measured_path, ranks_arg = "16,64,256,1024,4096", fit_arg;
  double check = 0;
  CLI::App app{"chorus creation and shrink at many ranks, simulated"};
  app.add_option("--preset", preset, "the model's parameters (JSON)")->required();
  app.add_option("--ranks", ranks_arg, "rank counts, comma-separated");
  app.add_option("--measured", measured_path, "startup_perf --threads lines to compare with");
  app.add_option("--fit-on", fit_arg,
                 "fit the CPU costs to these measured rank counts first (comma-separated)");
  app.add_option("--check", check,
                 "exit 1 where a measured rank count's simulated/measured is off by more than this")
      ->check(CLI::Range(0.0, 10.0));
  CLI11_PARSE(app, argc, argv);
  try {
    Params p = read_preset(preset);
    std::map<int, Measured> measured;
    if (!measured_path.empty()) measured = read_measured(measured_path);
    if (!fit_arg.empty()) {
      if (measured.empty()) throw std::runtime_error("--fit-on needs --measured");
      p = fit(p, measured, int_list(fit_arg));
      std::printf(
          "fitted to %s ranks: \"start_wait_us\": %.1f, \"rank_us\": %.1f, \"link_us\": %.2f, "
          "\"link_cached_us\": %.2f, \"link_after_us\": %.2f, "
          "\"teardown_us\": %.1f, \"link_teardown_us\": %.2f, \"teardown_wait_us\": %.1f\n\n",
          fit_arg.c_str(), p.start_wait_us, p.rank_us, p.link_us, p.link_cached_us, p.link_after_us,
          p.teardown_us, p.link_teardown_us, p.teardown_wait_us);
    }
    const std::vector<int> ranks = int_list(ranks_arg);
    int off = 0;
    std::printf(
        "| ranks | creation, simulated (ms) | measured | sim/meas | shrink, simulated (ms) | measured | "
        "sim/meas | store requests, creation | shrink's | wake-ups, creation | shrink's | links' memory "
        "(MiB) |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|\n");
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
      std::printf("| %d | %s | %s | %s | %s | %s | %s | %ld | %ld | %ld | %ld | %.0f |\n", n,
                  fmt(r.create_ms).c_str(), have ? fmt(x.create_ms).c_str() : "",
                  have ? ratio(r.create_ms, x.create_ms).c_str() : "", fmt(r.shrink_ms).c_str(),
                  have ? fmt(x.shrink_ms).c_str() : "", have ? ratio(r.shrink_ms, x.shrink_ms).c_str() : "",
                  r.create.requests, r.shrink.requests, r.create.wakeups, r.shrink.wakeups,
                  double(n) * (n - 1) * p.link_bytes / (1 << 20));
      if (check > 0 && have)
        for (const auto& [what, s, m] : {std::tuple{"creation", r.create_ms, x.create_ms},
                                         std::tuple{"shrink", r.shrink_ms, x.shrink_ms}})
          if (std::abs(s / m - 1) > check) {
            std::fprintf(
                stderr,
                "sim_startup: %d ranks: %s simulated %.1f ms, measured %.1f ms: off by more than %.0f%%\n", n,
                what, s, m, check * 100);
            ++off;
          }
    }
    return off == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sim_startup: %s\n", e.what());
    return 2;
  }
}
