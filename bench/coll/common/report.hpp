// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// The output of a *_perf program, in nccl-tests' layout (2.19, the same as 2.18's: src/util.cu), so that scripts
/// written for nccl-tests read it: the "#" header, one "#  Rank" line per rank, the two-level
/// column header, one row per size (out-of-place, then in-place), and the footer with
/// "# Out of bounds values" and "# Avg bus bandwidth". Where nccl-tests names a GPU, the rank
/// lines name the transport. --show-algo adds an "algo" column at the end of each row.
/// "Out of bounds values" is the number of wrong elements over every checked result, summed over
/// ranks (nccl-tests counts the failed results instead); either way 0 means every check passed.
///
/// With -J file.json, rank 0 also writes nccl-tests' JSON document (nlohmann::ordered_json): config,
/// devices (here: ranks), "results" with one record per row, out_of_bounds and
/// average_bus_bandwidth. Differences: booleans are JSON booleans (nccl-tests writes "true" as a
/// string), "root" is a number, "env" lists only CHORUS_* and launcher variables (never
/// CHORUS_JOB_TOKEN), and each record carries the "algorithm" the cost model picks.

#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "chorus/version.hpp"
#include "coll/common/settings.hpp"

extern char** environ;

namespace chorus::bench {

/// The nccl-tests release whose output layout this follows (printed as nccl-tests' version).
inline constexpr std::string_view kNcclTestsFormat = "2.19.7";

struct RankInfo {
  int rank = 0;
  int pid = 0;
  std::string host;
  int local_rank = -1;  ///< the communicator's (its ranks' host identities)
  int local_size = -1;
  std::string launcher;  ///< rank 0's launcher ("slurm", "torchrun", ...), "" without one
  int launcher_local_rank = -1;  ///< what the launcher's variables say, -1 where they do not
  int launcher_local_size = -1;
};

/// One half of a row: out-of-place or in-place.
struct Result {
  double time_us = 0;
  double algbw = 0;  ///< GB/s, 1 GB = 1e9 bytes
  double busbw = 0;
  std::optional<std::int64_t> wrong;  ///< nullopt: not checked (printed N/A)
};

namespace detail {

/// value in `width` characters, with as many decimals as fit (nccl-tests' getFloatStr).
inline std::string fit(double value, int width) {
  char buf[64];
  if (!std::isfinite(value)) {
    std::snprintf(buf, sizeof buf, "%*s", width, std::isnan(value) ? "nan" : "inf");
    return buf;
  }
  int digits = 0;  // of the integer part
  for (double p = 1; value >= p && digits < 40; p *= 10) ++digits;
  if (digits < width - 2) {
    std::snprintf(buf, sizeof buf, "%*.2f", width, value);
  } else if (digits < width - 1) {
    std::snprintf(buf, sizeof buf, "%*.1f", width, value);
  } else if (digits < width + 1) {
    std::snprintf(buf, sizeof buf, "%*.0f", width, value);
  } else if (width >= 7) {
    std::snprintf(buf, sizeof buf, "%*.1e", width, value);
  } else {
    std::snprintf(buf, sizeof buf, "%*.0e", width, value);
  }
  return buf;
}

inline std::string now_string() {
  char buf[64];
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

/// Environment entries worth recording: chorus's and the launchers', never the job token.
inline bool recorded_env(std::string_view entry) {
  const std::string_view name = entry.substr(0, entry.find('='));
  if (name == "CHORUS_JOB_TOKEN") return false;
  for (std::string_view p : {"CHORUS_", "OMPI_COMM_WORLD_", "PMI_", "PMIX_RANK", "SLURM_PROCID", "SLURM_NTASKS"})
    if (name.starts_with(p)) return true;
  return name == "RANK" || name == "WORLD_SIZE" || name == "LOCAL_RANK" || name == "MASTER_ADDR" ||
         name == "MASTER_PORT";
}

}  // namespace detail

class Reporter {
 public:
  /// Only the reporter with `enabled` (rank 0) prints or writes anything.
  Reporter(bool enabled, const Settings& s, std::string program) : on_(enabled), s_(s), program_(std::move(program)) {}

