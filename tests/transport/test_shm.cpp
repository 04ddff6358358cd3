// SPDX-License-Identifier: BSD-3-Clause
// The shm transport's own promises, and the auto transport's choice per peer:
// * both large-message paths (cross-memory attach, and streaming through the ring when
//   CHORUS_SHM_CMA=0) move data intact, with eager messages and mismatched sizes around them;
// * a communicator's shared memory goes with it: segments are anonymous memfds, and after the
//   communicator is destroyed (after a normal run, an exception, an abort, a peer's SIGKILL, a
//   peer killed mid-collective) the process holds as many memfd descriptors and memfd mappings as
//   before it was created;
// * 8 ranks on this machine's cores: a 64 MiB all_reduce (16 MiB under the sanitizers) completes,
//   and ranks that wait inside a collective use (almost) no CPU;
// * a rank killed mid-collective: the survivors get peer_failure within 5 s;
// * transport=auto uses shm on one host and tcp across hosts (CHORUS_HOST_ID pretends), and a
//   communicator mixing both works; transport=shm across hosts is invalid_argument;
// * CHORUS_TRANSPORT_DISABLE takes transports out of auto's choice, also when only one rank sets
//   it (its pairs leave them out at both ends); disabling all a pair could use, forcing a disabled
//   one, or naming no transport is invalid_argument naming the pair, the variables or the name.
#include "chorus/transport/shm/transport.hpp"

#include <doctest/doctest.h>

#include <sys/resource.h>

#include <chrono>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "chorus/transport/hybrid/transport.hpp"
#include "support/communicators.hpp"
#include "support/sanitized.hpp"
#include "support/spawn.hpp"

// This file's own names: the files of tests/transport/ are compiled together (unity build).
namespace transport_test_shm {

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using chorus::ErrorCode;
using chorus::Request;
using chorus::test::expect;
using chorus::test::expect_eq;
using chorus::test::expect_error;
using ShmComm = chorus::Communicator<chorus::shm::Transport>;
using AutoComm = chorus::Communicator<chorus::hybrid::Transport>;

constexpr auto kTimeout = 60s;  // far above kPrompt: only real failure detection passes
constexpr auto kPrompt = 5s;

chorus::test::ProcessOptions process_options(std::set<int> killed = {},
                                             std::vector<std::pair<std::string, std::string>> env = {}) {
  chorus::test::ProcessOptions p;
  p.comm_timeout = kTimeout;
  p.timeout = kTimeout + 30s;
  p.expect_killed = std::move(killed);
  p.env = std::move(env);
  return p;
}

std::byte byte_at(std::uint64_t seed, std::size_t k) {
  std::uint64_t x = (k + 1) * 0x9E3779B97F4A7C15ull ^ (seed + 1) * 0xC2B2AE3D27D4EB4Full;
  x ^= x >> 29;
  return static_cast<std::byte>(x >> 56);
}
std::vector<std::byte> pattern(std::size_t n, std::uint64_t seed) {
  std::vector<std::byte> v(n);
  for (std::size_t k = 0; k < n; ++k) v[k] = byte_at(seed, k);
  return v;
}
void check(std::span<const std::byte> b, std::uint64_t seed, const std::string& what) {
  for (std::size_t k = 0; k < b.size(); ++k)
    if (b[k] != byte_at(seed, k))
      throw chorus::test::Failure(what + ": wrong byte at index " + std::to_string(k) + " of " +
                                  std::to_string(b.size()));
}

/// This process's anonymous shared memory: descriptors that are memfds (/proc/self/fd links to
/// "/memfd:<name> (deleted)") and mappings of memfds (/proc/self/maps lines naming "memfd:").
/// The shm transport's segments are memfds: each link's is mapped once per end, and its
/// descriptor is closed once mapped (or passed to the peer).
struct MemfdUse {
  int fds = 0;
  int maps = 0;
};

MemfdUse memfd_use() {
  MemfdUse u;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    std::error_code link_ec;
    const auto target = std::filesystem::read_symlink(e.path(), link_ec).string();
    if (!link_ec && target.starts_with("/memfd:")) ++u.fds;
  }
  if (ec) throw chorus::test::Failure("cannot list /proc/self/fd: " + ec.message());
  std::ifstream maps("/proc/self/maps");
  if (!maps) throw chorus::test::Failure("cannot read /proc/self/maps");
  for (std::string line; std::getline(maps, line);)
    if (line.find("memfd:") != std::string::npos) ++u.maps;
  return u;
}

