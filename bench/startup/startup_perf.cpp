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
//   ranks 64 create_ms 2212.3 first_us 137000.0 steady_us 850.2 sockets_created 132 sockets_after 132 rss_kb 9000 wrong 0
//
// `wrong` counts ranks whose sums differ from the reference (exact small integers). The algorithm
// is the cost model's choice, or CHORUS_ALGO's (ring, tree, ...), the transport CHORUS_TRANSPORT's.
// The store's load: with CHORUS_DEBUG=INFO the launcher logs "TcpStore server on ...: served R
// requests over C connections" when it stops. scripts/startup-bench runs it over N and algorithms.
#include <dirent.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <span>
#include <string>
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

}  // namespace

int main(int argc, char** argv) {
  int nranks = 4;
  int iters = 20;
  CLI::App app{"chorus start-up: creation, first and steady 8 B all_reduce, sockets and memory per rank"};
  app.add_option("--nranks", nranks, "ranks to launch on this host (when no launcher started this)")
      ->check(CLI::Range(1, 4096));
  app.add_option("--iters", iters, "8 B all_reduces after the first (their median is reported)")
      ->check(CLI::Range(1, 100000));
  CLI11_PARSE(app, argc, argv);
  try {
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
