// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// A model of a communicator's creation and of shrink() at many ranks, in virtual time
/// (sim/sim_startup.cpp; docs/performance.md, "Start-up and shrink, simulated").
///
/// What it models is what `startup_perf --threads N` measures: N ranks as threads of one process
/// over tcp loopback with links made on first use, meeting in one MemoryStore, on `cores` cores.
/// Creation makes no connection there; its time is CPU work and the store:
///
/// - every rank's own set-up (its transport's sockets and threads, the communicator's state):
///   `rank_us` of a core, and per peer (a tcp Link per peer, connected or not) `link_cached_us`
///   while the process's links (n (n - 1) x `link_bytes`) fit `cache_bytes`, rising to `link_us`
///   at twice it (the allocator's new pages and the cache misses of a footprint that grows as n²); after the
///   all-gathers `link_after_us` per peer (the failure watch posts a notice receive on every link);
/// - its store requests, as the code makes them (the rendezvous, then `gathers` all-gathers of
///   bootstrap/store_gather.hpp: a rank sets its value and reads rank 0's list; rank 0 reads every
///   other rank's value in turn and sets the list), `request_us` of a core each;
/// - MemoryStore's one condition variable: a set wakes every thread blocked in a wait, whether
///   its key came or not; each wake-up is `wake_us` of a core (the herd: n sets with n ranks
///   waiting are n² wake-ups, the term that decides at many ranks).
///
/// shrink() after one rank's abort(): every survivor tears its communicator down (waits
/// `teardown_wait_us`, no CPU: its threads noticing the end; then `teardown_us` of a core, and
/// `link_teardown_us` per peer),
/// then the agreement of impl/standby.hpp's shared-store form (add "arrivals", set "join/<r>"; the
/// first to arrive waits for every join in turn and sets "decision", the others read it), then the
/// shrunk communicator's creation as above with n - 1 ranks.
///
/// Cores: as the kernel runs threads of one real-time priority under round robin (the
/// measurements run under `chrt -r 1`; its 100 ms slice is longer than any piece of work here): a
/// thread keeps its core until it blocks or ends; runnable threads wait for a core in the order
/// they became runnable, woken ones at the back.
/// Deterministic: the same parameters give the same times.

#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <queue>
#include <stdexcept>
#include <vector>

namespace chorus::sim::startup {

struct Params {
  int cores = 2;
  double start_wait_us = 0;     ///< what a rank's creation waits before its work (no CPU)
  double rank_us = 0;           ///< a rank's own creation work
  double link_us = 0;           ///< ... and per peer (a tcp Link per peer, connected or not), where the
                                ///< process's links outgrow the cache (below: link_cached_us)
  double link_cached_us = 0;    ///< ... where they fit it
  double link_after_us = 0;     ///< per peer after the all-gathers (the notice receive on every link)
  double link_bytes = 0;        ///< the memory a link takes (its objects and what they allocate)
  double cache_bytes = 0;       ///< the machine's last-level cache
  double request_us = 0;        ///< a store request's CPU (the caller's side; the store is in-process)
  double wake_us = 0;           ///< one thread woken by a set and checking its keys
  double teardown_us = 0;       ///< a rank's communicator torn down at the start of shrink
  double link_teardown_us = 0;  ///< ... and per peer
  double teardown_wait_us = 0;  ///< ... and waited (no CPU: its threads noticing the end)
  int gathers = 0;         ///< the all-gathers of creation (beside the rendezvous)
  int extra_requests = 0;  ///< a rank's other requests at creation (sets of keys nobody waits on)
};

/// What a run did: the store requests it made (as the code makes them) and the threads a set woke.
struct Counts {
  long requests = 0;
  long wakeups = 0;
};

struct Result {
  double create_ms = 0;  ///< the slowest rank's creation
  double shrink_ms = 0;  ///< the slowest survivor's shrink (0 when not run)
  Counts create, shrink;
};

namespace detail {

/// One step of a rank's script.
struct Step {
  enum Kind : std::uint8_t { cpu, delay, set, get, add } kind;
  double us = 0;  ///< cpu: the work; delay: the wait
  int key = -1;   ///< set, get: the key (get blocks until it is set); add: the counter
};

class Engine {
 public:
  Engine(const Params& p, int ranks, int keys)
      : p_(p), scripts_(static_cast<std::size_t>(ranks)), keys_(static_cast<std::size_t>(keys)) {}

  std::vector<std::vector<Step>>& scripts() { return scripts_; }

