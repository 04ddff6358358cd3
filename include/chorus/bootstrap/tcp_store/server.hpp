// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// The TcpStore server: listens on exactly the address it is given, on its own thread with one
/// io_context and one coroutine per connection. Each connection opens with the chorus handshake
/// (kind store), then request/response until the client leaves. Waiting (get, wait) is done
/// here: a request is parked until its keys are set or its timeout passes, so clients never poll.
/// A connection that fails the handshake, sends a malformed or oversized frame, stalls
/// mid-frame, or leaves while its get/wait is parked is dropped and logged; the others are
/// unaffected. The frames are in bootstrap/tcp_store/wire.hpp.

#include <algorithm>
#include <array>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <future>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "chorus/bootstrap/tcp_store/endpoint.hpp"
#include "chorus/bootstrap/tcp_store/wire.hpp"
#include "chorus/core/error.hpp"
#include "chorus/detail/asio.hpp"
#include "chorus/detail/handshake.hpp"
#include "chorus/detail/keepalive.hpp"
#include "chorus/detail/log.hpp"

namespace chorus::detail {

/// The server half: owns the data, the listening socket and the thread that runs its io_context.
/// Everything below the constructor runs on that one thread, so the data needs no lock.
class TcpStoreServer {
 public:
  TcpStoreServer(const std::string& host, std::uint16_t port, std::chrono::milliseconds timeout, std::string token)
      : timeout_(timeout), token_(std::move(token)) {
    const auto eps = resolve_endpoints(host, port);
    const ErrorContext ctx{-1, -1, "TcpStore server"};
    boost::system::error_code ec;
    const auto& ep = eps.front();
    acceptor_.open(ep.protocol(), ec);
    if (!ec) acceptor_.set_option(asio_tcp::acceptor::reuse_address(true), ec);
    if (!ec) acceptor_.bind(ep, ec);
    if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (!ec) local_ = acceptor_.local_endpoint(ec);
    if (ec) throw Error(ErrorCode::system, ctx, "cannot listen on " + endpoint_string(ep) + ": " + ec.message());
    asio::co_spawn(io_, accept_loop(), asio::detached);
    // The thread's first steps (its reactor's set-up, the first accept started: allocations) are
    // done before the constructor returns, so that no later measurement of a steady state in the
    // process (tests/alloc) sees them. The handler below runs after the accept loop's first step.
    auto started = std::make_shared<std::promise<void>>();
    std::future<void> started_f = started->get_future();
    asio::post(io_, [started] { started->set_value(); });
    thread_ = std::thread([this] { run(); });
    if (started_f.wait_for(std::chrono::seconds(10)) != std::future_status::ready)
      log(LogLevel::warn, LogSubsys::bootstrap, -1, "TcpStore server: its thread has not started within 10 s");
    log(LogLevel::info, LogSubsys::bootstrap, -1, "TcpStore server listening on ", endpoint_string(local_));
  }

  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  /// Closes every connection (their clients get peer_failure), lets the coroutines unwind and
  /// joins the thread; anything still running after 2 s is abandoned with the io_context.
  ~TcpStoreServer() {
    asio::post(io_, [this] {
      stopping_ = true;
      boost::system::error_code ec;
      acceptor_.close(ec);
      for (auto* s : conns_) s->close(ec);
      for (auto& w : waiters_) w.second->cancel();
      if (active_ == 0) return;
      stop_timer_.expires_after(std::chrono::seconds(2));
      stop_timer_.async_wait([this](const boost::system::error_code& e) {
        if (e) return;
        log(LogLevel::warn, LogSubsys::bootstrap, -1, "TcpStore server: ", active_, " connection(s) did not close in 2 s; abandoning them");
        io_.stop();
      });
    });
    if (thread_.joinable()) thread_.join();
    joined_ = true;
    log(LogLevel::info, LogSubsys::bootstrap, -1, "TcpStore server on ", endpoint_string(local_), ": served ",
        requests_.load(), " requests over ", connections_.load(), " connections");
  }

  const asio_tcp::endpoint& local_endpoint() const { return local_; }
  /// Requests served so far (every op, as they are read), and connections accepted: the load the
  /// store carries, for the creation and shrink measurements (CHORUS_DEBUG=INFO logs both when
  /// the server stops).
  std::uint64_t requests_served() const { return requests_.load(std::memory_order_relaxed); }
  std::uint64_t connections_accepted() const { return connections_.load(std::memory_order_relaxed); }

