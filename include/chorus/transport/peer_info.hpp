// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// What every rank publishes about itself before a transport is chosen for each pair of ranks
/// (transport/registry.hpp): a candidate's can_connect(me, peer) reads it.

#include <unistd.h>

#include <fstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "chorus/core/error.hpp"
#include "chorus/detail/env.hpp"

namespace chorus {

struct PeerInfo {
  int rank = -1;
  /// Equal for ranks of one machine: the kernel's boot id and the host name (as NCCL's host hash),
  /// or "id:" + CHORUS_HOST_ID where that is set (tests that pretend to span hosts; see
  /// docs/environment.md). Neither namespace counts: ranks of one host started in separate
  /// containers or mount namespaces are one host to the topology. Whether they can also share
  /// memory is shm's own fact (shm::Transport::local_fact: the network namespace).
  std::string host;
  /// What the candidates that publish something of their own (a static `local_fact(ctx)`, e.g.
  /// rdma: the fabric this rank can use, "" for none) said, by candidate name.
  std::vector<std::pair<std::string, std::string>> facts;

  /// The fact a candidate published, "" when it published none.
  std::string_view fact(std::string_view name) const {
    for (const auto& [k, v] : facts)
      if (k == name) return v;
    return {};
  }
};

namespace detail {

inline std::string read_first_line(const char* path) {
  std::ifstream f(path);
  std::string s;
  std::getline(f, s);
  return s;
}

inline std::string read_link(const char* path) {
  char buf[256];
  const ssize_t k = ::readlink(path, buf, sizeof buf - 1);
  return k > 0 ? std::string(buf, static_cast<std::size_t>(k)) : std::string("?");
}

/// The running kernel's boot id: the same for every process of one machine, whatever its
/// namespaces, and new at each boot.
inline std::string boot_id() { return read_first_line("/proc/sys/kernel/random/boot_id"); }

/// This process's host identity (PeerInfo::host): "<boot id>|<host name>", or "id:" +
/// CHORUS_HOST_ID.
inline std::string host_id(const ErrorContext& ctx) {
  if (auto v = chorus::detail::env_string("CHORUS_HOST_ID")) {
    if (v->empty()) throw Error(ErrorCode::invalid_argument, ctx, "CHORUS_HOST_ID is set but empty");
    return "id:" + *v;
  }
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  return boot_id() + '|' + name;
}

}  // namespace detail
}  // namespace chorus
