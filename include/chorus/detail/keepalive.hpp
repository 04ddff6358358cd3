// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// Keepalive and user timeout for every TCP socket chorus opens (links, and the store's client
/// and server ends), so that a peer or store host that vanishes without closing its connections
/// (power, cable, a link set down) is noticed in seconds rather than at the job timeout:
///   - data sent but not acknowledged for the user timeout (TCP_USER_TIMEOUT) fails the
///     connection (a busy link);
///   - a connection silent for `idle` seconds is probed every `interval` seconds; it fails once
///     probes have gone unanswered for the user timeout (with a user timeout set, Linux lets that,
///     not the probe count, decide), or after `count` unanswered probes when the kernel ignores
///     the user timeout (an idle link).
/// Settings from the environment (docs/environment.md), read where a transport or store is made.

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "chorus/detail/env.hpp"
#include "chorus/detail/log.hpp"

namespace chorus::detail {

struct SocketTuning {
  int keepalive_idle_s = 5;                       ///< CHORUS_SOCKET_KEEPALIVE_IDLE
  int keepalive_interval_s = 1;                   ///< CHORUS_SOCKET_KEEPALIVE_INTERVAL
  int keepalive_count = 5;                        ///< CHORUS_SOCKET_KEEPALIVE_COUNT
  std::chrono::milliseconds user_timeout{10000};  ///< CHORUS_SOCKET_USER_TIMEOUT (seconds)

  /// The defaults above, overridden by the variables that are set; a value that does not parse
  /// (or is out of the kernel's range) throws invalid_argument naming the variable.
  static SocketTuning from_env() {
    SocketTuning t;
    if (auto v = env_int("CHORUS_SOCKET_KEEPALIVE_IDLE", 1, 32767)) t.keepalive_idle_s = static_cast<int>(*v);
    if (auto v = env_int("CHORUS_SOCKET_KEEPALIVE_INTERVAL", 1, 32767))
      t.keepalive_interval_s = static_cast<int>(*v);
    if (auto v = env_int("CHORUS_SOCKET_KEEPALIVE_COUNT", 1, 127)) t.keepalive_count = static_cast<int>(*v);
    if (auto v = env_string("CHORUS_SOCKET_USER_TIMEOUT")) {
      t.user_timeout = parse_seconds(*v, "CHORUS_SOCKET_USER_TIMEOUT");
      if (t.user_timeout.count() > 0x7fffffff)
        throw Error(ErrorCode::invalid_argument, "CHORUS_SOCKET_USER_TIMEOUT='" + *v + "' is too large");
    }
    return t;
  }
};

/// Applies `t` to the connected TCP socket `fd`. A refused option is logged, not fatal: the
/// connection works without it, only a silent peer is then noticed later.
inline void tune_keepalive(int fd, const SocketTuning& t) {
  const int on = 1, user_timeout_ms = static_cast<int>(t.user_timeout.count());
  const struct {
    int level, name;
    const int* value;
    const char* what;
  } options[] = {
      {SOL_SOCKET, SO_KEEPALIVE, &on, "SO_KEEPALIVE"},
      {IPPROTO_TCP, TCP_KEEPIDLE, &t.keepalive_idle_s, "TCP_KEEPIDLE"},
      {IPPROTO_TCP, TCP_KEEPINTVL, &t.keepalive_interval_s, "TCP_KEEPINTVL"},
      {IPPROTO_TCP, TCP_KEEPCNT, &t.keepalive_count, "TCP_KEEPCNT"},
      {IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout_ms, "TCP_USER_TIMEOUT"},
  };
  for (const auto& o : options)
    if (::setsockopt(fd, o.level, o.name, o.value, sizeof(int)) != 0)
      log(LogLevel::warn, LogSubsys::net, -1, "setsockopt ", o.what, " failed: ", std::strerror(errno));
}

}  // namespace chorus::detail