/// Throws unless the process holds what it held at `before`. `what` says when.
void expect_memfds_back(const MemfdUse& before, const std::string& what) {
  const MemfdUse now = memfd_use();
  if (now.fds != before.fds || now.maps != before.maps)
    throw chorus::test::Failure(what + ": " + std::to_string(now.fds) + " memfd descriptors and " +
                                std::to_string(now.maps) + " memfd mappings, against " + std::to_string(before.fds) +
                                " and " + std::to_string(before.maps) + " before the communicator");
}

/// Runs body(comm) on a communicator of type Comm created from `o`, checking that the body really
/// made shm segments and that none outlives the communicator.
template <class Comm, class Body>
void expect_no_memfd_left(chorus::Options o, const std::string& what, const Body& body) {
  const MemfdUse before = memfd_use();
  {
    Comm comm = Comm::create(std::move(o));
    const MemfdUse during = memfd_use();
    expect(during.maps > before.maps, what + ": no memfd mapping while the communicator lives (is it shm?)");
    body(comm);
  }
  expect_memfds_back(before, what);
}

/// Waits (bounded by kPrompt) for `pending` to fail with peer_failure naming `peer`.
void expect_prompt_peer_failure(Request& pending, int peer, const std::string& what) {
  const auto t0 = Clock::now();
  while (!pending.state()->done()) {
    if (Clock::now() - t0 > kPrompt)
      throw chorus::test::Failure(what + ": still pending 5 s after the peer ended (no peer_failure)");
    std::this_thread::sleep_for(2ms);
  }
  auto e = expect_error(ErrorCode::peer_failure, [&] { pending.wait(); }, what);
  expect(std::string(e.what()).find("peer " + std::to_string(peer)) != std::string::npos,
         "the error names peer " + std::to_string(peer) + ": " + e.what());
}

double cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + 1e-6 * double(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

/// Both ways at once: eager sizes, large sizes (pulled or streamed), a size mismatch on a large
/// message, and many messages on one tag in order.
void exchange(ShmComm& comm) {
  const int r = comm.rank(), peer = 1 - r;
  const std::vector<std::size_t> sizes = {0, 1, 4096, 32768, 32769, 300000, 5u << 20, 17};
  std::vector<std::vector<std::byte>> out, in;
  std::vector<Request> reqs;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    out.push_back(pattern(sizes[i], 100 * r + i));
    in.emplace_back(sizes[i]);
  }
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    if (r == 0) reqs.push_back(comm.isend(out[i], peer, 3));
    reqs.push_back(comm.irecv(in[i], peer, 3));
    if (r == 1) reqs.push_back(comm.isend(out[i], peer, 3));
  }
  for (auto& q : reqs) q.wait();
  for (std::size_t i = 0; i < sizes.size(); ++i)
    check(in[i], 100 * peer + i, "message " + std::to_string(i) + " of " + std::to_string(sizes[i]) + " bytes");
  // A large message into a receive of another size: both sides fail with mismatch.
  std::vector<std::byte> big(1 << 20), small(1000);
  if (r == 0)
    expect_error(ErrorCode::mismatch, [&] { comm.send(big, 1, 9); }, "large send into a smaller receive");
  else
    expect_error(ErrorCode::mismatch, [&] { comm.recv(small, 0, 9); }, "smaller receive of a large send");
  // The link still works.
  comm.barrier();
}

}  // namespace

TEST_CASE("shm: data paths with and without cross-memory attach") {
  for (const char* cma : {"1", "0"}) {
    CAPTURE(cma);
    chorus::test::run_processes(
        2,
        [cma](int, chorus::Options o) {
          auto comm = ShmComm::create(std::move(o));
          const bool uses = comm.transport().uses_cma(1 - comm.rank());
          if (std::string(cma) == "0") expect(!uses, "CHORUS_SHM_CMA=0 turns cross-memory attach off");
          exchange(comm);
        },
        process_options({}, {{"CHORUS_SHM_CMA", cma}}));
  }
}

