// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// tcp::Transport: a TCP connection to each peer it exchanges with, over Boost.Asio, driven by the
/// thread that waits (a background thread stands in for work nobody waits on;
/// transport/progress.hpp).
///
/// Connection set-up: every rank listens on one address (CHORUS_SOCKET_IFNAME, or the one that
/// routes to the master host) on an ephemeral port and publishes "address port" in the store.
/// By default (CHORUS_CONNECT=lazy) that is all creation does: a link is connected when a call
/// first sends over it, and the socket listens for the transport's life (detail/lazy_links.hpp).
/// With CHORUS_CONNECT=eager, rank r connects to every rank below it and accepts from every rank
/// above it at creation. Each connection opens with the handshake of detail/handshake.hpp (magic,
/// version, the job nonce, the ranks at both ends, and with CHORUS_JOB_TOKEN a challenge-response);
/// a connection that fails it is refused and logged and the rank keeps accepting. Eager, the
/// listening socket is closed once all peers are connected, so nothing listens for the rest of
/// the job.
///
/// With CHORUS_SOCKETS_PER_PEER=K (detail/socket.hpp) each link is K connections, made the same
/// way; after the handshake the connecting side sends its stream hello (u32 stream index, u32 K,
/// little-endian) and the accepting side answers with its own K (u32). Ranks whose K differ both
/// fail with invalid_argument naming the variable and both values.

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "chorus/bootstrap/rendezvous.hpp"
#include "chorus/core/concepts.hpp"
#include "chorus/core/cost_model.hpp"
#include "chorus/transport/peer_info.hpp"
#include "chorus/detail/asio.hpp"
#include "chorus/detail/handshake.hpp"
#include "chorus/detail/log.hpp"
#include "chorus/transport/tcp/detail/socket.hpp"
#include "chorus/transport/shell.hpp"
#include "chorus/transport/tcp/detail/engine.hpp"
#include "chorus/transport/tcp/link.hpp"

namespace chorus::tcp {

class Transport : public chorus::detail::EngineTransport<Transport, detail::Engine, Link> {
 public:
  static constexpr std::string_view kName = "tcp";
  /// Loopback TCP on a 2-core machine: ~10 us per message with the waiting thread driving the
  /// socket (an 8-byte all_reduce of 2 ranks, one step: about 10 us), ~3 GB/s
  /// (bench/p2p/tcp_pingpong); slices of 512 KiB. To another host the host's network link bounds
  /// it: 10 Gbit/s Ethernet unless CHORUS_NET_BANDWIDTH says otherwise (algo/plan.hpp).
  static constexpr TransportModel kModel{10e-6, 1.0 / 3e9, 512 << 10, 1.0 / 1.25e9};
  /// Any two ranks (registry.hpp).
  static bool can_connect(const PeerInfo& me, const PeerInfo& peer) {
    (void)me, (void)peer;
    return true;
  }

  /// Links to every other rank.
  explicit Transport(const Bootstrap& b) : Transport(b, std::vector<bool>(static_cast<std::size_t>(b.size), true)) {}
  /// Links only to the ranks with peers[p] set (the others are reached another way, see
  /// transport/hybrid); both ends of a pair must agree. With no peer at all nothing listens.
  /// rank(), size(), link(peer), memory_bytes() and abort(why) are EngineTransport's
  /// (transport/shell.hpp).
  Transport(const Bootstrap& b, std::vector<bool> peers);

 private:
  void connect_all(const Bootstrap& b);

  /// invalid_argument: `peer` has a different CHORUS_SOCKETS_PER_PEER.
  Error streams_differ(int peer, std::uint32_t theirs) const;

