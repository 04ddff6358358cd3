// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// The pipelining engine of the hierarchical bandwidth forms (algo/hierarchical.hpp): segments that
/// go through stages (a ring run step by step, or a list of messages), several segments in flight
/// at once, each stage on a lane of its own, and the work area they use. Nothing here knows the
/// host layout: the algorithms say what each stage of a segment is (detail::pipeline's `make`).

#include <algorithm>
#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include "chorus/algo/common.hpp"
#include "chorus/algo/ring.hpp"
#include "chorus/topology/ring.hpp"

namespace chorus::algo::detail {

/// The bandwidth forms run in segments, pipelined: each segment goes through its stages (host
/// phase, rail phase across the hosts, host phase), every stage a set of messages in flight
/// (Stage: a ring run step by step, or a list of messages), and up to kWindow segments are in
/// flight at once, each stage on a lane of its own (lane 0 stays the other phases'). The calling
/// thread polls every stage in flight (which drives their links: tcp and shm alike), so the
/// rails carry one segment while the host phases of others run; after kSpins passes without
/// progress it blocks on the oldest segment's stage (its waits spin, then sleep).
///
/// Segments are cut so that a rail's message per step is 64 KiB (a segment of R x H x 64 KiB: R
/// rails, H hosts), small enough for the links' eager path (tcp sends up to 64 KiB without a
/// request-to-send round trip, which a rank busy with its host phases would answer late). 2 hosts
/// x 2 ranks, 1 Gbit/s links (scripts/hosts-bench), all_reduce of 64 MiB, medians of 3: segments
/// of 128 KiB 565 ms, 256 KiB 566 ms, 512 KiB 606 ms, 1 MiB 604 ms, 4 MiB 660 ms (the link's
/// limit: 537 ms); 4 x 2: 256 KiB 845 ms, 512 KiB 850 ms (limit 805 ms).
struct Pipeline {
  static constexpr std::size_t kRailMessageBytes = std::size_t(64) << 10;
  static constexpr int kMaxSegments = 1024;
  static constexpr int kWindow = 4;  ///< segments in flight
  static constexpr int kStageLanes = 3;
  static constexpr int kSpins = 16;
  /// Segments for a buffer of `bytes` over `rails` rails of `hosts` hosts.
  static int segments(std::size_t bytes, int rails, int hosts) {
    const std::size_t segment = kRailMessageBytes * static_cast<std::size_t>(rails) * static_cast<std::size_t>(hosts);
    return static_cast<int>(std::clamp<std::size_t>(bytes / segment, 1, kMaxSegments));
  }
  /// The lane of segment k's stage i.
  static int lane(int k, int stage) { return 1 + (k % kWindow) * kStageLanes + stage; }
};

/// A stage of a segment: messages in flight.
class Stage {
 public:
  virtual ~Stage() = default;
  /// Completes what has arrived, posts what follows; true once the stage is done.
  virtual bool advance() = 0;
  /// Blocks until one more step is done (or the stage).
  virtual void step() = 0;
};

/// A ring over a sub-channel (reduce-scatter, all-gather or both: all-reduce) on `buf` cut by
/// chunk offsets (`at`, one more than the ring's ranks), one message per step each way. `own`
/// (a reduce-scatter's contribution, buf where null) is read for the chunks sent first and
/// reduced with; received chunks land in `scratch` (the largest chunk) and are reduced into buf.
template <class Ch>
class AsyncRing final : public Stage {
 public:
  enum class Kind { reduce_scatter, all_gather, all_reduce };

  AsyncRing(Ch& ch, const Args& a, std::byte* buf, std::vector<std::size_t> at, Kind kind, int lane, std::byte* scratch,
            const std::byte* own = nullptr)
      : ch_(ch), a_(a), buf_(buf), own_(own ? own : buf), at_(std::move(at)), lane_(lane), scratch_(scratch) {
    const int n = ch.size();
    rs_steps_ = kind == Kind::all_gather ? 0 : n - 1;
    steps_ = rs_steps_ + (kind == Kind::reduce_scatter ? 0 : n - 1);
    if (steps_ > 0) post();
  }

  bool advance() override {
    while (step_ < steps_) {
      if (!recv_.req.test() || !send_.req.test()) return false;
      complete();
    }
    return true;
  }
  void step() override {
    if (step_ < steps_) complete();
  }

 private:
  std::size_t begin(int i) const { return at_[static_cast<std::size_t>(i)]; }
  std::size_t size(int i) const { return at_[static_cast<std::size_t>(i) + 1] - at_[static_cast<std::size_t>(i)]; }

  void post() {
    const int n = ch_.size(), r = ch_.rank();
    const bool rs = step_ < rs_steps_;
    const int k = rs ? step_ : step_ - rs_steps_;
    const int send_c = rs ? topology::reduce_scatter_send_chunk(r, k, n) : topology::all_gather_send_chunk(r, k, n);
    recv_c_ = rs ? topology::reduce_scatter_recv_chunk(r, k, n) : topology::all_gather_recv_chunk(r, k, n);
    const std::byte* from = step_ == 0 ? own_ : buf_;
    recv_ = ch_.irecv(topology::prev(r, n), mbytes(rs ? scratch_ : buf_ + a_.bytes(begin(recv_c_)), a_.bytes(size(recv_c_))),
                      lane_);
    send_ = ch_.isend(topology::next(r, n), cbytes(from + a_.bytes(begin(send_c)), a_.bytes(size(send_c))), lane_);
  }
  void complete() {
    ch_.wait(recv_);
    ch_.wait(send_);
    if (step_ < rs_steps_) {
      const std::size_t at = a_.bytes(begin(recv_c_));
      a_.x().reduce(a_.op, a_.dtype, buf_ + at, own_ + at, scratch_, size(recv_c_));
    }
    if (++step_ < steps_) post();
  }

