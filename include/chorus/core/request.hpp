#pragma once
/// Request: the handle of an operation in flight (isend, irecv, *_async collectives).
/// wait() blocks until it completes, bounded by the communicator's timeout; test() polls.
/// A failed operation rethrows its chorus::Error from wait() or test().
///
///   chorus::Request r = comm.irecv(std::span(buf), /*peer=*/1, /*tag=*/0);
///   ... overlap work ...
///   r.wait();

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "chorus/core/error.hpp"

namespace chorus {
namespace detail {

/// A link operation as plain data, put into words (ErrorContext::op) only when an error or a
/// caller needs them: formatting a text for every message would cost more than sending it.
struct LazyOp {
  const char* verb = nullptr;  ///< a string literal: "send", "recv"
  std::uint64_t tag = 0;
  std::size_t bytes = 0;
  std::string (*format)(const char* verb, std::uint64_t tag, std::size_t bytes) = nullptr;
};

/// Shared between the poster (who waits) and the progress engine (who completes).
/// Lock order: a link's lock may be held while calling complete()/fail(); the reverse never.
class RequestState {
 public:
  using Clock = std::chrono::steady_clock;

  RequestState(ErrorContext ctx, std::chrono::milliseconds timeout) : ctx_(std::move(ctx)), timeout_(timeout) {}
  RequestState(int rank, int peer, LazyOp op, std::chrono::milliseconds timeout)
      : lazy_(op), ctx_{rank, peer, {}}, timeout_(timeout) {}

  /// Marks success with the number of bytes moved. The first of complete()/fail() wins.
  void complete(std::size_t bytes = 0) {
    std::function<void()> then;
    {
      std::lock_guard lk(mu_);
      if (done_) return;
      done_ = true;
      bytes_ = bytes;
      then = std::move(then_);
    }
    cv_.notify_all();
    if (then) then();
  }
  /// Marks failure. The error travels as plain data (code and text) and is thrown anew by the
  /// thread that waits, so no exception object is shared between threads.
  void fail(ErrorCode code, const std::string& msg) { fail_text(code, Error(code, context(), msg).what()); }
  /// Marks failure with an error raised elsewhere (its text and code are kept as they are).
  void fail(const Error& e) { fail_text(e.code(), e.what()); }

  bool done() const {
    std::lock_guard lk(mu_);
    return done_;
  }
  bool test() {
    std::lock_guard lk(mu_);
    if (done_ && failed_) throw error_locked();
    return done_;
  }
  /// Waits until done or until the timeout; on timeout runs the on-timeout hook (the transport
  /// aborts, so the buffer is never written after wait() has thrown) and throws timeout.
  void wait() { wait_until(Clock::now() + timeout_); }
  /// As wait(), for a caller that has already waited part of the timeout (polling with
  /// wait_for): the deadline is the start of its wait plus timeout().
  void wait_until(Clock::time_point deadline) {
    {
      std::unique_lock lk(mu_);
      if (!cv_.wait_until(lk, deadline, [&] { return done_; })) {
        lk.unlock();
        auto hook = on_timeout_;
        Error e(ErrorCode::timeout, context(),
                "did not complete within " + std::to_string(timeout_.count()) + " ms (CHORUS_TIMEOUT)");
        if (hook) hook(e);
        throw e;
      }
      if (failed_) throw error_locked();
    }
  }
  /// Waits at most `d`: true when done (throws its error if it failed), false when still pending.
  /// No timeout handling: callers that poll with it bound the total themselves.
  bool wait_for(std::chrono::milliseconds d) {
    std::unique_lock lk(mu_);
    if (!cv_.wait_for(lk, d, [&] { return done_; })) return false;
    if (failed_) throw error_locked();
    return true;
  }

  std::size_t bytes() const {
    std::lock_guard lk(mu_);
    return bytes_;
  }
  /// Rank, peer and the operation in words (formatted on first use for a LazyOp).
  ErrorContext context() const {
    std::lock_guard lk(mu_);
    if (ctx_.op.empty() && lazy_.format) ctx_.op = lazy_.format(lazy_.verb, lazy_.tag, lazy_.bytes);
    return ctx_;
  }
  std::chrono::milliseconds timeout() const { return timeout_; }

  /// Called (without locks) once the request is done; runs at once when it already is.
  void then(std::function<void()> f) {
    {
      std::lock_guard lk(mu_);
      if (!done_) {
        then_ = std::move(f);
        return;
      }
    }
    f();
  }
  void set_on_timeout(std::function<void(const Error&)> f) { on_timeout_ = std::move(f); }

  /// True when the request failed; `out` then gets its error.
  bool failed(ErrorCode* code = nullptr, std::string* what = nullptr) const {
    std::lock_guard lk(mu_);
    if (failed_) {
      if (code) *code = code_;
      if (what) *what = what_;
    }
    return failed_;
  }

 private:
  void fail_text(ErrorCode code, std::string what) {
    std::function<void()> then;
    {
      std::lock_guard lk(mu_);
      if (done_) return;
      done_ = true;
      failed_ = true;
      code_ = code;
      what_ = std::move(what);
      then = std::move(then_);
    }
    cv_.notify_all();
    if (then) then();
  }

  Error error_locked() const { return Error::from_text(code_, what_, ctx_.rank, ctx_.peer); }

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::size_t bytes_ = 0;
  bool failed_ = false;
  ErrorCode code_ = ErrorCode::system;
  std::string what_;
  std::function<void()> then_;
  std::function<void(const Error&)> on_timeout_;
  LazyOp lazy_;
  mutable ErrorContext ctx_;  ///< op filled from lazy_ on first use, under mu_
  std::chrono::milliseconds timeout_;
};

}  // namespace detail

class Request {
 public:
  Request() = default;
  explicit Request(std::shared_ptr<detail::RequestState> s) : s_(std::move(s)) {}

  /// Blocks until the operation completes; throws its error, or timeout.
  void wait() {
    if (s_) s_->wait();
  }
  /// True when complete; throws the operation's error if it failed. Never blocks.
  bool test() { return !s_ || s_->test(); }
  /// Bytes moved (for irecv: bytes received).
  std::size_t bytes() const { return s_ ? s_->bytes() : 0; }
  bool valid() const { return s_ != nullptr; }
  const std::shared_ptr<detail::RequestState>& state() const { return s_; }

 private:
  std::shared_ptr<detail::RequestState> s_;
};

}  // namespace chorus
