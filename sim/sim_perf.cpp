// SPDX-License-Identifier: BSD-3-Clause
/// sim_perf: chorus's own collective algorithms, run for H hosts x L virtual ranks over a
/// simulated network (sim/include/chorus/sim/), printed as nccl-tests rows with the simulated time.
///
///   sim_perf --preset sim/presets/namespace-hosts-1gbit.json --hosts 8 --ranks-per-host 8
///            --collective all_reduce -b 8 -e 1G -f 4 [--algo all] [-J out.json]
///
/// For every size: a row per algorithm that can run the collective at that layout (--algo all,
/// the default), or only the one named, or only the cost model's pick (--algo auto); then a line
/// with the cost model's pick (algo/plan.hpp's choose, fed the preset's parameters as
/// TransportModel alpha/beta/slice and the layout as HostShape), its simulated time, and the best
/// simulated algorithm. size is the whole buffer as nccl-tests counts it (reduce_scatter's
/// input, all_gather's output); algbw = size / time, busbw = algbw x the factor of bench/coll
/// (all_reduce 2(n-1)/n, reduce_scatter and all_gather (n-1)/n, broadcast and reduce 1).
/// At the end: wall time and peak RSS. scripts/sim-plot draws busbw against size from -J, whose rows
/// also give each simulation's own cost: events, messages and `cpu_s`, the host CPU seconds it took.
///
/// --jobs N: the simulations (one per size and algorithm, each independent of the others) run in
/// N worker processes (fork; each its own engine), the largest sizes handed out first; the rows
/// are printed in the same order and with the same figures as with one job (only the wall time
/// differs; the peak RSS is the largest process's).

#include <poll.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <csignal>
#include <chrono>
#include <cstring>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "chorus/detail/env.hpp"
#include "chorus/sim/collective.hpp"
#include "chorus/sim/preset.hpp"

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

/// One simulation's outcome, as a worker sends it back (one write of less than PIPE_BUF: atomic).
struct Outcome {
  std::int32_t task = -1, worker = -1;
  double seconds = 0;
  std::int32_t finished = 0;
  std::uint64_t events = 0, messages = 0, stack = 0;
  double cpu_s = 0;  ///< the host CPU time the simulation took (the simulator's own cost)
  char error[1024] = {};
};
static_assert(sizeof(Outcome) <= PIPE_BUF);

struct Task {
  std::size_t entry;
  chorus::sim::Candidate cand;
  chorus::sim::Call call;
  chorus::algo::Choice choice;
  int calls = 1;  ///< back to back; the last one's time (sim::simulate)
};

double thread_cpu_seconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

Outcome run_task(chorus::sim::Engine& e, const chorus::sim::Arena& arena, const Task& t, std::int32_t index) {
  Outcome o;
  o.task = index;
  const double cpu0 = thread_cpu_seconds();
  try {
    const chorus::sim::Result r = chorus::sim::simulate(e, arena, t.call, t.choice, t.calls);
    o.seconds = r.seconds;
    o.finished = r.finished;
    o.events = r.events;
    o.messages = r.messages;
  } catch (const std::exception& x) {
    std::snprintf(o.error, sizeof o.error, "%s", x.what());
  }
  o.stack = e.stack_high_water();
  o.cpu_s = thread_cpu_seconds() - cpu0;
  return o;
}

void write_all(int fd, const void* p, std::size_t n) {
  const auto* b = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = ::write(fd, b, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) ::_exit(3);
    b += w, n -= static_cast<std::size_t>(w);
  }
}

/// Reads exactly n bytes; false on end of file before the first byte.
bool read_all(int fd, void* p, std::size_t n, const char* what) {
  auto* b = static_cast<char*>(p);
  std::size_t got = 0;
  while (got < n) {
    const ssize_t r = ::read(fd, b + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) throw chorus::Error(chorus::ErrorCode::system, std::string("sim_perf: reading ") + what + ": " + std::strerror(errno));
    if (r == 0) {
      if (got == 0) return false;
      throw chorus::Error(chorus::ErrorCode::system, std::string("sim_perf: ") + what + " ended mid-record");
    }
    got += static_cast<std::size_t>(r);
  }
  return true;
}

