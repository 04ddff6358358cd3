// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// shm's engine: the links of one transport, the poll lists and the progress thread
/// (transport/progress.hpp has the model; shm/transport.hpp starts and stops it). How it waits:
/// the file comment of shm/transport.hpp.

#include <poll.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "chorus/transport/progress.hpp"
#include "chorus/transport/shell.hpp"
#include "chorus/transport/shm/link.hpp"

namespace chorus::shm {
namespace detail {

using chorus::detail::cpu_relax;

/// The links and the progress thread of one transport; shared by the thread, so a transport
/// destroyed on its own progress thread leaves the engine to the thread until it ends. Requests
/// hold it (weakly) as their Driver: whoever waits for one drives the engine.
struct Engine final : chorus::detail::DrivenEngine<Engine> {
  /// An exception out of a pass leaves the links in an unknown state: every link fails.
  static constexpr bool kRunAgainAfterError = false;
  static constexpr auto kSpin = std::chrono::microseconds(50);  ///< the background thread's spin
  static constexpr auto kDeathCheck = std::chrono::milliseconds(20);
  static constexpr auto kPoll = std::chrono::milliseconds(500);

  Hub hub;
  std::vector<std::unique_ptr<Link>> links;  ///< by peer; null where there is no shm link
  std::thread thread;
  /// More ranks on this host (this rank and its shm peers) than processors this process may run
  /// on: a waiter then gives its core away at once when nothing is there (the rank it waits for
  /// may need that core), instead of spinning a while first.
  bool oversubscribed = false;

  /// Fails every link (from any thread); with close, peers see their sockets close.
  void fail_all(ErrorCode code, const std::string& why, bool close = true) {
    Completions done;
    {
      std::lock_guard lk(hub.mu);
      for (auto& l : links)
        if (l) l->fail(code, why, close, done);
    }
    hub.kick();
  }

  // ---- what DrivenEngine needs (the token held, except for wake_background) ----

  /// Drains every ring, writes what waits for room, runs at most one pull; every kDeathCheck
  /// also looks at the sockets (doorbells, a peer's EOF). True when anything moved.
  bool pass() {
    bool busy = false;
    std::optional<Pull> pull;
    Link* pull_link = nullptr;
    {
      Completions done;
      std::lock_guard lk(hub.mu);
      hub.kicked.store(false);
      for (auto& l : links) {
        if (!l) continue;
        busy = l->progress(done) || busy;
        if (!pull_link)
          if ((pull = l->take_pull())) pull_link = l.get();
      }
    }  // completions run here, after the lock
    if (pull_link) {
      const int err = pull_link->run_pull(*pull);
      Completions done;
      std::lock_guard lk(hub.mu);
      pull_link->finish_pull(std::move(*pull), err, done);
      busy = true;
    }
    // A busy driver still notices a dead peer: every kDeathCheck, looked at every 64 passes (a
    // clock read costs about as much as a pass).
    if (++passes_ % 64 == 0) {
      const auto now = Clock::now();
      if (now - last_check_ > kDeathCheck) {
        last_check_ = now;
        check_sockets(0);
      }
    }
    return busy;
  }
  /// Spins on lock-free peeks for a moment; gives the core away when nothing shows up: with more
  /// threads than cores (8 ranks on 2 cores) a plain spin would keep the rank that has to answer
  /// from running.
  template <class Ready>
  void spin_wait(const Ready& ready) const {
    for (int i = oversubscribed ? 64 : 0; i < 64; ++i) {
      if (work_visible() || ready()) return;
      cpu_relax();
    }
    ::sched_yield();
  }
  /// Announces sleep in every ring, makes one more pass (whatever came before the announcement),
  /// and blocks in poll() until `until` unless that pass found work or `ready()` holds (a
  /// mailbox writer rings the doorbell when it sees the reader's sleep flag, like a ring writer).
  template <class Ready>
  void sleep_until(Clock::time_point until, const Ready& ready) {
    {
      Completions done;
      std::lock_guard lk(hub.mu);
      hub.sleeping.store(1);
      bool work = false;
      for (auto& l : links)
        if (l) l->set_sleeping(true);
      for (auto& l : links)
        if (l) work = l->progress(done) || l->has_pull() || work;
      if (work || hub.kicked.load() || stop.load() || ready()) {
        hub.sleeping.store(0);
        for (auto& l : links)
          if (l) l->set_sleeping(false);
        return;
      }
    }
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(until - Clock::now());
    check_sockets(static_cast<int>(std::clamp<std::int64_t>(left.count(), 0, kPoll.count())), /*with_wake=*/true);
    std::lock_guard lk(hub.mu);
    hub.sleeping.store(0);
    for (auto& l : links)
      if (l) l->set_sleeping(false);
  }
  void wake_background() { hub.kick(); }
  /// Room for every link and the eventfd in the poll lists, so the first sleep allocates nothing.
  void reserve_polls() {
    fds_.reserve(links.size() + 1);
    who_.reserve(links.size() + 1);
  }

  // ---- the background thread ----

  void run() { run_passes(kSpin, kPoll); }

 private:
  /// Lock-free: input in a ring, or a kick.
  bool work_visible() const {
    if (hub.kicked.load(std::memory_order_relaxed)) return true;
    for (auto& l : links)
      if (l && l->has_input()) return true;
    return false;
  }

  /// Polls the link sockets (doorbells, EOF) for at most timeout_ms, plus the kick eventfd when
  /// sleeping.
  void check_sockets(int timeout_ms, bool with_wake = false) {
    fds_.clear();
    who_.clear();
    {
      std::lock_guard lk(hub.mu);
      if (with_wake) {
        fds_.push_back({hub.wake.get(), POLLIN, 0});
        who_.push_back(nullptr);
      }
      for (auto& l : links)
        if (l && l->poll_fd() >= 0) {
          fds_.push_back({l->poll_fd(), POLLIN, 0});
          who_.push_back(l.get());
        }
    }
    if (fds_.empty()) return;
    const int k = ::poll(fds_.data(), fds_.size(), timeout_ms);
    if (k <= 0) return;
    Completions done;
    std::lock_guard lk(hub.mu);
    for (std::size_t i = 0; i < fds_.size(); ++i) {
      if (!fds_[i].revents) continue;
      if (!who_[i]) {
        std::uint64_t v;
        [[maybe_unused]] auto r = ::read(hub.wake.get(), &v, sizeof v);
      } else {
        who_[i]->on_readable(done);
      }
    }
  }

  // Used by the token's holder only (reserved for every link at creation: reserve_polls()).
  std::vector<pollfd> fds_;
  std::vector<Link*> who_;
  Clock::time_point last_check_{};
  std::uint64_t passes_ = 0;  ///< passes made (the driver's, under the token)
};

}  // namespace detail

}  // namespace chorus::shm
