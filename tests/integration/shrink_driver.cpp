// SPDX-License-Identifier: BSD-3-Clause
// One rank of the shrink fault runs (tests/integration/run_shrink.sh starts six of them on three
// namespace hosts). It joins a communicator over chorus::DefaultTransport (shm inside a host, tcp
// across), loops mixed collectives whose results it checks against a reference computed from the
// inputs of the ranks that are members, and on peer_failure shrinks and goes on with the
// survivors. Lines the harness parses (wall: seconds since the epoch):
//   SHRINK_READY rank=R links=K,K,.. pid=P wall=W          after the first barrier
//   SHRINK_FAILED rank=R code=C wall=W msg=...              a collective failed (each time)
//   SHRINK_SHRINKING rank=R wall=W                          entering shrink()
//   SHRINK_SHRUNK rank=R new_rank=Q size=M ms=T wall=W     the new communicator
//   SHRINK_FIRST_OK rank=R size=M members=a,b,.. wall=W     its first round of collectives, checked;
//                                                           members: the original ranks (all_gather)
//   SHRINK_DONE rank=R size=M members=a,b,.. rounds=N       ROUNDS rounds on the last communicator
//   SHRINK_ERROR rank=R code=C peer=P wall=W msg=...        a chorus::Error ended it (exit 3)
//   SHRINK_WRONG rank=R msg=...                             a result differed (exit 4)
// Environment: RANK, WORLD_SIZE, MASTER_ADDR (the store host's address; rank 0 serves the job's
// store there on port 0 and writes the port to <port file>).
// Arguments: <port file> <rounds after the last shrink> <seconds before giving up on a fault>.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <unistd.h>

#include "chorus/chorus.hpp"
#include "support/port_store.hpp"

