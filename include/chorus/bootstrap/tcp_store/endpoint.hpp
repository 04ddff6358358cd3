// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// Host text to TCP endpoints and back, for the TcpStore's server (where it listens) and for the
/// clients of a store, chorus's and torch's (where they connect, and what their messages name).

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "chorus/core/error.hpp"
#include "chorus/detail/asio.hpp"
#include "chorus/detail/handshake/wire.hpp"  // HandshakeRefused

namespace chorus::detail {

/// Host text to endpoints: an IP literal (IPv6 with or without brackets) or a name to resolve.
inline std::vector<asio_tcp::endpoint> resolve_endpoints(std::string host, std::uint16_t port) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  if (host.empty()) throw Error(ErrorCode::invalid_argument, "empty host name");
  boost::system::error_code ec;
  auto addr = asio::ip::make_address(host, ec);
  if (!ec) return {asio_tcp::endpoint(addr, port)};
  asio::io_context io;
  asio_tcp::resolver resolver(io);
  auto results = resolver.resolve(host, std::to_string(port), asio_tcp::resolver::numeric_service, ec);
  if (ec || results.empty())
    throw Error(ErrorCode::invalid_argument, "cannot resolve host '" + host + "': " + (ec ? ec.message() : "no address"));
  std::vector<asio_tcp::endpoint> out;
  for (const auto& r : results) out.push_back(r.endpoint());
  return out;
}

inline std::string endpoint_string(const asio_tcp::endpoint& ep) {
  const std::string a = ep.address().to_string();
  return (ep.address().is_v6() ? "[" + a + "]" : a) + ":" + std::to_string(ep.port());
}

/// "host:port" as given, an IPv6 address in brackets.
inline std::string host_port_string(const std::string& host, std::uint16_t port) {
  const bool v6 = host.find(':') != std::string::npos && host.front() != '[';
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

/// What a store client's error names: "<store> <op> '<key>' at host:port" (no key: no quotes).
inline ErrorContext store_call_context(int rank, std::string_view store, std::string_view op, const std::string& key,
                                       const std::string& host, std::uint16_t port) {
  std::string s = std::string(store) + " " + std::string(op);
  if (!key.empty()) s += " '" + key + "'";
  return ErrorContext{rank, -1, s + " at " + host_port_string(host, port)};
}

/// A client's connection loop: `attempt(endpoint)` on each address of host:port in turn until one
/// returns, the whole round again with backoff (10 ms, doubling to 1 s) while `deadline` allows,
/// since a server may start after its clients. Returns "" once connected, else the last error. A
/// HandshakeRefused (the server answered, and said no) is rethrown at once: retrying cannot help.
template <class Attempt>
std::string connect_with_backoff(const std::string& host, std::uint16_t port,
                                 std::chrono::steady_clock::time_point deadline, Attempt&& attempt) {
  using Clock = std::chrono::steady_clock;
  auto backoff = std::chrono::milliseconds(10);
  std::string last = "no attempt";
  for (;;) {
    try {
      for (const auto& ep : resolve_endpoints(host, port)) {
        try {
          attempt(ep);
          return {};
        } catch (const HandshakeRefused&) {
          throw;
        } catch (const Error& e) {
          last = e.what();
          if (Clock::now() >= deadline) break;
        }
      }
    } catch (const HandshakeRefused&) {
      throw;
    } catch (const Error& e) {  // the host name does not resolve (yet)
      last = e.what();
    }
    const auto now = Clock::now();
    if (now >= deadline) return last;
    std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - now));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
  }
}

}  // namespace chorus::detail
