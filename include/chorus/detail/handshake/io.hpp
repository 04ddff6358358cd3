// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// Coroutines on a TCP socket, with a bound: read_exact and write_all (a short read or an error is
/// peer_failure naming what was being done), endpoint_text for messages, SocketWatchdog (a
/// server closes a connection whose handshake or frame does not finish in time) and
/// run_with_deadline (a blocking caller drives its own io_context up to a deadline). Used by the
/// handshake and by the TcpStore.

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>

#include "chorus/core/error.hpp"
#include "chorus/detail/asio.hpp"
#include "chorus/detail/log.hpp"

namespace chorus::detail {

/// async_read of exactly buf.size() bytes; a short read or error is peer_failure naming `what`.
inline asio::awaitable<void> read_exact(asio_tcp::socket& s, std::span<std::uint8_t> buf, ErrorContext ctx,
                                        std::string what) {
  boost::system::error_code ec;
  co_await asio::async_read(s, asio::buffer(buf.data(), buf.size()), asio::redirect_error(asio::use_awaitable, ec));
  if (ec) throw Error(ErrorCode::peer_failure, ctx, what + ": " + ec.message());
}

inline asio::awaitable<void> write_all(asio_tcp::socket& s, std::span<const std::uint8_t> buf, ErrorContext ctx,
                                       std::string what) {
  boost::system::error_code ec;
  co_await asio::async_write(s, asio::buffer(buf.data(), buf.size()), asio::redirect_error(asio::use_awaitable, ec));
  if (ec) throw Error(ErrorCode::peer_failure, ctx, what + ": " + ec.message());
}

inline std::string endpoint_text(const asio_tcp::socket& s) {
  boost::system::error_code ec;
  auto ep = s.remote_endpoint(ec);
  if (ec) return "?";
  std::string a = ep.address().to_string();
  if (ep.address().is_v6()) a = "[" + a + "]";
  return a + ":" + std::to_string(ep.port());
}

/// Closes a socket unless disarmed (destroyed) within `after`. For servers: arm one around each
/// per-connection handshake (and around reading each frame) so a silent client cannot hold a
/// slot forever. Runs on the socket's executor; the io_context must be run by one thread (or the
/// watchdog and the socket's users must share a strand).
class SocketWatchdog {
 public:
  SocketWatchdog(asio_tcp::socket& socket, std::chrono::milliseconds after)
      : timer_(socket.get_executor()), state_(std::make_shared<State>()) {
    timer_.expires_after(after);
    timer_.async_wait([&socket, st = state_](const boost::system::error_code& ec) {
      if (ec || !st->armed) return;  // disarmed: the socket may already be gone, do not touch it
      st->fired = true;
      boost::system::error_code ignored;
      socket.close(ignored);
    });
  }
  SocketWatchdog(const SocketWatchdog&) = delete;
  SocketWatchdog& operator=(const SocketWatchdog&) = delete;
  ~SocketWatchdog() { disarm(); }

  void disarm() {
    state_->armed = false;
    timer_.cancel();
  }
  /// True when the watchdog closed the socket.
  bool fired() const { return state_->fired; }

 private:
  struct State {
    bool armed = true;
    bool fired = false;
  };
  asio::steady_timer timer_;
  std::shared_ptr<State> state_;
};

/// Runs `op` on `io` from a blocking caller until it completes or `deadline` passes, and returns
/// its result (or rethrows its exception). On expiry calls `on_expiry` (which must make the
/// operation finish: close the socket it uses), lets the operation unwind, then throws timeout
/// with `ctx` and `what`. The io_context must not be run by any other thread meanwhile.
template <class T>
T run_with_deadline(asio::io_context& io, asio::awaitable<T> op, std::chrono::steady_clock::time_point deadline,
                    const std::function<void()>& on_expiry, const ErrorContext& ctx, const std::string& what) {
  bool done = false;
  std::exception_ptr error;
  std::optional<std::conditional_t<std::is_void_v<T>, int, T>> result;
  io.restart();
  if constexpr (std::is_void_v<T>) {
    asio::co_spawn(io, std::move(op), [&](std::exception_ptr e) {
      error = e;
      done = true;
    });
  } else {
    asio::co_spawn(io, std::move(op), [&](std::exception_ptr e, T v) {
      error = e;
      if (!e) result.emplace(std::move(v));
      done = true;
    });
  }
  while (!done && std::chrono::steady_clock::now() < deadline) {
    io.run_one_until(deadline);
    if (io.stopped()) break;
  }
  bool expired = false;
  if (!done) {
    expired = true;
    if (on_expiry) on_expiry();
    // The operation must unwind before its frame's references go out of scope: closing its
    // socket makes every pending operation complete with operation_aborted at once.
    io.restart();
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!done && std::chrono::steady_clock::now() < give_up) {
      io.run_one_until(give_up);
      if (io.stopped()) break;
    }
    if (!done) {
      log(LogLevel::warn, LogSubsys::net, ctx.rank, "run_with_deadline: ", what, ": operation did not unwind after expiry");
      io.stop();
    }
  }
  if (expired && (error || !done))
    throw Error(ErrorCode::timeout, ctx, what + ": did not complete in time");
  if (error) std::rethrow_exception(error);
  if constexpr (!std::is_void_v<T>) return std::move(*result);
}

}  // namespace chorus::detail
