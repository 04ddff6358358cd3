// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// tcp's links made on first use (CHORUS_CONNECT=lazy, the default; Options::connect): at
/// creation a rank only listens (one socket, on the address of tcp/transport.hpp, open for the
/// transport's life) and publishes "address port" in the store. A link is made when this rank
/// first sends on it (Link::isend asks), or when the peer does: so a ring or tree job holds links
/// to the ranks it exchanges with only, and the store serves one request per link made.
///
/// A rank that sends first dials (the store's address, then the handshake of detail/handshake.hpp
/// and the stream hello of tcp/transport.hpp: stream index and K, answered with K); frames queue
/// in the link meanwhile. The one that accepts adopts the connection, unless it is dialing the
/// same peer itself: then the connection dialed by the lower rank of the two is kept, the other
/// refused (answered 0 for K), so both ends settle on the same one. States per peer, changed on
/// the thread that runs the io_context only: idle, dialing, accepting (the peer's streams coming
/// in), up. A dial that fails (refused: the process is gone; no answer within the timeout; a
/// handshake refused) breaks that link with peer_failure naming the peer and its address; a
/// connection that fails the handshake is refused and logged, as at creation.
///
/// Its state lives in the engine (tcp/detail/engine.hpp), so that the handlers the progress thread
/// runs to the end never outlive it; Engine::on_stop shuts it (the listening socket and the
/// connections being made are closed).

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "chorus/bootstrap/rendezvous.hpp"
#include "chorus/detail/handshake.hpp"
#include "chorus/detail/log.hpp"
#include "chorus/transport/tcp/detail/socket.hpp"
#include "chorus/transport/tcp/link.hpp"

namespace chorus::tcp::detail {

class LazyLinks {
 public:
  /// Listens and publishes this rank's address: `links` (by peer, null where none) are the
  /// engine's, on `io`; `peers` masks them as tcp::Transport's does; `streams`: K.
  LazyLinks(const Bootstrap& b, std::vector<std::unique_ptr<Link>>& links, asio::io_context& io, int streams)
      : rank_(b.rank),
        size_(b.size),
        streams_(static_cast<std::uint32_t>(streams)),
        store_(b.store),
        nonce_(b.nonce),
        token_(b.options.job_token),
        bound_(b.options.timeout),
        tuning_(chorus::detail::SocketTuning::from_env()),
        io_(io),
        links_(links),
        acceptor_(io),
        retry_(io),
        peers_(links.size()),
        asked_(std::make_unique<std::atomic<bool>[]>(links.size())) {
    const auto addr = listen_address(b.options);
    acceptor_.open(addr.is_v6() ? asio_tcp::v6() : asio_tcp::v4());
    acceptor_.bind(asio_tcp::endpoint(addr, 0));
    acceptor_.listen(asio::socket_base::max_listen_connections);
    const auto port = acceptor_.local_endpoint().port();
    store_->set("tcp/addr/" + std::to_string(rank_), published_address(addr, port));
    chorus::detail::log(chorus::detail::LogLevel::info, chorus::detail::LogSubsys::net, rank_,
                        "tcp: listening on ", addr.to_string(), " port ", port, " (links made on first use)");
    for (auto& p : peers_) p.have.assign(streams_, false), p.reserved.assign(streams_, false);
  }
  LazyLinks(const LazyLinks&) = delete;
  LazyLinks& operator=(const LazyLinks&) = delete;

  /// Starts accepting (before the progress thread starts).
  void start() { asio::co_spawn(io_, accept_loop(), asio::detached); }

  /// A send on the link to `peer` found it unconnected (any thread; the first time only): reads
  /// the peer's address from the store here, then dials from the thread that runs the io_context.
  void need(int peer) {
    if (asked_[static_cast<std::size_t>(peer)].exchange(true)) return;
    const ErrorContext ctx{rank_, peer, "tcp connect"};
    try {
      const asio_tcp::endpoint ep =
          published_endpoint(store_->get("tcp/addr/" + std::to_string(peer), bound_), ctx);
      asio::post(io_, [this, peer, ep] { dial(peer, ep); });
    } catch (const std::exception& e) {
      const std::string why =
          std::string("cannot learn the address of rank ") + std::to_string(peer) + ": " + e.what();
      asio::post(io_, [this, peer, why] { fail(peer, why); });
    }
  }

