// SPDX-License-Identifier: BSD-3-Clause
// 01_ring: the smallest chorus program. Starts N local ranks (or joins a job started by mpirun,
// srun or torchrun --no_python; docs/torch.md), passes a token around the ring, then streams a
// buffer around it and reports the time per hop.
//
//   01_ring --nranks 4            # starts 4 ranks on this host
//   mpirun -np 4 01_ring          # or let a launcher start them

#include <chorus/chorus.hpp>
#include <chorus/bootstrap/local_launch.hpp>

#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <numeric>
#include <vector>

int main(int argc, char** argv) {
  CLI::App app{"chorus ring: a token and a buffer passed around the ranks"};
  int nranks = 4;
  std::size_t bytes = 1 << 20;
  int laps = 10;
  app.add_option("--nranks", nranks, "ranks to start on this host when not run by a launcher")->check(CLI::Range(1, 256));
  app.add_option("--bytes", bytes, "size of the buffer sent around the ring");
  app.add_option("--laps", laps, "laps of the buffer around the ring")->check(CLI::Range(1, 100000));
  CLI11_PARSE(app, argc, argv);

  try {
    if (!chorus::launched_by_launcher()) return chorus::launch_local(nranks, argc, argv);

    auto comm = chorus::init();
    const int rank = comm.rank(), size = comm.size();
    const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
    if (size == 1) {
      std::printf("rank 0 of 1: nobody to talk to; start more ranks with --nranks\n");
      return 0;
    }

    // 1. A token: rank 0 starts it at 0, every rank adds its rank and passes it on.
    std::int64_t token = 0;
    if (rank == 0) {
      comm.send(std::span(&token, 1), next, /*tag=*/0);
      comm.recv(std::span(&token, 1), prev, 0);
      const std::int64_t expect = std::int64_t(size) * (size - 1) / 2;
      std::printf("rank 0: the token came back as %lld after visiting %d ranks (expected %lld) %s\n",
                  static_cast<long long>(token), size, static_cast<long long>(expect), token == expect ? "OK" : "WRONG");
      if (token != expect) return 1;
    } else {
      comm.recv(std::span(&token, 1), prev, 0);
      token += rank;
      comm.send(std::span(&token, 1), next, 0);
    }
    comm.barrier();

    // 2. A buffer streamed around the ring: every rank sends to next while receiving from prev.
    std::vector<std::uint32_t> out(bytes / 4), in(bytes / 4);
    std::iota(out.begin(), out.end(), std::uint32_t(rank) << 24);
    const auto t0 = std::chrono::steady_clock::now();
    for (int lap = 0; lap < laps; ++lap) {
      auto r = comm.irecv(in, prev, 1);
      auto s = comm.isend(out, next, 1);
      s.wait();
      r.wait();
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    bool ok = true;
    for (std::size_t i = 0; i < in.size(); ++i) ok = ok && in[i] == (std::uint32_t(prev) << 24) + i;
    std::printf("rank %d of %d: received %d x %zu bytes from rank %d, %.1f us per hop, %.2f GB/s %s\n", rank, size,
                laps, in.size() * 4, prev, secs / laps * 1e6, double(in.size() * 4) * laps / secs / 1e9,
                ok ? "OK" : "WRONG");
    comm.barrier();
    return ok ? 0 : 1;
  } catch (const chorus::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
}
