#pragma once
/// Channel: what an algorithm talks through during one collective call. It knows the group (its
/// ranks in the transport's numbering), the call's tag and descriptor, and nothing of the
/// transport but the Link concept.
///
/// Descriptor protocol: the first message this rank sends to each peer during a call is preceded
/// by the call's CollectiveDesc (a separate 32-byte message on the descriptor tag, pipelined with
/// the data: no extra round trip). The first receive from each peer waits for that peer's
/// descriptor before its data and compares it with ours; a difference is a `mismatch` naming
/// both ranks and both descriptors, which the communicator then spreads to every rank.
/// Algorithms are symmetric (a's k-th send to b is b's k-th receive from a), so "first send to
/// b" and "first receive from a" always meet.

#include <cstring>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "chorus/algo/descriptor.hpp"
#include "chorus/core/concepts.hpp"
#include "chorus/transport/matching.hpp"

namespace chorus::algo {

/// Internal tag classes (bits 46..40 of a link tag, below the internal bit).
inline constexpr Tag kTagClassBarrier = Tag(1) << 40;
inline constexpr Tag kTagClassData = Tag(2) << 40;
inline constexpr Tag kTagClassDesc = Tag(3) << 40;
inline constexpr Tag kTagClassError = Tag(4) << 40;
inline constexpr Tag kSeqMask = (Tag(1) << 32) - 1;  ///< bits 31..0: the call's sequence number
inline constexpr int kLaneShift = 32;                  ///< bits 39..32: the lane (see Channel)

/// The members of a (sub-)communicator and how to reach them.
template <Transport T>
struct Group {
  T* transport = nullptr;
  std::vector<int> members;  ///< group rank -> transport rank
  int rank = -1;             ///< this rank in the group
  Tag context = 0;           ///< high bits of every tag of this group
  /// Descriptors on (the default). Off only to measure what mismatch detection costs
  /// (CHORUS_BENCH_NO_DESCRIPTORS=1, documented in docs/environment.md).
  bool descriptors = true;
  int size() const { return static_cast<int>(members.size()); }
};

template <Transport T>
class Channel {
 public:
  /// A message in flight.
  struct Op {
    Request req;
    int peer = -1;
    bool recv = false;
  };
  /// Called with the mismatch error before it is thrown: the communicator spreads it.
  using OnMismatch = std::function<void(const Error&)>;

  Channel(const Group<T>& g, CollectiveDesc desc, OnMismatch on_mismatch)
      : g_(g),
        desc_(desc),
        data_tag_(g.context | chorus::detail::kInternalTagBit | kTagClassData | (desc.seq & kSeqMask)),
        desc_tag_(g.context | chorus::detail::kInternalTagBit | kTagClassDesc | (desc.seq & kSeqMask)),
        on_mismatch_(std::move(on_mismatch)),
        sent_desc_(static_cast<std::size_t>(g.size()), false),
        peer_desc_(static_cast<std::size_t>(g.size())),
        desc_recv_(static_cast<std::size_t>(g.size())),
        desc_state_(static_cast<std::size_t>(g.size()), kNone) {}

  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  /// Descriptor sends still in flight are waited for here (they are tiny and eager).
  ~Channel() {
    for (auto& r : desc_sends_) {
      try {
        r.wait();
      } catch (...) {  // the link broke: the data operations report it
      }
    }
  }

  int rank() const { return g_.rank; }
  int size() const { return g_.size(); }
  const CollectiveDesc& desc() const { return desc_; }

  /// Lanes (0..255) separate independent streams between the same pair within one call (the two
  /// trees of a double binary tree): messages match in order per (peer, lane).
  Op isend(int peer, ConstBytes b, int lane = 0) {
    auto& link = g_.transport->link(g_.members[peer]);
    if (g_.descriptors && !sent_desc_[peer]) {
      sent_desc_[peer] = true;
      desc_sends_.push_back(link.isend(ConstBytes{reinterpret_cast<const std::byte*>(&desc_), sizeof desc_}, desc_tag_));
    }
    return {link.isend(b, lane_tag(lane)), peer, false};
  }

  Op irecv(int peer, MutableBytes b, int lane = 0) {
    auto& link = g_.transport->link(g_.members[peer]);
    if (g_.descriptors && desc_state_[peer] == kNone) {
      desc_state_[peer] = kPosted;
      desc_recv_[peer] = link.irecv(MutableBytes{reinterpret_cast<std::byte*>(&peer_desc_[peer]), sizeof(CollectiveDesc)}, desc_tag_);
    }
    return {link.irecv(b, lane_tag(lane)), peer, true};
  }

  /// Waits for one operation; for a receive, first checks the peer's descriptor.
  void wait(Op& op) {
    if (op.recv) check_desc(op.peer);
    op.req.wait();
  }
  void wait_all(std::span<Op> ops) {
    for (auto& o : ops) wait(o);
  }

  /// Blocking helpers for simple steps.
  void send(int peer, ConstBytes b, int lane = 0) {
    auto op = isend(peer, b, lane);
    wait(op);
  }
  void recv(int peer, MutableBytes b, int lane = 0) {
    auto op = irecv(peer, b, lane);
    wait(op);
  }
  /// Sends to one peer while receiving from another (or the same), then waits for both.
  void sendrecv(int to, ConstBytes out, int from, MutableBytes in) {
    Op ops[2] = {irecv(from, in), isend(to, out)};
    wait_all(ops);
  }

 private:
  enum : char { kNone, kPosted, kChecked };

  Tag lane_tag(int lane) const { return data_tag_ | (static_cast<Tag>(lane & 0xff) << kLaneShift); }

  void check_desc(int peer) {
    if (desc_state_[peer] != kPosted) return;
    desc_recv_[peer].wait();
    desc_state_[peer] = kChecked;
    const CollectiveDesc& theirs = peer_desc_[peer];
    if (theirs == desc_) return;
    Error e(ErrorCode::mismatch, ErrorContext{g_.rank, peer, describe(desc_)},
            "collectives differ: rank " + std::to_string(g_.rank) + " called " + describe(desc_) + ", rank " +
                std::to_string(peer) + " called " + describe(theirs));
    if (on_mismatch_) on_mismatch_(e);
    throw e;
  }

  const Group<T>& g_;
  CollectiveDesc desc_;
  Tag data_tag_;
  Tag desc_tag_;
  OnMismatch on_mismatch_;
  std::vector<bool> sent_desc_;
  std::vector<CollectiveDesc> peer_desc_;
  std::vector<Request> desc_recv_;
  std::vector<char> desc_state_;
  std::vector<Request> desc_sends_;
};

}  // namespace chorus::algo
