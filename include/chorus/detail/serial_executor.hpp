#pragma once
/// Runs a communicator's collectives one after another, in the order they were called: on one
/// worker (asio::thread_pool with one thread) for *_async calls, and on the caller's own thread
/// for a blocking call that finds nothing queued or running (try_run: no thread hop on the
/// latency path; a blocking call that finds work queued submits and waits instead).

#include <atomic>
#include <functional>
#include <memory>

#include "chorus/core/request.hpp"
#include "chorus/detail/asio.hpp"

namespace chorus::detail {

class SerialExecutor {
 public:
  SerialExecutor() = default;
  SerialExecutor(const SerialExecutor&) = delete;
  SerialExecutor& operator=(const SerialExecutor&) = delete;
  ~SerialExecutor() { pool_.join(); }

  /// Queues `task`; `state` completes when it has run (or fails with its error).
  void submit(std::function<void()> task, std::shared_ptr<RequestState> state) {
    pending_.fetch_add(1);
    asio::post(pool_, [this, task = std::move(task), state = std::move(state)] {
      run_into(task, *state);
      pending_.fetch_sub(1);
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
  static void run_into(const std::function<void()>& task, RequestState& state) {
    try {
      task();
      state.complete();
    } catch (const Error& e) {
      state.fail(e);
    } catch (const std::exception& e) {
      state.fail(ErrorCode::system, e.what());
    }
  }

  asio::thread_pool pool_{1};
  std::atomic<int> pending_{0};
};

}  // namespace chorus::detail
