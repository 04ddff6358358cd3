#pragma once
/// Runs a communicator's collectives one after another, in the order they were called: on one
/// worker (asio::thread_pool with one thread) for *_async calls, and on the caller's own thread
/// for a blocking call that finds nothing queued or running (try_run: no thread hop on the
/// latency path; a blocking call that finds work queued submits and waits instead).
///
/// A thread that waits for an async call's request runs the call itself when its turn has come
/// and the worker has not started it yet (the request's Driver is the queued job): so
/// `all_reduce_async(...)` followed by `wait()` costs no hand-off to the worker and back. Turns
/// are kept by an index per job: a job runs, on whichever thread claims it first, only once every
/// job submitted before it has finished.

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

class SerialExecutor {
 public:
  SerialExecutor() = default;
  SerialExecutor(const SerialExecutor&) = delete;
  SerialExecutor& operator=(const SerialExecutor&) = delete;
  ~SerialExecutor() { pool_.join(); }

  /// Queues `task`; `state` completes when it has run (or fails with its error). A thread that
  /// waits for `state` may run the task itself (see above).
  void submit(std::function<void()> task, std::shared_ptr<RequestState> state) {
    auto job = std::make_shared<Job>(*this, std::move(task), state);
    {
      std::lock_guard lk(mu_);
      job->index = submitted_++;
    }
    state->set_driver(job);
    pending_.fetch_add(1);
    asio::post(pool_, [this, job] {
      {
        std::unique_lock lk(mu_);
        cv_.wait(lk, [&] { return finished_ == job->index || job->claimed; });
        if (job->claimed) return;  // a waiter runs it
        job->claimed = true;
      }
      run_job(*job);
    });
  }

  /// Runs `task` now on this thread when nothing is queued or running, and says so; false (nothing
  /// run) otherwise. A template, so the task is not copied into a std::function (no allocation).
  template <class F>
  bool try_run(F& task) {
    int idle = 0;
    if (!pending_.compare_exchange_strong(idle, 1)) return false;
    struct Release {
      std::atomic<int>& p;
      ~Release() { p.fetch_sub(1); }
    } release{pending_};
    task();
    return true;
  }

 private:
  /// A queued call; the Driver of its request, so that the request's waiter can run it.
  struct Job final : Driver {
    Job(SerialExecutor& e, std::function<void()> t, std::shared_ptr<RequestState> s)
        : ex(e), task(std::move(t)), state(std::move(s)) {}

    /// The waiter: runs the call here once it is its turn and nobody has started it; else waits
    /// for it (looking again now and then, should the worker be slow to wake).
    void drive(const RequestState& r, Clock::time_point deadline) override {
      while (!r.done() && Clock::now() < deadline) {
        if (ex.try_claim(*this)) return ex.run_job(*this);
        r.settle_until(std::min(deadline, Clock::now() + std::chrono::microseconds(200)));
      }
    }
    void drive_until(bool (*)(const void*), const void*, Clock::time_point) override {}
    void poll() override {}
    /// The request's own on-timeout hook aborts the transport (Communicator::collective).
    void on_timeout(const Error&) override {}

    SerialExecutor& ex;
    std::function<void()> task;
    std::shared_ptr<RequestState> state;
    std::uint64_t index = 0;  ///< its turn (set under mu_)
    bool claimed = false;     ///< started by a thread (under mu_)
  };

  bool try_claim(Job& j) {
    std::lock_guard lk(mu_);
    if (j.claimed || finished_ != j.index) return false;
    j.claimed = true;
    return true;
  }

  /// Runs the call, lets the next one go, then completes its request: a waiter that returns
  /// finds the executor idle (its next blocking call runs inline, no hand-off).
  void run_job(Job& j) {
    std::optional<Error> err;          // a chorus error, kept as it is
    std::optional<std::string> other;  // any other exception's text
    try {
      j.task();
    } catch (const Error& e) {
      err = e;
    } catch (const std::exception& e) {
      other = e.what();
    }
    {
      std::lock_guard lk(mu_);
      ++finished_;
    }
    cv_.notify_all();
    pending_.fetch_sub(1);
    if (err)
      j.state->fail(*err);
    else if (other)
      j.state->fail(ErrorCode::system, *other);
    else
      j.state->complete();
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::uint64_t submitted_ = 0;  ///< jobs submitted (under mu_)
  std::uint64_t finished_ = 0;   ///< jobs finished, in order (under mu_)
  std::atomic<int> pending_{0};
  asio::thread_pool pool_{1};    ///< declared last: joined (in the destructor) before the rest goes
};

}  // namespace chorus::detail
