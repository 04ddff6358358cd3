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
///   `rank_us` of a core;
/// - its store requests, as the code makes them (the rendezvous, then `gathers` all-gathers of
///   bootstrap/store_gather.hpp: a rank sets its value and reads rank 0's list; rank 0 reads every
///   other rank's value in turn and sets the list), `request_us` of a core each;
/// - MemoryStore's one condition variable: a set wakes every thread blocked in a wait, whether
///   its key came or not; each wake-up is `wake_us` of a core (the herd: n sets with n ranks
///   waiting are n² wake-ups, the term that decides at many ranks).
///
/// shrink() after one rank's abort(): every survivor tears its communicator down (`teardown_us`),
/// then the agreement of impl/standby.hpp's shared-store form (add "arrivals", set "join/<r>"; the
/// first to arrive waits for every join in turn and sets "decision", the others read it), then the
/// shrunk communicator's creation as above with n - 1 ranks.
///
/// Cores: the work in hand shares them alike (processor sharing, as the kernel's fair scheduler
/// gives threads that are runnable together): k items progress at min(1, cores / k) each. A herd
/// of w wake-ups is w items of `wake_us`.
/// Deterministic: the same parameters give the same times.

#include <algorithm>
#include <cstdint>
#include <functional>
#include <queue>
#include <stdexcept>
#include <vector>

namespace chorus::sim::startup {

struct Params {
  int cores = 2;
  double rank_us = 0;      ///< a rank's own creation work
  double request_us = 0;   ///< a store request's CPU (the caller's side; the store is in-process)
  double wake_us = 0;      ///< one thread woken by a set and checking its keys
  double teardown_us = 0;  ///< a rank's communicator torn down at the start of shrink
  int gathers = 0;         ///< the all-gathers of creation (beside the rendezvous)
  int extra_requests = 0;  ///< a rank's other requests at creation (sets of keys nobody waits on)
};

/// The requests a run made, counted as the code makes them (to check against the store's own count).
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
  enum Kind : std::uint8_t { cpu, set, get, add } kind;
  double us = 0;  ///< cpu: the work
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
    for (std::size_t r = 0; r < n; ++r) advance(static_cast<int>(r));
    while (!work_.empty()) {
      const Item it = work_.top();
      work_.pop();
      // The cores are shared alike by the work in hand: k items progress at min(1, cores / k) each.
      const double k = static_cast<double>(work_.size() + 1);
      now_ += (it.done - served_) / std::min(1.0, static_cast<double>(std::max(1, p_.cores)) / k);
      served_ = it.done;
      if (it.rank >= 0) advance(it.rank);
    }
    for (std::size_t r = 0; r < n; ++r)
      if (pc_[r] != scripts_[r].size())
        throw std::logic_error("startup model: a rank never finished its script");
    return end_;
  }

 private:
  /// CPU work in hand: it ends when the service every item has had reaches `done`.
  struct Item {
    double done;
    std::uint64_t seq;
    int rank;  ///< goes on when it ends; -1: none (a woken thread that waits again)
    bool operator>(const Item& o) const { return done != o.done ? done > o.done : seq > o.seq; }
  };

  void cpu(int rank, double us) { work_.push({served_ + us, seq_++, rank}); }

  /// Rank `r` goes on from its current step (its previous one done at now_).
  void advance(int r) {
    auto& script = scripts_[static_cast<std::size_t>(r)];
    auto& pc = pc_[static_cast<std::size_t>(r)];
    end_[static_cast<std::size_t>(r)] = now_;
    if (pc >= script.size()) return;
    const Step& s = script[pc];
    switch (s.kind) {
      case Step::cpu:
        ++pc;
        cpu(r, s.us);
        return;
      case Step::set:
      case Step::add:
        ++pc;
        ++counts_->requests;
        keys_[static_cast<std::size_t>(s.key)] = true;
        herd();
        cpu(r, p_.request_us);
        return;
      case Step::get:
        if (!keys_[static_cast<std::size_t>(s.key)]) {
          waiting_.push_back(r);  // woken by the next set (every set wakes every waiter)
          return;
        }
        ++pc;
        ++counts_->requests;
        cpu(r, p_.request_us);
        return;
    }
  }

  /// A set: every rank blocked in a wait is woken and checks its key (`wake_us` of a core each);
  /// those whose key came go on after their wake-up, the others wait again.
  void herd() {
    std::vector<int> woken;
    woken.swap(waiting_);
    for (int w : woken) {
      ++counts_->wakeups;
      const Step& s = scripts_[static_cast<std::size_t>(w)][pc_[static_cast<std::size_t>(w)]];
      if (keys_[static_cast<std::size_t>(s.key)]) {
        cpu(w, p_.wake_us);  // then it goes on: its get is charged as it advances
      } else {
        cpu(-1, p_.wake_us);
        waiting_.push_back(w);
      }
    }
  }

  Params p_;
  std::vector<std::vector<Step>> scripts_;
  std::vector<bool> keys_;
  std::vector<std::size_t> pc_;
  std::vector<double> end_;
  std::vector<int> waiting_;
  std::priority_queue<Item, std::vector<Item>, std::greater<>> work_;
  double now_ = 0;     ///< virtual time, us
  double served_ = 0;  ///< the service each item in hand has had since time 0, us
  std::uint64_t seq_ = 0;
  Counts* counts_ = nullptr;
};

/// Keys are numbered by the caller; this hands them out.
struct Keys {
  int next = 0;
  int make() { return next++; }
};

/// Appends creation's steps for `n` ranks (one script each) to `scripts`; `keys` numbers the keys.
inline void creation(const Params& p, int n, std::vector<std::vector<Step>>& scripts, Keys& keys) {
  const int nonce = keys.make();
  std::vector<int> mine, list;
  for (int g = 0; g < p.gathers; ++g) {
    list.push_back(keys.make());
    for (int r = 0; r < n; ++r) mine.push_back(keys.make());
  }
  for (int r = 0; r < n; ++r) {
    auto& s = scripts[static_cast<std::size_t>(r)];
    s.push_back({Step::cpu, p.rank_us, -1});
    s.push_back({Step::add, 0, keys.make()});  // the rendezvous's generation counter
    if (r == 0) {
      s.push_back({Step::set, 0, keys.make()});  // world size
      s.push_back({Step::set, 0, nonce});
    } else {
      s.push_back({Step::get, 0, nonce});
      s.push_back({Step::get, 0, nonce});  // (world size: set before the nonce)
    }
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
    s.push_back({detail::Step::cpu, p.teardown_us, -1});
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