  /// The "#" header: version, parameters, one line per rank. Opens the JSON file, if any.
  void header(const std::vector<RankInfo>& ranks, std::string_view transport, const std::string& algorithm,
              std::chrono::milliseconds timeout) {
    if (!on_) return;
    open_json();
    std::printf("# nccl-tests version %.*s chorus=%s\n", int(kNcclTestsFormat.size()), kNcclTestsFormat.data(),
                chorus::version().string);
    std::printf("# Collective test starting: %s\n", program_.c_str());
    const bool factor = s_.step_factor > 1;
    std::printf(
        "# nThread 1 nGpus %d minBytes %zu maxBytes %zu step: %zu(%s) warmup iters: %d iters: %d agg iters: %d "
        "validation: %d graph: 0 unalign: 0\n",
        s_.ngpus, s_.min_bytes, s_.max_bytes, factor ? s_.step_factor : s_.step_bytes, factor ? "factor" : "bytes",
        s_.warmup_iters, s_.iters, s_.agg_iters, s_.check);
    if (s_.blocking == 1) std::printf("# Blocking Enabled: wait for completion and barrier after each collective \n");
    if (s_.blocking == 2) std::printf("# Blocking Enabled: wait for completion after each collective (no barrier) \n");
    std::printf("# chorus %s: %zu ranks, transport %.*s, algorithm %s, timeout %lld ms\n",
                chorus::version().string, ranks.size(),
                int(transport.size()), transport.data(), algorithm.empty() ? "auto" : algorithm.c_str(),
                static_cast<long long>(timeout.count()));
    if (s_.local_register != 0)
      std::printf("# chorus: -R 1: %s\n", s_.ngpus != 0 ? "device buffers, nothing registered (staged through chorus's own memory)"
                                                         : "send and receive buffers registered once (chorus::RegisteredMemory)");
    if (s_.persistent != 0)
      std::printf("# chorus: --persistent 1: each row's timed calls start one persistent operation (made once per row)\n");
    if (s_.device == "cuda")
      std::printf("# chorus: buffers in device memory (CUDA runtime), timed with CUDA events\n");
    else if (s_.device == "sim")
      std::printf("# chorus: buffers in simulated device memory (device::SimRuntime, no GPU): a check of the device "
                  "path; its times are not a GPU's\n");
    std::printf("#\n# Using devices\n");
    // nccl-tests' device list; chorus adds each rank's local rank and size on its host, and
    // those its launcher's variables give, where they give them.
    for (const auto& r : ranks) {
      std::printf("#  Rank %2d Group %2d Pid %6d on %10s transport %.*s local %d/%d", r.rank, 0, r.pid, r.host.c_str(),
                  int(transport.size()), transport.data(), r.local_rank, r.local_size);
      if (!r.launcher.empty()) std::printf(" %s local %d/%d", r.launcher.c_str(), r.launcher_local_rank, r.launcher_local_size);
      std::printf("\n");
    }
    if (json_) {
      auto& j = *json_;
      j["config"] = {
          {"nthreads", 1},
          {"ngpus", s_.ngpus},
          {"device", s_.device},
          {"minimum_bytes", s_.min_bytes},
          {"maximum_bytes", s_.max_bytes},
          {factor ? "step_factor" : "step_bytes", factor ? s_.step_factor : s_.step_bytes},
          {"warmup_iters", s_.warmup_iters},
          {"iterations", s_.iters},
          {"aggregated_iterations", s_.agg_iters},
          {"validation", s_.check},
          {"graph", 0},
          {"blocking_collectives", s_.blocking != 0},
          {"local_register", s_.local_register},
          {"persistent", s_.persistent != 0},
          {"parallel_init", false},
          {"run_cycles", s_.run_cycles},
          {"average", s_.average},
          {"nranks", ranks.size()},
          {"transport", transport},
          {"algorithm", algorithm.empty() ? "auto" : algorithm},
          {"chunk_bytes", s_.chunk_bytes},
          {"timeout_ms", timeout.count()},
      };
      auto& devices = j["config"]["devices"] = nlohmann::ordered_json::array();
      for (const auto& r : ranks)
        devices.push_back({{"rank", r.rank}, {"group", 0}, {"pid", r.pid}, {"hostname", r.host}, {"transport", transport}});
      j["results"] = nlohmann::ordered_json::array();
    }
    std::fflush(stdout);
  }

  /// The column header.
  void table_header() {
    if (!on_) return;
    const char* extra = s_.show_algo ? " algo" : "";
    const char* time = s_.report_cputime ? "cputime" : "time";
    std::printf("#\n");
    std::printf("# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          \n", "", "",
                "", "", "");
    std::printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s %s\n", "size", "count", "type",
                "redop", "root", time, "algbw", "busbw", "#wrong", time, "algbw", "busbw", "#wrong", extra);
    std::printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s %s\n", "(B)", "(elements)", "",
                "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "", "");
    std::fflush(stdout);
  }

  /// The start of a row: size, count, type, op, root. The row is printed whole by row_end.
  void row_begin(std::size_t bytes, std::size_t count, std::string_view type, std::string_view op, int root) {
    if (!on_) return;
    char buf[128];
    std::snprintf(buf, sizeof buf, "%12zu  %12zu  %8.*s  %6.*s  %6i", bytes, count, int(type.size()), type.data(),
                  int(op.size()), op.data(), root);
    row_ = buf;
    if (json_)
      record_ = {{"size", bytes}, {"count", count}, {"type", type}, {"redop", op}, {"root", root}};
  }