/// Runs `tasks` in `jobs` forked workers, each with its own engine; calls done(outcome) in the
/// parent as each finishes (in any order). A worker that dies is an error naming its task.
template <class Done>
void run_workers(int jobs, const std::vector<Task>& tasks, const chorus::sim::NetworkModel& model, const chorus::sim::Layout& layout,
                 std::size_t stack_bytes, std::size_t arena_bytes, Done&& done) {
  int results[2];
  if (::pipe(results) != 0) throw chorus::Error(chorus::ErrorCode::system, std::string("sim_perf: pipe: ") + std::strerror(errno));
  std::vector<int> to(static_cast<std::size_t>(jobs), -1);
  std::vector<pid_t> pid(static_cast<std::size_t>(jobs), -1);
  std::vector<std::int32_t> busy(static_cast<std::size_t>(jobs), -1);
  std::fflush(stdout);
  std::fflush(stderr);
  for (int w = 0; w < jobs; ++w) {
    int t[2];
    if (::pipe(t) != 0) throw chorus::Error(chorus::ErrorCode::system, std::string("sim_perf: pipe: ") + std::strerror(errno));
    const pid_t p = ::fork();
    if (p < 0) throw chorus::Error(chorus::ErrorCode::system, std::string("sim_perf: fork: ") + std::strerror(errno));
    if (p == 0) {
      ::close(results[0]);
      ::close(t[1]);
      for (int v = 0; v < w; ++v) ::close(to[static_cast<std::size_t>(v)]);
      int rc = 0;
      try {
        chorus::sim::Engine engine(model, layout, stack_bytes);
        chorus::sim::Arena arena(arena_bytes);
        std::int32_t i;
        while (read_all(t[0], &i, sizeof i, "tasks") && i >= 0) {
          Outcome o = run_task(engine, arena, tasks[static_cast<std::size_t>(i)], i);
          o.worker = w;
          write_all(results[1], &o, sizeof o);
        }
      } catch (const std::exception& x) {
        Outcome o;
        o.worker = w;
        std::snprintf(o.error, sizeof o.error, "%s", x.what());
        write_all(results[1], &o, sizeof o);
        rc = 1;
      }
      ::_exit(rc);
    }
    ::close(t[0]);
    to[static_cast<std::size_t>(w)] = t[1];
    pid[static_cast<std::size_t>(w)] = p;
  }
  ::close(results[1]);
  // The largest sizes first (they take longest): the workers finish close together.
  std::vector<std::int32_t> order;
  for (std::size_t i = tasks.size(); i-- > 0;) order.push_back(static_cast<std::int32_t>(i));
  std::size_t next = 0, left = tasks.size();
  auto give = [&](int w) {
    std::int32_t i = next < order.size() ? order[next++] : -1;
    busy[static_cast<std::size_t>(w)] = i;
    write_all(to[static_cast<std::size_t>(w)], &i, sizeof i);
    if (i < 0) ::close(std::exchange(to[static_cast<std::size_t>(w)], -1));
  };
  auto stop = [&] {
    for (int w = 0; w < jobs; ++w) {
      if (to[static_cast<std::size_t>(w)] >= 0) ::close(to[static_cast<std::size_t>(w)]);
      if (pid[static_cast<std::size_t>(w)] > 0) ::kill(pid[static_cast<std::size_t>(w)], SIGTERM);
    }
    for (int w = 0; w < jobs; ++w)
      if (pid[static_cast<std::size_t>(w)] > 0) ::waitpid(pid[static_cast<std::size_t>(w)], nullptr, 0);
    ::close(results[0]);
  };
  try {
    for (int w = 0; w < jobs; ++w) give(w);
    while (left > 0) {
      pollfd pf{results[0], POLLIN, 0};
      const int r = ::poll(&pf, 1, 1000);
      if (r < 0 && errno != EINTR)
        throw chorus::Error(chorus::ErrorCode::system, std::string("sim_perf: poll: ") + std::strerror(errno));
      if (r <= 0) {
        // Every second without a result: a worker that died (a crash, the OOM killer) is an error.
        for (int w = 0; w < jobs; ++w) {
          int st = 0;
          const pid_t p = pid[static_cast<std::size_t>(w)];
          if (p > 0 && ::waitpid(p, &st, WNOHANG) == p) {
            pid[static_cast<std::size_t>(w)] = -1;
            const std::int32_t i = busy[static_cast<std::size_t>(w)];
            if (i >= 0)
              throw chorus::Error(chorus::ErrorCode::system,
                                  "sim_perf: worker " + std::to_string(w) + " (pid " + std::to_string(p) + ") died (" +
                                      (WIFSIGNALED(st) ? "signal " + std::to_string(WTERMSIG(st)) : "exit " + std::to_string(WEXITSTATUS(st))) +
                                      ") while simulating " + tasks[static_cast<std::size_t>(i)].cand.name() + " at " +
                                      std::to_string(tasks[static_cast<std::size_t>(i)].call.count) + " elements");
          }
        }
        continue;
      }
      Outcome o;
      if (!read_all(results[0], &o, sizeof o, "results"))
        throw chorus::Error(chorus::ErrorCode::system, "sim_perf: every worker closed its results with " + std::to_string(left) + " simulations left");
      if (o.task < 0) throw chorus::Error(chorus::ErrorCode::system, "sim_perf: worker " + std::to_string(o.worker) + ": " + o.error);
      --left;
      busy[static_cast<std::size_t>(o.worker)] = -1;
      give(o.worker);
      done(o);
    }
  } catch (...) {
    stop();
    throw;
  }
  stop();
}

}  // namespace

