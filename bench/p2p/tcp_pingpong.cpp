// SPDX-License-Identifier: BSD-3-Clause
// tcp_pingpong: point-to-point latency and bandwidth between two processes on this host, over
// the tcp transport (loopback; the default), the shm transport (--transport shm) or the rdma
// transport (--transport rdma: an RDMA device, e.g. Soft-RoCE on lo, scripts/rdma-guest). The program
// launches itself: run it plainly and it starts two ranks of itself through chorus::launch_local
// (which hosts the store on 127.0.0.1).
//
//   tcp_pingpong [--transport tcp|shm|rdma|auto] [--iters N] [--warmup N] [--repeats N]
//                [--sizes 8,64,1K,64K] [--bw-sizes 1M,16M,64M]
//
// Latency: ping-pong, rank 0 sends `size` bytes and rank 1 sends them back; the half round trip
// of every iteration is timed, and the table gives the median, the minimum and the 90th percentile.
// Bandwidth: rank 0 sends back-to-back messages of `size` bytes (at least 256 MiB in all, at
// least 4 messages) while rank 1 keeps 4 receives posted; rank 1 acknowledges the last one. GB/s
// is bytes / (first send to ack received), 1 GB = 1e9 bytes; the table gives the median and the
// best of --repeats runs (after one warm-up run).
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include "chorus/bootstrap/local_launch.hpp"
#include "chorus/chorus.hpp"

#include <CLI/CLI.hpp>
#include "chorus/detail/env.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using Comm = chorus::Communicator<chorus::DefaultTransport>;  // transport chosen by --transport

struct Args {
  std::string transport = "tcp";
  int iters = 2000;
  int warmup = 200;
  int repeats = 5;
  std::vector<std::size_t> lat_sizes = {8, 64, 1024, 64 << 10};
  std::vector<std::size_t> bw_sizes = {1 << 20, 16 << 20, 64 << 20};
};

/// CLI11 reads sizes as strings so that K/M/G suffixes work ("8,64,1K,64K").
std::vector<std::size_t> to_sizes(const std::vector<std::string>& items, std::string_view what) {
  std::vector<std::size_t> out;
  for (const auto& item : items) out.push_back(static_cast<std::size_t>(chorus::detail::parse_bytes(item, what)));
  return out;
}