// Two ranks as threads of this process; their segments are gone with their communicators.
TEST_CASE("shm: ranks as threads") {
  const MemfdUse before = memfd_use();
  chorus::test::ThreadOptions t;
  t.timeout = 30s;
  chorus::test::run_threads(2, [](int, chorus::Options o) {
    auto comm = ShmComm::create(std::move(o));
    exchange(comm);
  }, t);
  expect_memfds_back(before, "after two ranks as threads");
}

// No memfd descriptor or mapping outlives its communicator, in each rank's own process: after a
// normal run (eager and cross-memory-attach sizes, one_shot mailboxes), an exception, an abort,
// and in the survivor after a SIGKILL of the rank that creates the link's segment (0) and of the
// one that maps it (1); also for the auto transport. (Ranks as threads: "shm: ranks as threads".)
TEST_CASE("shm: no memfd descriptor or mapping outlives its communicator") {
  SUBCASE("normal exit") {
    chorus::test::run_processes(3, [](int, chorus::Options o) {
      expect_no_memfd_left<ShmComm>(o, "after collectives", [](ShmComm& comm) {
        std::vector<float> v(1 << 20, 1.0f);
        comm.all_reduce(std::span<float>(v), chorus::ReduceOp::sum);
        expect_eq(v[999], 3.0f, "sum");
        std::vector<float> small(8, 1.0f);
        comm.all_reduce(std::span<float>(small), chorus::ReduceOp::sum);
        expect_eq(small[7], 3.0f, "small sum");
        auto sub = comm.split(comm.rank() % 2, 0);
        sub.barrier();
      });
    }, process_options());
  }
  SUBCASE("exception") {
    chorus::test::run_processes(2, [](int, chorus::Options o) {
      expect_no_memfd_left<ShmComm>(o, "after an exception", [](ShmComm& comm) {
        try {
          auto inner = ShmComm::create(comm.options());
          inner.barrier();
          throw std::runtime_error("the body fails");
        } catch (const std::runtime_error&) {
        }
      });
    }, process_options());
  }
  SUBCASE("abort") {
    chorus::test::run_processes(2, [](int rank, chorus::Options o) {
      expect_no_memfd_left<ShmComm>(o, "after an abort", [rank](ShmComm& comm) {
        comm.barrier();
        if (rank == 0) comm.abort();
        std::vector<std::byte> buf(1 << 20);
        // `aborted` on the rank that aborted, peer_failure on the other.
        expect_error(rank == 0 ? ErrorCode::aborted : ErrorCode::peer_failure, [&] { comm.recv(buf, 1 - rank, 4); },
                     "a receive after the abort");
      });
    }, process_options());
  }
  for (int victim : {0, 1}) {
    SUBCASE(("SIGKILL of rank " + std::to_string(victim)).c_str()) {
      chorus::test::run_processes(
          2,
          [victim](int rank, chorus::Options o) {
            auto store = o.store;
            expect_no_memfd_left<ShmComm>(o, "after the peer's SIGKILL", [&](ShmComm& comm) {
              std::vector<std::byte> big(8 << 20), small(100);
              comm.barrier();
              if (rank == victim) {
                Request s = comm.isend(big, 1 - rank, 1);  // a large send in flight
                store->set("test/posted", "1");
                store->get("test/pending", kTimeout);
                std::raise(SIGKILL);
              }
              store->get("test/posted", kTimeout);
              Request pending = comm.irecv(small, victim, 2);  // never sent
              store->set("test/pending", "1");
              expect_prompt_peer_failure(pending, victim, "receive from the killed rank");
            });
          },
          process_options({victim}));
    }
  }
  SUBCASE("auto transport") {
    chorus::test::run_processes(3, [](int, chorus::Options o) {
      ::unsetenv("CHORUS_HOST_ID");
      expect_no_memfd_left<AutoComm>(o, "auto transport", [](AutoComm& comm) {
        std::vector<double> v(100003, 1.0);
        comm.all_reduce(std::span<double>(v), chorus::ReduceOp::sum);
        expect_eq(v[100002], 3.0, "sum");
      });
    }, process_options());
  }
}