  /// The transport stops (on the thread that runs the io_context): nothing is accepted or dialed
  /// any more, and the connections being made are closed.
  void shutdown() {
    stopping_ = true;
    boost::system::error_code ignored;
    acceptor_.close(ignored);
    retry_.cancel();
    for (auto& w : in_flight_)
      if (auto s = w.lock()) s->close(ignored);
    in_flight_.clear();
  }

 private:
  enum class State : std::uint8_t { idle, dialing, accepting, up };
  struct Peer {
    State state = State::idle;
    std::uint32_t gen = 0;       ///< this rank's dials: the answers of an abandoned one are dropped
    std::vector<bool> have;      ///< the streams in place
    std::uint32_t count = 0;     ///< ... how many
    std::vector<bool> reserved;  ///< accepting: the streams answered (in place once settled)
    std::uint32_t dials = 0;     ///< this rank's dial_stream coroutines still running (any gen)
  };

  Link& link(int p) { return *links_[static_cast<std::size_t>(p)]; }
  Peer& peer(int p) { return peers_[static_cast<std::size_t>(p)]; }

  std::shared_ptr<asio_tcp::socket> tracked_socket() {
    std::erase_if(in_flight_, [](const std::weak_ptr<asio_tcp::socket>& w) { return w.expired(); });
    auto s = std::make_shared<asio_tcp::socket>(io_);
    in_flight_.push_back(s);
    return s;
  }

  /// Breaks the link to `p` with `code`, unless the peer's own connection serves it (up, or
  /// coming in: this rank's dial or address lookup failing then does not matter).
  void fail(int p, const std::string& why, ErrorCode code = ErrorCode::peer_failure) {
    if (stopping_ || peer(p).state == State::up || peer(p).state == State::accepting) return;
    chorus::detail::log(chorus::detail::LogLevel::warn, chorus::detail::LogSubsys::net, rank_, "tcp: ", why);
    link(p).fail(code, why);
  }

  void dial(int p, const asio_tcp::endpoint& ep) {
    Peer& s = peer(p);
    if (stopping_ || link(p).failed() || s.state != State::idle) return;  // the peer's connection serves
    s.state = State::dialing;
    const std::uint32_t gen = ++s.gen;
    s.dials += streams_;
    for (std::uint32_t i = 0; i < streams_; ++i)
      asio::co_spawn(io_, dial_stream(p, ep, i, gen), [this, p, gen](std::exception_ptr e) {
        --peer(p).dials;
        if (!e || stopping_ || peer(p).gen != gen || peer(p).state != State::dialing) {
          if (peer(p).state == State::accepting) up_if_settled(p);  // an abandoned dial ended
          return;
        }
        try {
          std::rethrow_exception(e);
        } catch (const Error& x) {
          fail(p, x.what(), x.code());  // peer_failure, or invalid_argument (K differs)
        } catch (const std::exception& x) {
          fail(p, x.what());
        }
      });
  }

  asio::awaitable<void> dial_stream(int p, asio_tcp::endpoint ep, std::uint32_t stream, std::uint32_t gen) {
    const ErrorContext ctx{rank_, p, "tcp connect"};
    const std::string where = ep.address().to_string() + " port " + std::to_string(ep.port());
    auto sock = tracked_socket();
    chorus::detail::SocketWatchdog dog(*sock, bound_);
    boost::system::error_code ec;
    co_await sock->async_connect(ep, asio::redirect_error(asio::use_awaitable, ec));
    if (ec)
      throw Error(
          ErrorCode::peer_failure, ctx,
          "cannot connect to rank " + std::to_string(p) + " at " + where + ": " +
              (dog.fired() ? "no answer within " + std::to_string(bound_.count()) + " ms (CHORUS_TIMEOUT)"
                           : ec.message() + " (the process exited or was killed?)"));
    chorus::Hello mine;
    mine.kind = chorus::kHandshakeLink;
    mine.nonce = nonce_;
    mine.rank = rank_;
    mine.peer = p;
    mine.world = size_;
    std::uint32_t theirs = 0;
    try {
      co_await chorus::handshake_connect(*sock, mine, token_);
      const std::array<std::uint32_t, 2> hello = {stream, streams_};
      co_await asio::async_write(*sock, asio::buffer(hello), asio::use_awaitable);
      co_await asio::async_read(*sock, asio::buffer(&theirs, sizeof theirs), asio::use_awaitable);
    } catch (const HandshakeRefused&) {
      throw;
    } catch (const std::exception& e) {
      throw Error(ErrorCode::peer_failure, ctx,
                  "rank " + std::to_string(p) + " (" + where + ") ended the connection while it was made (" +
                      (dog.fired() ? "no answer within " + std::to_string(bound_.count()) + " ms"
                                   : std::string(e.what())) +
                      "): it failed, is shutting down, or was killed");
    }
    dog.disarm();
    if (theirs == 0) co_return;  // refused: the peer keeps the connection it dials (or has one)
    if (theirs != streams_) throw streams_differ(p, theirs);
    Peer& s = peer(p);
    if (stopping_ || link(p).failed() || s.gen != gen || s.state != State::dialing) {
      boost::system::error_code ignored;
      sock->close(ignored);
      co_return;
    }
    link(p).socket(static_cast<int>(stream)) = std::move(*sock);
    settle(p, stream);
  }