 private:
  using Clock = std::chrono::steady_clock;
  enum class WaitResult { ok, timeout, stopped, client_gone };

  struct ActiveGuard {
    explicit ActiveGuard(TcpStoreServer& s) : s_(s) { ++s_.active_; }
    ~ActiveGuard() {
      if (s_.joined_) return;  // frames destroyed with the io_context after a forced stop
      if (--s_.active_ == 0 && s_.stopping_) s_.stop_timer_.cancel();
    }
    TcpStoreServer& s_;
  };

  void run() {
    for (;;) {
      try {
        io_.run();
        return;
      } catch (const std::exception& e) {
        log(LogLevel::warn, LogSubsys::bootstrap, -1, "TcpStore server: unexpected error: ", e.what());
      }
    }
  }

  asio::awaitable<void> accept_loop() {
    ActiveGuard active(*this);
    for (;;) {
      boost::system::error_code ec;
      asio_tcp::socket s = co_await acceptor_.async_accept(asio::redirect_error(asio::use_awaitable, ec));
      if (stopping_) co_return;
      if (ec) {
        if (ec == asio::error::operation_aborted) co_return;
        // EMFILE and friends: back off instead of spinning; the clients retry.
        log(LogLevel::warn, LogSubsys::bootstrap, -1, "TcpStore server: accept failed: ", ec.message());
        asio::steady_timer t(io_, std::chrono::milliseconds(100));
        co_await t.async_wait(asio::redirect_error(asio::use_awaitable, ec));
        continue;
      }
      connections_.fetch_add(1, std::memory_order_relaxed);
      asio::co_spawn(io_, serve(std::move(s)), asio::detached);
    }
  }

  /// One connection: handshake, then request/response until the client leaves.
  asio::awaitable<void> serve(asio_tcp::socket s) {
    ActiveGuard active(*this);
    conns_.insert(&s);
    struct Unregister {
      std::set<asio_tcp::socket*>& set;
      asio_tcp::socket* s;
      ~Unregister() { set.erase(s); }
    } unregister{conns_, &s};
    const std::string from = endpoint_text(s);
    if (stopping_) co_return;
    boost::system::error_code ec;
    s.set_option(asio_tcp::no_delay(true), ec);
    tune_keepalive(s.native_handle(), tuning_);  // a client host that vanishes frees its slot

    // Handshake, bounded so that a silent client cannot hold a slot forever.
    const auto hs_limit = std::min<std::chrono::milliseconds>(timeout_, std::chrono::seconds(10));
    bool fired = false;
    std::string failure;
    {
      SocketWatchdog dog(s, hs_limit);
      try {
        co_await handshake_accept(s, kHandshakeStore, token_, nullptr);
      } catch (const std::exception& e) {
        failure = e.what();
      }
      fired = dog.fired();
    }
    if (fired) failure = "no handshake within " + std::to_string(hs_limit.count()) + " ms";
    if (!failure.empty()) {
      if (!stopping_) log(LogLevel::warn, LogSubsys::bootstrap, -1, "TcpStore server: refused connection from ", from, ": ", failure);
      co_return;
    }

    try {
      while (co_await serve_one(s, from)) {
      }
    } catch (const std::exception& e) {
      if (!stopping_) log(LogLevel::warn, LogSubsys::bootstrap, -1, "TcpStore server: dropped client ", from, ": ", e.what());
    }
  }