  std::vector<bool> peers_;  ///< the ranks this transport links to
  int streams_ = 1;          ///< connections per link (CHORUS_SOCKETS_PER_PEER)
};

// ---- bodies ----

inline Transport::Transport(const Bootstrap& b, std::vector<bool> peers)
    : EngineTransport(b.rank, b.size, peers.size()), peers_(std::move(peers)), streams_(detail::sockets_per_peer_from_env()) {
  peers_[static_cast<std::size_t>(rank_)] = false;
  // Some peers reached another way (shm inside the host, transport/hybrid): a rank waiting on
  // those does not drive this engine, so its background thread takes the links over soon after
  // the last caller here leaves, for a peer's request-to-send or clear-to-send to be answered
  // (a tree all_reduce of 256 KiB on 4 namespace hosts of 2 ranks: 43 ms, 8.9 ms with it).
  const auto served = std::count(peers_.begin(), peers_.end(), true);
  if (served > 0 && served + 1 < size_) engine_->token.set_hand_over_on_leave(true);
  const std::weak_ptr<chorus::detail::Driver> weak_driver = engine_;
  for (int p = 0; p < size_; ++p)
    if (peers_[static_cast<std::size_t>(p)])
      engine_->links[p] =
          std::make_unique<Link>(rank_, p, engine_->io, b.options.timeout, weak_driver, engine_->token, streams_);
  const auto tuning = chorus::detail::SocketTuning::from_env();  // a bad value fails before connecting
  const bool any = std::find(peers_.begin(), peers_.end(), true) != peers_.end();
  if (any && b.options.connect != "eager") {  // links made on first use (detail/lazy_links.hpp)
    engine_->lazy = std::make_unique<detail::LazyLinks>(b, engine_->links, engine_->io, streams_);
    for (auto& l : engine_->links)
      if (l) l->set_unconnected(*engine_->lazy);
    engine_->lazy->start();
  } else if (any) {
    connect_all(b);
    for (auto& l : engine_->links) {
      if (!l) continue;
      for (int i = 0; i < streams_; ++i) detail::tune_socket(l->socket(i), tuning);
      l->start();
    }
  }
  engine_->work.emplace(engine_->io.get_executor());
  start_progress_thread();
}

inline void Transport::connect_all(const Bootstrap& b) {
  namespace asio = chorus::detail::asio;
  using chorus::detail::asio_tcp;
  using Clock = std::chrono::steady_clock;
  auto& io = engine_->io;
  const auto deadline = Clock::now() + b.options.setup_bound();
  const std::string& token = b.options.job_token;

  // Listen on one address, an ephemeral port; publish it.
  const auto addr = detail::listen_address(b.options);
  asio_tcp::acceptor acceptor(io, asio_tcp::endpoint(addr, 0));
  acceptor.listen(asio::socket_base::max_listen_connections);
  const auto port = acceptor.local_endpoint().port();
  b.store->set("tcp/addr/" + std::to_string(rank_), detail::published_address(addr, port));
  chorus::detail::log(chorus::detail::LogLevel::info, chorus::detail::LogSubsys::net, rank_, "tcp: listening on ", addr.to_string(), " port ", port);

  // Ranks outside the mask count as connected: nothing waits for them. A peer is connected when
  // all its streams are; have[p][i]: stream i to p is.
  const auto K = static_cast<std::uint32_t>(streams_);
  std::vector<bool> connected(static_cast<std::size_t>(size_), false);
  std::vector<std::vector<bool>> have(static_cast<std::size_t>(size_), std::vector<bool>(K, false));
  std::vector<std::uint32_t> streams_up(static_cast<std::size_t>(size_), 0);
  for (int p = 0; p < size_; ++p) connected[static_cast<std::size_t>(p)] = !peers_[static_cast<std::size_t>(p)];
  auto stream_up = [&](int p, std::uint32_t i) {
    have[static_cast<std::size_t>(p)][i] = true;
    if (++streams_up[static_cast<std::size_t>(p)] == K) connected[static_cast<std::size_t>(p)] = true;
  };
  std::exception_ptr first_error;

  auto remaining = [&] {
    return std::max(std::chrono::milliseconds(1),
                    std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
  };

  std::vector<std::weak_ptr<asio_tcp::socket>> handshaking;
  auto finish_if_done = [&] {
    for (int p = 0; p < size_; ++p)
      if (p != rank_ && !connected[p]) return;
    boost::system::error_code ignored;
    acceptor.close(ignored);
    for (auto& w : handshaking)
      if (auto s = w.lock()) s->close(ignored);
  };
  // Connect to every lower rank.
  for (int p = 0; p < rank_; ++p) {
    if (!peers_[static_cast<std::size_t>(p)]) continue;
    const asio_tcp::endpoint ep = detail::published_endpoint(
        b.store->get("tcp/addr/" + std::to_string(p), remaining()), ErrorContext{rank_, p, "tcp connect"});
    for (std::uint32_t stream = 0; stream < K; ++stream)
    asio::co_spawn(
        io,
        [this, p, ep, &b, &token, deadline, stream, K]() -> asio::awaitable<void> {
          auto& sock = engine_->links[p]->socket(static_cast<int>(stream));
          asio::steady_timer backoff(co_await asio::this_coro::executor);
          auto delay = std::chrono::milliseconds(10);
          for (;;) {
            boost::system::error_code ec;
            co_await sock.async_connect(ep, asio::redirect_error(asio::use_awaitable, ec));
            if (!ec) break;
            boost::system::error_code ignored;
            sock.close(ignored);
            if (Clock::now() + delay >= deadline)
              throw Error(ErrorCode::timeout, ErrorContext{rank_, p, "tcp connect"},
                          "cannot connect to " + ep.address().to_string() + " port " + std::to_string(ep.port()) +
                              ": " + ec.message());
            backoff.expires_after(delay);
            co_await backoff.async_wait(asio::use_awaitable);
            delay = std::min(delay * 2, std::chrono::milliseconds(1000));
          }
          chorus::Hello mine;
          mine.kind = chorus::kHandshakeLink;
          mine.nonce = b.nonce;
          mine.rank = rank_;
          mine.peer = p;
          mine.world = size_;
          co_await chorus::handshake_connect(sock, mine, token);
          // Which stream this is, and this rank's K; the peer answers with its K.
          const std::array<std::uint32_t, 2> stream_hello = {stream, K};
          co_await asio::async_write(sock, asio::buffer(stream_hello), asio::use_awaitable);
          std::uint32_t theirs = 0;
          co_await asio::async_read(sock, asio::buffer(&theirs, sizeof theirs), asio::use_awaitable);
          if (theirs != K) throw streams_differ(p, theirs);
        },
        [&, p, stream](std::exception_ptr e) {
          if (e) {
            if (!first_error) first_error = e;
            io.stop();
          } else {
            stream_up(p, stream);
            finish_if_done();
          }
        });
  }

  // Accept from every higher rank; refuse and log whatever fails the handshake. Once every peer
  // is connected, close the acceptor and cut short handshakes still in progress (strangers).
  if (std::find(peers_.begin() + rank_ + 1, peers_.end(), true) != peers_.end()) {
    asio::co_spawn(
        io,
        [&]() -> asio::awaitable<void> {
          while (acceptor.is_open()) {
            auto sock = std::make_shared<asio_tcp::socket>(io);
            boost::system::error_code ec;
            co_await acceptor.async_accept(*sock, asio::redirect_error(asio::use_awaitable, ec));
            if (ec == asio::error::operation_aborted || !acceptor.is_open()) co_return;
            if (ec) continue;
            handshaking.push_back(sock);
            asio::co_spawn(
                io,
                [&, sock]() -> asio::awaitable<void> {
                  boost::system::error_code rec;
                  const auto rep = sock->remote_endpoint(rec);
                  const std::string from =
                      rec ? std::string("?") : rep.address().to_string() + " port " + std::to_string(rep.port());
                  try {
                    const auto hello = co_await chorus::handshake_accept(
                        *sock, chorus::kHandshakeLink, token, [&](const chorus::Hello& h) {
                          return h.nonce == b.nonce && h.world == size_ && h.peer == rank_ && h.rank > rank_ &&
                                 h.rank < size_ && peers_[static_cast<std::size_t>(h.rank)] &&
                                 !connected[static_cast<std::size_t>(h.rank)];
                        });
                    std::array<std::uint32_t, 2> stream_hello{};  // {stream index, the peer's K}
                    co_await asio::async_read(*sock, asio::buffer(stream_hello), asio::use_awaitable);
                    co_await asio::async_write(*sock, asio::buffer(&K, sizeof K), asio::use_awaitable);
                    if (stream_hello[1] != K) {
                      if (!first_error) first_error = std::make_exception_ptr(streams_differ(hello.rank, stream_hello[1]));
                      io.stop();
                      co_return;
                    }
                    const std::uint32_t stream = stream_hello[0];
                    if (stream >= K) throw std::runtime_error("stream index " + std::to_string(stream) + " out of range");
                    if (have[static_cast<std::size_t>(hello.rank)][stream]) co_return;  // raced a duplicate
                    engine_->links[hello.rank]->socket(static_cast<int>(stream)) = std::move(*sock);
                    stream_up(hello.rank, stream);
                    finish_if_done();
                  } catch (const std::exception& e) {
                    chorus::detail::log(chorus::detail::LogLevel::warn, chorus::detail::LogSubsys::net, rank_, "tcp: refused a connection from ", from,
                                        ": ", e.what());
                  }
                },
                asio::detached);
          }
        },
        asio::detached);
  }

  io.run_until(deadline);
  boost::system::error_code ignored;
  acceptor.close(ignored);
  // Let whatever was cut short (handshakes in progress) finish with operation_aborted.
  const bool all = [&] {
    for (int p = 0; p < size_; ++p)
      if (p != rank_ && !connected[p]) return false;
    return true;
  }();
  if (!all || first_error) {
    for (auto& l : engine_->links)
      if (l)
        for (int i = 0; i < streams_; ++i) l->socket(i).close(ignored);
    io.restart();
    io.poll();
  }
  if (first_error) std::rethrow_exception(first_error);
  if (!all) {
    std::string missing;
    for (int p = 0; p < size_; ++p)
      if (p != rank_ && !connected[p]) missing += (missing.empty() ? "" : ", ") + std::to_string(p);
    throw Error(ErrorCode::timeout, ErrorContext{rank_, -1, "tcp connect"},
                "no connection from/to ranks " + missing + " within " + std::to_string(b.options.setup_bound().count()) +
                    " ms (CHORUS_TIMEOUT)");
  }
  io.restart();
}

inline Error Transport::streams_differ(int peer, std::uint32_t theirs) const {
  return detail::streams_differ(rank_, peer, streams_, theirs);
}

static_assert(chorus::Transport<Transport>);

}  // namespace chorus::tcp
