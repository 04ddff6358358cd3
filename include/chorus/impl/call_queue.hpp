// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// Runs a communicator's collectives one after another, in the order they were called: on one
/// worker (asio::thread_pool with one thread) for *_async calls, and on the caller's own thread
/// for a blocking call that finds nothing queued or running (try_run: no thread hop on the
/// latency path; a blocking call that finds work queued submits and waits instead).
///
/// A thread that waits for an async call's request runs the call itself when its turn has come
/// and the worker has not started it yet (the request's Driver is the queued job): so
/// `all_reduce_async(...)` followed by `wait()` costs no hand-off to the worker and back. A wait
/// shorter than half the call's timeout (Request::wait_for) leaves the call to the worker, so that
/// it returns within its bound. Turns
/// are kept by an index per job: a job runs, on whichever thread claims it first, only once every
/// job submitted before it has finished.
///
/// Order of completion: a call's request completes just after the next call is let go (so its
/// waiter, once back, finds the executor idle), and a call run inline starts only once every
/// earlier call's request has completed: a blocking call that returned implies that every call
/// before it reports done, and so does a queued call's (its turn comes once the requests of the
/// calls before it have completed).

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "chorus/core/request.hpp"
#include "chorus/detail/asio.hpp"

namespace chorus::detail {

class CallQueue {
 public:
  CallQueue() = default;
  CallQueue(const CallQueue&) = delete;
  CallQueue& operator=(const CallQueue&) = delete;
  ~CallQueue() { pool_.join(); }

  /// Queues `task`; `state` completes when it has run (or fails with its error). A thread that
  /// waits for `state` may run the task itself (see above). Once cancel() has been called, a
  /// queued task never runs: its request fails with the cancel error when its turn comes.
  void submit(std::function<void()> task, std::shared_ptr<RequestState> state) {
    auto job = std::make_shared<Job>(*this, std::move(task), state);
    {
      std::lock_guard lk(mu_);
      job->index = submitted_++;
    }
    state->set_driver(job);
    unsettled_.fetch_add(1);  // before pending_ (try_begin_inline)
    pending_.fetch_add(1);
    asio::post(pool_, [this, job] {
      {
        std::unique_lock lk(mu_);
        cv_.wait(lk, [&] { return my_turn(*job) || job->claimed; });
        if (job->claimed) return;  // a waiter runs it
        job->claimed = true;
      }
      run_job(*job);
    });
  }

  /// Claims the executor for a call that the caller runs on its own thread: true when nothing is
  /// queued or running (then end_inline() must follow the call), false otherwise. The claim is an
  /// atomic flag, so a call submitted meanwhile waits for end_inline() and never overlaps it.
  /// Once claimed, it waits for the requests of the calls that ran before it to complete (those
  /// calls have finished and only their completion is left, a few instructions away on another
  /// thread); calls submitted after the claim, which wait for this one, are not waited for.
  bool try_begin_inline() {
    int idle = 0;
    if (!pending_.compare_exchange_strong(idle, kInline)) return false;
    // submit() counts a call in unsettled_ before pending_, so a call being submitted meanwhile is
    // at most waited for until it appears in pending_.
    while (unsettled_.load(std::memory_order_acquire) >
           static_cast<std::uint64_t>(pending_.load(std::memory_order_acquire) & (kInline - 1)))
      ::sched_yield();
    return true;
  }
  void end_inline() {
    if (pending_.fetch_sub(kInline) != kInline) {  // a call was queued meanwhile: its turn now
      std::lock_guard lk(mu_);
      cv_.notify_all();
    }
  }

  /// Runs `task` now on this thread when nothing is queued or running, and says so; false (nothing
  /// run) otherwise. A template, so the task is not copied into a std::function (no allocation).
  template <class F>
  bool try_run(F& task) {
    if (!try_begin_inline()) return false;
    struct End {
      CallQueue& e;
      ~End() { e.end_inline(); }
    } end{*this};
    task();
    return true;
  }

  /// Waits until every call submitted so far has run and its request has completed (a request
  /// completes just after the next call is let go), or until `deadline`; true when they have.
  bool wait_settled(std::chrono::steady_clock::time_point deadline) {
    std::unique_lock lk(mu_);
    const std::uint64_t target = submitted_;
    return cv_.wait_until(lk, deadline, [&] { return settled_ >= target; });
  }

