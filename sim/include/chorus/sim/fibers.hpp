// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// The virtual ranks of the simulator (sim/engine.hpp schedules them): their layout on hosts, the
/// fibers' stacks, the cores their compute queues for, a rank's state as the engine keeps it, and
/// the error of a run that stopped with ranks still waiting.

#include <algorithm>
#include <boost/context/fiber.hpp>
#include <boost/context/stack_context.hpp>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include <sys/mman.h>
#include <cstring>

#include "chorus/core/error.hpp"
#include "chorus/sim/events.hpp"

namespace chorus::sim {

/// The layout: H hosts of L ranks, rank r on host r / L.
struct Layout {
  int hosts = 1;
  int ranks_per_host = 1;
  int ranks() const { return hosts * ranks_per_host; }
  int host_of(int r) const { return r / ranks_per_host; }
};

/// The fibers' stacks: one mapping of N stacks back to back, with transparent huge pages where
/// the kernel gives them, so that switching among thousands of ranks does not miss the TLB on
/// every switch. No guard pages (they would split the huge pages): after each run the engine
/// measures how deep each stack went (the mapping starts zeroed) and fails the run when one came
/// within kMargin of its end. Stacks start kColor bytes apart beyond their size: with a stride of
/// a power of two, the hot top lines of every stack would share a few cache sets (at 4,096 ranks
/// of 32 KiB, 64 sets of the L3 for 4,096 lines each), and every fiber switch would miss.
class Stacks {
 public:
  static constexpr std::size_t kMargin = 4096;
  static constexpr std::size_t kColor = 5 * 64;  ///< an odd number of cache lines

  Stacks(int n, std::size_t bytes)
      : n_(static_cast<std::size_t>(n)), bytes_((bytes + 4095) / 4096 * 4096), stride_(bytes_ + kColor) {
    base_ = static_cast<std::byte*>(::mmap(nullptr, n_ * stride_, PROT_READ | PROT_WRITE,
                                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));
    if (base_ == MAP_FAILED)
      throw Error(ErrorCode::system, "sim: mapping " + std::to_string(n_) + " fiber stacks of " + std::to_string(bytes_) +
                                         " bytes failed: " + std::strerror(errno));
#ifdef MADV_HUGEPAGE
    (void)::madvise(base_, n_ * stride_, MADV_HUGEPAGE);
#endif
  }
  ~Stacks() { ::munmap(base_, n_ * stride_); }
  Stacks(const Stacks&) = delete;
  Stacks& operator=(const Stacks&) = delete;

  /// A stack allocator (boost::context's StackAllocator) handing out stack r.
  struct Slot {
    std::byte* low;
    std::size_t size;
    boost::context::stack_context allocate() {
      boost::context::stack_context sc;
      sc.size = size;
      sc.sp = low + size;
      return sc;
    }
    void deallocate(boost::context::stack_context&) noexcept {}
  };
  Slot stack(int r) { return Slot{base_ + static_cast<std::size_t>(r) * stride_, bytes_}; }

  /// The deepest any stack has gone, in bytes (the lowest byte written, from the top).
  std::size_t high_water() const {
    std::size_t deepest = 0;
    for (std::size_t r = 0; r < n_; ++r) {
      const auto* low = reinterpret_cast<const std::uint64_t*>(base_ + r * stride_);
      std::size_t i = 0;
      const std::size_t words = bytes_ / 8;
      while (i < words && low[i] == 0) ++i;
      deepest = std::max(deepest, (words - i) * 8);
    }
    return deepest;
  }
  std::size_t bytes() const { return bytes_; }

 private:
  std::size_t n_, bytes_, stride_;
  std::byte* base_;
};

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

namespace internal {

/// A rank's state, in one cache-line-aligned block with its first kInlinePairs pairs (a ring
/// has one per receiver): a message touches its sender's and its receiver's block, not
/// separate allocations of each.
inline constexpr int kInlinePairs = 2;
struct alignas(64) Rank {
  boost::context::fiber self, back;
  double clock = 0;
  SimRequest* waiting = nullptr;
  void* sp = nullptr;  ///< where its fiber stopped last (suspend's frame)
  bool finished = false;
  int npairs = 0;  ///< pairs in use: the inline ones first, then `more`
  Pair pairs[kInlinePairs];
  std::vector<Pair> more;

  /// The pair of sender `src` on `lane` (a new one where it has none yet).
  Pair* pair(int src, int lane) {
    const int inl = std::min(npairs, kInlinePairs);
    for (int i = 0; i < inl; ++i)
      if (pairs[i].peer == src && pairs[i].lane == lane) return &pairs[i];
    for (Pair& q : more)
      if (q.peer == src && q.lane == lane) return &q;
    Pair* p = npairs < kInlinePairs ? &pairs[npairs] : &more.emplace_back();
    ++npairs;
    p->peer = src;
    p->lane = lane;
    return p;
  }
  /// The latest data_free of its pairs of sender `from`, or t where later.
  double data_free_from(int from, double t) const {
    const int inl = std::min(npairs, kInlinePairs);
    for (int i = 0; i < inl; ++i)
      if (pairs[i].peer == from) t = std::max(t, pairs[i].data_free);
    for (const Pair& q : more)
      if (q.peer == from) t = std::max(t, q.data_free);
    return t;
  }
};

/// The error of a run with no event left at virtual time `now` while ranks have not finished:
/// how many, and what the first 8 of them wait for.
inline Error deadlock_error(const std::vector<Rank>& ranks, double now) {
  const int n = static_cast<int>(ranks.size());
  std::string s;
  int shown = 0, stuck = 0;
  for (int r = 0; r < n; ++r) {
    const Rank& k = ranks[static_cast<std::size_t>(r)];
    if (k.finished) continue;
    ++stuck;
    if (shown++ >= 8) continue;
    s += "; rank " + std::to_string(r);
    if (k.waiting)
      s += " waits for " + k.waiting->context().op + " from/to peer " + std::to_string(k.waiting->peer_rank);
    else
      s += " is not waiting for a message";
  }
  return Error(ErrorCode::timeout, "sim: no event left at virtual time " + std::to_string(now) + " s while " +
                                       std::to_string(stuck) + " of " + std::to_string(n) + " ranks have not finished" + s);
}

}  // namespace internal

}  // namespace chorus::sim
