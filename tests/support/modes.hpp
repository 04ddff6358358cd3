// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// How the ranks of a transport test run: the transport, and threads or processes. Test cases are
/// templated on these (TEST_CASE_TEMPLATE), so each runs in every mode.

#include <doctest/doctest.h>

#include <chrono>
#include <utility>

#include "support/communicators.hpp"
#include "support/spawn.hpp"

namespace chorus::test {

struct InprocThreads {
  using Transport = chorus::inproc::Transport;
  static constexpr bool kProcesses = false;
};
struct TcpThreads {
  using Transport = chorus::tcp::Transport;
  static constexpr bool kProcesses = false;
};
struct TcpProcesses {
  using Transport = chorus::tcp::Transport;
  static constexpr bool kProcesses = true;
};

struct ShmThreads {
  using Transport = chorus::shm::Transport;
  static constexpr bool kProcesses = false;
};
struct ShmProcesses {
  using Transport = chorus::shm::Transport;
  static constexpr bool kProcesses = true;
};
/// The default transport (transport=auto): shm here, since every rank is on this host.
struct AutoProcesses {
  using Transport = chorus::hybrid::Transport;
  static constexpr bool kProcesses = true;
};

/// Creates a communicator of M's transport on every rank of an n-rank world (threads or
/// processes, as M says) and runs fn(comm, store) on each; store is the one the ranks met
/// through. `timeout` is the communicators' (Options::timeout); a run of processes is bounded by
/// it plus 60 s.
template <class M, class Fn>
void run_world(int n, const Fn& fn, std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  auto body = [&fn](int, chorus::Options o) {
    auto store = o.store;
    auto comm = chorus::Communicator<typename M::Transport>::create(std::move(o));
    fn(comm, *store);
  };
  if constexpr (M::kProcesses) {
    ProcessOptions p;
    p.comm_timeout = timeout;
    p.timeout = timeout + std::chrono::seconds(60);
    run_processes(n, body, p);
  } else {
    ThreadOptions t;
    t.timeout = timeout;
    run_threads(n, body, t);
  }
}

}  // namespace chorus::test

// The names the test cases show for the modes (one place: the files of a folder are compiled
// together, see cmake/ChorusTesting.cmake).
TYPE_TO_STRING_AS("InprocThreads", chorus::test::InprocThreads);
TYPE_TO_STRING_AS("TcpThreads", chorus::test::TcpThreads);
TYPE_TO_STRING_AS("TcpProcesses", chorus::test::TcpProcesses);
TYPE_TO_STRING_AS("ShmThreads", chorus::test::ShmThreads);
TYPE_TO_STRING_AS("ShmProcesses", chorus::test::ShmProcesses);
TYPE_TO_STRING_AS("AutoProcesses", chorus::test::AutoProcesses);
