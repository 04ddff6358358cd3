// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// How the ranks of a transport test run: the transport, and threads or processes. Test cases are
/// templated on these (TEST_CASE_TEMPLATE), so each runs in every mode.

#include <doctest/doctest.h>

#include "support/communicators.hpp"

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

}  // namespace chorus::test

// The names the test cases show for the modes (one place: the files of a folder are compiled
// together, see cmake/ChorusTesting.cmake).
TYPE_TO_STRING_AS("InprocThreads", chorus::test::InprocThreads);
TYPE_TO_STRING_AS("TcpThreads", chorus::test::TcpThreads);
TYPE_TO_STRING_AS("TcpProcesses", chorus::test::TcpProcesses);
TYPE_TO_STRING_AS("ShmThreads", chorus::test::ShmThreads);
TYPE_TO_STRING_AS("ShmProcesses", chorus::test::ShmProcesses);
TYPE_TO_STRING_AS("AutoProcesses", chorus::test::AutoProcesses);
