#pragma once
/// How the ranks of a transport test run: the transport, and threads or processes. Test cases are
/// templated on these (TEST_CASE_TEMPLATE), so each runs in every mode.

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
