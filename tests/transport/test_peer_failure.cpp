// SPDX-License-Identifier: BSD-3-Clause
// Over tcp and shm (the shm transport's own kill tests are in test_shm.cpp).
// A peer that dies (SIGKILL) or leaves (destroys its communicator) fails the survivors' pending
// operations with it with peer_failure, promptly: the communicators here have a 60 s timeout, and
// the survivors must see peer_failure within 5 s of the peer's end, so only real detection of the
// broken link passes, never the timeout.
#include "chorus/communicator.hpp"

#include "chorus/transport/inproc/transport.hpp"
#include "chorus/transport/shm/transport.hpp"
#include "chorus/transport/tcp/transport.hpp"

#include <doctest/doctest.h>

#include <csignal>
#include <chrono>
#include <cstddef>
#include <fstream>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "support/modes.hpp"
#include "support/spawn.hpp"

// This file's own names: the files of tests/transport/ are compiled together (unity build).
namespace transport_test_peer_failure {

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using chorus::ErrorCode;
using chorus::Request;
using chorus::test::expect;
using chorus::test::expect_eq;
using chorus::test::expect_error;

using TcpComm = chorus::Communicator<chorus::tcp::Transport>;

constexpr auto kTimeout = 60s;     // the communicators' timeout: far above kPrompt
constexpr auto kPrompt = 5s;       // how soon a survivor must see peer_failure
constexpr std::size_t kBig = std::size_t(256) << 20;

using chorus::test::InprocThreads;
using chorus::test::ShmProcesses;
using chorus::test::TcpProcesses;
using chorus::test::TcpThreads;

chorus::test::ProcessOptions process_options(std::set<int> killed = {}) {
  chorus::test::ProcessOptions p;
  p.comm_timeout = kTimeout;
  p.timeout = kTimeout + 30s;
  p.expect_killed = std::move(killed);
  return p;
}

/// Waits on `pending` (whose peer ended just now) and checks that it fails with peer_failure
/// naming that peer, within kPrompt. Done() is polled up to the kPrompt deadline so a transport
/// that misses the failure fails this test in kPrompt, not after the 60 s timeout.
void expect_prompt_peer_failure(Request& pending, int rank, int peer, const std::string& what) {
  const std::string who = "rank " + std::to_string(rank) + ": " + what;
  const auto t0 = Clock::now();
  while (!pending.state()->done()) {
    if (Clock::now() - t0 > kPrompt)
      throw chorus::test::Failure(who + ": still pending " + std::to_string(kPrompt.count()) +
                                  " s after the peer ended (no peer_failure)");
    std::this_thread::sleep_for(2ms);
  }
  const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0);
  auto e = expect_error(ErrorCode::peer_failure, [&] { pending.wait(); }, who);
  expect(waited < kPrompt, who + ": peer_failure took " + std::to_string(waited.count()) + " ms");
  const std::string m = e.what();
  expect(m.find("peer " + std::to_string(peer)) != std::string::npos,
         "the error names peer " + std::to_string(peer) + ": " + m);
  expect_eq(e.peer(), peer, "Error::peer()");
}

/// This process's resident memory in bytes (/proc/self/statm).
std::size_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  std::size_t size_pages = 0, resident_pages = 0;
  statm >> size_pages >> resident_pages;
  expect(bool(statm), "reading /proc/self/statm");
  return resident_pages * static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
}

}  // namespace

// Rank 0 posts a 256 MiB receive; rank 1 starts sending 256 MiB and is killed while the bytes flow:
// rank 0's receive, partly written, must fail with peer_failure.
//
// "While the bytes flow" without reading the buffer under the transport's feet: rank 0's buffer
// is allocated untouched, so its pages become resident only as received data is written into it
// (or into any staging buffer); once rank 0's resident size has grown by 16 MiB, data is flowing,
// and rank 1 is told to die. The other 240 MiB cannot arrive in the store round trip it takes.
TEST_CASE("peer failure: sender killed by SIGKILL mid-transfer") {
  chorus::test::run_processes(
      2,
      [](int rank, chorus::Options o) {
        auto store = o.store;
        auto comm = TcpComm::create(std::move(o));
        if (rank == 0) {
          std::unique_ptr<std::byte[]> in(new std::byte[kBig]);  // default-initialised: untouched
          const std::size_t base = resident_bytes();
          Request pending = comm.irecv(std::span(in.get(), kBig), 1, 0);
          store->set("test/posted", "1");
          const auto t0 = Clock::now();
          while (resident_bytes() < base + (16u << 20) && !pending.state()->done()) {
            expect(Clock::now() - t0 < 30s, "no data of the 256 MiB message arrived within 30 s");
            std::this_thread::sleep_for(1ms);
          }
          store->set("test/flowing", "1");
          store->get("test/dying", kTimeout);
          expect_prompt_peer_failure(pending, 0, 1, "256 MiB receive from the killed rank 1");
        } else {
          std::vector<std::byte> out(kBig, std::byte{0x5a});
          store->get("test/posted", kTimeout);
          Request s = comm.isend(out, 0, 0);
          store->get("test/flowing", kTimeout);
          store->set("test/dying", "1");
          std::raise(SIGKILL);
        }
      },
      process_options({1}));
}

