// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// sim::Executor: an exec::Executor whose copies and reductions move no bytes but charge the
/// virtual rank their time (bytes / the model's copy_rate or reduce_rate, sim/network.hpp), and
/// whose memory (the call's buffers, slots, work, staging) is one Arena: a PROT_NONE,
/// MAP_NORESERVE reservation that is never touched. Only sizes matter to the simulation; an
/// algorithm that read or wrote a byte itself would fault at once (it must not: scripts/check-layers).
/// With the model's `core_queues` (sim/network.hpp), copies and reductions queue for the cores
/// of the rank's host (CoreQueues, held by the Arena with the call's other shared state).

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "chorus/core/error.hpp"
#include "chorus/core/types.hpp"
#include "chorus/exec/executor.hpp"
#include "chorus/sim/engine.hpp"

namespace chorus::sim {

/// The cores of each pool (a host, or the machine where hosts share cores) as servers of compute:
/// each core keeps the intervals it is busy, and a piece of compute of d seconds that a rank
/// starts at its clock t takes the core that can fit [s, s + d) earliest, s >= t (a gap between
/// intervals booked earlier counts: ranks run in fiber order, not in virtual-time order, so a rank
/// behind another's clock still gets the core the other left free then). Deterministic: the same
/// order of requests gives the same intervals.
class CoreQueues {
 public:
  void clear() { pools_.clear(); }

  /// Books d seconds of compute on one of `cores` cores of `pool` from time t on; returns its end.
  double run(int pool, int cores, double t, double d) {
    if (!(d > 0)) return t;
    auto& p = pools_[pool];
    if (p.size() < static_cast<std::size_t>(cores)) p.resize(static_cast<std::size_t>(cores));
    std::size_t best = 0;
    double best_s = 0;
    for (std::size_t c = 0; c < p.size(); ++c) {
      const double s = fit(p[c], t, d);
      if (c == 0 || s < best_s) best = c, best_s = s;
    }
    p[best].emplace(best_s, best_s + d);
    return best_s + d;
  }

 private:
  using Busy = std::map<double, double>;  ///< start -> end, disjoint

  static double fit(const Busy& b, double t, double d) {
    auto it = b.upper_bound(t);
    double s = t;
    if (it != b.begin()) s = std::max(s, std::prev(it)->second);
    for (; it != b.end() && it->first < s + d; ++it) s = std::max(s, it->second);
    return s;
  }

  std::map<int, std::vector<Busy>> pools_;
};

/// Address space for the simulated buffers: kAreas areas of `area` bytes each, reserved, never
/// backed (PROT_NONE, MAP_NORESERVE): in, out, slots, work, stage. Shared by every rank.
class Arena {
 public:
  enum Area { in = 0, out, slots, work, stage, kAreas };

  explicit Arena(std::size_t area = std::size_t(64) << 30) : area_(area) {
    base_ = ::mmap(nullptr, area_ * kAreas, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base_ == MAP_FAILED)
      throw Error(ErrorCode::system, "sim: reserving " + std::to_string(area_ * kAreas) +
                                         " bytes of address space failed: " + std::strerror(errno));
  }
  ~Arena() { ::munmap(base_, area_ * kAreas); }
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  /// The start of area `a`, for `n` bytes (throws when n does not fit).
  std::byte* at(Area a, std::size_t n) const {
    if (n > area_)
      throw Error(ErrorCode::invalid_argument,
                  "sim: " + std::to_string(n) + " bytes exceed the arena's area of " + std::to_string(area_));
    handed_[a] = n;
    if (a == in) {  // a call asks for its input first (sim/collective.hpp): a new call
      handed_[out] = 0;
      cores_.clear();
    }
    return static_cast<std::byte*>(base_) + area_ * static_cast<std::size_t>(a);
  }
  /// The size of the last `at(a, n)`: n.
  std::size_t handed(Area a) const { return handed_[a]; }
  /// The cores of the current call (cleared when a call asks for its input).
  CoreQueues& cores() const { return cores_; }

 private:
  std::size_t area_;
  void* base_;
  mutable std::size_t handed_[kAreas] = {};
  mutable CoreQueues cores_;
};

class Executor final : public exec::Executor {
 public:
  /// The call's working set (its input and output per rank, as the arena handed them out) sets
  /// the engine's memory tier for the call (NetworkModel::effective).
  Executor(Engine& e, int rank, const Arena& arena) : exec::Executor(MemoryKind::host), e_(e), rank_(rank), arena_(arena) {
    e_.set_call_bytes(std::max(arena_.handed(Arena::in), arena_.handed(Arena::out)));
  }

  void copy(std::byte* dst, const std::byte* src, std::size_t n) override {
    if (dst != src) compute(static_cast<double>(n) / e_.model().copy_rate);
  }
  void reduce(ReduceOp, DataType dt, std::byte*, const std::byte*, const std::byte*, std::size_t count) override {
    compute(static_cast<double>(count * size_of(dt)) / e_.model().reduce_rate);
  }
  void reduce_many(ReduceOp, DataType dt, std::byte*, const std::byte* const*, int n, std::size_t count) override {
    if (n < 2 || n > chorus::kMaxReduceInputs)
      throw Error(ErrorCode::invalid_argument, "sim: reduce_many of " + std::to_string(n) + " inputs");
    compute(static_cast<double>(n - 1) * static_cast<double>(count * size_of(dt)) / e_.model().reduce_rate);
  }
  void finalize_avg(DataType dt, std::byte*, std::size_t count, int) override {
    compute(static_cast<double>(count * size_of(dt)) / e_.model().reduce_rate);
  }
  std::byte* slots(std::size_t n) override { return arena_.at(Arena::slots, n); }
  std::byte* work(std::size_t n) override { return arena_.at(Arena::work, n); }
  std::byte* stage(std::size_t n) override { return arena_.at(Arena::stage, n); }
  void download(std::byte*, const std::byte*, std::size_t n) override {
    compute(static_cast<double>(n) / e_.model().copy_rate);
  }
  void upload(std::byte*, const std::byte*, std::size_t n) override {
    compute(static_cast<double>(n) / e_.model().copy_rate);
  }
  void end_call() override {}
  std::size_t bytes() const override { return 0; }

 private:
  /// Charges `seconds` of compute to the rank: at once, or queued for a core of its pool.
  void compute(double seconds) {
    const NetworkModel& m = e_.model();
    const Layout& l = e_.layout();
    if (!m.queues_for_cores(l.hosts, l.ranks_per_host)) {
      e_.charge(rank_, seconds);
      return;
    }
    const double t = e_.clock(rank_);
    const int pool = m.hosts_share_cores ? 0 : l.host_of(rank_);
    const int cores = std::max(1, static_cast<int>(m.cores + 0.5));
    e_.charge(rank_, arena_.cores().run(pool, cores, t, seconds) - t);
  }

  Engine& e_;
  int rank_;
  const Arena& arena_;
};

}  // namespace chorus::sim