  /// Reads one request, executes it, replies. False when the connection is done with.
  asio::awaitable<bool> serve_one(asio_tcp::socket& s, const std::string& from) {
    std::array<std::uint8_t, kStoreRequestHeader> hdr{};
    boost::system::error_code ec;
    co_await asio::async_read(s, asio::buffer(hdr.data(), 1), asio::redirect_error(asio::use_awaitable, ec));
    if (ec) {  // between requests: a client leaving is normal
      if (!stopping_) log(LogLevel::info, LogSubsys::bootstrap, -1, "TcpStore server: client ", from, " left (", ec.message(), ")");
      co_return false;
    }
    StoreRequest req;
    bool dog_fired = false;
    std::string bad;
    {
      SocketWatchdog dog(s, timeout_);  // the rest of the frame must follow promptly
      try {
        co_await read_request(s, hdr, req);
      } catch (const std::exception& e) {
        bad = e.what();
      }
      dog_fired = dog.fired();
    }
    if (dog_fired) bad = "incomplete request after " + std::to_string(timeout_.count()) + " ms";
    if (!bad.empty()) {
      if (!stopping_) log(LogLevel::warn, LogSubsys::bootstrap, -1, "TcpStore server: dropped client ", from, ": ", bad);
      co_return false;
    }
    Response resp;
    if (!co_await handle(s, req, resp)) co_return false;  // stopping, or the client left
    const std::vector<std::uint8_t> out = encode_store_response(resp.status, resp.payload);
    {
      SocketWatchdog dog(s, timeout_);  // a client that stops reading cannot pin us
      co_await asio::async_write(s, asio::buffer(out), asio::redirect_error(asio::use_awaitable, ec));
    }
    if (ec) {
      if (!stopping_) log(LogLevel::warn, LogSubsys::bootstrap, -1, "TcpStore server: dropped client ", from, ": reply: ", ec.message());
      co_return false;
    }
    co_return true;
  }

  struct Response {
    StoreStatus status = StoreStatus::ok;
    std::string payload;
  };

  /// Reads the rest of a request whose first byte is in hdr[0]; throws what is wrong with it.
  asio::awaitable<void> read_request(asio_tcp::socket& s, std::array<std::uint8_t, kStoreRequestHeader>& hdr,
                                     StoreRequest& req) {
    const ErrorContext ctx{-1, -1, "TcpStore server"};
    co_await read_exact(s, std::span(hdr.data() + 1, kStoreRequestHeader - 1), ctx, "reading request");
    const StoreRequestHeader h = decode_store_request_header(hdr);
    req.op = h.op;
    req.arg = h.arg;
    req.keys.resize(h.nkeys);
    for (auto& k : req.keys) {
      std::array<std::uint8_t, 4> kl{};
      co_await read_exact(s, kl, ctx, "reading request");
      const std::uint32_t klen = decode_store_key_length(kl);
      k.resize(klen);
      if (klen)
        co_await read_exact(s, std::span(reinterpret_cast<std::uint8_t*>(k.data()), klen), ctx, "reading request");
    }
    req.value.resize(h.vlen);
    if (h.vlen)
      co_await read_exact(s, std::span(reinterpret_cast<std::uint8_t*>(req.value.data()), h.vlen), ctx,
                          "reading request");
  }

  /// Executes a request; false when there is no one to reply to (stopping, or the client left).
  asio::awaitable<bool> handle(asio_tcp::socket& s, const StoreRequest& req, Response& resp) {
    requests_.fetch_add(1, std::memory_order_relaxed);
    switch (req.op) {
      case StoreOp::set:
        data_[req.keys[0]] = req.value;
        notify(req.keys[0]);
        break;
      case StoreOp::get:
      case StoreOp::wait: {
        const auto ms = std::min(req.arg, kStoreMaxWaitMs);
        const auto deadline = Clock::now() + std::chrono::milliseconds(ms);
        const auto r = co_await wait_keys(s, req.keys, deadline);
        if (r == WaitResult::stopped) co_return false;
        if (r == WaitResult::client_gone) {
          log(LogLevel::info, LogSubsys::bootstrap, -1, "TcpStore server: client ", endpoint_text(s), " left during ", store_op_name(req.op));
          co_return false;
        }
        if (r == WaitResult::timeout) {
          std::vector<std::string> missing;
          for (const auto& k : req.keys)
            if (!data_.count(k)) missing.push_back(k);
          resp.status = StoreStatus::timeout;
          resp.payload = (missing.size() == 1 ? "key " : "keys ") + join_keys(missing) + " not set within " +
                         std::to_string(ms) + " ms";
        } else if (req.op == StoreOp::get) {
          resp.payload = data_[req.keys[0]];
        }
        break;
      }
      case StoreOp::add: {
        std::int64_t v = 0;
        const auto& k = req.keys[0];
        auto it = data_.find(k);
        if (it != data_.end()) {
          const auto& t = it->second;
          auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
          if (ec != std::errc() || p != t.data() + t.size()) {
            resp.status = StoreStatus::bad_request;
            resp.payload = "add: the value of '" + k + "' is not an integer";
            break;
          }
        }
        std::int64_t r = 0;
        if (__builtin_add_overflow(v, static_cast<std::int64_t>(req.arg), &r)) {
          resp.status = StoreStatus::bad_request;
          resp.payload = "add: '" + k + "' would overflow";
          break;
        }
        data_[k] = std::to_string(r);
        notify(k);
        resp.payload.resize(8);
        put_u64(reinterpret_cast<std::uint8_t*>(resp.payload.data()), static_cast<std::uint64_t>(r));
        break;
      }
      case StoreOp::check: {
        bool all = true;
        for (const auto& k : req.keys) all = all && data_.count(k) != 0;
        resp.payload.assign(1, all ? '\1' : '\0');
        break;
      }
    }
    co_return true;
  }

