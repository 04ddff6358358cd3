// SPDX-License-Identifier: BSD-3-Clause
// startup_perf: what a job pays before and at its first collective, at many ranks: the
// communicator's creation, the first 8 B all_reduce, the steady one, the sockets each rank holds
// and its resident memory. The program launches itself (chorus::launch_local: N processes of
// this host, the launcher hosting the store) unless a launcher started it.
//
//   startup_perf [--nranks N] [--iters K]
//
// Every rank times its own chorus::init() (from the call to its return), its first all_reduce of
// 2 float32 (8 B) and then K more (their median); it counts its sockets (/proc/self/fd) after
// creation and after the calls, and reads its VmRSS. Rank 0 prints the maximum over the ranks of
// each (the median's maximum for the steady call), one line:
//
//   ranks 64 create_ms 2212.3 first_us 137000.0 steady_us 850.2 sockets_created 132 sockets_after 132 rss_kb
//   9000 wrong 0
//
// `wrong` counts ranks whose sums differ from the reference (exact small integers). The algorithm
// is the cost model's choice, or CHORUS_ALGO's (ring, tree, ...), the transport CHORUS_TRANSPORT's.
// The store's load: with CHORUS_DEBUG=INFO the launcher logs "TcpStore server on ...: served R
// requests over C connections" when it stops. scripts/startup-bench runs it over N and algorithms.
//
//   startup_perf --threads N
//
// runs N ranks as threads of this process over tcp loopback, meeting in one MemoryStore (as
// ranks as threads do), and times, slowest rank: creation, the first 8 B all_reduce, a barrier;
// then one rank's communicator is aborted (rank N*3/10; its thread lives on), and the others time
// their next call (it fails with peer_failure), shrink() (the aborted rank says it will not join),
// and the shrunk communicator's first 8 B all_reduce. One line:
//
//   threads 256 create_ms 1925.7 first_ms 618.3 barrier_ms 579.2 failed_ms 381.4 shrink_ms 2315.0
//           after_ms 432.9 rss_kb 190000 wrong 0
//
// (rss_kb: the process's resident memory once every rank is created.)
// sim/sim_startup models these (sim/include/chorus/sim/startup.hpp).
#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "chorus/bootstrap/local_launch.hpp"
#include "chorus/chorus.hpp"

namespace {

using Clock = std::chrono::steady_clock;

double micros(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

/// Open file descriptors of this process that are sockets.
int sockets_held() {
  int n = 0;
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  while (const dirent* e = ::readdir(dir)) {
    if (e->d_name[0] == '.') continue;
    char target[64] = {};
    const std::string path = std::string("/proc/self/fd/") + e->d_name;
    const ssize_t k = ::readlink(path.c_str(), target, sizeof target - 1);
    if (k > 0 && std::string_view(target, static_cast<std::size_t>(k)).starts_with("socket:")) ++n;
  }
  ::closedir(dir);
  return n;
}

/// VmRSS of this process in KiB.
long rss_kib() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.starts_with("VmRSS:")) return std::stol(line.substr(6));
  return -1;
}