// Rank 1 posts a 256 MiB receive; rank 0 starts sending 256 MiB and rank 1 is killed: rank 0's
// send fails (256 MiB cannot all sit in socket buffers, so the send cannot have completed).
TEST_CASE("peer failure: receiver killed by SIGKILL mid-transfer") {
  chorus::test::run_processes(
      2,
      [](int rank, chorus::Options o) {
        auto store = o.store;
        auto comm = TcpComm::create(std::move(o));
        if (rank == 0) {
          std::vector<std::byte> out(kBig, std::byte{0xa5});
          store->get("test/posted", kTimeout);
          Request s = comm.isend(out, 1, 0);
          store->set("test/sending", "1");
          store->get("test/dying", kTimeout);
          expect_prompt_peer_failure(s, 0, 1, "256 MiB send to the killed rank 1");
        } else {
          std::vector<std::byte> in(kBig);
          Request r = comm.irecv(in, 0, 0);
          store->set("test/posted", "1");
          store->get("test/sending", kTimeout);
          store->set("test/dying", "1");
          std::raise(SIGKILL);
        }
      },
      process_options({1}));
}

// Rank 1 leaves normally (its communicator is destroyed, and in the process case the process
// exits) while rank 0 waits on a receive from it.
TEST_CASE_TEMPLATE("peer failure: peer leaves while a receive from it is pending", M, InprocThreads, TcpThreads,
                   TcpProcesses, ShmProcesses) {
  auto body = [](int rank, chorus::Options o) {
    auto store = o.store;
    if (rank == 0) {
      auto comm = chorus::Communicator<typename M::Transport>::create(std::move(o));
      std::vector<std::byte> in(64 << 10);
      Request pending = comm.irecv(in, 1, 4);
      store->set("test/posted", "1");
      store->get("test/leaving", kTimeout);
      expect_prompt_peer_failure(pending, 0, 1, "receive from rank 1, which left");
      expect_error(ErrorCode::peer_failure, [&] { comm.recv(in, 1, 4); }, "a later receive from rank 1");
    } else {
      {
        auto comm = chorus::Communicator<typename M::Transport>::create(std::move(o));
        store->get("test/posted", kTimeout);
        store->set("test/leaving", "1");
      }  // the communicator is destroyed here
    }
  };
  if constexpr (M::kProcesses) {
    chorus::test::run_processes(2, body, process_options());
  } else {
    chorus::test::ThreadOptions t;
    t.timeout = kTimeout;
    chorus::test::run_threads(2, body, t);
  }
}

// Three ranks: rank 2 is killed while ranks 0 and 1 wait on receives from it; both fail with
// peer_failure naming peer 2.
TEST_CASE_TEMPLATE("peer failure: one of three ranks killed", M, TcpProcesses, ShmProcesses) {
  chorus::test::run_processes(
      3,
      [](int rank, chorus::Options o) {
        auto store = o.store;
        auto comm = chorus::Communicator<typename M::Transport>::create(std::move(o));
        if (rank == 2) {
          store->wait({"test/posted/0", "test/posted/1"}, kTimeout);
          store->set("test/dying", "1");
          std::raise(SIGKILL);
        } else {
          std::vector<std::byte> in(1 << 20);
          Request pending = comm.irecv(in, 2, 1);
          store->set("test/posted/" + std::to_string(rank), "1");
          store->get("test/dying", kTimeout);
          expect_prompt_peer_failure(pending, rank, 2, "receive from the killed rank 2");
        }
      },
      process_options({2}));
}

}  // namespace transport_test_peer_failure
