// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// sim::Channel: what an algorithm talks through in the simulator, with exactly the interface of
/// algo::Channel (algo/channel.hpp) that the algorithms use, so algo::run() runs the same code
/// over it. Its rank and size are the engine's (the whole group); its messages are the engine's
/// (sim/engine.hpp): isend/irecv return algo::ChannelOp whose `req` is a chorus Request,
/// complete in virtual time, and match per (peer, lane) in order as the real links do. No
/// descriptor check: every virtual rank runs the same call.
///
///   sim::Engine engine(model, {8, 8});
///   engine.run([&](int r) {
///     sim::Channel ch(engine, r);
///     sim::Executor x(engine, r, arena);
///     ... algo::run(ch, desc, args, choice, engine.size(), hosts); ch.finish();
///   });

#include <array>
#include <span>
#include <vector>

#include "chorus/algo/channel.hpp"
#include "chorus/algo/group.hpp"
#include "chorus/core/buffer.hpp"
#include "chorus/sim/engine.hpp"

namespace chorus::sim {

/// wait_all, send, recv and sendrecv: algo::BlockingSteps.
class Channel : public algo::BlockingSteps<Channel> {
 public:
  using Op = algo::ChannelOp;
  static constexpr int kOpLists = 4;  ///< as mismatch::ChannelMemory::kOpLists
  static constexpr int kMaxLanes = 64;

  Channel(Engine& e, int rank) : e_(e), rank_(rank) {}
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  int rank() const { return rank_; }
  int size() const { return e_.size(); }

  /// An empty list for operations in flight (list i of kOpLists), reused within the call.
  std::vector<Op>& ops(int i) {
    auto& v = lists_.at(static_cast<std::size_t>(i));
    v.clear();
    return v;
  }

  Op isend(int peer, ConstBytes b, int lane = 0) {
    check_lane(peer, lane, "send");
    return Op{e_.isend(rank_, peer, b.size, lane), peer, false, -1, {}, nullptr};
  }
  Op irecv(int peer, MutableBytes b, int lane = 0) {
    check_lane(peer, lane, "recv");
    return Op{e_.irecv(rank_, peer, b.size, lane), peer, true, -1, b, nullptr};
  }

  /// Waits for one operation; a receive costs the receiver its per-message overhead.
  void wait(Op& op) {
    auto* q = static_cast<SimRequest*>(op.req.state().get());
    if (!q) return;
    e_.wait(rank_, *q);
    if (op.recv) e_.overhead(rank_, e_.link(op.peer, rank_));
  }
  /// Nothing to complete (no descriptors in the simulator).
  void finish() {}

 private:
  void check_lane(int peer, int lane, const char* op) const {
    if (lane < 0 || lane >= kMaxLanes) bad_lane(peer, lane, op);
  }
  [[noreturn, gnu::noinline, gnu::cold]] void bad_lane(int peer, int lane, const char* op) const {
    throw Error(ErrorCode::invalid_argument, ErrorContext{rank_, peer, op},
                "sim: lane " + std::to_string(lane) + " is outside 0.." + std::to_string(kMaxLanes - 1));
  }

  Engine& e_;
  int rank_;
  std::array<std::vector<Op>, kOpLists> lists_;
};

}  // namespace chorus::sim