double millis(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

/// --threads: N ranks as threads over tcp loopback; see the top of this file. Returns the exit code.
int run_threads(int n) {
  rlimit fds{};  // every rank's sockets are this process's: the soft limit raised to the hard one
  if (::getrlimit(RLIMIT_NOFILE, &fds) == 0 && fds.rlim_cur < fds.rlim_max) {
    fds.rlim_cur = fds.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &fds);
  }
  using Comm = chorus::Communicator<chorus::tcp::Transport>;
  using namespace std::chrono_literals;
  struct Times {
    double create = 0, first = 0, barrier = 0, failed = 0, shrink = 0, after = 0;
  };
  std::vector<Times> times(static_cast<std::size_t>(n));
  std::atomic<int> wrong{0};
  long rss_created = 0;  // the process's VmRSS (KiB) once every rank is created
  std::vector<std::string> errors(static_cast<std::size_t>(n));
  auto store = std::make_shared<chorus::MemoryStore>();  // the shrink's agreement meets in it too
  const int victim = n * 3 / 10;
  auto sum_8b = [&](Comm& c, int who) {
    std::vector<float> in{float(who + 1), 1.0f}, out(2, 0.0f);
    c.all_reduce(std::span<const float>(in), std::span(out), chorus::ReduceOp::sum);
    if (out[1] != float(c.size())) ++wrong;
  };
  auto meet = [&](const std::string& what, int rank, int skip) {  // through the store, not the links
    store->set("bench/" + what + "/" + std::to_string(rank), "1");
    std::vector<std::string> keys;
    for (int r = 0; r < n; ++r)
      if (r != skip) keys.push_back("bench/" + what + "/" + std::to_string(r));
    store->wait(keys, 600s);
  };
  std::vector<std::thread> threads;
  for (int rank = 0; rank < n; ++rank)
    threads.emplace_back([&, rank] {
      Times& t = times[static_cast<std::size_t>(rank)];
      try {
        chorus::Options o;
        o.rank = rank;
        o.world_size = n;
        o.store = store;
        o.timeout = 600s;
        o.setup_timeout = 600s;
        o.shrink_wait = 600s;  // not waited out: the aborted rank says it will not join
        auto t0 = Clock::now();
        auto comm = Comm::create(o);
        t.create = millis(Clock::now() - t0);
        meet("created", rank, -1);  // the calls' times without the creations' skew
        if (rank == 0) rss_created = rss_kib();
        t0 = Clock::now();
        sum_8b(comm, rank);
        t.first = millis(Clock::now() - t0);
        t0 = Clock::now();
        comm.barrier();
        t.barrier = millis(Clock::now() - t0);
        if (rank == victim) {
          comm.abort();
          store->set("bench/aborted", "1");
          return;
        }
        store->wait({"bench/aborted"}, 600s);
        t0 = Clock::now();
        try {
          sum_8b(comm, rank);
          ++wrong;  // the call without the aborted rank returned
        } catch (const chorus::Error& e) {
          if (e.code() != chorus::ErrorCode::peer_failure) throw;
        }
        t.failed = millis(Clock::now() - t0);
        t0 = Clock::now();
        auto shrunk = comm.shrink();
        t.shrink = millis(Clock::now() - t0);
        if (shrunk.size() != n - 1) ++wrong;
        meet("shrunk", rank, victim);
        t0 = Clock::now();
        sum_8b(shrunk, shrunk.rank());
        t.after = millis(Clock::now() - t0);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(rank)] = e.what();
        ++wrong;
      }
    });
  for (auto& th : threads) th.join();
  for (int r = 0; r < n; ++r)
    if (!errors[static_cast<std::size_t>(r)].empty())
      std::fprintf(stderr, "startup_perf: rank %d: %s\n", r, errors[static_cast<std::size_t>(r)].c_str());
  auto most = [&](double Times::*f) {
    double m = 0;
    for (const Times& t : times) m = std::max(m, t.*f);
    return m;
  };
  std::printf(
      "threads %d create_ms %.1f first_ms %.1f barrier_ms %.1f failed_ms %.1f shrink_ms %.1f after_ms %.1f "
      "rss_kb %ld wrong %d\n",
      n, most(&Times::create), most(&Times::first), most(&Times::barrier), most(&Times::failed),
      most(&Times::shrink), most(&Times::after), rss_created, wrong.load());
  return wrong.load() == 0 ? 0 : 4;
}

}  // namespace

int main(int argc, char** argv) {
  int nranks = 4;
  int iters = 20;
  CLI::App app{"chorus start-up: creation, first and steady 8 B all_reduce, sockets and memory per rank"};
  app.add_option("--nranks", nranks, "ranks to launch on this host (when no launcher started this)")
      ->check(CLI::Range(1, 4096));
  app.add_option("--iters", iters, "8 B all_reduces after the first (their median is reported)")
      ->check(CLI::Range(1, 100000));
  int threads = 0;
  app.add_option("--threads", threads, "run this many ranks as threads over tcp loopback (creation, shrink)")
      ->check(CLI::Range(2, 4096));
  CLI11_PARSE(app, argc, argv);
  try {
    if (threads > 0) return run_threads(threads);
    if (!chorus::launched_by_launcher()) return chorus::launch_local(nranks, argc, argv);

    const auto t0 = Clock::now();
    auto comm = chorus::init();
    const double create_us = micros(Clock::now() - t0);
    const int sockets_created = sockets_held();

    const int n = comm.size();
    std::vector<float> in{float(comm.rank() + 1), 1.0f}, out(2);
    int wrong = 0;
    auto check = [&] {
      if (out[0] != float(n) * float(n + 1) / 2 || out[1] != float(n)) wrong = 1;
    };
    auto t = Clock::now();
    comm.all_reduce(std::span<const float>(in), std::span<float>(out), chorus::ReduceOp::sum);
    const double first_us = micros(Clock::now() - t);
    check();
    std::vector<double> steady;
    for (int i = 0; i < iters; ++i) {
      t = Clock::now();
      comm.all_reduce(std::span<const float>(in), std::span<float>(out), chorus::ReduceOp::sum);
      steady.push_back(micros(Clock::now() - t));
      check();
    }
    std::nth_element(steady.begin(), steady.begin() + steady.size() / 2, steady.end());
    const double steady_us = steady[steady.size() / 2];
    const int sockets_after = sockets_held();

    // The maxima over the ranks, and the wrong ranks' count.
    std::vector<double> mine{create_us, first_us, steady_us, double(sockets_created), double(sockets_after),
                             double(rss_kib())};
    std::vector<double> most(mine.size());
    comm.all_reduce(std::span<const double>(mine), std::span<double>(most), chorus::ReduceOp::max);
    std::vector<std::int32_t> w{wrong}, wrong_ranks(1);
    comm.all_reduce(std::span<const std::int32_t>(w), std::span<std::int32_t>(wrong_ranks), chorus::ReduceOp::sum);
    if (comm.rank() == 0)
      std::printf("ranks %d create_ms %.1f first_us %.1f steady_us %.1f sockets_created %d sockets_after %d rss_kb %ld wrong %d\n",
                  n, most[0] / 1000, most[1], most[2], int(most[3]), int(most[4]), long(most[5]), wrong_ranks[0]);
    return wrong_ranks[0] == 0 ? 0 : 4;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "startup_perf: %s\n", e.what());
    return 3;
  }
}
