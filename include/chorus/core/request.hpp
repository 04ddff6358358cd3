// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// Request: the handle of an operation in flight (isend, irecv, *_async collectives).
/// wait() blocks until it completes, bounded by the communicator's timeout; test() polls.
/// A failed operation rethrows its chorus::Error from wait() or test().
///
///   chorus::Request r = comm.irecv(std::span(buf), /*peer=*/1, /*tag=*/0);
///   ... overlap work ...
///   r.wait();

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

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

class RequestState;

/// What a transport's progress engine lends a thread that waits for one of its requests, so that
/// the waiting thread moves the bytes itself instead of sleeping until another thread has (see
/// the progress contract in core/concepts.hpp).
class Driver {
 public:
  using Clock = std::chrono::steady_clock;
  virtual ~Driver() = default;
  /// Makes progress on the calling thread until `r` is done or `deadline` passes: polls the
  /// engine's links for a bounded spin, then sleeps in one wait that covers all of them. Returns
  /// early, with `r` possibly still pending, when the engine is stopped. Another thread driving
  /// the same engine at the time makes this wait for `r` instead.
  virtual void drive(const RequestState& r, Clock::time_point deadline) = 0;
  /// The same, until `ready(ctx)` holds: for a wait on something that is not a request (an shm
  /// mailbox); ready must be cheap and must not block.
  virtual void drive_until(bool (*ready)(const void*), const void* ctx, Clock::time_point deadline) = 0;
  /// One non-blocking pass over the links, when no other thread drives them (Request::test()).
  virtual void poll() = 0;
  /// A request of this engine timed out: abort the engine, so no buffer is written after the
  /// waiter has thrown.
  virtual void on_timeout(const Error& e) = 0;
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
      if (done_.load(std::memory_order_relaxed)) return;
      bytes_ = bytes;
      then = std::move(then_);
      done_.store(true, std::memory_order_release);
    }
    cv_.notify_all();
    if (then) then();
  }
  /// Marks failure. The error travels as plain data (code and text) and is thrown anew by the
  /// thread that waits, so no exception object is shared between threads.
  void fail(ErrorCode code, const std::string& msg) { fail_text(code, Error(code, context(), msg).what()); }
  /// Marks failure with an error raised elsewhere (its text and code are kept as they are).
  void fail(const Error& e) { fail_text(e.code(), e.what()); }

  bool done() const { return done_.load(std::memory_order_acquire); }
  bool test() {
    if (!done())
      if (auto d = driver_.lock()) d->poll();
    std::lock_guard lk(mu_);
    if (done() && failed_) throw error_locked();
    return done();
  }
  /// Waits until done or until the timeout; on timeout runs the on-timeout hook (the transport
  /// aborts, so the buffer is never written after wait() has thrown) and throws timeout.
  void wait() {
    if (done()) return settled();  // no clock read for a request that is already complete
    if (!from_start_) return wait_until(Clock::now() + timeout_);
    // A queued call: the timeout counts from when it starts running. Until then it waits behind
    // calls that are each bounded by their own timeout (and a timeout aborts the rest).
    while (started_.load(std::memory_order_acquire) == 0)
      if (wait_before(Clock::now() + timeout_)) return;
    wait_until(Clock::time_point(Clock::duration(started_.load(std::memory_order_acquire))) + timeout_ + grace_);
  }
  /// As wait(), for a caller that has already waited part of the timeout (polling with
  /// wait_for): the deadline is the start of its wait plus timeout().
  void wait_until(Clock::time_point deadline) {
    if (done()) return settled();
    drive(deadline);
    {
      std::unique_lock lk(mu_);
      if (!cv_.wait_until(lk, deadline, [&] { return done(); })) {
        lk.unlock();
        auto hook = on_timeout_;
        Error e(ErrorCode::timeout, context(),
                "did not complete within " + std::to_string(timeout_.count()) + " ms (CHORUS_TIMEOUT)");
        if (hook)
          hook(e);
        else if (auto d = driver_.lock())
          d->on_timeout(e);
        throw e;
      }
      if (failed_) throw error_locked();
    }
  }
  /// Waits at most `d`: true when done (throws its error if it failed), false when still pending.
  /// No timeout handling: callers that poll with it bound the total themselves.
  bool wait_for(std::chrono::milliseconds d) {
    if (done()) return settled(), true;
    return wait_before(Clock::now() + d);
  }
  /// As wait_for, until `deadline`.
  bool wait_before(Clock::time_point deadline) {
    if (done()) return settled(), true;
    drive(deadline);
    std::unique_lock lk(mu_);
    if (!cv_.wait_until(lk, deadline, [&] { return done(); })) return false;
    if (failed_) throw error_locked();
    return true;
  }

  /// Waits without driving (another thread drives) until done or `t`; true when done. Never
  /// throws.
  bool settle_until(Clock::time_point t) const {
    std::unique_lock lk(mu_);
    return cv_.wait_until(lk, t, [&] { return done(); });
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

  /// Called (without locks) once the request is done; runs at once when it already is. Several
  /// may be set (the communicator's own and a caller's, Request::on_complete): they run in the
  /// order they were set.
  void then(std::function<void()> f) {
    {
      std::lock_guard lk(mu_);
      if (!done()) {
        if (then_)
          then_ = [a = std::move(then_), b = std::move(f)] {
            a();
            b();
          };
        else
          then_ = std::move(f);
        return;
      }
    }
    f();
  }
  void set_on_timeout(std::function<void(const Error&)> f) { on_timeout_ = std::move(f); }
  /// wait()'s timeout counts from mark_started(), not from the wait, plus `grace` (for an
  /// operation whose own steps time out first and report more); set before handing it out.
  void count_from_start(std::chrono::milliseconds grace = {}) {
    from_start_ = true;
    grace_ = grace;
  }
  /// The operation starts running now (see count_from_start()).
  void mark_started() { started_.store(Clock::now().time_since_epoch().count(), std::memory_order_release); }
  /// The engine that completes this request: its waiter drives it, and a timeout aborts it unless
  /// an on-timeout hook is set (set once, before the request is handed out).
  void set_driver(std::weak_ptr<Driver> d) { driver_ = std::move(d); }
  /// The driver set_driver gave (read it once that is done: the two are not synchronised).
  const std::weak_ptr<Driver>& driver() const { return driver_; }

  // ---- a receive from any source (Communicator::irecv_any_bytes) ----
  // Every link of the communicator holds an entry for it; the first link with a message for its
  // tag claims it (claim_source, under that link's lock or drive token), and the others drop
  // their entries when they next look. Claiming is one compare-and-swap, so two links never both
  // take it, and a receive withdrawn at its timeout (withdraw_source) is never written. A link
  // that breaks gives its entry up (leave_source); the last one to do so fails it.

  static constexpr int kSourceOpen = -1;       ///< an any-source receive that no link has taken
  static constexpr int kSourceWithdrawn = -2;  ///< ... withdrawn at its timeout

  /// Makes this the request of a receive from any source with an entry on `links` links (before
  /// it is handed out).
  void set_any_source(int links) {
    any_source_ = true;
    source_.store(kSourceOpen, std::memory_order_relaxed);
    links_.store(links, std::memory_order_relaxed);
  }
  bool any_source() const { return any_source_; }
  /// True when the entry of the link from `source` may match: always for an ordinary request; for
  /// one from any source, when this call claims it (it then names `source` as its peer).
  bool claim_source(int source) {
    if (!any_source_) return true;
    int open = kSourceOpen;
    if (!source_.compare_exchange_strong(open, source, std::memory_order_acq_rel)) return false;
    std::lock_guard lk(mu_);
    ctx_.peer = source;
    return true;
  }
  /// The link from `source` broke: true when the request fails with it. Always for an ordinary
  /// request; for one from any source only when no other link can take it any more (this was the
  /// last open entry: it is claimed for the failure), since another rank may still send it.
  bool leave_source(int source) {
    if (!any_source_) return true;
    if (!source_open() || links_.fetch_sub(1, std::memory_order_acq_rel) != 1) return false;
    return claim_source(source);
  }
  /// An any-source receive that no link has taken yet (nor withdrawn).
  bool source_open() const { return any_source_ && source_.load(std::memory_order_acquire) == kSourceOpen; }
  /// Withdraws an any-source receive that no link has taken: true when it was open (no link
  /// writes its buffer from now on), false when a link has it already.
  bool withdraw_source() {
    int open = kSourceOpen;
    return source_.compare_exchange_strong(open, kSourceWithdrawn, std::memory_order_acq_rel);
  }
  /// The rank a receive is from: for an any-source receive the one that took it (-1 before),
  /// else the request's peer.
  int source() const {
    if (any_source_) return std::max(source_.load(std::memory_order_acquire), -1);
    std::lock_guard lk(mu_);
    return ctx_.peer;
  }

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
      if (done_.load(std::memory_order_relaxed)) return;
      failed_ = true;
      code_ = code;
      what_ = std::move(what);
      then = std::move(then_);
      done_.store(true, std::memory_order_release);
    }
    cv_.notify_all();
    if (then) then();
  }

  /// A done request: throws its error if it failed. failed_ was written before done_ was set
  /// (release), and done() read it (acquire), so it is read here without the lock.
  void settled() const {
    if (!failed_) return;
    std::lock_guard lk(mu_);
    throw error_locked();
  }

  /// The waiting thread makes the progress itself, where the request's engine lends it a driver.
  void drive(Clock::time_point deadline) {
    if (done()) return;
    if (auto d = driver_.lock()) d->drive(*this, deadline);
  }

  Error error_locked() const { return Error::from_text(code_, what_, ctx_.rank, ctx_.peer); }

  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  /// Set once, under mu_ (so a waiter on cv_ cannot miss it), after the result; atomic so that a
  /// driver's spin reads it without the lock.
  std::atomic<bool> done_{false};
  std::size_t bytes_ = 0;
  bool failed_ = false;
  ErrorCode code_ = ErrorCode::system;
  std::string what_;
  std::function<void()> then_;
  std::function<void(const Error&)> on_timeout_;
  std::weak_ptr<Driver> driver_;
  LazyOp lazy_;
  mutable ErrorContext ctx_;  ///< op filled from lazy_ on first use, under mu_
  std::chrono::milliseconds timeout_;
  bool from_start_ = false;
  std::chrono::milliseconds grace_{0};
  std::atomic<Clock::rep> started_{0};  ///< when the operation started running (0: not yet)
  bool any_source_ = false;             ///< a receive from any source (set before hand-out)
  std::atomic<int> source_{kSourceOpen};  ///< ... the rank that took it, or kSourceOpen/kSourceWithdrawn
  std::atomic<int> links_{0};             ///< ... the links whose entries may still take it
};

