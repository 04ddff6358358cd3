// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// The progress model every transport engine shares (the contract is in core/concepts.hpp).
///
/// A thread that waits for a request drives the request's engine itself: it polls the links for a
/// bounded spin (ProgressPolicy::spin(), CHORUS_SPIN_US), then sleeps in the engine's one wait
/// that covers every link (shm: poll() on the link sockets and the engine's eventfd; tcp: the
/// Asio reactor's epoll), and goes on polling when that wait returns, until its request is done
/// or its deadline passes. So a blocking call costs no thread hop: the bytes are read, reduced
/// and answered by the thread that needs them.
///
/// One thread at a time drives an engine: it holds the engine's DriveToken. The engine's
/// background thread makes progress only for work nobody waits on (async work whose requests
/// nobody waits for yet, a peer's death, a peer waiting for room in a ring): it parks while any
/// caller drives and for ProgressPolicy::kHandover after the last one left, so in a loop of calls
/// it never competes with the callers for the cores. A caller that finds the background thread
/// holding the token wakes it (Engine::wake_background) and takes the token from it.
///
/// An engine provides, for drive():
///   bool pass();                           one non-blocking pass over every link (token held);
///                                          true when anything moved
///   void spin_wait(const Ready& ready);    a short pause between passes while spinning (may end
///                                          early when work becomes visible or ready() holds)
///   void sleep_until(Clock::time_point, const Ready& ready);
///                                          the one wait that covers every link (token held); it
///                                          does not block when ready() holds once the engine has
///                                          announced that it sleeps (a wake-up for a condition
///                                          that is not a request: a mailbox, shm/detail/segment.hpp)
///   void wake_background();                makes a background thread that holds the token let go
/// and derives from DrivenEngine<Engine>, which does the rest.

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <string>

#include "chorus/core/request.hpp"
#include "chorus/detail/env.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace chorus::detail {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

struct ProgressPolicy {
  using Clock = std::chrono::steady_clock;
  /// How long a waiting thread polls its links before it sleeps, unless CHORUS_SPIN_US says
  /// otherwise. Each empty round of the spin yields the core (sched_yield), so with more ranks
  /// than cores the rank that has to answer still runs.
  static constexpr std::chrono::microseconds kDefaultSpin{50};
  static constexpr std::int64_t kMaxSpinUs = 10'000'000;
  /// The background thread leaves the links to the callers until none has driven for this long.
  static constexpr std::chrono::milliseconds kHandover{2};
  /// How long the background thread parks at a time while a caller drives.
  static constexpr std::chrono::milliseconds kBusyPark{20};
  /// The longest single sleep of a driver (it re-checks its deadline and the engine after it).
  static constexpr std::chrono::milliseconds kMaxSleep{500};

  /// CHORUS_SPIN_US (0 .. 10^7 microseconds; 0 sleeps at once), read once per process.
  static std::chrono::microseconds spin() {
    static const std::chrono::microseconds v{env_int("CHORUS_SPIN_US", 0, kMaxSpinUs).value_or(kDefaultSpin.count())};
    return v;
  }
};

/// Who may drive an engine now, and where its background thread parks.
/// Not re-entrant: completion callbacks (RequestState::then) run on the driver with the token
/// held, so they must not wait for a request of the same engine (none does today); test() and
/// the links check held_here() first.
class DriveToken {
 public:
  using Clock = std::chrono::steady_clock;

  /// A caller inside drive(): counted from before it asks for the token until it has let go.
  class Caller {
   public:
    explicit Caller(DriveToken& t) : t_(t) { t_.callers_.fetch_add(1, std::memory_order_seq_cst); }
    ~Caller() {
      // A new value tells the background thread that a caller was here (no clock read: this
      // runs once per wait). Racing callers may store the same value; any change is enough.
      t_.left_gen_.store(t_.left_gen_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
      // The last caller out wakes a background thread parked for kBusyPark, so that it takes
      // the links over kHandover from now, not up to kBusyPark later: a rank of the hybrid
      // transport that goes on to wait on another engine (shm) drives this one (tcp) no more,
      // and a peer's request-to-send here would wait for the park to end.
      // Only where set_hand_over_on_leave() asked for it: elsewhere the caller that leaves is
      // back in a moment, and a background thread woken each time competes for the cores
      // (4 shm ranks on 2 cores, 8 B: 9.3 us against 5.5).
      if (t_.callers_.fetch_sub(1, std::memory_order_seq_cst) == 1 && t_.hand_over_on_leave_.load(std::memory_order_relaxed) &&
          t_.busy_parked_.load(std::memory_order_seq_cst))
        t_.nudge();
    }
    Caller(const Caller&) = delete;
    Caller& operator=(const Caller&) = delete;

   private:
    DriveToken& t_;
  };