// 8 ranks (4 per core here): ranks waiting in a collective for a late rank must sleep, not spin:
// each of 7 spinning ranks would get at least 2/7 of a core while rank 7 is late. Then a 64 MiB
// all_reduce (16 MiB under the sanitizers, which run it 3-10x slower) completes and is exact.
// (rank 7's pause only makes the idle time; no ordering rests on it.)
TEST_CASE("shm: 8 ranks, a large all_reduce, no spinning while waiting") {
  chorus::test::run_processes(8, [](int rank, chorus::Options o) {
    auto store = o.store;
    auto comm = ShmComm::create(std::move(o));
    comm.barrier();
    constexpr auto kLate = 1500ms;
    std::vector<std::int32_t> one(2, rank);
    if (rank == 7) std::this_thread::sleep_for(kLate);
    const double c0 = cpu_seconds();
    const auto t0 = Clock::now();
    comm.all_reduce(std::span<std::int32_t>(one), chorus::ReduceOp::sum);
    const double cpu = cpu_seconds() - c0;
    const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
    expect_eq(one[1], 28, "sum of the ranks");
    if (rank != 7) {
      MESSAGE("rank " << rank << ": " << cpu << " s CPU while waiting " << wall << " s");
      expect(wall < 0.5 || cpu < 0.1 * wall,
             "rank " + std::to_string(rank) + " used " + std::to_string(cpu) + " s of CPU while waiting " +
                 std::to_string(wall) + " s for a late rank");
    }
    constexpr std::size_t kBytes = chorus::test::kSanitized ? 16u << 20 : 64u << 20;
    constexpr std::size_t kCount = kBytes / sizeof(float);
    std::vector<float> v(kCount);
    for (std::size_t i = 0; i < kCount; ++i) v[i] = float((i + 31 * rank) % 1024);
    const double c1 = cpu_seconds();
    const auto t1 = Clock::now();
    comm.all_reduce(std::span<float>(v), chorus::ReduceOp::sum);
    MESSAGE("rank " << rank << ": " << (kBytes >> 20) << " MiB all_reduce: " << cpu_seconds() - c1 << " s CPU, "
                    << std::chrono::duration<double>(Clock::now() - t1).count() << " s wall");
    for (std::size_t i = 0; i < kCount; i += 4099) {
      float want = 0;
      for (int q = 0; q < 8; ++q) want += float((i + 31 * q) % 1024);
      if (v[i] != want) expect_eq(v[i], want, "element " + std::to_string(i));
    }
  }, process_options());
}

// Three ranks in an all_reduce; rank 2 is killed while 0 and 1 are inside it: they get
// peer_failure within 5 s, and once their communicators are gone, so are its memfds.
TEST_CASE("shm: rank killed mid-collective") {
  chorus::test::run_processes(
      3,
      [](int rank, chorus::Options o) {
        auto store = o.store;
        expect_no_memfd_left<ShmComm>(o, "after a peer died mid-collective", [&](ShmComm& comm) {
          std::vector<float> v(4 << 20, 1.0f);
          comm.all_reduce(std::span<float>(v), chorus::ReduceOp::sum);  // all three, once
          if (rank == 2) {
            store->wait({"test/inside/0", "test/inside/1"}, kTimeout);
            std::raise(SIGKILL);
          }
          Request r = comm.all_reduce_async(std::span<float>(v), chorus::ReduceOp::sum);
          store->set("test/inside/" + std::to_string(rank), "1");
          const auto t0 = Clock::now();
          while (!r.state()->done()) {
            if (Clock::now() - t0 > kPrompt + 2s) throw chorus::test::Failure("no failure 7 s after the kill");
            std::this_thread::sleep_for(2ms);
          }
          expect_error(ErrorCode::peer_failure, [&] { r.wait(); }, "all_reduce with a killed rank");
        });
      },
      process_options({2}));
}

// A large send to a rank that has not posted its receive; that rank is killed: the send fails.
TEST_CASE("shm: receiver killed while a large send to it is pending") {
  chorus::test::run_processes(
      2,
      [](int rank, chorus::Options o) {
        auto store = o.store;
        auto comm = ShmComm::create(std::move(o));
        std::vector<std::byte> buf(16 << 20);
        if (rank == 1) {
          store->get("test/sent", kTimeout);
          std::raise(SIGKILL);
        }
        Request s = comm.isend(buf, 1, 0);
        store->set("test/sent", "1");
        expect_prompt_peer_failure(s, 1, "large send to the killed rank 1");
      },
      process_options({1}));
}