  /// Runs every script from time 0 (virtual us); returns each rank's end time.
  std::vector<double> run(Counts& counts) {
    const std::size_t n = scripts_.size();
    pc_.assign(n, 0);
    end_.assign(n, 0.0);
    counts_ = &counts;
    cores_.assign(static_cast<std::size_t>(std::max(1, p_.cores)), -1);
    for (std::size_t r = 0; r < n; ++r)
      ready_.push_back({static_cast<int>(r), 0.0});  // started in rank order
    dispatch();
    while (!events_.empty()) {
      const Event e = events_.top();
      events_.pop();
      now_ = e.t;
      if (e.core < 0)
        ready_.push_back({e.rank, 0.0});  // a delay ended: the rank is runnable again
      else
        go_on(e.core, e.rank);  // its work (or its wake-up) ended: it goes on
      dispatch();
    }
    for (std::size_t r = 0; r < n; ++r)
      if (pc_[r] != scripts_[r].size())
        throw std::logic_error("startup model: a rank never finished its script");
    return end_;
  }

 private:
  struct Event {
    double t;
    std::uint64_t seq;
    int core;  ///< the core whose work ends (-1: a rank's delay ends)
    int rank;
    bool operator>(const Event& o) const { return t != o.t ? t > o.t : seq > o.seq; }
  };
  struct Ready {
    int rank;
    double first_us;  ///< CPU it spends before its step (a woken thread's wake-up)
  };

  /// Idle cores take runnable ranks in the order they became runnable.
  void dispatch() {
    for (std::size_t c = 0; c < cores_.size() && !ready_.empty(); ++c) {
      if (cores_[c] >= 0) continue;
      const Ready r = ready_.front();
      ready_.pop_front();
      cores_[c] = r.rank;
      if (r.first_us > 0)
        events_.push({now_ + r.first_us, seq_++, static_cast<int>(c), r.rank});
      else
        go_on(static_cast<int>(c), r.rank);
    }
  }

  /// Rank `r`, on core `c`, goes on from its current step until it spends CPU (an event ends it),
  /// blocks, waits or ends (the core is then idle).
  void go_on(int c, int r) {
    auto& script = scripts_[static_cast<std::size_t>(r)];
    auto& pc = pc_[static_cast<std::size_t>(r)];
    end_[static_cast<std::size_t>(r)] = now_;
    auto busy = [&](double us) { events_.push({now_ + us, seq_++, c, r}); };
    if (pc >= script.size()) {
      cores_[static_cast<std::size_t>(c)] = -1;
      return;
    }
    const Step& s = script[pc];
    switch (s.kind) {
      case Step::cpu:
        ++pc;
        return busy(s.us);
      case Step::delay:
        ++pc;
        cores_[static_cast<std::size_t>(c)] = -1;
        events_.push({now_ + s.us, seq_++, -1, r});
        return;
      case Step::set:
      case Step::add:
        ++pc;
        ++counts_->requests;
        keys_[static_cast<std::size_t>(s.key)] = true;
        herd();
        return busy(p_.request_us);
      case Step::get:
        if (!keys_[static_cast<std::size_t>(s.key)]) {  // it waits; the next set wakes it
          waiting_.push_back(r);
          cores_[static_cast<std::size_t>(c)] = -1;
          return;
        }
        ++pc;
        ++counts_->requests;
        return busy(p_.request_us);
    }
  }

  /// A set: every thread blocked in a wait is runnable again (MemoryStore's one condition
  /// variable); each, when it runs, spends `wake_us` and looks at its key (and waits again if
  /// it has not come).
  void herd() {
    for (int w : waiting_) {
      ++counts_->wakeups;
      ready_.push_back({w, p_.wake_us});
    }
    waiting_.clear();
  }

