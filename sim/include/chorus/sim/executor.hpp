// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// sim::Executor: an exec::Executor whose copies and reductions move no bytes but charge the
/// virtual rank their time (bytes / the model's copy_rate or reduce_rate, sim/network.hpp), and
/// whose memory (the call's buffers, slots, work, staging) is one Arena: a PROT_NONE,
/// MAP_NORESERVE reservation that is never touched. Only sizes matter to the simulation; an
/// algorithm that read or wrote a byte itself would fault at once (it must not: scripts/check-layers).
/// With the model's `core_queues` (sim/network.hpp), copies and reductions queue for the cores
/// of the rank's host (CoreQueues, sim/engine.hpp).

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "chorus/core/error.hpp"
#include "chorus/core/types.hpp"
#include "chorus/exec/executor.hpp"
#include "chorus/sim/engine.hpp"

namespace chorus::sim {

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
    if (a == in) handed_[out] = 0;  // a call asks for its input first (sim/collective.hpp): a new call
    return static_cast<std::byte*>(base_) + area_ * static_cast<std::size_t>(a);
  }
  /// The size of the last `at(a, n)`: n.
  std::size_t handed(Area a) const { return handed_[a]; }

 private:
  std::size_t area_;
  void* base_;
  mutable std::size_t handed_[kAreas] = {};
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
  void reduce(ReduceOp, DataType dt, std::byte* dst, const std::byte* a, const std::byte*, std::size_t count) override {
    compute(static_cast<double>(count * size_of(dt)) / reduce_rate(dst == a));
  }
  void reduce_many(ReduceOp, DataType dt, std::byte* dst, const std::byte* const* in, int n, std::size_t count) override {
    if (n < 2 || n > chorus::kMaxReduceInputs)
      throw Error(ErrorCode::invalid_argument, "sim: reduce_many of " + std::to_string(n) + " inputs");
    compute(static_cast<double>(n - 1) * static_cast<double>(count * size_of(dt)) / reduce_rate(dst == in[0]));
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
  /// Bytes per second of a reduction, in place (dst is its first input) or not (sim/network.hpp).
  double reduce_rate(bool in_place) const {
    return e_.model().reduce_rate * (in_place ? e_.model().in_place_reduce_speedup : 1.0);
  }

  /// Charges `seconds` of compute to the rank: at once, or queued for a core of its pool.
  void compute(double seconds) { e_.cpu(rank_, seconds, e_.cores_queue()); }

  Engine& e_;
  int rank_;
  const Arena& arena_;
};

}  // namespace chorus::sim