  /// wait_keys' watch on its client's socket, shared with the read it starts. (At class scope, not
  /// local to the coroutine: g++ 12 cannot mangle a local class of a coroutine in a precompiled
  /// header.)
  struct Watch {
    asio::steady_timer* timer = nullptr;  ///< null once wait_keys has returned
    bool readable = false;
  };

  /// Parks until every key is set (woken by notify), the deadline passes, the server stops, or
  /// the client leaves. A client sends nothing while it waits for a reply, so the socket turning
  /// readable means it closed (or broke the protocol): the request is dropped at once instead of
  /// holding its coroutine until the deadline.
  asio::awaitable<WaitResult> wait_keys(asio_tcp::socket& s, const std::vector<std::string>& keys,
                                        Clock::time_point deadline) {
    asio::steady_timer timer(io_, deadline);
    auto watch = std::make_shared<Watch>();
    watch->timer = &timer;
    bool watching = false;
    struct StopWatching {
      asio_tcp::socket& s;
      std::shared_ptr<Watch> w;
      bool& watching;
      ~StopWatching() {
        w->timer = nullptr;
        if (watching) {
          boost::system::error_code ec;
          s.cancel(ec);  // completes the pending wait with operation_aborted
        }
      }
    } stop_watching{s, watch, watching};
    for (;;) {
      if (stopping_) co_return WaitResult::stopped;
      std::vector<const std::string*> missing;
      for (const auto& k : keys)
        if (!data_.count(k)) missing.push_back(&k);
      if (missing.empty()) co_return WaitResult::ok;
      if (watch->readable) co_return WaitResult::client_gone;
      if (Clock::now() >= deadline) co_return WaitResult::timeout;
      if (!watching) {
        watching = true;
        s.async_wait(asio_tcp::socket::wait_read, [w = watch, &watching](const boost::system::error_code& ec) {
          if (!w->timer) return;  // wait_keys is over: `watching` is gone too
          watching = false;
          if (ec == asio::error::operation_aborted) return;
          w->readable = true;
          w->timer->cancel();
        });
      }
      struct Registration {
        std::multimap<std::string, asio::steady_timer*>& map;
        std::vector<std::multimap<std::string, asio::steady_timer*>::iterator> its;
        ~Registration() {
          for (auto it : its) map.erase(it);
        }
      } reg{waiters_, {}};
      for (const auto* k : missing) reg.its.push_back(waiters_.emplace(*k, &timer));
      boost::system::error_code ec;
      co_await timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));  // cancelled = woken
    }
  }

  void notify(const std::string& key) {
    auto [b, e] = waiters_.equal_range(key);
    for (auto it = b; it != e; ++it) it->second->cancel();
  }

  // Declared before io_ so they outlive coroutine frames that a forced stop leaves to ~io_context.
  std::chrono::milliseconds timeout_;
  std::string token_;
  SocketTuning tuning_ = SocketTuning::from_env();
  std::map<std::string, std::string> data_;
  std::multimap<std::string, asio::steady_timer*> waiters_;
  std::set<asio_tcp::socket*> conns_;
  bool stopping_ = false;
  bool joined_ = false;
  int active_ = 0;
  std::atomic<std::uint64_t> requests_{0};
  std::atomic<std::uint64_t> connections_{0};
  asio::io_context io_;
  asio_tcp::acceptor acceptor_{io_};
  asio::steady_timer stop_timer_{io_};
  asio_tcp::endpoint local_;
  std::thread thread_;
};

}  // namespace chorus::detail