  /// Takes the token if it is free (never call it while holding it: held_here()).
  bool try_acquire() {
    if (!mu_.try_lock()) return false;
    owner_.store(std::this_thread::get_id(), std::memory_order_relaxed);
    return true;
  }
  void release() {
    owner_.store(std::thread::id(), std::memory_order_relaxed);
    mu_.unlock();
  }
  /// True on the thread that holds the token (a completion callback run by a driver).
  bool held_here() const { return owner_.load(std::memory_order_relaxed) == std::this_thread::get_id(); }

  /// Background side (its thread only): true when no caller drives and none has left since the
  /// background thread first saw the present state, at least kHandover ago (so between kHandover
  /// and about twice that after the last caller left, the background thread parking kHandover
  /// between looks).
  bool background_may_run() {
    if (callers_.load(std::memory_order_seq_cst) != 0) return false;
    const auto gen = left_gen_.load(std::memory_order_relaxed);
    const auto now = Clock::now();
    if (gen != seen_gen_ || seen_at_ == Clock::time_point{}) {
      seen_gen_ = gen;
      seen_at_ = now;
      return false;
    }
    return now - seen_at_ >= ProgressPolicy::kHandover;
  }
  bool callers_waiting() const { return callers_.load(std::memory_order_seq_cst) != 0; }
  /// Set by the background thread while it holds the token (a caller then wakes it).
  void set_background_holds(bool on) { background_holds_.store(on, std::memory_order_seq_cst); }
  bool background_holds() const { return background_holds_.load(std::memory_order_seq_cst); }

  /// The background thread waits until unpark(), or for a while: kHandover once the callers
  /// have left, kBusyPark while one drives (which may last: a caller sleeping on a slow peer).
  /// With set_hand_over_on_leave(true), the last caller to leave ends a kBusyPark early (Caller's
  /// destructor): the background thread then looks again, and takes over kHandover later if no
  /// caller came back.
  /// True when the park ended early (nudge(), unpark(), or a caller that left as it began),
  /// false when it ran its time.
  bool park() {
    std::unique_lock lk(park_mu_);
    if (unparked_) return true;
    const bool busy = callers_waiting();
    const auto d = busy ? ProgressPolicy::kBusyPark : ProgressPolicy::kHandover;
    const std::uint64_t nudges = nudges_;
    busy_parked_.store(busy, std::memory_order_seq_cst);
    // A caller that left between callers_waiting() and the store above did not see the flag:
    // look again before sleeping the long park.
    bool early = true;
    if (!busy || callers_waiting())
      early = park_cv_.wait_for(lk, std::chrono::duration_cast<std::chrono::microseconds>(d),
                                [&] { return unparked_ || nudges_ != nudges; });
    busy_parked_.store(false, std::memory_order_seq_cst);
    return early;
  }
  /// The background thread is in a kBusyPark (or about to sleep it, holding the park's lock).
  bool busy_parked() const { return busy_parked_.load(std::memory_order_seq_cst); }
  /// Whether the last caller to leave ends a kBusyPark (Caller's destructor): for an engine that
  /// serves some of a rank's peers while another engine serves the rest (transport/hybrid).
  void set_hand_over_on_leave(bool on) { hand_over_on_leave_.store(on, std::memory_order_relaxed); }

  /// Ends the present park (the background thread looks again).
  void nudge() {
    {
      std::lock_guard lk(park_mu_);
      ++nudges_;
    }
    park_cv_.notify_all();
  }
  /// Ends every park for good (the engine stops).
  void unpark() {
    {
      std::lock_guard lk(park_mu_);
      unparked_ = true;
    }
    park_cv_.notify_all();
  }

 private:
  std::mutex mu_;  ///< the token itself
  std::atomic<std::thread::id> owner_{};
  std::atomic<int> callers_{0};
  std::atomic<std::uint64_t> left_gen_{0};  ///< changed by every caller that leaves drive()
  std::uint64_t seen_gen_ = 0;               ///< background thread: left_gen_ when it last looked
  Clock::time_point seen_at_{};              ///< ... and since when it has been the same
  std::atomic<bool> background_holds_{false};
  std::mutex park_mu_;
  std::condition_variable park_cv_;
  bool unparked_ = false;
  std::uint64_t nudges_ = 0;              ///< nudge()s so far (under park_mu_)
  std::atomic<bool> busy_parked_{false};  ///< the background thread is in (or entering) a kBusyPark
  std::atomic<bool> hand_over_on_leave_{false};
};

/// The Driver every engine is (CRTP): the token, the stop flag, drive(), poll() and the
/// background thread's loop, written once. `Engine` provides what the file comment lists.
template <class Engine>
class DrivenEngine : public Driver {
 public:
  /// A CHORUS_SPIN_US that does not parse fails here, when the transport is created.
  DrivenEngine() { (void)ProgressPolicy::spin(); }