namespace {

using Comm = chorus::Communicator<chorus::DefaultTransport>;
using Clock = std::chrono::steady_clock;

double wall() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

struct Wrong {
  std::string what;
};

void expect(bool ok, const std::string& what) {
  if (!ok) throw Wrong{what};
}

std::string list(const std::vector<int>& v) {
  std::string s;
  for (int x : v) {
    if (!s.empty()) s += ',';
    s += std::to_string(x);
  }
  return s;
}

/// The members' original ranks, in the communicator's order (an all_gather, checked: ascending,
/// this rank's own at its place).
std::vector<int> members_of(Comm& c, int orig) {
  std::vector<std::int32_t> mine{orig}, all(static_cast<std::size_t>(c.size()));
  c.all_gather(std::span<const std::int32_t>(mine), std::span(all));
  std::vector<int> m(all.begin(), all.end());
  expect(std::is_sorted(m.begin(), m.end()) && std::adjacent_find(m.begin(), m.end()) == m.end(),
         "members not in ascending order: " + list(m));
  expect(m[static_cast<std::size_t>(c.rank())] == orig, "this rank's place among the members");
  return m;
}

/// One round of mixed collectives on odd sizes; every input is a function of the original rank,
/// every result checked against the members' inputs.
void round(Comm& c, int orig, const std::vector<int>& members, std::uint64_t iter) {
  const int n = c.size(), r = c.rank();
  const std::size_t count = 1000 + (iter * 7919) % 30011;
  std::int64_t sum_orig = 0;
  for (int m : members) sum_orig += m + 1;
  std::vector<std::int32_t> v(count);
  for (std::size_t i = 0; i < count; ++i) v[i] = static_cast<std::int32_t>(orig + 1 + i % 13);
  c.all_reduce(std::span(v), chorus::ReduceOp::sum);
  for (std::size_t i = 0; i < count; ++i)
    expect(v[i] == sum_orig + n * static_cast<std::int64_t>(i % 13), "all_reduce at " + std::to_string(i));

  const int root = static_cast<int>(iter % static_cast<std::uint64_t>(n));
  std::vector<std::int64_t> b(count / 2 + 1, r == root ? members[static_cast<std::size_t>(root)] * 1000 + 7 : -1);
  c.broadcast(std::span(b), root);
  for (auto x : b) expect(x == members[static_cast<std::size_t>(root)] * 1000 + 7, "broadcast");

  std::vector<double> mx(257, static_cast<double>(orig)), mx_out(257);
  c.all_reduce(std::span<const double>(mx), std::span(mx_out), chorus::ReduceOp::max);
  for (auto x : mx_out) expect(x == static_cast<double>(members.back()), "all_reduce max");

  std::vector<std::int32_t> rs_in(static_cast<std::size_t>(n) * 131), rs_out(131);
  for (std::size_t i = 0; i < rs_in.size(); ++i) rs_in[i] = orig * 3 + static_cast<std::int32_t>(i / 131);
  c.reduce_scatter(std::span<const std::int32_t>(rs_in), std::span(rs_out), chorus::ReduceOp::sum);
  std::int64_t rs_want = 0;
  for (int m : members) rs_want += m * 3 + r;
  for (auto x : rs_out) expect(x == rs_want, "reduce_scatter");

  std::vector<std::int32_t> a_in(static_cast<std::size_t>(n) * 97), a_out(a_in.size());
  for (std::size_t i = 0; i < a_in.size(); ++i) a_in[i] = orig * 100000 + static_cast<std::int32_t>(i / 97);
  c.all_to_all(std::span<const std::int32_t>(a_in), std::span(a_out));
  for (std::size_t i = 0; i < a_out.size(); ++i)
    expect(a_out[i] == members[i / 97] * 100000 + r, "all_to_all");
  c.barrier();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s <port file> <rounds after the last shrink> <seconds>\n", argv[0]);
    return 2;
  }
  const std::string port_file = argv[1];
  const int rounds_after = std::atoi(argv[2]);
  const double seconds = std::atof(argv[3]);
  int orig = -1;
  try {
    chorus::Options o = chorus::Options::from_env();
    orig = std::atoi(std::getenv("RANK") ? std::getenv("RANK") : "-1");
    const char* master = std::getenv("MASTER_ADDR");
    if (orig < 0 || master == nullptr)
      throw chorus::Error(chorus::ErrorCode::invalid_argument, "RANK and MASTER_ADDR must be set");
    o.store = chorus::test::open_port_file_store(orig, master, port_file, o.timeout);
    Comm comm = chorus::init(o);
    comm.barrier();
    std::string links;
    for (int p = 0; p < comm.size(); ++p) {
      if (p > 0) links += ',';
      links.append(p == orig ? std::string_view("self") : comm.transport().link_kind(p));
    }
    std::printf("SHRINK_READY rank=%d links=%s pid=%d wall=%.3f\n", orig, links.c_str(), static_cast<int>(::getpid()), wall());
    std::fflush(stdout);
    std::vector<int> members(static_cast<std::size_t>(comm.size()));
    std::iota(members.begin(), members.end(), 0);
    const auto start = Clock::now();
    int shrinks = 0;
    int done_rounds = 0;  // on the current communicator, after a shrink
    std::uint64_t iter = 0;
    bool need_shrink = false;
    for (;;) {
      if (need_shrink) {  // a failure of shrink itself (left out, no quorum) ends this rank
        std::printf("SHRINK_SHRINKING rank=%d wall=%.3f\n", orig, wall());
        std::fflush(stdout);
        const auto t0 = Clock::now();
        comm = comm.shrink();
        const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
        need_shrink = false;
        done_rounds = 0;
        iter = 0;  // the members failed in different rounds: every one starts the new communicator at 0
        std::printf("SHRINK_SHRUNK rank=%d new_rank=%d size=%d ms=%lld wall=%.3f\n", orig, comm.rank(), comm.size(),
                    static_cast<long long>(ms), wall());
        std::fflush(stdout);
      }
      try {
        if (shrinks > 0 && done_rounds == 0) members = members_of(comm, orig);
        round(comm, orig, members, iter++);
        if (shrinks > 0) {
          if (done_rounds++ == 0) {
            std::printf("SHRINK_FIRST_OK rank=%d size=%d members=%s wall=%.3f\n", orig, comm.size(), list(members).c_str(),
                        wall());
            std::fflush(stdout);
          }
          if (done_rounds >= rounds_after) break;
        } else if (std::chrono::duration<double>(Clock::now() - start).count() > seconds) {
          throw chorus::Error(chorus::ErrorCode::timeout, "no fault within " + std::to_string(seconds) + " s");
        }
      } catch (const chorus::Error& e) {
        if (e.code() != chorus::ErrorCode::peer_failure && e.code() != chorus::ErrorCode::aborted) throw;
        std::printf("SHRINK_FAILED rank=%d code=%s wall=%.3f msg=%s\n", orig, std::string(chorus::to_string(e.code())).c_str(),
                    wall(), e.what());
        std::fflush(stdout);
        if (++shrinks > 4) throw;
        need_shrink = true;
      }
    }
    std::printf("SHRINK_DONE rank=%d size=%d members=%s rounds=%d\n", orig, comm.size(), list(members).c_str(), done_rounds);
    std::fflush(stdout);
    comm.finalize();
    return 0;
  } catch (const chorus::Error& e) {
    std::printf("SHRINK_ERROR rank=%d code=%s peer=%d wall=%.3f msg=%s\n", orig, std::string(chorus::to_string(e.code())).c_str(),
                e.peer(), wall(), e.what());
    std::fflush(stdout);
    return 3;
  } catch (const Wrong& w) {
    std::printf("SHRINK_WRONG rank=%d msg=%s\n", orig, w.what.c_str());
    std::fflush(stdout);
    return 4;
  } catch (const std::exception& e) {
    std::printf("SHRINK_ERROR rank=%d code=other peer=-1 wall=%.3f msg=%s\n", orig, wall(), e.what());
    std::fflush(stdout);
    return 5;
  }
}
