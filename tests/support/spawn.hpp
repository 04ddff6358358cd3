// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// Ranks as threads or as processes, for tests (after gloo/test/base_test.h's spawn).
///
///   chorus::test::run_threads(4, [](int rank, chorus::Options o) {
///     auto comm = chorus::Communicator<chorus::inproc::Transport>::create(std::move(o));
///     chorus::test::expect(comm.rank() == rank, "rank");
///   });
///   chorus::test::run_processes(2, [](int rank, chorus::Options o) { ... });   // same body shape
///
/// Failures in a body: bodies signal failure by throwing. expect(), expect_eq() and expect_error()
/// below throw chorus::test::Failure with the file and line; any exception works. The helper
/// catches it, finishes the other ranks, and reports it on the calling (doctest) thread.
///
/// Threads and doctest: doctest 2.4.9 does not promise that CHECK/REQUIRE may be called from
/// threads other than the test's own (its per-test counters and INFO contexts are per thread,
/// and a REQUIRE's exception would escape the thread), so run_threads bodies must NOT use doctest
/// macros; use the throwing helpers. In run_processes the body runs on the child's test thread,
/// so doctest macros work there too (a failed CHECK makes the child exit non-zero), but bodies
/// shared between both helpers should stick to the throwing helpers.
///
/// How run_processes works: the parent hosts a TcpStore on 127.0.0.1 (port 0: the kernel picks)
/// and re-executes its own binary (/proc/self/exe) once per rank, with doctest filters that
/// select only the current test case and CHORUS_TEST_CHILD_* variables that name the rank, the
/// world size, the store's port and which run_processes call of the test case to run (a test
/// case may call it several times, also from SUBCASEs: calls are counted in execution order,
/// which must be deterministic). In the child, the k-th call runs the body and exits the
/// process (0 on success, non-zero on failure); the other calls return at once without doing
/// anything. A child never spawns. The parent waits for every child, bounded by
/// ProcessOptions::timeout (after which all are killed with SIGKILL), and on failure prints the
/// output of every child (captured in anonymous memfd files) and throws Failure naming each
/// failed rank and how it ended. A child that exits 0 without having run the body (it marks the
/// store first) fails too, so a filter that selects nothing never passes silently. Set
/// CHORUS_TEST_VERBOSE=1 to see the children's output on success as well. run_processes must be
/// called from the test case's own thread (children die with it: PR_SET_PDEATHSIG).

#include "chorus/bootstrap/store.hpp"
#include "chorus/core/error.hpp"
#include "chorus/options.hpp"

#include <doctest/doctest.h>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <iostream>
#include <memory>
#include <mutex>
#include <set>
#include <source_location>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace chorus::test {

/// The body of one rank: its rank and the Options to create a communicator from (rank,
/// world_size, store and timeout are set).
using RankBody = std::function<void(int rank, chorus::Options options)>;

/// A failed expectation in a rank's body.
class Failure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {

inline std::string where(const std::source_location& loc) {
  std::string_view file = loc.file_name();
  if (auto p = file.find_last_of('/'); p != std::string_view::npos) file.remove_prefix(p + 1);
  return std::string(file) + ":" + std::to_string(loc.line());
}

inline std::string describe(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (const doctest::detail::TestFailureException&) {
    return "a doctest REQUIRE failed (see above)";
  } catch (...) {
    return "an exception of unknown type";
  }
}

}  // namespace detail

/// Throws Failure("file:line: what") unless ok.
inline void expect(bool ok, std::string_view what, std::source_location loc = std::source_location::current()) {
  if (!ok) throw Failure(detail::where(loc) + ": " + std::string(what));
}

/// Throws Failure("file:line: what: got A, expected B") unless got == want.
template <class A, class B>
void expect_eq(const A& got, const B& want, std::string_view what,
               std::source_location loc = std::source_location::current()) {
  if (!(got == want)) {
    std::ostringstream os;
    os << detail::where(loc) << ": " << what << ": got " << got << ", expected " << want;
    throw Failure(os.str());
  }
}

/// Runs f, which must throw chorus::Error with the given code; returns that error so the caller
/// can look at its message. Throws Failure otherwise (other exception types pass through).
template <class F>
chorus::Error expect_error(chorus::ErrorCode code, F&& f, std::string_view what,
                           std::source_location loc = std::source_location::current()) {
  try {
    std::forward<F>(f)();
  } catch (const chorus::Error& e) {
    if (e.code() != code) {
      throw Failure(detail::where(loc) + ": " + std::string(what) + ": expected chorus::Error " +
                    std::string(chorus::to_string(code)) + ", got: " + e.what());
    }
    return e;
  }
  throw Failure(detail::where(loc) + ": " + std::string(what) + ": expected chorus::Error " +
                std::string(chorus::to_string(code)) + ", nothing was thrown");
}

// ---------------------------------------------------------------------------------------------
// Ranks as threads

struct ThreadOptions {
  /// Options::timeout of every rank: keep it short in tests, so a bug fails instead of hanging.
  std::chrono::milliseconds timeout = std::chrono::seconds(30);
  /// The store the ranks share; a fresh MemoryStore when null.
  std::shared_ptr<chorus::Store> store;
};

/// Runs body on n threads, rank r on the r-th, all sharing one store; joins them all, then
/// rethrows the first failure (in time). Every failure is also written to stderr with its rank.
/// Bounded by the bodies themselves: every chorus call in them is bounded by the timeout.
void run_threads(int n, const RankBody& body, ThreadOptions topt = {});

/// A barrier through the store the ranks share, not over their links (so it makes no connection
/// and takes no part in what a test counts of them): every rank of `n` but `skip` has reached
/// `what`. Bounded by `timeout` (the store's timeout error).
inline void store_barrier(chorus::Store& store, const std::string& what, int rank, int n, int skip = -1,
                          std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  store.set("test/" + what + "/" + std::to_string(rank), "1");
  std::vector<std::string> keys;
  for (int r = 0; r < n; ++r)
    if (r != skip) keys.push_back("test/" + what + "/" + std::to_string(r));
  store.wait(keys, timeout);
}

// ---------------------------------------------------------------------------------------------
// Ranks as processes

struct ProcessOptions {
  /// Wall-clock bound on the whole run; past it every child still running is killed (SIGKILL)
  /// and the run fails.
  std::chrono::milliseconds timeout = std::chrono::seconds(90);
  /// Options::timeout of every rank (and of its store client).
  std::chrono::milliseconds comm_timeout = std::chrono::seconds(30);
  /// Extra environment for every child (e.g. {"CHORUS_DEBUG", "TRACE"}).
  std::vector<std::pair<std::string, std::string>> env = {};
  /// Ranks that are expected to die by SIGKILL (failure tests); any other ending of theirs fails.
  std::set<int> expect_killed = {};
};

/// Runs body as ranks 0..n-1, each in its own process (see the top of this file). Returns when
/// every child ended as expected; throws Failure otherwise. In a child, returns without doing
/// anything when this is not the call the child was started for.
void run_processes(int n, const RankBody& body, ProcessOptions popt = {});

}  // namespace chorus::test