  Ch& ch_;
  const Args& a_;
  std::byte* buf_;
  const std::byte* own_;
  std::vector<std::size_t> at_;
  int lane_;
  std::byte* scratch_;
  int rs_steps_ = 0, steps_ = 0, step_ = 0;
  int recv_c_ = 0;
  ChannelOp send_{}, recv_{};
};

/// Messages posted at once (a gather or a scatter inside a host); done when all are.
template <class Ch>
class AsyncOps final : public Stage {
 public:
  explicit AsyncOps(Ch& ch) : ch_(ch) {}
  void send(int peer, ConstBytes b, int lane) { ops_.push_back(ch_.isend(peer, b, lane)); }
  void recv(int peer, MutableBytes b, int lane) { ops_.push_back(ch_.irecv(peer, b, lane)); }
  bool advance() override {
    while (next_ < ops_.size()) {
      if (!ops_[next_].req.test()) return false;
      ch_.wait(ops_[next_++]);
    }
    return true;
  }
  void step() override {
    if (next_ < ops_.size()) ch_.wait(ops_[next_++]);
  }

 private:
  Ch& ch_;
  std::vector<ChannelOp> ops_;
  std::size_t next_ = 0;
};

/// Runs `segments` segments through `stages` stages each: `make(k, i)` starts stage i of segment k
/// (its local work done at once) and returns its messages in flight, or null where it has none.
/// Segments enter in order, at most Pipeline::kWindow at once; see Pipeline for the polling.
/// Every rank runs the same segments and stages; their messages meet by lane, whatever order
/// the ranks' polling completes them in.
template <class Make>
void pipeline(int segments, int stages, Make&& make) {
  struct Slot {
    int k = -1, stage = 0;
    std::unique_ptr<Stage> cur;
  };
  std::vector<Slot> slots(static_cast<std::size_t>(Pipeline::kWindow));
  // Starts stages of `s` until one has messages in flight or the segment is done.
  auto start_next = [&](Slot& s) {
    while (s.stage < stages) {
      s.cur = make(s.k, s.stage);
      if (s.cur) return;
      ++s.stage;
    }
    s.k = -1;
  };
  int next = 0, left = segments, idle = 0;
  while (left > 0) {
    bool progress = false;
    for (std::size_t i = 0; i < slots.size(); ++i) {
      Slot& s = slots[i];
      // Segment k takes slot k % kWindow once segment k - kWindow has left it: the lanes and
      // the work area of a slot are never used by two segments at once.
      if (s.k < 0 && next < segments && static_cast<std::size_t>(next % Pipeline::kWindow) == i) {
        s.k = next++;
        s.stage = 0;
        start_next(s);
        progress = true;
      }
      while (s.k >= 0 && s.cur && s.cur->advance()) {
        s.cur.reset();
        ++s.stage;
        start_next(s);
        progress = true;
      }
      if (s.k < 0 && s.stage == stages) {
        s.stage = 0;
        --left;
      }
    }
    if (progress) {
      idle = 0;
    } else if (++idle >= Pipeline::kSpins) {
      // Nothing moved for a while: block on the oldest segment's stage.
      Slot* oldest = nullptr;
      for (Slot& s : slots)
        if (s.k >= 0 && s.cur && (!oldest || s.k < oldest->k)) oldest = &s;
      if (oldest) oldest->cur->step();
      idle = 0;
    }
  }
}

/// The work area of a bandwidth form: per segment in flight, `region` bytes (its piece of every
/// block, or nothing) and two scratch areas of `scratch` bytes (the host ring's, the rail's).
class SegmentWork {
 public:
  SegmentWork(const Args& a, std::size_t region, std::size_t scratch)
      : region_(region), scratch_(scratch), base_(a.x().work((region + 2 * scratch) * Pipeline::kWindow)) {}
  std::byte* region(int k) const { return base_ + (region_ + 2 * scratch_) * static_cast<std::size_t>(k % Pipeline::kWindow); }
  std::byte* host_scratch(int k) const { return region(k) + region_; }
  std::byte* rail_scratch(int k) const { return region(k) + region_ + scratch_; }

 private:
  std::size_t region_, scratch_;
  std::byte* base_;
};

/// Chunk offsets of FirstChunks over a ring of n ranks.
inline std::vector<std::size_t> offsets(const FirstChunks& c, int n) {
  std::vector<std::size_t> at(static_cast<std::size_t>(n) + 1);
  for (int i = 0; i <= n; ++i) at[static_cast<std::size_t>(i)] = i < n ? c.begin(i) : c.count;
  return at;
}

}  // namespace chorus::algo::detail