// transport=auto: shm between ranks with the same host id, tcp between the others, in one
// communicator; collectives and p2p across both. transport=tcp: tcp to all. transport=shm with a
// rank on "another host": invalid_argument naming it.
TEST_CASE("auto: shm on one host, tcp across hosts, in one communicator") {
  chorus::test::run_processes(4, [](int rank, chorus::Options o) {
    ::setenv("CHORUS_HOST_ID", rank < 2 ? "host-a" : "host-b", 1);
    o.transport = "auto";
    auto comm = AutoComm::create(o);
    auto& t = comm.transport();
    for (int p = 0; p < 4; ++p) {
      if (p == rank) continue;
      expect_eq(std::string(t.link_kind(p)), std::string(p / 2 == rank / 2 ? "shm" : "tcp"),
                "link kind to " + std::to_string(p));
    }
    std::vector<double> v(100003, double(rank + 1));
    comm.all_reduce(std::span<double>(v), chorus::ReduceOp::sum);
    expect_eq(v[100002], 10.0, "all_reduce over shm and tcp");
    std::vector<std::byte> out = pattern(1 << 20, rank), in(1 << 20);
    const int right = (rank + 1) % 4, left = (rank + 3) % 4;
    Request s = comm.isend(out, right, 0);
    comm.recv(in, left, 0);
    s.wait();
    check(in, left, "1 MiB around the ring");

    chorus::Options to = o;
    to.transport = "tcp";
    auto tcp = AutoComm::create(to);
    expect_eq(std::string(tcp.transport().link_kind((rank + 1) % 4)), std::string("tcp"), "transport=tcp");
    tcp.barrier();

    chorus::Options so = o;
    so.transport = "shm";
    auto e = expect_error(ErrorCode::invalid_argument, [&] { (void)AutoComm::create(so); }, "transport=shm across hosts");
    expect(std::string(e.what()).find("on another host") != std::string::npos, e.what());
  }, process_options());
}

TEST_CASE("auto: every rank on this host uses shm") {
  chorus::test::run_processes(3, [](int rank, chorus::Options o) {
    ::unsetenv("CHORUS_HOST_ID");
    auto comm = AutoComm::create(std::move(o));
    for (int p = 0; p < 3; ++p)
      if (p != rank) expect_eq(std::string(comm.transport().link_kind(p)), std::string("shm"), "link kind");
    std::vector<float> v(1000, 1.0f);
    comm.all_reduce(std::span<float>(v), chorus::ReduceOp::sum);
    expect_eq(v[0], 3.0f, "sum");
  }, process_options());
}

// CHORUS_TRANSPORT_DISABLE=shm on rank 0 only: its pairs go over tcp (at both ends, or the set-ups
// would not meet), the others' over shm; collectives and p2p across both.
TEST_CASE("auto: CHORUS_TRANSPORT_DISABLE on one rank takes shm out of its pairs") {
  chorus::test::run_processes(3, [](int rank, chorus::Options o) {
    ::unsetenv("CHORUS_HOST_ID");
    if (rank == 0) ::setenv("CHORUS_TRANSPORT_DISABLE", "shm", 1);
    o.apply_env();
    auto comm = AutoComm::create(std::move(o));
    for (int p = 0; p < 3; ++p)
      if (p != rank)
        expect_eq(std::string(comm.transport().link_kind(p)), std::string(p == 0 || rank == 0 ? "tcp" : "shm"),
                  "link kind to " + std::to_string(p));
    std::vector<double> v(70001, double(rank + 1));
    comm.all_reduce(std::span<double>(v), chorus::ReduceOp::sum);
    expect_eq(v[70000], 6.0, "all_reduce over shm and tcp");
    std::vector<std::byte> out = pattern(1 << 18, rank), in(1 << 18);
    Request s = comm.isend(out, (rank + 1) % 3, 0);
    comm.recv(in, (rank + 2) % 3, 0);
    s.wait();
    check(in, (rank + 2) % 3, "256 KiB around the ring");
  }, process_options());
}

