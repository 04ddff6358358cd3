// SPDX-License-Identifier: BSD-3-Clause
// shm_floor: what the machine itself costs for the exchange a 2-rank 8-byte all_reduce over shm
// makes, with nothing but two processes and one shared mapping: no library, no checks, busy
// polling. Each process writes 8 bytes, a 32-byte descriptor and a stamp into its own cache line
// (two slots per direction used in turn, the layout of the shm links' mailboxes,
// transport/shm/detail/segment.hpp), then spins until the peer's stamp of the same round is
// there, and adds the peer's value to its own. That is all one_shot_all_reduce
// (algo/intranode/one_shot.hpp) does with the data; what the communicator adds around it
// (sequence number, call order, descriptor check, flight recorder) is what chorus's 8 B all_reduce
// costs above this floor. Read all_reduce_perf -b 8 -e 8 -z 2 --transport shm against it, in the
// same sitting.
//
// Usage: shm_floor [-n ITERS] [-r REPS]
// Prints one line per run: "shm_floor exchange 8 B: <microseconds> us" (per exchange), then the
// median. The two processes are pinned to CPUs 0 and 1 where the machine has two. A peer that
// does not answer within 10 s ends the program with status 1 (no wait without a bound).
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <new>
#include <vector>

#include <CLI/CLI.hpp>

namespace {

struct alignas(64) Slot {
  std::atomic<std::uint32_t> stamp{0};
  std::uint32_t bytes = 0;
  std::byte desc[32] = {};
  double value = 0;
};
static_assert(sizeof(Slot) == 64);

struct Shared {
  Slot slot[2][2];  ///< [writer][round % 2]
};

using Clock = std::chrono::steady_clock;

/// `iters` exchanges from round `first` on; false when the peer's stamp did not come within 10 s.
bool exchange(Shared& s, int me, std::uint32_t first, long iters, double& sum) {
  const double mine = me + 1.0;
  for (long i = 0; i < iters; ++i) {
    const std::uint32_t k = first + static_cast<std::uint32_t>(i);
    Slot& out = s.slot[me][k % 2];
    out.value = mine;
    out.bytes = 8;
    std::memcpy(out.desc, &k, sizeof k);
    out.stamp.store(k, std::memory_order_seq_cst);
    const Slot& in = s.slot[1 - me][k % 2];
    if (in.stamp.load(std::memory_order_acquire) != k) {
      const auto deadline = Clock::now() + std::chrono::seconds(10);
      for (long spins = 0; in.stamp.load(std::memory_order_acquire) != k; ++spins)
        if ((spins & 0xffff) == 0 && Clock::now() > deadline) return false;
    }
    sum += mine + in.value;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  long iters = 1'000'000;
  int reps = 5;
  CLI::App app{"shm_floor: two processes exchanging 8 bytes through one shared cache line each way"};
  app.add_option("-n,--iters", iters, "exchanges per run")->check(CLI::PositiveNumber);
  app.add_option("-r,--reps", reps, "runs")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);

  void* mem = ::mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) {
    std::perror("shm_floor: mmap");
    return 1;
  }
  auto* s = new (mem) Shared();
  const pid_t child = ::fork();
  if (child < 0) {
    std::perror("shm_floor: fork");
    return 1;
  }
  const int me = child == 0 ? 1 : 0;
  if (::sysconf(_SC_NPROCESSORS_ONLN) >= 2) {
    cpu_set_t cpus;
    CPU_ZERO(&cpus);
    CPU_SET(me, &cpus);
    (void)::sched_setaffinity(0, sizeof cpus, &cpus);
  }
  double sum = 0;
  std::vector<double> us;
  std::uint32_t round = 1;
  bool ok = exchange(*s, me, round, iters / 10 + 1, sum);  // warm-up
  round += static_cast<std::uint32_t>(iters / 10 + 1);
  for (int r = 0; ok && r < reps; ++r) {
    const auto t0 = Clock::now();
    ok = exchange(*s, me, round, iters, sum);
    const auto t1 = Clock::now();
    round += static_cast<std::uint32_t>(iters);
    us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / static_cast<double>(iters));
    if (ok && me == 0) std::printf("shm_floor exchange 8 B: %.3f us\n", us.back());
  }
  if (!ok) {
    std::fprintf(stderr, "shm_floor: process %d: the peer did not answer within 10 s\n", me);
    if (me == 0) ::kill(child, SIGKILL);
    return 1;
  }
  if (me == 1) return sum > 0 ? 0 : 1;
  int status = 0;
  ::waitpid(child, &status, 0);
  std::sort(us.begin(), us.end());
  std::printf("shm_floor exchange 8 B: median %.3f us of %d runs of %ld\n", us[us.size() / 2], reps, iters);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
