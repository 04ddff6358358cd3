// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// TorchStore: a client of torch.distributed's TCPStore, as torch 1.13 speaks it, behind
/// chorus's Store interface. torchrun's agent serves such a store on MASTER_ADDR:MASTER_PORT and
/// tells its workers so (TORCHELASTIC_USE_AGENT_STORE=True); the rendezvous then joins it with
/// this client instead of serving chorus's own TcpStore there (impl/rendezvous.hpp).
///
///   chorus::TorchStore store("127.0.0.1", 29500, std::chrono::seconds(30));
///   store.set("k", "v");   // the key torch's TCPStore("127.0.0.1", 29500).get("k") reads
///
/// The frames are in torch_store/wire.hpp. What differs from chorus's TcpStore:
///   * no handshake and no job token: torch's store has neither (the links that the transports
///     open afterwards keep chorus's handshake, with the job's nonce and token);
///   * torch's set has no reply: each set is followed on the same connection by a check of its
///     key, whose answer says the server has applied it (it serves a connection in order), so a
///     set that returns is visible to every later call and a lost server fails the set itself;
///   * torch 1.13 cannot cancel a parked wait: a get or wait that times out drops its connection
///     (the server forgets the wait) and the next call opens a new one. A connection lost any
///     other way fails that call and every later one with peer_failure, as TcpStore does.
/// Every call is bounded: the plain ones by the store's timeout, get and wait by their own,
/// set_within and check_within by the caller's limit. Errors name this rank (when given), the
/// call, its key and the store's address.

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "chorus/bootstrap/store.hpp"
#include "chorus/bootstrap/tcp_store/endpoint.hpp"
#include "chorus/bootstrap/tcp_store/wire.hpp"  // join_keys
#include "chorus/bootstrap/torch_store/wire.hpp"
#include "chorus/core/error.hpp"
#include "chorus/detail/asio.hpp"
#include "chorus/detail/handshake/io.hpp"
#include "chorus/detail/keepalive.hpp"

namespace chorus {

class TorchStore final : public Store {
 public:
  using Clock = std::chrono::steady_clock;

  /// Connects to torch's TCPStore at host:port, retrying with backoff until `timeout` (the
  /// server may not listen yet); `timeout` also bounds each call. `rank` labels errors (-1: none).
  TorchStore(std::string host, std::uint16_t port, std::chrono::milliseconds timeout, int rank = -1)
      : host_(std::move(host)), port_(port), timeout_(timeout), rank_(rank) {
    std::lock_guard lk(mu_);
    connect(Clock::now() + timeout_, context("connect", ""));
  }
  ~TorchStore() override { close(); }

  const std::string& host() const { return host_; }
  std::uint16_t port() const { return port_; }

  void set(const std::string& key, const std::string& value) override { set_within(key, value, timeout_); }
  void set_within(const std::string& key, const std::string& value, Duration limit) override {
    const auto ctx = context("set", key);
    if (value.size() > detail::kTorchStoreMaxValueBytes)
      throw Error(ErrorCode::invalid_argument, ctx,
                  "value of " + std::to_string(value.size()) + " bytes; the limit is 64 MiB");
    const std::vector<std::string> keys{key};
    detail::TorchRequest r(detail::TorchQuery::set);
    r.key(key).value(value).then(detail::TorchRequest(detail::TorchQuery::check).keys(keys));
    (void)detail::decode_torch_check_reply(call(r, detail::TorchReply::byte, Clock::now() + limit, ctx).byte, ctx);
  }

  std::string get(const std::string& key, Duration timeout) override {
    const auto ctx = context("get", key);
    const std::vector<std::string> keys{key};
    // A get of a missing key makes torch's server close the connection: wait for it first.
    wait_for(keys, timeout, ctx);
    return call(detail::TorchRequest(detail::TorchQuery::get).key(key), detail::TorchReply::bytes,
                Clock::now() + timeout_, ctx)
        .value;
  }

  void wait(const std::vector<std::string>& keys, Duration timeout) override {
    wait_for(keys, timeout, context("wait", keys.size() == 1 ? keys.front() : std::string()));
  }

  std::int64_t add(const std::string& key, std::int64_t delta) override {
    const auto ctx = context("add", key);
    return call(detail::TorchRequest(detail::TorchQuery::add).key(key).i64(delta), detail::TorchReply::int64,
                Clock::now() + timeout_, ctx)
        .number;
  }

  bool check(const std::vector<std::string>& keys) override { return check_within(keys, timeout_); }
  bool timeouts_are_clean() const override { return false; }  // a timeout drops the connection
  bool check_within(const std::vector<std::string>& keys, Duration limit) override {
    const auto ctx = context("check", keys.size() == 1 ? keys.front() : std::string());
    check_count(keys, ctx);
    return detail::decode_torch_check_reply(
        call(detail::TorchRequest(detail::TorchQuery::check).keys(keys), detail::TorchReply::byte,
             Clock::now() + limit, ctx)
            .byte,
        ctx);
  }

  /// torch's compare_set: when the value of `key` is `expected`, replaces it with `desired`;
  /// returns the value after the call. A missing key is set only when `expected` is empty; else
  /// the answer is `expected` and nothing is set (torch 1.13's server does so).
  std::string compare_set(const std::string& key, const std::string& expected, const std::string& desired) {
    const auto ctx = context("compare_set", key);
    if (std::max(expected.size(), desired.size()) > detail::kTorchStoreMaxValueBytes)
      throw Error(ErrorCode::invalid_argument, ctx, "a value of more than 64 MiB");
    return call(detail::TorchRequest(detail::TorchQuery::compare_set).key(key).value(expected).value(desired),
                detail::TorchReply::bytes, Clock::now() + timeout_, ctx)
        .value;
  }

