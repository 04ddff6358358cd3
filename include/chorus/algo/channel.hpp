#pragma once
/// Channel: what an algorithm talks through during one collective call. It knows the group (its
/// ranks in the transport's numbering), the call's tag and descriptor, and nothing of the
/// transport but the Link concept.
///
/// Descriptor protocol: the first message this rank sends to each peer during a call is preceded
/// by the call's CollectiveDesc (a separate 32-byte message on the descriptor tag, pipelined with
/// the data: no extra round trip). Data receives are posted at once; waiting for one then checks
/// the peer's descriptor, which the link delivers before that peer's data (messages of one link
/// arrive in the order they were sent), so by then it is there and the check costs no wake-up.
/// When the data failed (a size that differs), or the wait stalls while the peer's descriptor
/// has arrived, the descriptor is compared first: a difference surfaces as one `mismatch`
/// naming both ranks and both descriptors (never as a bare size error), which the communicator
/// then spreads to every rank. A message of a call that differs may land in a buffer before the
/// difference is seen; the call fails either way.
/// Algorithms are symmetric (a's k-th send to b is b's k-th receive from a), so "first send to
/// b" and "first receive from a" always meet.

#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
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
  /// Called while a wait has stalled (every kStallCheck): compares this call with what the other
  /// ranks were doing, by another route (the store), and throws mismatch on a difference. This
  /// catches the mismatches in which no two ranks ever exchange a message (both wait to receive,
  /// each from a different peer), at no cost while nothing stalls.
  using OnStall = std::function<void(const CollectiveDesc&)>;
  static constexpr std::chrono::milliseconds kStallCheck{200};

  Channel(const Group<T>& g, CollectiveDesc desc, OnMismatch on_mismatch, OnStall on_stall = {})
      : g_(g),
        desc_(desc),
        data_tag_(g.context | chorus::detail::kInternalTagBit | kTagClassData | (desc.seq & kSeqMask)),
        desc_tag_(g.context | chorus::detail::kInternalTagBit | kTagClassDesc | (desc.seq & kSeqMask)),
        on_mismatch_(std::move(on_mismatch)),
        on_stall_(std::move(on_stall)),
        peer_desc_(std::make_shared<std::vector<CollectiveDesc>>(static_cast<std::size_t>(g.size()))),
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
    meet(peer, link);
    return {link.isend(b, lane_tag(lane)), peer, false};
  }

  Op irecv(int peer, MutableBytes b, int lane = 0) {
    auto& link = g_.transport->link(g_.members[peer]);
    meet(peer, link);
    return {link.irecv(b, lane_tag(lane)), peer, true};
  }

  /// Checks every descriptor still unchecked (peers this rank only sent to); call once the
  /// algorithm is done. A difference throws mismatch, as in wait().
  void finish() {
    for (int p = 0; p < size(); ++p) check_desc(p);
  }

  /// Waits for one operation; for a receive, then checks the peer's descriptor. When the
  /// operation failed (either way: a differing call explains a differing size), the descriptor
  /// is checked first.
  void wait(Op& op) {
    if (!g_.descriptors) return wait_request(op.req);
    try {
      wait_request(op.req, op.peer);
    } catch (const Error&) {
      check_desc(op.peer);
      throw;
    }
    if (op.recv) check_desc(op.peer);
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

  /// Waits for `r`, checking with the other ranks each time it stalls (first with `peer`'s
  /// descriptor, if it has arrived); the request's own timeout still bounds the whole wait.
  void wait_request(Request& r, int peer = -1) {
    if (!r.valid()) return;
    if (on_stall_ || peer >= 0) {
      const auto deadline = std::chrono::steady_clock::now() + r.state()->timeout();
      while (std::chrono::steady_clock::now() < deadline) {
        if (r.state()->wait_for(kStallCheck)) return;
        if (peer >= 0 && desc_state_[peer] == kPosted && desc_recv_[peer].test()) check_desc(peer);
        if (on_stall_) on_stall_(desc_);
      }
    }
    r.wait();
  }

  /// First contact with `peer` in this call, either way: send our descriptor and post the receive
  /// of theirs. Both ends do it at their first contact, whichever side sends first, so two ranks
  /// that both wait to receive from each other (different collectives) still compare.
  template <class L>
  void meet(int peer, L& link) {
    if (!g_.descriptors || desc_state_[peer] != kNone) return;
    desc_state_[peer] = kPosted;
    desc_sends_.push_back(link.isend(ConstBytes{reinterpret_cast<const std::byte*>(&desc_), sizeof desc_}, desc_tag_));
    CollectiveDesc* slot = &(*peer_desc_)[peer];
    desc_recv_[peer] = link.irecv(MutableBytes{reinterpret_cast<std::byte*>(slot), sizeof(CollectiveDesc)}, desc_tag_);
    // The buffer lives as long as the receive, should this call end early (an exception).
    desc_recv_[peer].state()->then([keep = peer_desc_] {});
  }

  /// Waits for the peer's descriptor and compares.
  void check_desc(int peer) {
    if (desc_state_[peer] != kPosted) return;
    wait_request(desc_recv_[peer]);
    const CollectiveDesc& theirs = (*peer_desc_)[peer];
    if (theirs == desc_) {
      desc_state_[peer] = kChecked;
      return;
    }
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
  OnStall on_stall_;
  std::shared_ptr<std::vector<CollectiveDesc>> peer_desc_;
  std::vector<Request> desc_recv_;
  std::vector<char> desc_state_;
  std::vector<Request> desc_sends_;
};

}  // namespace chorus::algo
