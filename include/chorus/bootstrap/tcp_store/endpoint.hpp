// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// Host text to TCP endpoints and back, for the TcpStore's server (where it listens) and client
/// (where it connects, and what its messages name).

#include <cstdint>
#include <string>
#include <vector>

#include "chorus/core/error.hpp"
#include "chorus/detail/asio.hpp"

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

}  // namespace chorus::detail
