// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// The bodies of TcpStore (bootstrap/tcp_store.hpp; CHORUS_DECL, config.hpp): included by that
/// header in a header-only program, and by chorus/impl/bodies.hpp alone with
/// CHORUS_SEPARATE_COMPILATION.

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "chorus/bootstrap/tcp_store.hpp"
#include "chorus/bootstrap/tcp_store/client.hpp"
#include "chorus/bootstrap/tcp_store/server.hpp"
#include "chorus/detail/asio.hpp"

namespace chorus {

CHORUS_DECL TcpStore::TcpStore(std::string host, std::uint16_t port, bool is_server, std::chrono::milliseconds timeout,
                               std::string token)
    : host_(std::move(host)), port_(port) {
  if (is_server) {
    server_ = std::make_unique<detail::TcpStoreServer>(host_, port, timeout, token);
    auto ep = server_->local_endpoint();
    port_ = ep.port();
    auto addr = ep.address();
    if (addr.is_unspecified())
      addr = addr.is_v6() ? detail::asio::ip::address(detail::asio::ip::address_v6::loopback())
                           : detail::asio::ip::address(detail::asio::ip::address_v4::loopback());
    client_ = std::make_unique<detail::TcpStoreClient>(addr.to_string(), port_, timeout, token);
  } else {
    client_ = std::make_unique<detail::TcpStoreClient>(host_, port_, timeout, token);
  }
}

CHORUS_DECL TcpStore::~TcpStore() {
  client_.reset();  // our own connection first, then the server
  server_.reset();
}

CHORUS_DECL void TcpStore::set(const std::string& key, const std::string& value) { client_->set(key, value); }
CHORUS_DECL std::string TcpStore::get(const std::string& key, Duration timeout) { return client_->get(key, timeout); }
CHORUS_DECL void TcpStore::wait(const std::vector<std::string>& keys, Duration timeout) { client_->wait(keys, timeout); }
CHORUS_DECL std::int64_t TcpStore::add(const std::string& key, std::int64_t delta) { return client_->add(key, delta); }
CHORUS_DECL bool TcpStore::check(const std::vector<std::string>& keys) { return client_->check(keys); }
CHORUS_DECL void TcpStore::set_within(const std::string& key, const std::string& value, Duration limit) {
  client_->set(key, value, limit);
}
CHORUS_DECL bool TcpStore::check_within(const std::vector<std::string>& keys, Duration limit) {
  return client_->check(keys, limit);
}

}  // namespace chorus