/// Memory blocks of one size, recycled: the request states of a link (control block and object,
/// through allocate_shared) come from here, so a link in steady state makes them without touching
/// the heap. Thread-safe (a request may be freed on any thread). At most kMaxFree blocks are kept.
class BlockPool {
 public:
  static constexpr std::size_t kMaxFree = 256;

  BlockPool() { free_.reserve(kMaxFree); }
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;
  ~BlockPool() {
    for (void* p : free_) ::operator delete(p);
  }

  void* get(std::size_t n) {
    {
      std::lock_guard lk(mu_);
      if (size_ == 0) size_ = n;
      if (n == size_ && !free_.empty()) {
        void* p = free_.back();
        free_.pop_back();
        return p;
      }
    }
    return ::operator new(n);
  }
  void put(void* p, std::size_t n) {
    {
      std::lock_guard lk(mu_);
      if (n == size_ && free_.size() < kMaxFree) {
        free_.push_back(p);
        return;
      }
    }
    ::operator delete(p);
  }

 private:
  std::mutex mu_;
  std::size_t size_ = 0;  ///< the one size kept (the first asked for)
  std::vector<void*> free_;
};

/// An allocator over a shared BlockPool (for allocate_shared).
template <class T>
struct PoolAllocator {
  using value_type = T;
  std::shared_ptr<BlockPool> pool;