  /// Stream `i` of the link to `p` is in place; the last one connects the link.
  void settle(int p, std::uint32_t i) {
    Peer& s = peer(p);
    if (!s.have[i]) s.have[i] = true, ++s.count;
    up_if_settled(p);
  }

  /// Connects the link once its streams are in place and, where this rank's own dial was
  /// abandoned for the peer's connection, once that dial has ended too (the peer answered it 0): so
  /// no connection of the link is still being made, on either end, when it first carries data (the
  /// peer answered before this rank sends), and a steady state is reached on the first call.
  void up_if_settled(int p) {
    Peer& s = peer(p);
    if (stopping_ || link(p).failed() || s.count != streams_ || s.state == State::up) return;
    if (s.state == State::accepting && s.dials != 0) return;
    const bool dialed = s.state == State::dialing;
    s.state = State::up;
    for (int k = 0; k < static_cast<int>(streams_); ++k) tune_socket(link(p).socket(k), tuning_);
    chorus::detail::log(chorus::detail::LogLevel::info, chorus::detail::LogSubsys::net, rank_,
                        "tcp: link to rank ", p, dialed ? " dialed" : " accepted", " (", streams_,
                        streams_ == 1 ? " connection)" : " connections)");
    link(p).connected();
  }

  /// What this rank answers stream `i` of a connection from `p` whose K is `theirs`: K to take
  /// it (stream i is then reserved), 0 to refuse it (both dial; a duplicate). A K that differs is
  /// answered (the peer then fails as this rank does). Throws where the connection is closed
  /// unanswered: a stream index out of range, a link already broken, a transport that stops (the
  /// peer's dial then fails with peer_failure).
  std::uint32_t answer(int p, std::uint32_t i, std::uint32_t theirs) {
    if (theirs != streams_) return streams_;
    Peer& s = peer(p);
    if (i >= streams_) throw std::runtime_error("stream index " + std::to_string(i) + " out of range");
    if (stopping_ || link(p).failed())
      throw std::runtime_error("the link to that rank is broken or the transport stops");
    switch (s.state) {
      case State::up:
        return 0;  // a duplicate
      case State::dialing:
        if (p > rank_) return 0;  // both dial: the lower rank's connection is kept, this one's
        abandon_dial(p);
        break;
      case State::idle:
        s.state = State::accepting;
        break;
      case State::accepting:
        if (s.reserved[i]) return 0;
        break;
    }
    s.reserved[i] = true;  // until the socket is in place (settle)
    return streams_;
  }

  /// Both dial and the peer is the lower rank: its connection is kept; what this rank's dial put
  /// in place is closed and its later answers dropped.
  void abandon_dial(int p) {
    Peer& s = peer(p);
    boost::system::error_code ignored;
    for (std::uint32_t k = 0; k < streams_; ++k)
      if (s.have[k]) link(p).socket(static_cast<int>(k)).close(ignored);
    s.have.assign(streams_, false);
    s.reserved.assign(streams_, false);
    s.count = 0;
    ++s.gen;
    s.state = State::accepting;
  }

