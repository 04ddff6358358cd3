// SPDX-License-Identifier: BSD-3-Clause
// Host identity (transport/peer_info.hpp) and who may share memory (shm::Transport::can_connect,
// which cuda_ipc's starts from): a host is the machine (boot id and host name), whatever the
// namespaces; shm needs one kernel and one network namespace as well. The namespace cases run in
// children that unshare a mount or a network namespace (root only; skipped with a message where
// unshare is refused).
#include "chorus/transport/peer_info.hpp"
#include "chorus/transport/cuda_ipc/transport.hpp"
#include "chorus/transport/shm/transport.hpp"

#include <doctest/doctest.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <optional>
#include <string>

// This file's own names: the files of tests/unit/ are compiled together (unity build).
namespace unit_test_host_identity {

using chorus::PeerInfo;
using Shm = chorus::shm::Transport;

PeerInfo info(int rank, std::string host, std::string shm_fact) {
  return PeerInfo{rank, std::move(host), {{"shm", std::move(shm_fact)}}};
}

/// What a child that unshares `flags` (CLONE_NEWNS, CLONE_NEWNET) sees: "<host id>\n<shm fact>",
/// or nullopt where unshare is refused (not root).
std::optional<std::string> seen_after_unshare(int flags) {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(fds[0]);
    std::string s = "-";
    if (::unshare(flags) == 0) {
      const chorus::ErrorContext ctx{0, -1, "test"};
      s = chorus::detail::host_id(ctx) + "\n" + Shm::local_fact(ctx);
    }
    const bool ok = ::write(fds[1], s.data(), s.size()) == static_cast<ssize_t>(s.size());
    ::_exit(ok ? 0 : 1);
  }
  ::close(fds[1]);
  std::string got;
  char buf[512];
  for (ssize_t k; (k = ::read(fds[0], buf, sizeof buf)) > 0;) got.append(buf, static_cast<std::size_t>(k));
  ::close(fds[0]);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  if (got == "-") return std::nullopt;
  return got;
}

TEST_CASE("host id: boot id and host name, no namespace") {
  ::unsetenv("CHORUS_HOST_ID");
  const chorus::ErrorContext ctx{0, -1, "test"};
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  const std::string boot = chorus::detail::boot_id();
  CHECK(boot.size() == 36);  // a UUID
  CHECK(chorus::detail::host_id(ctx) == boot + "|" + name);
  const std::string fact = Shm::local_fact(ctx);
  CHECK(fact == boot + "|" + chorus::detail::read_link("/proc/self/ns/net"));
  CHECK(fact.find("|net:[") == boot.size());

  ::setenv("CHORUS_HOST_ID", "node-7", 1);
  CHECK(chorus::detail::host_id(ctx) == "id:node-7");
  ::unsetenv("CHORUS_HOST_ID");
}

TEST_CASE("host id: the same in a mount namespace of its own and in a network namespace of its own") {
  ::unsetenv("CHORUS_HOST_ID");
  const chorus::ErrorContext ctx{0, -1, "test"};
  const std::string here = chorus::detail::host_id(ctx) + "\n" + Shm::local_fact(ctx);
  const auto mnt = seen_after_unshare(CLONE_NEWNS);
  if (!mnt) {
    MESSAGE("unshare(CLONE_NEWNS) refused (not root?): the namespace cases are not checked");
    return;
  }
  CHECK(*mnt == here);  // one host, and shm reaches it: a mount namespace changes neither
  const auto net = seen_after_unshare(CLONE_NEWNET);
  REQUIRE(net.has_value());
  const auto line = net->find('\n');
  CHECK(net->substr(0, line) == here.substr(0, here.find('\n')));  // one host
  CHECK(net->substr(line + 1) != here.substr(here.find('\n') + 1));  // shm does not reach it
  const PeerInfo me = info(0, here.substr(0, here.find('\n')), here.substr(here.find('\n') + 1));
  const PeerInfo peer = info(1, net->substr(0, line), net->substr(line + 1));
  CHECK_FALSE(Shm::can_connect(me, peer));
  CHECK(Shm::why_not(me, peer).starts_with("cannot share memory: different network namespaces"));
}

TEST_CASE("shm::can_connect: one host and one network namespace") {
  const std::string boot = "0b5d6c5e-1111-4222-8333-444455556666";
  const PeerInfo a = info(0, boot + "|node", boot + "|net:[4026531840]");

  SUBCASE("same host, same network namespace (mount namespaces do not count)") {
    const PeerInfo b = info(1, boot + "|node", boot + "|net:[4026531840]");
    CHECK(Shm::can_connect(a, b));
    CHECK(Shm::can_connect(b, a));
    CHECK(Shm::why_not(a, b).empty());
  }
  SUBCASE("same host, another network namespace") {
    const PeerInfo b = info(1, boot + "|node", boot + "|net:[4026532300]");
    CHECK_FALSE(Shm::can_connect(a, b));
    CHECK_FALSE(Shm::can_connect(b, a));
    CHECK(Shm::why_not(a, b) ==
          "cannot share memory: different network namespaces (net:[4026531840] and net:[4026532300])");
    // cuda_ipc rides shm's links: the same reason, before any device fact is read.
    CHECK_FALSE(chorus::cuda_ipc::Transport::can_connect(a, b));
    CHECK(chorus::cuda_ipc::Transport::why_not(a, b) == Shm::why_not(a, b));
  }
  SUBCASE("another host") {
    const PeerInfo b = info(1, boot + "|other", boot + "|net:[4026531840]");
    CHECK_FALSE(Shm::can_connect(a, b));
    CHECK(Shm::why_not(a, b) == "not on the same host");
    CHECK(chorus::cuda_ipc::Transport::why_not(a, b) == "not on the same host");
  }
  SUBCASE("one CHORUS_HOST_ID on two machines: the initial network namespaces look alike") {
    const PeerInfo c = info(0, "id:x", boot + "|net:[4026531840]");
    const PeerInfo d = info(1, "id:x", "99999999-1111-4222-8333-444455556666|net:[4026531840]");
    CHECK_FALSE(Shm::can_connect(c, d));
    CHECK(Shm::why_not(c, d).starts_with("cannot share memory: different kernels (boot ids "));
  }
}

}  // namespace unit_test_host_identity