  explicit PoolAllocator(std::shared_ptr<BlockPool> p) : pool(std::move(p)) {}
  template <class U>
  PoolAllocator(const PoolAllocator<U>& o) : pool(o.pool) {}
  T* allocate(std::size_t n) { return static_cast<T*>(pool->get(n * sizeof(T))); }
  void deallocate(T* p, std::size_t n) { pool->put(p, n * sizeof(T)); }
  template <class U>
  bool operator==(const PoolAllocator<U>& o) const {
    return pool == o.pool;
  }
};

/// The request states of one link: pooled, each naming the link's ends and its engine.
class RequestFactory {
 public:
  RequestFactory(int rank, int peer, std::chrono::milliseconds timeout, std::weak_ptr<Driver> driver)
      : rank_(rank), peer_(peer), timeout_(timeout), driver_(std::move(driver)) {}
  const std::weak_ptr<Driver>& driver() const { return driver_; }

  std::shared_ptr<RequestState> make(const char* verb, std::uint64_t tag, std::size_t bytes,
                                     std::string (*format)(const char*, std::uint64_t, std::size_t)) {
    auto req = std::allocate_shared<RequestState>(PoolAllocator<RequestState>(pool_), rank_, peer_,
                                                  LazyOp{verb, tag, bytes, format}, timeout_);
    req->set_driver(driver_);
    return req;
  }