 private:
  struct Reply {
    std::uint8_t byte = 0;
    std::int64_t number = 0;
    std::string value;
  };

  ErrorContext context(const char* op, const std::string& key) const {
    return detail::store_call_context(rank_, "torch TCPStore", op, key, host_, port_);
  }
  static void check_count(const std::vector<std::string>& keys, const ErrorContext& ctx) {
    if (keys.size() > detail::kTorchStoreMaxKeys)
      throw Error(ErrorCode::invalid_argument, ctx,
                  std::to_string(keys.size()) + " keys in one call; the limit is " +
                      std::to_string(detail::kTorchStoreMaxKeys));
  }

  void wait_for(const std::vector<std::string>& keys, Duration timeout, const ErrorContext& ctx) {
    check_count(keys, ctx);
    try {
      detail::decode_torch_wait_reply(call(detail::TorchRequest(detail::TorchQuery::wait).keys(keys),
                                           detail::TorchReply::byte, Clock::now() + std::max(timeout, Duration(0)), ctx)
                                          .byte,
                                      ctx);
    } catch (const Error& e) {
      if (e.code() != ErrorCode::timeout) throw;
      throw Error(ErrorCode::timeout, ctx,
                  "keys not set within " + std::to_string(timeout.count()) + " ms: " + detail::join_keys(keys));
    }
  }

  /// One request and its reply under `deadline`. Opens a connection first when the last one was
  /// dropped by a timeout. A timeout drops the connection (the stream may hold a late reply); any
  /// other failure marks the store broken.
  Reply call(const detail::TorchRequest& request, detail::TorchReply kind, Clock::time_point deadline,
             const ErrorContext& ctx) {
    std::lock_guard lk(mu_);
    if (!broken_.empty())
      throw Error(ErrorCode::peer_failure, ctx, "the connection to the store was lost earlier: " + broken_);
    try {
      if (!socket_.is_open()) connect(deadline, ctx);
      const auto allowed = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      return detail::run_with_deadline(
          io_, exchange(request.bytes(), kind, ctx), deadline, [this] { close(); }, ctx,
          "store request, allowed " + std::to_string(std::max<std::int64_t>(allowed.count(), 0)) + " ms");
    } catch (const Error& e) {
      close();
      if (e.code() != ErrorCode::timeout) broken_ = e.what();
      throw;
    }
  }

  detail::asio::awaitable<Reply> exchange(const std::vector<std::uint8_t>& frame, detail::TorchReply kind,
                                          ErrorContext ctx) {
    const std::string lost = "the store closed the connection or is gone";
    co_await detail::write_all(socket_, frame, ctx, "sending the request (" + lost + "?)");
    Reply r;
    std::array<std::uint8_t, 8> word{};
    switch (kind) {
      case detail::TorchReply::byte:
        co_await detail::read_exact(socket_, std::span(word.data(), 1), ctx, "reading the reply (" + lost + "?)");
        r.byte = word[0];
        break;
      case detail::TorchReply::int64:
        co_await detail::read_exact(socket_, word, ctx, "reading the reply (" + lost + "?)");
        r.number = static_cast<std::int64_t>(detail::get_u64(word.data()));
        break;
      case detail::TorchReply::bytes: {
        co_await detail::read_exact(socket_, word, ctx, "reading the reply (" + lost + "?)");
        r.value.resize(detail::decode_torch_value_length(std::span<const std::uint8_t, 8>(word), ctx));
        if (!r.value.empty())
          co_await detail::read_exact(socket_, std::span(reinterpret_cast<std::uint8_t*>(r.value.data()), r.value.size()),
                                      ctx, "reading the reply (" + lost + "?)");
        break;
      }
    }
    co_return r;
  }

  void close() {
    boost::system::error_code ec;
    socket_.close(ec);
  }

  detail::asio::awaitable<void> connect_once(detail::asio_tcp::endpoint ep, ErrorContext ctx) {
    boost::system::error_code ec;
    co_await socket_.async_connect(ep, detail::asio::redirect_error(detail::asio::use_awaitable, ec));
    if (ec) throw Error(ErrorCode::peer_failure, ctx, detail::endpoint_string(ep) + ": " + ec.message());
    socket_.set_option(detail::asio_tcp::no_delay(true), ec);
    detail::tune_keepalive(socket_.native_handle(), tuning_);  // a store host that vanishes fails the calls
  }

  /// Opens the connection, retrying with backoff until `deadline` (the first time: the server may
  /// start after its clients; later: after a timeout dropped the connection).
  void connect(Clock::time_point deadline, const ErrorContext& ctx) {
    const std::string last = detail::connect_with_backoff(host_, port_, deadline, [&](const detail::asio_tcp::endpoint& ep) {
      close();
      socket_ = detail::asio_tcp::socket(io_);
      try {
        detail::run_with_deadline(io_, connect_once(ep, ctx), deadline, [this] { close(); }, ctx, "connecting");
      } catch (...) {
        close();
        throw;
      }
    });
    if (last.empty()) return;
    throw Error(ErrorCode::timeout, ctx,
                "no torch TCPStore reachable at " + detail::host_port_string(host_, port_) +
                    " in time (is torchrun's agent running, and MASTER_ADDR/MASTER_PORT right?); last error: " + last);
  }

  std::string host_;
  std::uint16_t port_;
  std::chrono::milliseconds timeout_;
  int rank_;
  detail::SocketTuning tuning_ = detail::SocketTuning::from_env();
  std::mutex mu_;
  std::string broken_;  ///< why the store is unusable; empty while it is fine
  detail::asio::io_context io_{1};
  detail::asio_tcp::socket socket_{io_};
};

}  // namespace chorus