int main(int argc, char** argv) {
  namespace sim = chorus::sim;
  CLI::App app{"sim_perf: chorus's algorithms over a simulated network"};
  std::string preset, collective = "all_reduce", algo = "all", dtype_name = "float32", json_path, min_s = "8", max_s = "1G";
  int hosts = 1, local = 1, jobs = 1, calls = 1;
  std::size_t factor = 4, stack_kib = 32;
  app.add_option("--preset", preset, "network model (JSON, sim/presets/)")->required();
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
  app.add_option("--calls", calls, "calls back to back per simulation, the time being the last one's (as a timed loop "
                                    "of calls sees it; scripts/sim-validate --calls)")
      ->check(CLI::Range(1, 16))
      ->capture_default_str();
  app.add_option("--jobs", jobs, "worker processes, each simulating whole calls (sizes, algorithms) of its own")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  const auto wall0 = std::chrono::steady_clock::now();
  try {
    const sim::NetworkModel model = chorus::sim::load_preset(preset);
    model.check();
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
    const std::size_t arena_bytes = std::max<std::size_t>(std::size_t(64) << 30, 16 * max_b);
    const bool blocks = kind == CollectiveKind::reduce_scatter || kind == CollectiveKind::all_gather;

    // The plan: per size, its rows (one simulation each), in the order they are printed.
    struct Entry {
      std::uint64_t size = 0;
      bool skipped = false;
      std::size_t count = 0, total = 0;
      chorus::algo::Choice pick{};
      std::vector<std::size_t> tasks;
    };
    std::vector<Entry> entries;
    std::vector<Task> tasks;
    for (std::uint64_t size = min_b; size <= max_b; size = size * factor) {
      Entry en;
      en.size = size;
      std::size_t count = size / elem;
      if (blocks) count /= static_cast<std::size_t>(n);
      if (count == 0) {
        en.skipped = true;
        entries.push_back(en);
        if (size == 0) break;
        continue;
      }
      const std::size_t bytes = count * elem;  // per rank, as the communicator plans
      en.count = count;
      en.total = blocks ? bytes * static_cast<std::size_t>(n) : bytes;
      en.pick = sim::model_choice(kind, bytes, in);
      const sim::Call call{kind, *dtype, chorus::ReduceOp::sum, count, 0};
      for (const auto& c : run) {
        const bool is_pick = c.algorithm == en.pick.algorithm &&
                             (c.algorithm != chorus::algo::Algorithm::hierarchical || c.latency == en.pick.latency);
        if (algo == "auto" && !is_pick) continue;
        en.tasks.push_back(tasks.size());
        tasks.push_back(Task{entries.size(), c, call, sim::choice_for(c, kind, bytes, in), calls});
      }
      entries.push_back(std::move(en));
      if (size == 0 || size > max_b / factor) break;
    }

    std::printf("# sim_perf: %s over %d hosts x %d ranks (%d ranks), preset '%s' (%s)\n", collective.c_str(), hosts, local, n,
                model.name.c_str(), preset.c_str());
    if (calls > 1) std::printf("# %d calls back to back per row, the time being the last one's\n", calls);
    std::printf("# model: intra %.2f us, %.3g GB/s, overhead %.2f us, eager %zu B; inter %.2f us, %.3g GB/s per %s, overhead "
                "%.2f us, eager %zu B; reduce %.3g GB/s\n",
                model.intra.latency * 1e6, model.intra.bandwidth / 1e9, model.intra.overhead * 1e6, model.intra.eager_bytes,
                model.inter.latency * 1e6, model.inter.bandwidth / 1e9, model.nic_per_rank ? "rank" : "host",
                model.inter.overhead * 1e6, model.inter.eager_bytes, model.reduce_rate / 1e9);
    std::printf("#\n# %12s %12s %8s %6s %14s %12s %8s %8s %10s\n", "size", "count", "type", "redop", "algorithm", "time(us)",
                "algbw", "busbw", "events");
    nlohmann::json out = {{"preset", model.name},    {"preset_file", preset}, {"collective", collective},
                          {"hosts", hosts},          {"ranks_per_host", local}, {"ranks", n},
                          {"dtype", dtype_name},     {"calls", calls},
                          {"rows", nlohmann::json::array()},
                          {"choices", nlohmann::json::array()}};
    int worst_size = -1;
    double worst = 0;
    std::size_t deepest = 0;

    // Prints every row whose simulation is done, in plan order, up to the first one not done.
    std::vector<Outcome> outcomes(tasks.size());
    std::vector<bool> have(tasks.size(), false);
    std::size_t shown_entry = 0, shown_task = 0;  // next entry; next of its tasks
    double best = std::numeric_limits<double>::infinity(), picked = -1;
    std::string best_name;
    auto emit = [&] {
      for (; shown_entry < entries.size(); ++shown_entry, shown_task = 0) {
        const Entry& en = entries[shown_entry];
        if (en.skipped) {
          std::printf("# %12llu: fewer elements than ranks, skipped\n", static_cast<unsigned long long>(en.size));
          continue;
        }
        for (; shown_task < en.tasks.size(); ++shown_task) {
          const std::size_t ti = en.tasks[shown_task];
          if (!have[ti]) return;
          const Outcome& r = outcomes[ti];
          const Task& t = tasks[ti];
          if (r.error[0]) throw chorus::Error(chorus::ErrorCode::system, r.error);
          const double us = r.seconds * 1e6, algbw = static_cast<double>(en.total) / r.seconds / 1e9,
                       busbw = algbw * bus_factor(kind, n);
          const bool is_pick = t.cand.algorithm == en.pick.algorithm &&
                               (t.cand.algorithm != chorus::algo::Algorithm::hierarchical || t.cand.latency == en.pick.latency);
          std::printf("  %12zu %12zu %8s %6s %14s %12.2f %8.3f %8.3f %10llu%s\n", en.total, blocks ? en.count * n : en.count,
                      dtype_name.c_str(), "sum", t.cand.name().c_str(), us, algbw, busbw, static_cast<unsigned long long>(r.events),
                      is_pick ? "  <- model" : "");
          std::fflush(stdout);
          out["rows"].push_back({{"size", en.total}, {"count", en.count}, {"type", dtype_name}, {"redop", "sum"},
                                 {"algorithm", t.cand.name()}, {"time_us", us}, {"algbw", algbw}, {"busbw", busbw},
                                 {"model_pick", is_pick}, {"events", r.events}, {"messages", r.messages},
                                 {"ranks_finished", r.finished}, {"cpu_s", r.cpu_s}});
          if (r.seconds < best) best = r.seconds, best_name = t.cand.name();
          if (is_pick) picked = r.seconds;
        }
        if (run.size() > 1 || algo == "auto") {
          const double ratio = picked > 0 ? picked / best : 0;
          std::printf("# %12zu model picks %s (models %.2f us)%s; best simulated: %s %.2f us%s\n", en.total,
                      choice_name(en.pick).c_str(), en.pick.seconds * 1e6, picked > 0 ? "" : ", not simulated", best_name.c_str(),
                      best * 1e6, picked > 0 ? (" (pick/best " + std::to_string(ratio).substr(0, 5) + ")").c_str() : "");
          out["choices"].push_back({{"size", en.total}, {"model_pick", choice_name(en.pick)}, {"model_us", en.pick.seconds * 1e6},
                                    {"pick_us", picked > 0 ? picked * 1e6 : -1}, {"best", best_name}, {"best_us", best * 1e6}});
          if (picked > 0 && ratio > worst) worst = ratio, worst_size = static_cast<int>(out["choices"].size()) - 1;
        }
        best = std::numeric_limits<double>::infinity(), picked = -1, best_name.clear();
      }
    };
    auto done = [&](const Outcome& o) {
      outcomes[static_cast<std::size_t>(o.task)] = o;
      have[static_cast<std::size_t>(o.task)] = true;
      deepest = std::max<std::size_t>(deepest, o.stack);
      emit();
    };
    emit();  // sizes skipped before the first simulation
    if (jobs == 1 || tasks.size() <= 1) {
      sim::Engine engine(model, layout, stack_kib << 10);
      sim::Arena arena(arena_bytes);
      for (std::size_t i = 0; i < tasks.size(); ++i) done(run_task(engine, arena, tasks[i], static_cast<std::int32_t>(i)));
    } else {
      run_workers(std::min<int>(jobs, static_cast<int>(tasks.size())), tasks, model, layout, stack_kib << 10, arena_bytes, done);
    }
    emit();
    rusage ru{}, kids{};
    ::getrusage(RUSAGE_SELF, &ru);
    ::getrusage(RUSAGE_CHILDREN, &kids);
    const long maxrss = std::max(ru.ru_maxrss, kids.ru_maxrss);
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
    if (worst_size >= 0)
      std::printf("# worst pick/best: %.3f at %s bytes\n", worst, out["choices"][static_cast<std::size_t>(worst_size)]["size"].dump().c_str());
    std::printf("# wall time %.2f s, peak RSS %.1f MiB, deepest fiber stack %zu of %zu KiB\n", wall,
                static_cast<double>(maxrss) / 1024.0, deepest >> 10, stack_kib);
    out["wall_s"] = wall;
    out["peak_rss_kib"] = maxrss;
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