  asio::awaitable<void> accept_loop() {
    while (!stopping_) {
      auto sock = tracked_socket();
      boost::system::error_code ec;
      co_await acceptor_.async_accept(*sock, asio::redirect_error(asio::use_awaitable, ec));
      if (stopping_ || ec == asio::error::operation_aborted) co_return;
      if (ec) {  // out of descriptors, say: look again a little later
        chorus::detail::log(chorus::detail::LogLevel::warn, chorus::detail::LogSubsys::net, rank_,
                            "tcp: accept failed: ", ec.message());
        retry_.expires_after(std::chrono::milliseconds(10));
        co_await retry_.async_wait(asio::redirect_error(asio::use_awaitable, ec));
        continue;
      }
      asio::co_spawn(io_, accept_one(std::move(sock)), asio::detached);
    }
  }

  asio::awaitable<void> accept_one(std::shared_ptr<asio_tcp::socket> sock) {
    boost::system::error_code rec;
    const auto rep = sock->remote_endpoint(rec);
    const std::string from =
        rec ? std::string("?") : rep.address().to_string() + " port " + std::to_string(rep.port());
    chorus::detail::SocketWatchdog dog(*sock, bound_);
    int p = -1;
    std::uint32_t reserved = 0;  // the answer given (K: stream `stream` of p is reserved)
    std::uint32_t stream = 0;
    try {
      const auto hello = co_await chorus::handshake_accept(
          *sock, chorus::kHandshakeLink, token_, [&](const chorus::Hello& h) {
            return h.nonce == nonce_ && h.world == size_ && h.peer == rank_ && h.rank >= 0 &&
                   h.rank < size_ && h.rank != rank_ && links_[static_cast<std::size_t>(h.rank)] != nullptr;
          });
      p = hello.rank;
      std::array<std::uint32_t, 2> hi{};  // {stream index, the peer's K}
      co_await asio::async_read(*sock, asio::buffer(hi), asio::use_awaitable);
      stream = hi[0];
      const std::uint32_t mine = answer(p, stream, hi[1]);
      if (hi[1] == streams_) reserved = mine;
      co_await asio::async_write(*sock, asio::buffer(&mine, sizeof mine), asio::use_awaitable);
      dog.disarm();
      if (hi[1] != streams_) {
        fail_differ(p, hi[1]);
        co_return;
      }
      if (mine == 0) co_return;
      if (stopping_ || link(p).failed() || peer(p).state != State::accepting) {
        boost::system::error_code ignored;
        sock->close(ignored);
        co_return;
      }
      link(p).socket(static_cast<int>(stream)) = std::move(*sock);
      settle(p, stream);
    } catch (const std::exception& e) {
      if (reserved != 0 && p >= 0)
        fail(p, "the connection from rank " + std::to_string(p) + " (" + from +
                    ") broke while it was made: " + e.what());
      else
        chorus::detail::log(chorus::detail::LogLevel::warn, chorus::detail::LogSubsys::net, rank_,
                            "tcp: refused a connection from ", from, ": ", e.what());
    }
  }

  Error streams_differ(int peer, std::uint32_t theirs) const {
    return detail::streams_differ(rank_, peer, static_cast<int>(streams_), theirs);
  }
  void fail_differ(int p, std::uint32_t theirs) {
    if (!stopping_) link(p).fail(ErrorCode::invalid_argument, streams_differ(p, theirs).what());
  }

  int rank_;
  int size_;
  std::uint32_t streams_;
  std::shared_ptr<Store> store_;
  JobNonce nonce_;
  std::string token_;
  std::chrono::milliseconds bound_;
  chorus::detail::SocketTuning tuning_;
  asio::io_context& io_;
  std::vector<std::unique_ptr<Link>>& links_;
  asio_tcp::acceptor acceptor_;
  asio::steady_timer retry_;
  bool stopping_ = false;
  std::vector<Peer> peers_;
  std::unique_ptr<std::atomic<bool>[]> asked_;              ///< need() was called (by peer; any thread)
  std::vector<std::weak_ptr<asio_tcp::socket>> in_flight_;  ///< the sockets being connected
};

}  // namespace chorus::tcp::detail

namespace chorus::tcp {

inline void Link::ask_for_connection() {
  if (lazy_) lazy_->need(peer_);
}

}  // namespace chorus::tcp