 private:
  int rank_;
  int peer_;
  std::chrono::milliseconds timeout_;
  std::weak_ptr<Driver> driver_;
  std::shared_ptr<BlockPool> pool_ = std::make_shared<BlockPool>();
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
  /// Waits at most `d`, making progress meanwhile (a queued collective is left to the
  /// communicator's worker unless `d` is at least half the timeout: running it here would hold
  /// this thread until the call ends): true when the operation has completed (throws its error if
  /// it failed), false when it is still pending. Unlike wait(), running out of time
  /// is not an error here and aborts nothing: the operation goes on, bounded by the
  /// communicator's timeout, and the caller decides (wait again, or Communicator::abort()).
  ///
  ///   while (!r.wait_for(std::chrono::milliseconds(100))) report_progress();
  bool wait_for(std::chrono::milliseconds d) { return !s_ || s_->wait_for(d); }
  /// Runs `f` once the operation is done, with its error (null on success): at once, on this
  /// thread, when it already is; else on the thread that completes it (a communicator's worker
  /// or progress thread, or a waiter), so `f` must be short and must not wait for this
  /// communicator. An empty request counts as done.
  ///
  ///   r.on_complete([](std::exception_ptr e) { if (!e) notify_ready(); });
  void on_complete(std::function<void(std::exception_ptr)> f) {
    if (!s_) return f(nullptr);
    s_->then([st = s_.get(), f = std::move(f)] {  // the state runs this, so it outlives it
      ErrorCode code{};
      std::string what;
      if (!st->failed(&code, &what)) return f(nullptr);
      const ErrorContext ctx = st->context();
      f(std::make_exception_ptr(Error::from_text(code, what, ctx.rank, ctx.peer)));
    });
  }
  /// Bytes moved (for irecv: bytes received).
  std::size_t bytes() const { return s_ ? s_->bytes() : 0; }
  /// The rank a receive is from: for a receive from any source (Communicator::irecv_any) the
  /// sender, in the communicator's ranks, once a message has matched it (-1 before); for any
  /// other request the peer of the link it was posted on (in the ranks of the communicator that
  /// made the links: the parent's, for one from split()).
  int source() const { return s_ ? s_->source() : -1; }
  bool valid() const { return s_ != nullptr; }
  const std::shared_ptr<detail::RequestState>& state() const { return s_; }

 private:
  std::shared_ptr<detail::RequestState> s_;
};

}  // namespace chorus