  /// One half of the row (out-of-place first).
  void result(const Result& r, bool out_of_place) {
    bus_sum_ += r.busbw;
    ++bus_count_;
    if (!on_) return;
    const std::string t = detail::fit(r.time_us, 7), a = detail::fit(r.algbw, 6), b = detail::fit(r.busbw, 6);
    char buf[128];
    if (r.wrong) {
      std::snprintf(buf, sizeof buf, "  %7s  %6s  %6s  %6g", t.c_str(), a.c_str(), b.c_str(), static_cast<double>(*r.wrong));
    } else {
      std::snprintf(buf, sizeof buf, "  %7s  %6s  %6s    N/A", t.c_str(), a.c_str(), b.c_str());
    }
    row_ += buf;
    if (json_) {
      nlohmann::ordered_json half = {
          {s_.report_cputime ? "cpu_time" : "time", r.time_us}, {"alg_bw", r.algbw}, {"bus_bw", r.busbw}};
      half["nwrong"] = r.wrong ? nlohmann::ordered_json(*r.wrong) : nlohmann::ordered_json(nullptr);
      record_[out_of_place ? "out_of_place" : "in_place"] = std::move(half);
    }
  }

  /// The end of a row.
  void row_end(const std::string& algorithm) {
    if (!on_) return;
    if (s_.show_algo) row_ += "  " + algorithm;
    std::printf("%s\n", row_.c_str());  // whole, so that a rank's report of a wrong element never splits it
    std::fflush(stdout);
    if (json_) {
      record_["actual_iterations"] = s_.iters;
      record_["experiment_name"] = "";
      record_["algorithm"] = algorithm;
      (*json_)["results"].push_back(std::move(record_));
      record_ = nlohmann::ordered_json();
    }
  }

  /// The footer; writes the JSON file. `wrong`: wrong elements over every checked result.
  void footer(std::int64_t wrong) {
    const double avg = bus_count_ ? bus_sum_ / bus_count_ : 0.0;
    if (!on_) return;
    if (s_.check == 0)  // -c 0: nothing was compared, so nothing is claimed
      std::printf("# %-20s : not checked (-c 0)\n", "Out of bounds values");
    else
      std::printf("# %-20s : %lld %s\n", "Out of bounds values", static_cast<long long>(wrong), wrong ? "FAILED" : "OK");
    std::printf("# %-20s : %g %s\n", "Avg bus bandwidth", avg, "");
    std::printf("#\n# Collective test concluded: %s\n#\n\n", program_.c_str());
    std::fflush(stdout);
    if (json_) {
      auto& j = *json_;
      j["out_of_bounds"] = {{"count", wrong}, {"okay", wrong == 0}};
      j["average_bus_bandwidth"] = {{"bandwidth", avg}, {"okay", "unchecked"}};
      j["end_time"] = detail::now_string();
      j["errors"] = nlohmann::ordered_json::array();
      std::ofstream out(json_path_);
      out << j.dump(2) << '\n';
      if (!out) std::fprintf(stderr, "%s: could not write %s\n", program_.c_str(), json_path_.c_str());
      json_.reset();
    }
  }

 private:
  /// Like nccl-tests: only *.json is written; an existing file is kept and FILE.0, FILE.1, ...
  /// tried instead.
  void open_json() {
    const std::string& path = s_.output_file;
    if (path.empty()) return;
    const auto dot = path.rfind('.'), slash = path.rfind('/');
    std::string ext = dot == std::string::npos || (slash != std::string::npos && dot < slash) ? "" : path.substr(dot + 1);
    for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (ext != "json") {
      std::printf("# skipping output file %s: only .json is supported\n", path.c_str());
      return;
    }
    std::string candidate = path;
    for (int i = 0; ::access(candidate.c_str(), F_OK) == 0; ++i) candidate = path + "." + std::to_string(i);
    {
      std::ofstream probe(candidate);
      if (!probe) {
        std::printf("# skipping json output; %s not accessible\n", candidate.c_str());
        return;
      }
    }
    json_path_ = candidate;
    std::printf("# Writing JSON output to %s\n", candidate.c_str());
    nlohmann::ordered_json j;
    j["version"] = 2;
    j["start_time"] = detail::now_string();
    j["args"] = s_.argv;
    auto& env = j["env"] = nlohmann::ordered_json::array();
    for (char** e = environ; *e != nullptr; ++e)
      if (detail::recorded_env(*e)) env.push_back(*e);
    j["chorus_version"] = chorus::version().string;
    json_ = std::move(j);
  }

  bool on_;
  const Settings& s_;
  std::string program_;
  double bus_sum_ = 0;
  long bus_count_ = 0;
  std::optional<nlohmann::ordered_json> json_;
  std::string json_path_;
  std::string row_;
  nlohmann::ordered_json record_;
};

}  // namespace chorus::bench
