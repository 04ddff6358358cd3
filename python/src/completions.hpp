// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// Completions: the threads that complete the Works' futures, off chorus's communicator thread.
//
// A future's callbacks (Future.then, DDP's communication hooks) run on the thread that marks it
// completed. PowerSGD's hook, for one, starts an all_reduce in its callback and waits for it:
// run on the communicator's worker, which that all_reduce needs, it would wait for itself. So
// the worker hands each completion here (the Work itself, which Work.wait() waits on, completes
// on the worker first: a blocking wait pays no thread hop).
//
// Why not a fixed pool (Boost.Asio's thread_pool, torch's inter-op pool): a callback may block
// on a later completion (the one of the all_reduce it started), which a pool whose threads all
// block so can never run. Here a completion that finds no idle thread gets a new one (up to
// kMaxThreads; a program that nests deeper is bounded by the group's timeout, not hung). In the
// usual case (callbacks that do not block) one thread does all the work.

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace chorus_torch {

class Completions {
 public:
  static constexpr std::size_t kMaxThreads = 16;

  Completions() = default;
  Completions(const Completions&) = delete;
  Completions& operator=(const Completions&) = delete;
  ~Completions() { stop(); }

  /// Runs `f` on a completion thread; at once on this thread after stop().
  void post(std::function<void()> f) {
    {
      std::lock_guard lk(mu_);
      if (!stopping_) {
        q_.push_back(std::move(f));
        if (q_.size() > idle_ && threads_.size() < kMaxThreads)
          threads_.emplace_back([this] { loop(); });
        else
          cv_.notify_one();
        return;
      }
    }
    f();
  }

  /// Runs what is queued and joins the threads; later posts run on the poster's thread.
  /// Idempotent. Not from a completion thread.
  void stop() {
    std::vector<std::thread> threads;
    {
      std::lock_guard lk(mu_);
      stopping_ = true;
      threads.swap(threads_);
    }
    cv_.notify_all();
    for (auto& t : threads) t.join();
  }

 private:
  void loop() {
    std::unique_lock lk(mu_);
    for (;;) {
      ++idle_;
      cv_.wait(lk, [&] { return stopping_ || !q_.empty(); });
      --idle_;
      if (q_.empty()) return;  // stopping, nothing left
      std::function<void()> f = std::move(q_.front());
      q_.pop_front();
      lk.unlock();
      f();
      f = nullptr;  // what it holds (the future, its tensors) goes before the lock is taken again
      lk.lock();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> q_;
  std::size_t idle_ = 0;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace chorus_torch