  void drive(const RequestState& r, Clock::time_point deadline) final {
    drive_while([&r] { return r.done(); },
                // Another caller drives: its passes complete this request too. Look again
                // shortly, since it leaves once its own request is done.
                [&r](Clock::time_point t) { r.settle_until(t); }, deadline);
  }

  void drive_until(bool (*ready)(const void*), const void* ctx, Clock::time_point deadline) final {
    drive_while([ready, ctx] { return ready(ctx); },
                [](Clock::time_point) {
                  cpu_relax();
                  ::sched_yield();
                },
                deadline);
  }

  /// One pass for Request::test(), when the token is free.
  void poll() final {
    if (stopped() || token.held_here() || !token.try_acquire()) return;
    self().pass();
    token.release();
  }

  /// A request timed out: every link fails (the waiter throws timeout; nothing is written to its
  /// buffer afterwards).
  void on_timeout(const Error& e) final {
    self().fail_all(ErrorCode::peer_failure, std::string("aborted after a timeout: ") + e.what());
  }

  bool stopped() const { return stop.load(std::memory_order_relaxed); }

  /// What the engine does when its transport goes, before `stop` is set (EngineTransport,
  /// transport/shell.hpp): nothing, unless the engine hides this with its own.
  void on_stop() {}

 private:
  /// Drives until `ready()` or `deadline` (or the engine stops). `settle(t)`: how to wait, until
  /// at most t, while another caller holds the token.
  template <class Ready, class Settle>
  void drive_while(const Ready& ready, const Settle& settle, Clock::time_point deadline) {
    Engine& e = self();
    DriveToken::Caller in(token);
    bool woke = false;
    while (!token.try_acquire()) {
      if (ready() || stopped() || Clock::now() >= deadline) return;
      if (token.background_holds()) {
        if (!woke) e.wake_background();
        woke = true;
        cpu_relax();
        ::sched_yield();
      } else {
        settle(std::min(deadline, Clock::now() + std::chrono::microseconds(100)));
      }
    }
    struct Release {
      DriveToken& t;
      ~Release() { t.release(); }
    } release{token};
    const auto spin = ProgressPolicy::spin();
    // The first kFreeRounds empty passes of a spin read no clock (a clock read costs about as
    // much as a pass): most waits on a live peer end within them. While passes move bytes, the
    // deadline is looked at every kBusyRounds passes.
    constexpr int kFreeRounds = 4;
    constexpr unsigned kBusyRounds = 64;
    const int free_rounds = spin.count() > 0 ? kFreeRounds : 0;
    int idle = 0;  ///< empty passes since the last that moved (counting stops at free_rounds + 1)
    unsigned busy = 0;
    Clock::time_point spin_end{};
    for (;;) {
      if (ready() || stopped()) return;
      const bool moved = e.pass();
      if (ready()) return;
      if (moved) {
        idle = 0;
        if (++busy % kBusyRounds == 0 && Clock::now() >= deadline) return;
        continue;
      }
      if (idle < free_rounds) {
        ++idle;
        e.spin_wait(ready);
        continue;
      }
      const auto now = Clock::now();
      if (now >= deadline) return;
      if (idle == free_rounds) {  // the spin's clock starts at its first clock read
        ++idle;
        spin_end = now + spin;
      }
      if (now < spin_end) {
        e.spin_wait(ready);
        continue;
      }
      e.sleep_until(std::min(deadline, now + ProgressPolicy::kMaxSleep), ready);
      idle = free_rounds;  // after a sleep the spin starts again, clock first
    }
  }

 public:
  DriveToken token;
  std::atomic<bool> stop{false};

 protected:
  /// The background thread's loop of a polling engine: passes while they move, spins for `spin`
  /// after the last one that moved, then sleeps (sleep_until) for at most `poll` at a time.
  void run_passes(std::chrono::microseconds spin, std::chrono::milliseconds poll) {
    Engine& e = self();
    auto last_active = Clock::now();
    const auto nothing = [] { return false; };
    run_background([&] {
      const auto now = Clock::now();
      if (e.pass()) {
        last_active = now;
      } else if (now - last_active < spin) {
        e.spin_wait(nothing);
      } else {
        e.sleep_until(now + poll, nothing);
        last_active = Clock::now();
      }
    });
  }

  /// The background thread's loop: it takes the token only when no caller has driven for
  /// kHandover, and repeats `step()` (a pass, a spin or a wait, each short or ended by
  /// wake_background) until a caller asks for the token or the engine stops.
  template <class Step>
  void run_background(Step step) {
    while (!stopped()) {
      if (!token.background_may_run() || !token.try_acquire()) {
        token.park();
        continue;
      }
      token.set_background_holds(true);
      while (!stopped() && !token.callers_waiting()) step();
      token.set_background_holds(false);
      token.release();
    }
  }

 private:
  Engine& self() { return static_cast<Engine&>(*this); }
};

}  // namespace chorus::detail
