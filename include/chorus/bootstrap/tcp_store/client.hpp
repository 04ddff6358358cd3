// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// The TcpStore client: one connection to the server, opened with the chorus handshake (kind
/// store) and retried with backoff until the store's timeout, since the server may start after
/// its clients. Each call writes one request frame and reads its reply under a deadline. A
/// client that loses its connection fails that call and every later one with peer_failure at
/// once; it does not reconnect. The frames are in bootstrap/tcp_store/wire.hpp.

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "chorus/bootstrap/tcp_store/endpoint.hpp"
#include "chorus/bootstrap/tcp_store/wire.hpp"
#include "chorus/core/error.hpp"
#include "chorus/detail/asio.hpp"
#include "chorus/detail/handshake.hpp"
#include "chorus/detail/keepalive.hpp"

namespace chorus::detail {

/// The client half: one connection, one io_context driven by the calling thread under a mutex.
class TcpStoreClient {
 public:
  using Clock = std::chrono::steady_clock;

  TcpStoreClient(std::string host, std::uint16_t port, std::chrono::milliseconds timeout, std::string token)
      : host_(std::move(host)), port_(port), timeout_(timeout), token_(std::move(token)) {
    connect();
  }

  /// set and check take an optional bound of their own (`limit`; default: the store's timeout).
  void set(const std::string& key, const std::string& value) { set(key, value, timeout_); }
  void set(const std::string& key, const std::string& value, std::chrono::milliseconds limit) {
    const ErrorContext ctx = context("set", key);
    check_store_key(key, ctx);
    if (value.size() > kStoreMaxValueBytes)
      throw Error(ErrorCode::invalid_argument, ctx,
                  "value of " + std::to_string(value.size()) + " bytes; the limit is 64 MiB");
    expect_ok(request(encode_store_request(StoreOp::set, {key}, 0, value), Clock::now() + limit, ctx), ctx);
  }

  std::string get(const std::string& key, std::chrono::milliseconds timeout) {
    const ErrorContext ctx = context("get", key);
    check_store_key(key, ctx);
    const auto ms = clamp_ms(timeout);
    auto r = request(encode_store_request(StoreOp::get, {key}, ms, {}), wait_deadline(ms), ctx);
    expect_ok(r, ctx);
    return std::move(r.payload);
  }

  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
    const ErrorContext ctx = context("wait", keys.size() == 1 ? keys.front() : std::string());
    check_keys(keys, ctx);
    const auto ms = clamp_ms(timeout);
    expect_ok(request(encode_store_request(StoreOp::wait, keys, ms, {}), wait_deadline(ms), ctx), ctx);
  }

  std::int64_t add(const std::string& key, std::int64_t delta) {
    const ErrorContext ctx = context("add", key);
    check_store_key(key, ctx);
    auto r = request(encode_store_request(StoreOp::add, {key}, static_cast<std::uint64_t>(delta), {}),
                     Clock::now() + timeout_, ctx);
    expect_ok(r, ctx);
    return decode_store_add_reply(r.payload, ctx);
  }

  bool check(const std::vector<std::string>& keys) { return check(keys, timeout_); }
  bool check(const std::vector<std::string>& keys, std::chrono::milliseconds limit) {
    const ErrorContext ctx = context("check", keys.size() == 1 ? keys.front() : std::string());
    check_keys(keys, ctx);
    auto r = request(encode_store_request(StoreOp::check, keys, 0, {}), Clock::now() + limit, ctx);
    expect_ok(r, ctx);
    return decode_store_check_reply(r.payload, ctx);
  }

 private:
  struct Response {
    StoreStatus status = StoreStatus::ok;
    std::string payload;
  };

