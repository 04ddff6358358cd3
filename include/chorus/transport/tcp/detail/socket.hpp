// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// Socket-level details of the tcp transport: which address to listen on, and socket options.

#include <cstring>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "chorus/bootstrap/launch_env.hpp"
#include "chorus/core/error.hpp"
#include "chorus/detail/asio.hpp"
#include "chorus/detail/env.hpp"
#include "chorus/detail/interfaces.hpp"
#include "chorus/detail/keepalive.hpp"
#include "chorus/options.hpp"

namespace chorus::tcp::detail {

namespace asio = chorus::detail::asio;
using chorus::detail::asio_tcp;

using chorus::detail::choose_interface;
using chorus::detail::interface_address;
using chorus::detail::interface_addresses;
using chorus::detail::InterfaceAddress;

/// The host ranks rendezvous at: from tcp://host:port, else MASTER_ADDR (or its default under
/// srun, chorus::master_addr); nullopt when neither.
inline std::optional<std::string> master_host(const Options& o) {
  std::string m = o.init_method;
  if (m.rfind("tcp://", 0) == 0) {
    std::string hp = m.substr(6);
    if (!hp.empty() && hp[0] == '[') return hp.substr(1, hp.find(']') - 1);
    return hp.substr(0, hp.rfind(':'));
  }
  if (m.empty() || m == "env://") return chorus::master_addr(GetEnv(&chorus::detail::env_string));
  return std::nullopt;
}

/// The address this rank's links listen on: CHORUS_SOCKET_IFNAME's address if set; else the local
/// address that routes to the master host (a UDP connect sends nothing, it only picks a route);
/// else loopback. Listening on one address, never on all of them.
inline asio::ip::address listen_address(const Options& o) {
  if (!o.socket_ifname.empty()) return interface_address(o.socket_ifname);
  auto host = master_host(o);
  if (!host) return asio::ip::address_v4::loopback();
  asio::io_context io;
  asio_tcp::resolver res(io);
  boost::system::error_code ec;
  auto results = res.resolve(*host, "0", ec);
  if (ec || results.empty())
    throw Error(ErrorCode::invalid_argument, "cannot resolve the master host '" + *host + "': " + ec.message());
  const auto target = results.begin()->endpoint().address();
  if (target.is_loopback()) return target;
  asio::ip::udp::socket probe(io);
  probe.connect(asio::ip::udp::endpoint(target, 9), ec);
  if (ec) throw Error(ErrorCode::system, "no route to the master host '" + *host + "': " + ec.message());
  return probe.local_endpoint().address();
}

/// CHORUS_SOCKETS_PER_PEER: the TCP connections (streams) each link opens to its peer, 1 to 16;
/// large messages are striped across them (tcp/link.hpp). The default, 1, is what the
/// measurements of docs/transports.md chose on a 2-core machine.
inline constexpr int kMaxSocketsPerPeer = 16;
inline constexpr int kDefaultSocketsPerPeer = 1;

/// CHORUS_SOCKETS_PER_PEER's value; invalid_argument naming the variable when it is not an integer
/// in [1, 16].
inline int sockets_per_peer_from_env() {
  if (auto v = chorus::detail::env_int("CHORUS_SOCKETS_PER_PEER", 1, kMaxSocketsPerPeer)) return static_cast<int>(*v);
  return kDefaultSocketsPerPeer;
}

/// The text a rank publishes in the store under "tcp/addr/<rank>" (eager and lazy set-up alike).
inline std::string published_address(const asio::ip::address& a, unsigned short port) {
  return a.to_string() + " " + std::to_string(port);
}

/// published_address's inverse; invalid_argument naming `ctx` when `where` is not such a text.
inline asio_tcp::endpoint published_endpoint(const std::string& where, const ErrorContext& ctx) {
  const auto space = where.rfind(' ');
  boost::system::error_code ec;
  const auto addr =
      space == std::string::npos ? asio::ip::address() : asio::ip::make_address(where.substr(0, space), ec);
  if (ec || space == std::string::npos)
    throw Error(ErrorCode::invalid_argument, ctx, "bad address in store: '" + where + "'");
  return {addr, static_cast<unsigned short>(std::stoi(where.substr(space + 1)))};
}

/// invalid_argument of rank `rank`, whose K is `mine`: `peer` has `theirs` (the stream hello of
/// tcp/transport.hpp told), at creation (eager links) or at the first call (lazy ones).
inline Error streams_differ(int rank, int peer, int mine, std::uint32_t theirs) {
  return Error(ErrorCode::invalid_argument, ErrorContext{rank, peer, "tcp connect"},
               "CHORUS_SOCKETS_PER_PEER differs: " + std::to_string(mine) + " on rank " +
                   std::to_string(rank) + ", " + std::to_string(theirs) + " on rank " + std::to_string(peer) +
                   " (every rank must use the same value)");
}

/// Options every link socket gets: no Nagle delay, and keepalive plus a user timeout so a host
/// that vanishes without closing (cable, power) is noticed in seconds, not at the job timeout
/// (chorus/detail/keepalive.hpp; CHORUS_SOCKET_* variables).
inline void tune_socket(asio_tcp::socket& s, const chorus::detail::SocketTuning& t) {
  s.set_option(asio_tcp::no_delay(true));
  chorus::detail::tune_keepalive(s.native_handle(), t);
}

}  // namespace chorus::tcp::detail