// transport=tcp on rank 0 only: its pairs go over tcp at both ends (a rank left on auto follows
// the rank that forces), the others' over shm. Then ranks 0 and 1 force tcp and shm: both fail at
// creation with mismatch naming the other's value, and rank 2, left on auto and waiting for rank
// 1's shm listener, fails at once with their words (creation_notice.hpp); before, each waited in
// its own transport's set-up for the timeout. The three then make a communicator again.
TEST_CASE(
    "auto: a transport one rank forces carries its pairs; ranks that force different ones fail at once") {
  chorus::test::run_processes(
      3,
      [](int rank, chorus::Options o) {
        ::unsetenv("CHORUS_HOST_ID");
        chorus::Options one = o;
        if (rank == 0) one.transport = "tcp";
        auto comm = AutoComm::create(one);
        for (int p = 0; p < 3; ++p)
          if (p != rank)
            expect_eq(std::string(comm.transport().link_kind(p)),
                      std::string(p == 0 || rank == 0 ? "tcp" : "shm"), "link kind to " + std::to_string(p));
        std::vector<double> v(70001, double(rank + 1));
        comm.all_reduce(std::span<double>(v), chorus::ReduceOp::sum);
        expect_eq(v[70000], 6.0, "all_reduce over shm and tcp");

        chorus::Options two = o;
        two.transport = rank == 0 ? "tcp" : rank == 1 ? "shm" : "auto";
        const auto t0 = std::chrono::steady_clock::now();
        const auto e = expect_error(
            ErrorCode::mismatch, [&] { (void)AutoComm::create(two); }, "tcp against shm");
        const auto ms =
            std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
                .count();
        const std::string what = e.what();
        std::cerr << "rank " << rank << " after " << ms << " ms: " << what << "\n";  // CHORUS_TEST_VERBOSE=1
        const std::string named = rank == 0 ? "transport=tcp here but transport=shm on rank 1"
                                            : "transport=shm here but transport=tcp on rank 0";
        expect(what.find(rank == 2 ? std::string("could not create its communicator") : named) !=
                   std::string::npos,
               what);
        expect(ms < std::chrono::duration_cast<std::chrono::milliseconds>(kPrompt).count(),
               "failed after " + std::to_string(ms) + " ms (the timeout is far above)");

        auto again = AutoComm::create(o);
        again.barrier();
      },
      process_options());
}

TEST_CASE("auto: CHORUS_TRANSPORT_DISABLE that leaves a pair nothing, or that disables the forced one, is refused") {
  chorus::test::run_processes(2, [](int rank, chorus::Options o) {
    ::setenv("CHORUS_HOST_ID", rank == 0 ? "host-a" : "host-b", 1);  // shm and cuda_ipc cannot connect them
    ::setenv("CHORUS_TRANSPORT_DISABLE", "rdma, tcp", 1);
    chorus::Options none = o;
    none.apply_env();
    auto e = expect_error(ErrorCode::invalid_argument, [&] { (void)AutoComm::create(none); }, "tcp and rdma disabled");
    const std::string what = e.what();
    std::cerr << what << "\n";  // shown with CHORUS_TEST_VERBOSE=1
    const std::string pair = "rank " + std::to_string(rank) + " and rank " + std::to_string(1 - rank);
    for (const std::string& part : {pair, std::string("CHORUS_TRANSPORT_DISABLE"), std::string("tcp could"), std::string("'rdma,tcp'")})
      expect(what.find(part) != std::string::npos, "'" + part + "' in: " + what);

    ::setenv("CHORUS_TRANSPORT", "tcp", 1);
    ::setenv("CHORUS_TRANSPORT_DISABLE", "tcp", 1);
    chorus::Options forced = o;
    forced.apply_env();
    e = expect_error(ErrorCode::invalid_argument, [&] { (void)AutoComm::create(forced); }, "transport=tcp, tcp disabled");
    std::cerr << e.what() << "\n";
    expect(std::string(e.what()).find("CHORUS_TRANSPORT_DISABLE") != std::string::npos, e.what());

    // Disabling rdma alone leaves tcp for the pair.
    ::unsetenv("CHORUS_TRANSPORT");
    ::setenv("CHORUS_TRANSPORT_DISABLE", "rdma", 1);
    chorus::Options rest = o;
    rest.apply_env();
    auto comm = AutoComm::create(rest);
    expect_eq(std::string(comm.transport().link_kind(1 - rank)), std::string("tcp"), "rdma disabled across hosts");
    comm.barrier();
  }, process_options());
}

}  // namespace transport_test_shm