Args parse_args(int argc, char** argv) {
  Args a;
  CLI::App app{"chorus transports: ping-pong latency and one-way bandwidth between 2 local processes"};
  std::vector<std::string> lat = {"8", "64", "1K", "64K"}, bw = {"1M", "16M", "64M"};
  app.add_option("--transport", a.transport, "tcp, shm, rdma or auto (shm between processes of this host)")
      ->check(CLI::IsMember({"tcp", "shm", "rdma", "auto"}));
  app.add_option("--iters", a.iters, "ping-pong iterations per size")->check(CLI::Range(1, 100000000));
  app.add_option("--warmup", a.warmup, "warm-up iterations per size")->check(CLI::Range(0, 100000000));
  app.add_option("--repeats", a.repeats, "bandwidth runs per size (median and best are shown)")->check(CLI::Range(1, 100000));
  app.add_option("--sizes", lat, "ping-pong sizes (K/M/G suffixes)")->delimiter(',');
  app.add_option("--bw-sizes", bw, "bandwidth sizes, positive (K/M/G suffixes)")->delimiter(',');
  try {
    app.parse(argc, argv);
    a.lat_sizes = to_sizes(lat, "--sizes");
    a.bw_sizes = to_sizes(bw, "--bw-sizes");
    for (auto b : a.bw_sizes)
      if (b == 0) throw CLI::ValidationError("--bw-sizes", "sizes must be positive");
  } catch (const CLI::ParseError& e) {
    std::exit(app.exit(e));
  } catch (const chorus::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    std::exit(2);
  }
  return a;
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const auto i = static_cast<std::size_t>(p * double(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

std::string human(std::size_t bytes) {
  if (bytes >= (1u << 20) && bytes % (1u << 20) == 0) return std::to_string(bytes >> 20) + " MiB";
  if (bytes >= (1u << 10) && bytes % (1u << 10) == 0) return std::to_string(bytes >> 10) + " KiB";
  return std::to_string(bytes) + " B";
}

void latency(Comm& comm, const Args& a) {
  const int r = comm.rank();
  if (r == 0) {
    std::printf("# ping-pong latency (half round trip), %d iterations after %d warm-up\n", a.iters, a.warmup);
    std::printf("%12s %12s %12s %12s\n", "size", "median_us", "min_us", "p90_us");
  }
  for (std::size_t size : a.lat_sizes) {
    std::vector<std::byte> buf(size, std::byte{0x42});
    std::vector<double> half_rtt_us;
    half_rtt_us.reserve(static_cast<std::size_t>(a.iters));
    comm.barrier();
    for (int i = -a.warmup; i < a.iters; ++i) {
      if (r == 0) {
        const auto t0 = Clock::now();
        comm.send(buf, 1, 0);
        comm.recv(buf, 1, 0);
        const auto t1 = Clock::now();
        if (i >= 0) half_rtt_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / 2);
      } else {
        comm.recv(buf, 0, 0);
        comm.send(buf, 0, 0);
      }
    }
    if (r == 0) {
      std::printf("%12s %12.2f %12.2f %12.2f\n", human(size).c_str(), percentile(half_rtt_us, 0.5),
                  percentile(half_rtt_us, 0.0), percentile(half_rtt_us, 0.9));
      std::fflush(stdout);
    }
  }
}

void bandwidth(Comm& comm, const Args& a) {
  constexpr int kWindow = 4;                 // receives kept posted on rank 1
  constexpr std::size_t kMinTotal = 256u << 20;
  const int r = comm.rank();
  if (r == 0) {
    std::printf("# one-way bandwidth, rank 0 -> rank 1, median and best of %d runs\n", a.repeats);
    std::printf("%12s %8s %14s %14s\n", "size", "msgs", "median_GB/s", "best_GB/s");
  }
  for (std::size_t size : a.bw_sizes) {
    const int msgs = static_cast<int>(std::max<std::size_t>(4, (kMinTotal + size - 1) / std::max<std::size_t>(size, 1)));
    std::vector<double> gbps;
    comm.barrier();
    if (r == 0) {
      std::vector<std::byte> src(size, std::byte{0x17});
      std::vector<chorus::Request> sends(static_cast<std::size_t>(msgs));
      for (int rep = -1; rep < a.repeats; ++rep) {
        comm.recv(std::span<std::byte>{}, 1, 1);  // rank 1 has posted its receives
        const auto t0 = Clock::now();
        for (int m = 0; m < msgs; ++m) sends[static_cast<std::size_t>(m)] = comm.isend(src, 1, 0);
        for (auto& s : sends) s.wait();
        comm.recv(std::span<std::byte>{}, 1, 2);  // rank 1 has the last byte
        const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
        if (rep >= 0) gbps.push_back(double(size) * msgs / secs / 1e9);
      }
      std::printf("%12s %8d %14.3f %14.3f\n", human(size).c_str(), msgs, percentile(gbps, 0.5),
                  percentile(gbps, 1.0));
      std::fflush(stdout);
    } else {
      std::vector<std::vector<std::byte>> bufs(kWindow, std::vector<std::byte>(size));
      std::vector<chorus::Request> recvs(kWindow);
      for (int rep = -1; rep < a.repeats; ++rep) {
        for (int m = 0; m < std::min(kWindow, msgs); ++m) recvs[m] = comm.irecv(bufs[m], 0, 0);
        comm.send(std::span<const std::byte>{}, 0, 1);
        for (int m = 0; m < msgs; ++m) {
          recvs[m % kWindow].wait();
          if (m + kWindow < msgs) recvs[m % kWindow] = comm.irecv(bufs[m % kWindow], 0, 0);
        }
        comm.send(std::span<const std::byte>{}, 0, 2);
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse_args(argc, argv);
  try {
    if (!chorus::launched_by_launcher()) return chorus::launch_local(2, argc, argv);
    chorus::Options o = chorus::Options::from_env();
    o.transport = args.transport;
    auto comm = Comm::create(std::move(o));
    if (comm.size() != 2) {
      if (comm.rank() == 0) std::fprintf(stderr, "tcp_pingpong needs exactly 2 ranks, got %d\n", comm.size());
      return 2;
    }
    if (comm.rank() == 0)
      std::printf("# chorus %s transport, 2 processes on this host\n", std::string(comm.transport().link_kind(1)).c_str());
    latency(comm, args);
    bandwidth(comm, args);
    comm.barrier();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tcp_pingpong: %s\n", e.what());
    return 1;
  }
}
