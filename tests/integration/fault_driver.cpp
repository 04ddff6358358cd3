// SPDX-License-Identifier: BSD-3-Clause
// One rank of the multi-host fault tests (tests/integration/run_fault.sh starts four of them in
// two network namespaces). It joins a communicator over chorus::DefaultTransport (shm inside a
// host, tcp across), runs a loop of collectives whose results it checks, and prints one line that
// the harness parses when the loop ends:
//   CHORUS_READY rank=R links=K,K,.. wall=<epoch s>         after the first barrier; K: how it
//                                                          reaches each rank (self, shm, tcp)
//   CHORUS_ERROR rank=R code=<ErrorCode> peer=P t=<s since start> wall=<epoch s> iter=N msg=<what()>
//   CHORUS_WRONG rank=R iter=N msg=...                      a result differed (exit 4)
//   CHORUS_DONE rank=R iters=N                              the loop ran its time (exit 0)
// A chorus::Error exits 3, anything else 5.
//
// Environment: RANK, WORLD_SIZE, MASTER_ADDR (the store host's address), as for chorus::init().
// Arguments: <port file> <workload: mixed | allreduce16m> <seconds>. Rank 0 hosts the store on
// MASTER_ADDR port 0 and writes the bound port to <port file> (written aside, then renamed); the
// others read it from there, so no port is fixed in advance.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "chorus/chorus.hpp"
#include "support/port_store.hpp"

namespace {

using Clock = std::chrono::steady_clock;
const Clock::time_point kStart = Clock::now();

double since_start() { return std::chrono::duration<double>(Clock::now() - kStart).count(); }
double wall() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

struct Wrong {
  std::string what;
};

void expect(bool ok, const std::string& what) {
  if (!ok) throw Wrong{what};
}

/// One round of mixed collectives on small and odd sizes, each result checked exactly.
void mixed_round(chorus::Communicator<chorus::DefaultTransport>& c, std::uint64_t iter) {
  const int n = c.size(), r = c.rank();
  const std::size_t count = 1000 + (iter * 7919) % 70000;  // up to ~280 KB of int32
  std::vector<std::int32_t> v(count);
  for (std::size_t i = 0; i < count; ++i) v[i] = static_cast<std::int32_t>(r + 1 + i % 13);
  c.all_reduce(std::span(v), chorus::ReduceOp::sum);
  for (std::size_t i = 0; i < count; ++i)
    expect(v[i] == n * (n + 1) / 2 + n * static_cast<std::int32_t>(i % 13), "all_reduce");

  const int root = static_cast<int>(iter % static_cast<std::uint64_t>(n));
  std::vector<std::int64_t> b(count / 2 + 1, r == root ? static_cast<std::int64_t>(iter) : -1);
  c.broadcast(std::span(b), root);
  for (auto x : b) expect(x == static_cast<std::int64_t>(iter), "broadcast");

  std::vector<std::int32_t> mine(count / 4 + 1, r), all(static_cast<std::size_t>(n) * (count / 4 + 1));
  c.all_gather(std::span<const std::int32_t>(mine), std::span(all));
  for (std::size_t i = 0; i < all.size(); ++i)
    expect(all[i] == static_cast<std::int32_t>(i / mine.size()), "all_gather");

  std::vector<std::int32_t> rs_in(static_cast<std::size_t>(n) * 257, 1), rs_out(257);
  c.reduce_scatter(std::span<const std::int32_t>(rs_in), std::span(rs_out), chorus::ReduceOp::sum);
  for (auto x : rs_out) expect(x == n, "reduce_scatter");

  std::vector<std::int32_t> a_in(static_cast<std::size_t>(n) * 1024), a_out(a_in.size());
  for (std::size_t i = 0; i < a_in.size(); ++i) a_in[i] = r * 100000 + static_cast<std::int32_t>(i / 1024);
  c.all_to_all(std::span<const std::int32_t>(a_in), std::span(a_out));
  for (std::size_t i = 0; i < a_out.size(); ++i)
    expect(a_out[i] == static_cast<std::int32_t>(i / 1024) * 100000 + r, "all_to_all");

  c.barrier();
}

/// One 16 MiB all_reduce of float32 (exact: small integers).
void big_round(chorus::Communicator<chorus::DefaultTransport>& c, std::vector<float>& v) {
  const int n = c.size(), r = c.rank();
  std::fill(v.begin(), v.end(), static_cast<float>(r + 1));
  c.all_reduce(std::span(v), chorus::ReduceOp::sum);
  const float want = static_cast<float>(n * (n + 1) / 2);
  for (float x : v) expect(x == want, "all_reduce 16 MiB");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s <port file> <mixed|allreduce16m> <seconds>\n", argv[0]);
    return 2;
  }
  const std::string port_file = argv[1], workload = argv[2];
  const double seconds = std::atof(argv[3]);
  int rank = -1;
  std::uint64_t iter = 0;
  try {
    chorus::Options o = chorus::Options::from_env();
    rank = std::atoi(std::getenv("RANK") ? std::getenv("RANK") : "-1");
    const char* master = std::getenv("MASTER_ADDR");
    if (rank < 0 || master == nullptr)
      throw chorus::Error(chorus::ErrorCode::invalid_argument, "RANK and MASTER_ADDR must be set");
    o.store = chorus::test::open_port_file_store(rank, master, port_file, o.timeout);
    auto comm = chorus::init(o);
    comm.barrier();
    std::string links;
    for (int p = 0; p < comm.size(); ++p) {
      if (p > 0) links += ',';
      links.append(p == rank ? std::string_view("self") : comm.transport().link_kind(p));
    }
    std::printf("CHORUS_READY rank=%d links=%s wall=%.3f\n", rank, links.c_str(), wall());
    std::fflush(stdout);
    std::vector<float> big(workload == "allreduce16m" ? (std::size_t(16) << 20) / sizeof(float) : 0);
    while (since_start() < seconds) {
      if (big.empty())
        mixed_round(comm, iter);
      else
        big_round(comm, big);
      ++iter;
    }
    std::printf("CHORUS_DONE rank=%d iters=%llu\n", rank, static_cast<unsigned long long>(iter));
    return 0;
  } catch (const chorus::Error& e) {
    std::printf("CHORUS_ERROR rank=%d code=%s peer=%d t=%.3f wall=%.3f iter=%llu msg=%s\n", rank,
                std::string(chorus::to_string(e.code())).c_str(), e.peer(), since_start(), wall(),
                static_cast<unsigned long long>(iter), e.what());
    std::fflush(stdout);
    return 3;
  } catch (const Wrong& w) {
    std::printf("CHORUS_WRONG rank=%d iter=%llu msg=%s\n", rank, static_cast<unsigned long long>(iter),
                w.what.c_str());
    std::fflush(stdout);
    return 4;
  } catch (const std::exception& e) {
    std::printf("CHORUS_ERROR rank=%d code=other peer=-1 t=%.3f wall=%.3f iter=%llu msg=%s\n", rank,
                since_start(), wall(), static_cast<unsigned long long>(iter), e.what());
    std::fflush(stdout);
    return 5;
  }
}