  std::string where() const { return host_port_string(host_, port_); }
  ErrorContext context(const char* op, const std::string& key) const {
    return store_call_context(-1, "TcpStore", op, key, host_, port_);
  }
  static void check_keys(const std::vector<std::string>& keys, const ErrorContext& ctx) {
    if (keys.size() > kStoreMaxKeys) throw Error(ErrorCode::invalid_argument, ctx, "too many keys in one call");
    for (const auto& k : keys) check_store_key(k, ctx);
  }
  static std::uint64_t clamp_ms(std::chrono::milliseconds t) {
    const auto c = t.count();
    return c <= 0 ? 0 : std::min(static_cast<std::uint64_t>(c), kStoreMaxWaitMs);
  }
  /// The server answers a parked request by its timeout; allow a little more for the reply.
  static Clock::time_point wait_deadline(std::uint64_t ms) {
    return Clock::now() + std::chrono::milliseconds(ms) + std::chrono::seconds(2);
  }
  static void expect_ok(const Response& r, const ErrorContext& ctx) {
    if (r.status == StoreStatus::ok) return;
    if (r.status == StoreStatus::timeout) throw Error(ErrorCode::timeout, ctx, r.payload);
    throw Error(ErrorCode::invalid_argument, ctx, r.payload);
  }

  Response request(const std::vector<std::uint8_t>& frame, Clock::time_point deadline, const ErrorContext& ctx) {
    std::lock_guard lk(mu_);
    if (!broken_.empty())
      throw Error(ErrorCode::peer_failure, ctx, "the connection to the store was lost earlier: " + broken_);
    try {
      const auto allowed = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      return run_with_deadline(
          io_, exchange(frame, ctx), deadline, [this] { close(); }, ctx,
          "store request, allowed " + std::to_string(allowed.count()) + " ms");
    } catch (const std::exception& e) {  // the stream is mid-frame: unusable from here on
      broken_ = e.what();
      close();
      throw;
    }
  }

  asio::awaitable<Response> exchange(const std::vector<std::uint8_t>& frame, const ErrorContext& ctx) {
    co_await write_all(socket_, frame, ctx, "sending the request (store server gone?)");
    std::array<std::uint8_t, kStoreResponseHeader> hdr{};
    co_await read_exact(socket_, hdr, ctx, "reading the response (store server gone?)");
    const StoreResponseHeader h = decode_store_response_header(hdr, ctx);
    Response r;
    r.status = h.status;
    r.payload.resize(h.len);
    if (h.len)
      co_await read_exact(socket_, std::span(reinterpret_cast<std::uint8_t*>(r.payload.data()), h.len), ctx,
                          "reading the response (store server gone?)");
    co_return r;
  }

  void close() {
    boost::system::error_code ec;
    socket_.close(ec);
  }

  asio::awaitable<void> connect_once(asio_tcp::endpoint ep) {
    const ErrorContext ctx{-1, -1, "TcpStore connect to " + endpoint_string(ep)};
    boost::system::error_code ec;
    co_await socket_.async_connect(ep, asio::redirect_error(asio::use_awaitable, ec));
    if (ec) throw Error(ErrorCode::peer_failure, ctx, ec.message());
    socket_.set_option(asio_tcp::no_delay(true), ec);
    tune_keepalive(socket_.native_handle(), tuning_);  // a store host that vanishes fails the calls
    Hello hello;
    hello.kind = kHandshakeStore;
    co_await handshake_connect(socket_, hello, token_);
  }

  /// Retries with backoff until the timeout: the server may start after its clients.
  void connect() {
    const ErrorContext ctx{-1, -1, "TcpStore connect to " + where()};
    const auto deadline = Clock::now() + timeout_;
    const std::string last = connect_with_backoff(host_, port_, deadline, [&](const asio_tcp::endpoint& ep) {
      close();
      socket_ = asio_tcp::socket(io_);
      try {
        run_with_deadline(io_, connect_once(ep), deadline, [this] { close(); }, ctx, "connecting");
      } catch (...) {
        close();
        throw;
      }
    });
    if (last.empty()) return;
    throw Error(ErrorCode::timeout, ctx,
                "no store server reachable within " + std::to_string(timeout_.count()) +
                    " ms (is rank 0 running, and MASTER_ADDR/MASTER_PORT right?); last error: " + last);
  }

  std::string host_;
  std::uint16_t port_;
  std::chrono::milliseconds timeout_;
  std::string token_;
  SocketTuning tuning_ = SocketTuning::from_env();
  std::mutex mu_;
  std::string broken_;  ///< why the connection is unusable; empty while it is fine
  asio::io_context io_{1};
  asio_tcp::socket socket_{io_};
};

}  // namespace chorus::detail
