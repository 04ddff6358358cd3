// SPDX-License-Identifier: BSD-3-Clause
// A communicator's life and its failure paths: destruction and abort never wait for peers,
// finalize() waits for pending work, a queued call's timeout counts from its start, calls from
// several threads at once, and the flight recorder (dumps and the late ranks a timeout names).
// Bounds on time here are far above what is expected and far below the communicators' timeout,
// so only the mechanism under test can pass them (never the timeout).
#include "chorus/communicator.hpp"

#include "chorus/transport/hybrid/transport.hpp"
#include "chorus/transport/inproc/transport.hpp"
#include "chorus/transport/shm/transport.hpp"
#include "chorus/transport/tcp/transport.hpp"

#include <doctest/doctest.h>

#include <dirent.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "support/modes.hpp"
#include "support/sanitized.hpp"
#include "support/spawn.hpp"

// This file's own names: the files of tests/transport/ are compiled together (unity build).
namespace transport_test_lifecycle {

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using chorus::ErrorCode;
using chorus::ReduceOp;
using chorus::Request;
using chorus::test::expect;
using chorus::test::expect_eq;
using chorus::test::expect_error;

using chorus::test::AutoProcesses;
using chorus::test::InprocThreads;
using chorus::test::ShmProcesses;
using chorus::test::TcpProcesses;
using chorus::test::TcpThreads;

constexpr auto kTimeout = 60s;  // the communicators' timeout: far above every bound below
constexpr auto kPrompt = 10s;   // how soon a failure must arrive

std::int64_t ms_since(Clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
}
std::int64_t wall_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

/// Runs `body(rank, options)` as n ranks of mode M (threads or processes), with timeout `t`.
template <class M, class F>
void run_ranks(int n, F body, std::chrono::milliseconds t = kTimeout, std::vector<std::pair<std::string, std::string>> env = {}) {
  if constexpr (M::kProcesses) {
    chorus::test::ProcessOptions p;
    p.comm_timeout = t;
    p.timeout = t + 60s;
    p.env = std::move(env);
    chorus::test::run_processes(n, body, p);
  } else {
    chorus::test::ThreadOptions o;
    o.timeout = t;
    chorus::test::run_threads(n, body, o);
  }
}

/// A fresh directory of this test's own, made by the test's parent process (removed by it); a
/// rank process (run_processes re-runs the test case in each child) gets "" and finds the
/// directory in CHORUS_DUMP_DIR, which the parent passes on.
std::string make_temp_dir() {
  if (std::getenv("CHORUS_TEST_CHILD_RANK")) return "";
  std::string tmpl = (std::filesystem::temp_directory_path() / "chorus-test-lifecycle-XXXXXX").string();
  expect(::mkdtemp(tmpl.data()) != nullptr, "mkdtemp");
  return tmpl;
}

/// The text of every file in `dir`, one string per file.
std::vector<std::string> read_files(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    std::ifstream f(e.path());
    std::stringstream ss;
    ss << f.rdbuf();
    out.push_back(ss.str());
  }
  return out;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

// Rank 0 starts an all_reduce that rank 1 never joins and destroys its communicator: the
// destructor returns at once (not after rank 1 leaves or the 60 s timeout), and the pending
// request fails with `aborted`. Rank 1 then sees peer_failure on its calls with rank 0.
TEST_CASE_TEMPLATE("lifecycle: destruction with a pending, never-joined collective does not wait", M, InprocThreads,
                   TcpProcesses, ShmProcesses, AutoProcesses) {
  run_ranks<M>(2, [](int rank, chorus::Options o) {
    auto store = o.store;
    std::vector<float> v(1000, 1.0f);
    if (rank == 0) {
      Request pending;
      std::int64_t destroy_ms = 0;
      {
        auto comm = chorus::Communicator<typename M::Transport>::create(std::move(o));
        pending = comm.all_reduce_async(v, ReduceOp::sum);
        std::vector<float> w(5, 2.0f);
        Request queued = comm.all_reduce_async(w, ReduceOp::sum);  // queued behind it
        struct Timed {  // declared before `dying`, so destroyed after it
          Clock::time_point t0;
          std::int64_t& out;
          ~Timed() { out = ms_since(t0); }
        };
        {
          Timed timed{Clock::now(), destroy_ms};
          auto dying = std::move(comm);  // destroyed at the end of this block
        }
        expect_error(ErrorCode::aborted, [&] { queued.wait(); }, "the queued call");
      }
      MESSAGE("destructor with a pending never-joined all_reduce took " << destroy_ms << " ms");
      expect(destroy_ms < std::chrono::duration_cast<std::chrono::milliseconds>(kPrompt).count(),
             "the destructor took " + std::to_string(destroy_ms) + " ms");
      auto e = expect_error(ErrorCode::aborted, [&] { pending.wait(); }, "the pending all_reduce");
      expect(contains(e.what(), "destroyed"), std::string("the error says why: ") + e.what());
      store->set("test/destroyed", "1");
    } else {
      auto comm = chorus::Communicator<typename M::Transport>::create(std::move(o));
      store->get("test/destroyed", kTimeout);
      // Rank 0's part of the first call may have reached rank 1 before rank 0 left (then this
      // one completes); the second call needs rank 0 and must fail.
      try {
        comm.all_reduce(v, ReduceOp::sum);
      } catch (const chorus::Error& e) {
        expect(e.code() == ErrorCode::peer_failure, std::string("rank 1's first all_reduce: ") + e.what());
      }
      expect_error(ErrorCode::peer_failure, [&] { comm.all_reduce(v, ReduceOp::sum); }, "rank 1's second all_reduce");
    }
  });
}

// A rank whose creation fails tells the others through the store (bootstrap/creation_notice.hpp):
// rank 0, which waits in its creation for rank 1, fails at once with rank 1's words instead of
// waiting out its 60 s timeout. Rank 1 fails in rendezvous (a world size other than rank 0's) or
// after it (a forced algorithm that does not exist: invalid_argument in the plan's overrides).
TEST_CASE_TEMPLATE("lifecycle: a rank whose creation fails tells the others at once", M, InprocThreads,
                   TcpProcesses, AutoProcesses) {
  for (const bool world_size : {true, false}) {
    CAPTURE(world_size);
    run_ranks<M>(2, [world_size](int rank, chorus::Options o) {
      using Comm = chorus::Communicator<typename M::Transport>;
      if (rank == 1) {
        if (world_size) {
          o.world_size = 3;
          const auto e = expect_error(
              ErrorCode::mismatch, [&] { (void)Comm::create(std::move(o)); }, "rank 1's creation");
          expect(contains(e.what(), "world size 3 here but 2 on rank 0"), e.what());
        } else {
          o.algorithm = "no_such_algorithm";
          expect_error(
              ErrorCode::invalid_argument, [&] { (void)Comm::create(std::move(o)); }, "rank 1's creation");
        }
        return;
      }
      const auto t0 = Clock::now();
      const auto e = expect_error(
          world_size ? ErrorCode::mismatch : ErrorCode::peer_failure,
          [&] { (void)Comm::create(std::move(o)); }, "rank 0's creation");
      const auto ms = ms_since(t0);
      MESSAGE("rank 0 failed after " << ms << " ms: " << std::string(e.what()));
      expect(e.rank() == 0 && e.peer() == 1, std::string("the error names both ranks: ") + e.what());
      expect(contains(e.what(), "rank 1 could not create its communicator"), e.what());
      expect(contains(e.what(), world_size ? "world size 3 here but 2 on rank 0" : "no_such_algorithm"),
             e.what());
      expect(ms < std::chrono::duration_cast<std::chrono::milliseconds>(kPrompt).count(),
             "rank 0 waited " + std::to_string(ms) + " ms");
    });
  }
}

// finalize() waits for every queued call; the results are all there afterwards.
TEST_CASE_TEMPLATE("lifecycle: finalize waits for pending work", M, InprocThreads, TcpProcesses, ShmProcesses) {
  run_ranks<M>(3, [](int rank, chorus::Options o) {
    auto comm = chorus::Communicator<typename M::Transport>::create(std::move(o));
    const int n = comm.size();
    std::vector<std::vector<std::int64_t>> bufs;
    for (int k = 0; k < 6; ++k) bufs.emplace_back(std::size_t(1) << (3 * k), std::int64_t(rank + k));
    std::vector<Request> reqs;
    for (auto& b : bufs) reqs.push_back(comm.all_reduce_async(b, ReduceOp::sum));
    comm.finalize();
    for (std::size_t k = 0; k < bufs.size(); ++k) {
      expect(reqs[k].state()->done(), "call " + std::to_string(k) + " done after finalize()");
      const std::int64_t want = std::int64_t(n) * (n - 1) / 2 + std::int64_t(n) * std::int64_t(k);
      for (auto x : bufs[k]) expect_eq(x, want, "call " + std::to_string(k));
    }
    comm.finalize();  // nothing pending: returns at once
  });
}

// abort() from a second thread while every rank is blocked (rank 0 in a receive nobody sends,
// the others in an all_reduce rank 0 never joins): every rank's call fails within a second or so,
// rank 0's with `aborted`, the others' with peer_failure.
TEST_CASE_TEMPLATE("lifecycle: abort from another thread frees every rank", M, InprocThreads, TcpProcesses, ShmProcesses,
                   AutoProcesses) {
  run_ranks<M>(3, [](int rank, chorus::Options o) {
    auto store = o.store;
    auto comm = chorus::Communicator<typename M::Transport>::create(std::move(o));
    const int n = comm.size();
    std::vector<float> v(4096, 1.0f);
    if (rank == 0) {
      std::thread aborter([&] {
        std::vector<std::string> keys;
        for (int p = 1; p < n; ++p) keys.push_back("test/entering/" + std::to_string(p));
        store->wait(keys, kTimeout);
        store->set("test/abort_at", std::to_string(wall_ms()));
        comm.abort();
      });
      std::vector<std::byte> b(8);
      auto e = expect_error(ErrorCode::aborted, [&] { comm.recv(b, 1, 99); }, "rank 0's receive");
      aborter.join();
      const std::int64_t late = wall_ms() - std::stoll(store->get("test/abort_at", kTimeout));
      MESSAGE("rank 0 returned " << late << " ms after abort()");
      expect(late < 10000, "rank 0 returned " + std::to_string(late) + " ms after abort()");
    } else {
      store->set("test/entering/" + std::to_string(rank), "1");
      expect_error(ErrorCode::peer_failure, [&] { comm.all_reduce(v, ReduceOp::sum); },
                   "rank " + std::to_string(rank) + "'s all_reduce");
      const std::int64_t late = wall_ms() - std::stoll(store->get("test/abort_at", kTimeout));
      MESSAGE("rank " << rank << " returned " << late << " ms after rank 0's abort()");
      expect(late < 10000, "rank " + std::to_string(rank) + " returned " + std::to_string(late) + " ms after abort()");
    }
  });
}

// An async call queued behind a slow one: its wait() starts at once, and the call itself runs
// for less than the timeout but finishes after more than the timeout since the wait began. Its
// timeout counts from when it starts running, so it completes. (Timeout 2 s; rank 1 joins the
// first call after 1.2 s and the second 1.2 s later.)
TEST_CASE("lifecycle: a queued call's timeout counts from when it starts running" *
          doctest::test_suite("waits")) {
  run_ranks<InprocThreads>(
      2,
      [](int rank, chorus::Options o) {
        auto comm = chorus::Communicator<chorus::inproc::Transport>::create(std::move(o));
        std::vector<std::int32_t> a(100, rank + 1), b(7, rank + 10);
        if (rank == 0) {
          Request ra = comm.all_reduce_async(a, ReduceOp::sum);
          Request rb = comm.all_reduce_async(b, ReduceOp::sum);
          const auto t0 = Clock::now();
          rb.wait();  // 2.4 s from now, 1.2 s after it starts
          MESSAGE("the second call completed " << ms_since(t0) << " ms after its wait began (timeout 2000 ms)");
          ra.wait();
        } else {
          std::this_thread::sleep_for(1200ms);  // the delay under test, not a synchronisation
          comm.all_reduce(a, ReduceOp::sum);
          std::this_thread::sleep_for(1200ms);
          comm.all_reduce(b, ReduceOp::sum);
        }
        for (auto x : a) expect_eq(x, 3, "first call");
        for (auto x : b) expect_eq(x, 21, "second call");
      },
      2s);
}

// Two threads per rank call collectives on one communicator at once, blocking and async mixed:
// every call completes with the right result (the calls look alike, so any order the ranks'
// threads take pairs them correctly), and ThreadSanitizer sees no race.
TEST_CASE_TEMPLATE("lifecycle: collectives from two threads at once on one communicator", M, InprocThreads, TcpThreads) {
  run_ranks<M>(3, [](int rank, chorus::Options o) {
    auto comm = chorus::Communicator<typename M::Transport>::create(std::move(o));
    const int n = comm.size();
    auto work = [&](int thread) {
      for (int i = 0; i < 40; ++i) {
        std::vector<std::int64_t> v(37, rank + 1);
        if ((i + thread) % 2) comm.all_reduce(v, ReduceOp::sum);
        else comm.all_reduce_async(v, ReduceOp::sum).wait();
        for (auto x : v) expect_eq(x, std::int64_t(n) * (n + 1) / 2, "thread " + std::to_string(thread) + " call " + std::to_string(i));
      }
    };
    std::exception_ptr err;
    std::thread other([&] {
      try {
        work(1);
      } catch (...) {
        err = std::current_exception();
      }
    });
    work(0);
    other.join();
    if (err) std::rethrow_exception(err);
    comm.barrier();
  });
}

// A forced hang: rank 2 does not enter all_reduce #3. Ranks 0 and 1 wait in it; the first to
// time out (3 s) throws an error that names rank 2 and its last completed call (#2: rank 2
// stalled in #2, waiting for the others, so it published its progress when #2 completed), and
// aborts, so the other one fails with peer_failure (or times out too). Every rank dumps its
// flight recorder into CHORUS_DUMP_DIR: for its timeout or for the peer failure (rank 2 meets
// it on its next call).
TEST_CASE("lifecycle: a timeout names the late rank, and every rank dumps its flight recorder" *
          doctest::test_suite("waits")) {
  const std::string dir = make_temp_dir();
  run_ranks<TcpProcesses>(
      3,
      [](int rank, chorus::Options o) {
        auto store = o.store;
        auto comm = chorus::Communicator<chorus::tcp::Transport>::create(std::move(o));
        std::vector<float> v(1000, 1.0f);
        for (int k = 0; k < 2; ++k) comm.all_reduce(v, ReduceOp::sum);
        // #2: rank 2 waits for the others until its wait stalls and it publishes its progress
        // (the store key that its stall check writes).
        // (The bootstrap store of a job's first communicator prefixes its keys with chorus/g1/comm/.)
        if (rank != 2) store->wait({"chorus/g1/comm/chorus/progress/0/2"}, kTimeout);
        comm.all_reduce(v, ReduceOp::sum);
        if (rank == 2) {
          store->wait({"test/failed/0", "test/failed/1"}, kTimeout);
          expect_error(ErrorCode::peer_failure, [&] { comm.all_reduce(v, ReduceOp::sum); }, "rank 2's late all_reduce");
          return;
        }
        std::string m;
        try {
          comm.all_reduce(v, ReduceOp::sum);
        } catch (const chorus::Error& e) {
          m = e.what();
          store->set("test/failed/" + std::to_string(rank), e.code() == ErrorCode::timeout ? "timeout" : "other");
          if (e.code() != ErrorCode::timeout) {
            expect(e.code() == ErrorCode::peer_failure, "timeout or peer_failure: " + m);
            return;
          }
        }
        expect(!m.empty(), "all_reduce #3 without rank 2 returned");
        MESSAGE("rank " << rank << ": " << m);
        expect(contains(m, "rank 2 has not entered all_reduce #3; its last completed call is #2"),
               "the error names the late rank and its last call: " + m);
        expect(contains(m, "in it: rank " + std::to_string(1 - rank)), "the error names the rank inside the call: " + m);
      },
      3s, {{"CHORUS_DUMP_DIR", dir}});
  const auto files = read_files(dir);
  std::filesystem::remove_all(dir);
  REQUIRE(files.size() == 3);
  int timeouts = 0;
  for (const auto& f : files) {
    INFO(f);
    CHECK(contains(f, "chorus flight recorder: rank "));
    CHECK(contains(f, "#2 all_reduce float32 sum count 1000 algorithm "));
    CHECK(contains(f, "calls entered"));
    if (contains(f, "timeout in all_reduce")) {
      ++timeouts;
      CHECK(contains(f, "#3 all_reduce float32 sum count 1000"));
      CHECK(contains(f, ": failed"));
    }
  }
  CHECK(timeouts >= 1);
  MESSAGE("a dump:\n" << files[0]);
}

// CHORUS_DUMP_ON_SIGNAL=1: SIGUSR1 makes every live communicator of the process dump its recorder.
TEST_CASE("lifecycle: SIGUSR1 dumps the flight recorder when CHORUS_DUMP_ON_SIGNAL=1") {
  const std::string dir = make_temp_dir();
  run_ranks<TcpProcesses>(
      2,
      [](int rank, chorus::Options o) {
        const std::string dir = std::getenv("CHORUS_DUMP_DIR");
        auto comm = chorus::Communicator<chorus::tcp::Transport>::create(std::move(o));
        std::vector<std::int32_t> v(33, 1);
        comm.all_reduce(v, ReduceOp::max);
        comm.barrier();
        ::kill(::getpid(), SIGUSR1);
        const auto t0 = Clock::now();
        for (;;) {
          const auto files = read_files(dir);
          bool mine = false;
          for (const auto& f : files)
            mine = mine || (contains(f, "rank " + std::to_string(rank) + " of 2") && contains(f, "SIGUSR1") &&
                            contains(f, "#0 all_reduce int32 max count 33") && contains(f, "#1 barrier"));
          if (mine) break;
          expect(Clock::now() - t0 < kPrompt, "no dump within 10 s of SIGUSR1");
          std::this_thread::sleep_for(10ms);  // polling a file, bounded above
        }
      },
      kTimeout, {{"CHORUS_DUMP_DIR", dir}, {"CHORUS_DUMP_ON_SIGNAL", "1"}});
  std::filesystem::remove_all(dir);
}

// memory_stats() after a 64 MiB all_reduce at 4 ranks (8 MiB under the sanitizers), and after a
// window of small calls: the parts add up, the links hold their segments, and the scratch of the
// large call is given back.
TEST_CASE_TEMPLATE("lifecycle: memory_stats reports what a communicator holds", M, ShmProcesses, TcpProcesses) {
  run_ranks<M>(4, [](int rank, chorus::Options o) {
    auto comm = chorus::Communicator<typename M::Transport>::create(std::move(o));
    const std::size_t count = (std::size_t(chorus::test::kSanitized ? 8 : 64) << 20) / sizeof(float);
    std::vector<float> v(count, float(rank));
    const chorus::MemoryStats at_start = comm.memory_stats();
    comm.all_reduce(v, ReduceOp::sum);
    expect_eq(v[count - 1], 6.0f, "the all_reduce's last element");
    const chorus::MemoryStats big = comm.memory_stats();
    for (int i = 0; i < 40; ++i) comm.all_reduce(std::span(v.data(), 3), ReduceOp::sum);
    const chorus::MemoryStats after = comm.memory_stats();
    if (rank == 0)
      MESSAGE("rank 0, 4 ranks: at creation: " << at_start.to_string() << "; after a " << (count * 4 >> 20)
                                               << " MiB all_reduce: " << big.to_string() << "; after 40 calls of 12 bytes: "
                                               << after.to_string());
    expect_eq(big.total(), big.scratch_bytes + big.channel_bytes + big.recorder_bytes + big.transport_bytes, "total");
    expect(big.transport_bytes > 0 && big.recorder_bytes > 0, "links and recorder are counted: " + big.to_string());
    expect(after.scratch_bytes <= big.scratch_bytes, "scratch does not grow on small calls");
    expect(after.scratch_bytes <= 2 * chorus::exec::Scratch::kKeepBytes, "scratch given back: " + after.to_string());
  });
}

// CHORUS_MAX_BUFFERED_BYTES=40K: rank 1 sends three 16 KiB messages that rank 0 has not asked
// for; the third would take rank 0 past the cap, so its link fails with `system` naming the
// variable (instead of growing), rank 0's next receive says so, and rank 1 sees peer_failure.
TEST_CASE_TEMPLATE("lifecycle: early messages past CHORUS_MAX_BUFFERED_BYTES fail the link, never grow", M, TcpProcesses,
                   ShmProcesses) {
  run_ranks<M>(
      2,
      [](int rank, chorus::Options o) {
        auto store = o.store;
        auto comm = chorus::Communicator<typename M::Transport>::create(std::move(o));
        std::vector<std::byte> b(16 << 10);
        if (rank == 1) {
          for (int tag = 1; tag <= 3; ++tag) comm.isend(b, 0, tag);
          store->set("test/sent", "1");
          store->get("test/checked", kTimeout);
          expect_error(ErrorCode::peer_failure, [&] { comm.recv(b, 0, 7); }, "rank 1's receive from rank 0");
        } else {
          store->get("test/sent", kTimeout);
          auto e = expect_error(ErrorCode::system, [&] { comm.recv(b, 1, 99); }, "rank 0's receive after the flood");
          expect(contains(e.what(), "CHORUS_MAX_BUFFERED_BYTES"), std::string("the error names the variable: ") + e.what());
          expect(comm.memory_stats().transport_bytes < (std::size_t(1) << 30), "bounded");
          store->set("test/checked", "1");
        }
      },
      kTimeout, {{"CHORUS_MAX_BUFFERED_BYTES", "40K"}});
}

}  // namespace transport_test_lifecycle
