// SPDX-License-Identifier: BSD-3-Clause
// One rank of a program that creates its communicator several times, as test suites and
// notebooks do: ROUNDS rounds (argument, default 3) of chorus::init(), an all_reduce of odd size
// checked against its reference, and in the second round a split into even and odd ranks with a
// barrier and an all_reduce on it; each communicator is destroyed before the next is made. Run by
// tests/integration/run_mpi_hosts.sh under mpirun and mpiexec across namespace hosts, where the
// rounds after the first meet on the store the launcher's exchange found.
//
// Output: "ROUND r rank R/N OK" per round, or "ROUND r rank R/N WRONG index I got G expected E";
// a chorus::Error ends the program with "ROUNDS_ERROR rank R: <what()>" and status 3.
// Exit: 0 all right, 4 a wrong result, 3 an error, 2 usage.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <span>
#include <string>
#include <vector>

#include "chorus/chorus.hpp"

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 3;
  if (rounds < 1) {
    std::fprintf(stderr, "usage: rounds_driver [rounds >= 1]\n");
    return 2;
  }
  int rank = -1;
  try {
    int status = 0;
    for (int round = 0; round < rounds; ++round) {
      auto comm = chorus::init();
      rank = comm.rank();
      const int n = comm.size();
      constexpr std::size_t kCount = 1021;
      std::vector<std::int64_t> in(kCount), out(kCount);
      for (std::size_t i = 0; i < kCount; ++i) in[i] = static_cast<std::int64_t>(i) * (rank + 1) + round;
      comm.all_reduce(std::span<const std::int64_t>(in), std::span<std::int64_t>(out), chorus::ReduceOp::sum);
      bool ok = true;
      for (std::size_t i = 0; i < kCount && ok; ++i) {
        const std::int64_t want = static_cast<std::int64_t>(i) * n * (n + 1) / 2 + std::int64_t(round) * n;
        if (out[i] != want) {
          std::printf("ROUND %d rank %d/%d WRONG index %zu got %lld expected %lld\n", round, rank, n, i,
                      static_cast<long long>(out[i]), static_cast<long long>(want));
          ok = false;
        }
      }
      if (round == 1) {
        auto sub = comm.split(rank % 2, rank);
        sub.barrier();
        std::vector<std::int64_t> one{rank}, sum(1);
        sub.all_reduce(std::span<const std::int64_t>(one), std::span<std::int64_t>(sum), chorus::ReduceOp::sum);
        std::int64_t want = 0;
        for (int r = rank % 2; r < n; r += 2) want += r;
        if (sum[0] != want) {
          std::printf("ROUND %d rank %d/%d WRONG split sum got %lld expected %lld\n", round, rank, n,
                      static_cast<long long>(sum[0]), static_cast<long long>(want));
          ok = false;
        }
      }
      if (ok) std::printf("ROUND %d rank %d/%d OK\n", round, rank, n);
      std::fflush(stdout);
      if (!ok) status = 4;
    }
    return status;
  } catch (const std::exception& e) {
    std::printf("ROUNDS_ERROR rank %d: %s\n", rank, e.what());
    return 3;
  }
}