  Params p_;
  std::vector<std::vector<Step>> scripts_;
  std::vector<bool> keys_;
  std::vector<std::size_t> pc_;
  std::vector<double> end_;
  std::vector<int> waiting_;
  std::vector<int> cores_;  ///< the rank each core runs (-1: idle)
  std::deque<Ready> ready_;
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events_;
  double now_ = 0;  ///< virtual time, us
  std::uint64_t seq_ = 0;
  Counts* counts_ = nullptr;
};

/// Keys are numbered by the caller; this hands them out.
struct Keys {
  int next = 0;
  int make() { return next++; }
};

/// Appends creation's steps for `n` ranks (one script each) to `scripts`; `keys` numbers the keys.
/// A link's creation work, at `n` ranks in one process (n (n - 1) links there).
inline double link_cost(const Params& p, int n) {
  const double footprint = static_cast<double>(n) * (n - 1) * p.link_bytes;
  // From the cache's size to twice it, a growing share of the links' memory is outside it.
  const double outside = p.cache_bytes > 0 ? std::clamp(footprint / p.cache_bytes - 1, 0.0, 1.0) : 1.0;
  return p.link_cached_us + (p.link_us - p.link_cached_us) * outside;
}

inline void creation(const Params& p, int n, std::vector<std::vector<Step>>& scripts, Keys& keys) {
  const int nonce = keys.make();
  std::vector<int> mine, list;
  for (int g = 0; g < p.gathers; ++g) {
    list.push_back(keys.make());
    for (int r = 0; r < n; ++r) mine.push_back(keys.make());
  }
  for (int r = 0; r < n; ++r) {
    auto& s = scripts[static_cast<std::size_t>(r)];
    // The rendezvous (bootstrap/impl/rendezvous.hpp), then the transport and the state: their
    // work, then the layout's all-gathers.
    if (p.start_wait_us > 0) s.push_back({Step::delay, p.start_wait_us, -1});
    s.push_back({Step::add, 0, keys.make()});  // the rendezvous's generation counter
    if (r == 0) {
      s.push_back({Step::set, 0, keys.make()});  // world size
      s.push_back({Step::set, 0, nonce});
    } else {
      s.push_back({Step::get, 0, nonce});
      s.push_back({Step::get, 0, nonce});  // (world size: set before the nonce)
    }
    s.push_back({Step::cpu, p.rank_us + link_cost(p, n) * (n - 1), -1});
    for (int e = 0; e < p.extra_requests; ++e) s.push_back({Step::set, 0, keys.make()});
    if (n == 1) continue;
    for (int g = 0; g < p.gathers; ++g) {
      const auto at = [&](int q) { return mine[static_cast<std::size_t>(g * n + q)]; };
      if (r == 0) {
        for (int q = 1; q < n; ++q) s.push_back({Step::get, 0, at(q)});
        s.push_back({Step::set, 0, list[static_cast<std::size_t>(g)]});
      } else {
        s.push_back({Step::set, 0, at(r)});
        s.push_back({Step::get, 0, list[static_cast<std::size_t>(g)]});
      }
    }
    // Then the failure watch's notice receive on every link (diag/), and the rest of the state.
    s.push_back({Step::cpu, p.link_after_us * (n - 1), -1});
  }
}

}  // namespace detail

/// Creation of `n` ranks and, with `shrink`, a shrink after one rank's abort (n - 1 survivors).
inline Result simulate(const Params& p, int n, bool shrink) {
  Result res;
  {
    detail::Keys keys;
    std::vector<std::vector<detail::Step>> scripts(static_cast<std::size_t>(n));
    detail::creation(p, n, scripts, keys);
    detail::Engine e(p, n, keys.next);
    e.scripts() = std::move(scripts);
    const auto end = e.run(res.create);
    res.create_ms = *std::max_element(end.begin(), end.end()) / 1000.0;
  }
  if (!shrink || n < 3) return res;
  const int m = n - 1;
  detail::Keys keys;
  std::vector<std::vector<detail::Step>> scripts(static_cast<std::size_t>(m));
  const int arrivals = keys.make(), decision = keys.make();
  std::vector<int> join(static_cast<std::size_t>(m));
  for (int& k : join) k = keys.make();
  for (int r = 0; r < m; ++r) {
    auto& s = scripts[static_cast<std::size_t>(r)];
    s.push_back({detail::Step::delay, p.teardown_wait_us, -1});
    s.push_back({detail::Step::cpu, p.teardown_us + p.link_teardown_us * (n - 1), -1});
    s.push_back({detail::Step::add, 0, arrivals});
    s.push_back({detail::Step::set, 0, join[static_cast<std::size_t>(r)]});
    if (r == 0) {  // the first to arrive coordinates: rank 0 of the survivors here
      for (int q = 1; q < m; ++q) {
        s.push_back({detail::Step::get, 0, join[static_cast<std::size_t>(q)]});  // its wait
        s.push_back({detail::Step::get, 0, join[static_cast<std::size_t>(q)]});  // and its read
      }
      s.push_back({detail::Step::set, 0, decision});
    } else {
      s.push_back({detail::Step::get, 0, decision});
    }
  }
  std::vector<std::vector<detail::Step>> created(static_cast<std::size_t>(m));
  detail::creation(p, m, created, keys);
  for (int r = 0; r < m; ++r) {
    auto& s = scripts[static_cast<std::size_t>(r)];
    auto& c = created[static_cast<std::size_t>(r)];
    s.insert(s.end(), c.begin(), c.end());
  }
  detail::Engine e(p, m, keys.next);
  e.scripts() = std::move(scripts);
  const auto end = e.run(res.shrink);
  res.shrink_ms = *std::max_element(end.begin(), end.end()) / 1000.0;
  return res;
}

}  // namespace chorus::sim::startup