  /// Calls queued or running (an inline call counts as one).
  int pending() const {
    const int p = pending_.load();
    return (p & (kInline - 1)) + (p >= kInline ? 1 : 0);
  }

  /// Fails every queued call that has not started with `why` instead of running it (each when
  /// its turn comes, in order); a call that is running is not touched (the caller aborts the
  /// transport under it). Later submissions fail the same way. Never blocks.
  void cancel(const Error& why) {
    {
      std::lock_guard lk(mu_);
      if (!cancelled_) cancelled_ = why;
    }
    cv_.notify_all();
  }

 private:
  /// A queued call; the Driver of its request, so that the request's waiter can run it.
  struct Job final : Driver {
    Job(CallQueue& e, std::function<void()> t, std::shared_ptr<RequestState> s)
        : ex(e), task(std::move(t)), state(std::move(s)) {}

    /// The waiter: runs the call here once it is its turn and nobody has started it; else waits
    /// for it (looking again now and then, should the worker be slow to wake). Only a wait that
    /// may last about as long as the call (wait(), whose deadline is the call's timeout away;
    /// not a Request::wait_for shorter than half of it) runs it, since the call then holds the
    /// waiter until it ends.
    void drive(const RequestState& r, Clock::time_point deadline) override {
      const bool may_run = deadline - Clock::now() >= r.timeout() / 2;
      while (!r.done() && Clock::now() < deadline) {
        if (may_run && ex.try_claim(*this)) return ex.run_job(*this);
        r.settle_until(std::min(deadline, Clock::now() + std::chrono::microseconds(200)));
      }
    }
    void drive_until(bool (*)(const void*), const void*, Clock::time_point) override {}
    void poll() override {}
    /// The request's own on-timeout hook aborts the transport (Communicator::collective).
    void on_timeout(const Error&) override {}

    CallQueue& ex;
    std::function<void()> task;
    std::shared_ptr<RequestState> state;
    std::uint64_t index = 0;  ///< its turn (set under mu_)
    bool claimed = false;     ///< started by a thread (under mu_)
  };

  static constexpr int kInline = 1 << 24;  ///< in pending_: a caller runs a call inline

  /// Every call before `j` has finished and its request completed, and no inline call runs
  /// (under mu_).
  bool my_turn(const Job& j) const { return settled_ == j.index && pending_.load() < kInline; }

  bool try_claim(Job& j) {
    std::lock_guard lk(mu_);
    if (j.claimed || !my_turn(j)) return false;
    j.claimed = true;
    return true;
  }

  /// Runs the call, lets the next one go (pending_), then completes its request: a waiter that
  /// returns finds the executor idle (its next blocking call runs inline, no hand-off); a queued
  /// next call starts once the request has completed (settled_).
  void run_job(Job& j) {
    std::optional<Error> err;          // a chorus error, kept as it is
    std::optional<std::string> other;  // any other exception's text
    {
      std::lock_guard lk(mu_);
      err = cancelled_;
    }
    if (!err) j.state->mark_started();
    try {
      if (!err) j.task();
    } catch (const Error& e) {
      err = e;
    } catch (const std::exception& e) {
      other = e.what();
    }
    pending_.fetch_sub(1);
    if (err)
      j.state->fail(*err);
    else if (other)
      j.state->fail(ErrorCode::system, *other);
    else
      j.state->complete();
    unsettled_.fetch_sub(1, std::memory_order_release);
    {
      std::lock_guard lk(mu_);
      ++settled_;
    }
    cv_.notify_all();
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::uint64_t submitted_ = 0;  ///< jobs submitted (under mu_)
  std::uint64_t settled_ = 0;    ///< jobs whose requests have completed (under mu_)
  std::optional<Error> cancelled_;  ///< set by cancel() (under mu_)
  std::atomic<int> pending_{0};     ///< calls queued or running; kInline added while one runs inline
  std::atomic<std::uint64_t> unsettled_{0};  ///< calls submitted whose requests have not completed
  asio::thread_pool pool_{1};    ///< declared last: joined (in the destructor) before the rest goes
};

}  // namespace chorus::detail
