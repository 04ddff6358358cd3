// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// TcpStore: a Store served over TCP by one process (rank 0), like torch.distributed's TCPStore.
///
///   chorus::TcpStore server("127.0.0.1", 0, /*is_server=*/true, std::chrono::seconds(30));
///   chorus::TcpStore client("127.0.0.1", server.port(), false, std::chrono::seconds(30));
///   client.set("k", "v");  server.get("k", std::chrono::seconds(1));   // "v"
///
/// The server listens on exactly the address it is given (IPv4 or IPv6; "0.0.0.0" or "::" only
/// when asked), on its own thread with one io_context and one coroutine per connection. The
/// server object is also a client of itself, over loopback. Waiting (get, wait) is done by the
/// server: it parks the request until the keys are set or the request's timeout passes, so
/// clients never poll. Every connection opens with the chorus handshake (kind store; with a job
/// token, the HMAC challenge-response). A connection that fails the handshake, sends a malformed
/// or oversized frame, stalls mid-frame, or leaves while its get/wait is parked is dropped and
/// logged; the others are unaffected.
///
/// The frames are described and coded in tcp_store/wire.hpp; the two halves are
/// tcp_store/server.hpp and tcp_store/client.hpp.
///
/// A client that loses its connection (server gone) fails that call and every later one with
/// peer_failure at once; it does not reconnect. Both ends' sockets get keepalive and a user
/// timeout (detail/keepalive.hpp), so a host that vanishes fails the other end's calls within
/// seconds; set_within and check_within bound a call more tightly than the store's timeout.

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "chorus/bootstrap/store.hpp"
#include "chorus/bootstrap/tcp_store/client.hpp"
#include "chorus/bootstrap/tcp_store/server.hpp"
#include "chorus/config.hpp"
#include "chorus/detail/asio.hpp"

namespace chorus {

/// A Store served by one process over TCP. The protocol is in tcp_store/wire.hpp.
class TcpStore final : public Store {
 public:
  /// is_server: bind host:port (port 0: an ephemeral port, see port()) and serve; also connect
  /// to it as a client. Otherwise connect to host:port, retrying with backoff until `timeout`.
  /// `timeout` also bounds each call (get and wait take their own). `token`: the job token for
  /// the handshake (empty: none); client and server must agree.
  CHORUS_DECL TcpStore(std::string host, std::uint16_t port, bool is_server, std::chrono::milliseconds timeout,
                       std::string token = {});

  CHORUS_DECL ~TcpStore() override;

  /// The port: the bound one for a server (useful with port 0), else the one connected to.
  std::uint16_t port() const { return port_; }
  const std::string& host() const { return host_; }
  bool is_server() const { return server_ != nullptr; }
  /// A server's requests served and connections accepted so far (its own client's included); 0
  /// for a client.
  std::uint64_t requests_served() const { return server_ ? server_->requests_served() : 0; }
  std::uint64_t connections_accepted() const { return server_ ? server_->connections_accepted() : 0; }

  CHORUS_DECL void set(const std::string& key, const std::string& value) override;
  CHORUS_DECL std::string get(const std::string& key, Duration timeout) override;
  CHORUS_DECL void wait(const std::vector<std::string>& keys, Duration timeout) override;
  CHORUS_DECL std::int64_t add(const std::string& key, std::int64_t delta) override;
  CHORUS_DECL bool check(const std::vector<std::string>& keys) override;
  CHORUS_DECL void set_within(const std::string& key, const std::string& value, Duration limit) override;
  CHORUS_DECL bool check_within(const std::vector<std::string>& keys, Duration limit) override;

 private:
  std::string host_;
  std::uint16_t port_;
  std::unique_ptr<detail::TcpStoreServer> server_;
  std::unique_ptr<detail::TcpStoreClient> client_;
};

}  // namespace chorus

// The bodies (bootstrap/impl/tcp_store.hpp): here in a header-only program; compiled once with
// CHORUS_SEPARATE_COMPILATION (config.hpp, CHORUS_DECL), so that a file that makes a TcpStore
// compiles neither its server nor its client (the destructor, out of line, holds the vtable).
#if !defined(CHORUS_SEPARATE_COMPILATION)
#include "chorus/bootstrap/impl/tcp_store.hpp"
#endif
