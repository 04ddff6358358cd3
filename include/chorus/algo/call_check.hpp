// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// The mismatch protocol of one collective call, on the messages the algorithm sends anyway:
/// stamps, separate descriptors, their comparison, and the explanation of a failed message. The
/// call's Channel (algo/channel.hpp) asks it before each first message to a peer and after each
/// wait; the communicator spreads what it finds (herald.hpp) and cross-checks through the store
/// when a wait stalls (cross_check.hpp).
///
/// Descriptor protocol (mismatch detection at no extra message on the common path):
/// * Stamps. The first message this rank sends to a peer on each lane, when it is small
///   (DescriptorPolicy::kInlineBytes), carries a 40-byte stamp (magic + CollectiveDesc) in front
///   of its data, staged with it in one buffer: one message, as without descriptors. The
///   receiver's first receive from that peer on that lane expects the stamp, compares it when the
///   message is in and copies the data out.
/// * Separate descriptors. Before a first message that is too large to stage, the descriptor goes
///   as its own message on the descriptor tag (once per peer and call), and the receiver, at its
///   first large receive from that peer, posts a receive for it. A pair in which only one side
///   sends (a broadcast root and its child) exchanges separate descriptors both ways in finish(),
///   so a sender learns of a difference too, and two ranks that both only send to each other (two
///   different roots) still compare. Both ends derive every one of these choices from the same
///   sizes, so in a matched call every separate descriptor sent is received.
/// * Differences. A stamp or separate descriptor that differs raises `mismatch` naming both ranks
///   and both descriptors, which the communicator then spreads to every rank. When a message has
///   another size than its receive (a differing call), the link still writes the message's first
///   bytes to the buffer (see the Link concept), so the peer's stamp is read from there; failing
///   that, from the peer's separate descriptor (it precedes a large message on the link), whose
///   receive is then posted; a wait that stalls also cross-checks through the store (OnStall).
///   A message of a call that differs may land in a buffer before the difference is seen; the
///   call fails either way.
/// Algorithms are symmetric (a's k-th send to b on a lane is b's k-th receive from a on it), so a
/// first send and a first receive always meet.

/// * Device memory. When the call's buffers are in device memory the host never reads them:
///   every first message is preceded by a separate descriptor (CallCheck's inline_bytes is 0).

#include <array>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "chorus/algo/descriptor.hpp"
#include "chorus/exec/bytes.hpp"
#include "chorus/algo/group.hpp"
#include "chorus/core/concepts.hpp"
#include "chorus/algo/stamp.hpp"

namespace chorus::mismatch {

using algo::ChannelOp;

/// What a call's channel keeps per peer and per stamped message, owned by the communicator and
/// reused from call to call (no allocation per call once grown). A channel that ends with an
/// operation still pending (an exception) hands the memory to that operation and the
/// communicator starts a new one (see Channel's constructor and destructor).
class ChannelMemory {
 public:
  /// What one call has exchanged with one peer.
  struct Peer {
    std::uint64_t sent_lanes = 0;  ///< lanes on which the first message was sent
    std::uint64_t recv_lanes = 0;  ///< lanes on which the first receive was posted
    bool desc_sent = false;        ///< a separate descriptor went to the peer
    bool checked = false;          ///< the peer's descriptor was compared and equal
    Request desc_recv;             ///< the receive of the peer's separate descriptor, if posted
  };
  /// A stamped message: its staging buffer (stamp, then data) and its request.
  struct Staged {
    std::byte* buf = nullptr;  ///< null once the data has been moved out (or the send is done)
    Request req;
  };

  /// Starts a call among `peers` ranks.
  void reset(int peers, const Stamp& mine) {
    peers_.resize(static_cast<std::size_t>(peers));
    for (auto& q : peers_) q = Peer{};
    staged_.clear();
    ops_.clear();
    mine_ = mine;
    // Staging blocks beyond what the last call used are freed once there are more than 16
    // (1 MiB): a burst of many-message calls does not keep its peak.
    if (blocks_.size() > 16 && block_ + 1 < blocks_.size() / 2) blocks_.resize(block_ + 1);
    block_ = 0;
    used_ = 0;
  }

  /// Bytes held (staging blocks and the lists' capacity).
  std::size_t bytes() const {
    std::size_t b = sizeof(*this) + blocks_.size() * kBlockBytes + peers_.capacity() * sizeof(Peer) +
                    staged_.capacity() * sizeof(Staged) + ops_.capacity() * sizeof(Request) +
                    theirs_.capacity() * sizeof(Stamp);
    for (const auto& l : op_lists_) b += l.capacity() * sizeof(ChannelOp);
    return b;
  }

  /// n bytes of staging memory, valid until the next reset (blocks never move).
  std::byte* stage(std::size_t n) {
    n = (n + 15) / 16 * 16;
    if (block_ < blocks_.size() && used_ + n > kBlockBytes) ++block_, used_ = 0;
    if (block_ == blocks_.size()) blocks_.push_back(std::make_unique_for_overwrite<std::byte[]>(kBlockBytes));
    std::byte* p = blocks_[block_].get() + used_;
    used_ += n;
    return p;
  }

  std::vector<Peer> peers_;
  std::vector<Staged> staged_;
  std::vector<Request> ops_;    ///< separate descriptor sends and receives
  std::vector<Stamp> theirs_;   ///< peers' separate descriptors land here (sized on first use)
  Stamp mine_;                  ///< this call's separate descriptor is sent from here

  /// Lists an algorithm keeps its operations in flight in (Channel::ops), kept from call to call
  /// with their capacity.
  static constexpr int kOpLists = 4;
  std::array<std::vector<ChannelOp>, kOpLists> op_lists_;

 private:
  static constexpr std::size_t kBlockBytes = 64 << 10;
  static_assert(kBlockBytes >= DescriptorPolicy::kInlineBytes + sizeof(Stamp) + 15, "a block holds any staged message");
  std::vector<std::unique_ptr<std::byte[]>> blocks_;
  std::size_t block_ = 0;
  std::size_t used_ = 0;
};

template <Transport T>
class CallCheck {
 public:
  using Op = ChannelOp;
  /// Called while a wait has stalled (every kStallCheck): compares this call with what the other
  /// ranks were doing, by another route (the store), and throws mismatch on a difference. This
  /// catches the mismatches in which no two ranks ever exchange a message (both wait to receive,
  /// each from a different peer), at no cost while nothing stalls.
  using OnStall = std::function<void(const CollectiveDesc&)>;
  static constexpr std::chrono::milliseconds kStallCheck{200};

  /// `memory`: the communicator's, reused across its calls (they run one at a time); replaced by
  /// a new one when an earlier call left operations pending on it. `inline_bytes`: the largest
  /// first message that carries its stamp in front (0: none; every first message is preceded
  /// by a separate descriptor).
  CallCheck(const algo::Group<T>& g, CollectiveDesc desc, Tag desc_tag, std::shared_ptr<ChannelMemory>& memory,
            std::size_t inline_bytes, OnStall on_stall)
      : g_(g), desc_tag_(desc_tag), inline_bytes_(inline_bytes), on_stall_(std::move(on_stall)), owner_(memory) {
    stamp_.desc = desc;
    if (!memory || memory.use_count() > 1) memory = std::make_shared<ChannelMemory>();
    lists_ = memory.get();
    if (!g.descriptors) return;
    mem_ = memory.get();
    mem_->reset(g.size(), stamp_);
  }
  CallCheck(const CallCheck&) = delete;
  CallCheck& operator=(const CallCheck&) = delete;

  /// Never blocks: a buffer that a link may still read or write (an operation left pending when
  /// the call ended early, by an exception) is handed to that operation, which frees it when done.
  ~CallCheck() {
    if (!mem_) return;
    auto keep = [this](Request& r) {
      if (r.valid() && !r.state()->done()) r.state()->then([keep = owner_] {});
    };
    for (auto& s : mem_->staged_)
      if (s.buf) keep(s.req);
    for (auto& r : mem_->ops_) keep(r);
  }

  const CollectiveDesc& desc() const { return stamp_.desc; }
  /// The lists of operations in flight, kept with the memory (see Channel::ops).
  ChannelMemory& lists() { return *lists_; }

  /// A data send of `b` to op.peer on `lane` is about to be posted with `tag`. A first one that
  /// is small goes out here with its stamp in front (true: op.req is set); a large one is
  /// preceded by the separate descriptor (false: the caller posts b itself).
  template <class L>
  bool send(L& link, Op& op, int lane, ConstBytes b, Tag tag) {
    if (!first(op.peer, lane, /*recv=*/false)) return false;
    if (b.size <= inline_bytes_) {
      op.staged = stage(b.size);
      auto& s = mem_->staged_[static_cast<std::size_t>(op.staged)];
      exec::store(s.buf, stamp_);
      exec::copy_host(s.buf + sizeof stamp_, b.data, b.size);
      s.req = link.isend(ConstBytes{s.buf, sizeof stamp_ + b.size}, tag);
      op.req = s.req;
      return true;
    }
    send_desc(op.peer, link);
    return false;
  }

  /// The receive counterpart of send(): true when posted here (a stamped first receive, whose
  /// data wait() moves to b), false when the caller posts it.
  template <class L>
  bool recv(L& link, Op& op, int lane, MutableBytes b, Tag tag) {
    if (!first(op.peer, lane, /*recv=*/true)) return false;
    if (b.size <= inline_bytes_) {
      op.staged = stage(b.size);
      auto& s = mem_->staged_[static_cast<std::size_t>(op.staged)];
      std::memset(s.buf, 0, sizeof(Stamp));
      s.req = link.irecv(MutableBytes{s.buf, sizeof(Stamp) + b.size}, tag);
      op.req = s.req;
      return true;
    }
    recv_desc(op.peer, link);
    return false;
  }

  /// Completes the descriptor exchange; call once the algorithm is done. Pairs in which only one
  /// side sent exchange separate descriptors both ways here; every descriptor still unchecked is
  /// then waited for and compared. A difference throws mismatch, as in wait().
  void finish() {
    if (!mem_) return;
    bool separate = !mem_->ops_.empty();
    for (int p = 0; p < g_.size(); ++p) {
      const Peer& q = peer(p);
      if ((q.sent_lanes == 0) == (q.recv_lanes == 0)) continue;  // both ways, or no contact
      auto& link = g_.transport->link(g_.members[p]);
      send_desc(p, link);
      recv_desc(p, link);
      separate = true;
    }
    if (!separate) return;  // every descriptor came as a stamp, and was checked on arrival
    for (int p = 0; p < g_.size(); ++p) check_separate(p);
    // A call returns once its messages have left, as its data sends have: a rank that returns and
    // exits at once must not take a descriptor its peer still waits for with it.
    for (auto& r : mem_->ops_) wait_request(r);
  }

  /// Waits for one operation. A stamped receive then compares the peer's stamp and moves its data
  /// into place. When the operation failed (either way: a differing call explains a differing
  /// size), the peer's descriptor is compared first, so a different call surfaces as mismatch.
  void wait(Op& op) {
    if (!mem_) return wait_request(op.req);
    try {
      wait_request(op.req, op.peer);
    } catch (const Error& e) {
      if (e.code() == ErrorCode::mismatch) explain_failure(op);
      throw;
    }
    if (op.staged >= 0) {
      if (op.recv)
        unstage(op);
      else
        mem_->staged_[static_cast<std::size_t>(op.staged)].buf = nullptr;
    } else if (op.recv) {
      check_separate(op.peer);  // after a large first receive: the descriptor came before the data
    }
  }

 private:
  using Peer = ChannelMemory::Peer;

  Peer& peer(int p) { return mem_->peers_[static_cast<std::size_t>(p)]; }

  /// True for the first send (or receive) to `peer` on `lane` in this call (always false with
  /// descriptors off).
  bool first(int peer, int lane, bool recv) {
    if (!mem_) return false;
    if (lane < 0 || lane >= DescriptorPolicy::kMaxLanes)
      throw Error(ErrorCode::invalid_argument, ErrorContext{g_.rank, peer, describe(stamp_.desc)},
                  "lane " + std::to_string(lane) + " out of range");
    Peer& q = this->peer(peer);
    std::uint64_t& lanes = recv ? q.recv_lanes : q.sent_lanes;
    const std::uint64_t bit = std::uint64_t(1) << lane;
    if (lanes & bit) return false;
    lanes |= bit;
    return true;
  }

  int stage(std::size_t bytes) {
    mem_->staged_.push_back({mem_->stage(sizeof(Stamp) + bytes), {}});
    return static_cast<int>(mem_->staged_.size() - 1);
  }

  /// Sends this call's descriptor to `peer` as its own message (once per call).
  template <class L>
  void send_desc(int peer, L& link) {
    Peer& q = this->peer(peer);
    if (q.desc_sent) return;
    q.desc_sent = true;
    const Stamp& mine = mem_->mine_;
    mem_->ops_.push_back(link.isend(ConstBytes{reinterpret_cast<const std::byte*>(&mine), sizeof mine}, desc_tag_));
  }

  /// Posts the receive of `peer`'s separate descriptor (once per call).
  template <class L>
  void recv_desc(int peer, L& link) {
    Peer& q = this->peer(peer);
    if (q.desc_recv.valid()) return;
    if (mem_->theirs_.size() < mem_->peers_.size()) mem_->theirs_.resize(mem_->peers_.size());
    Stamp* slot = &mem_->theirs_[static_cast<std::size_t>(peer)];
    q.desc_recv = link.irecv(MutableBytes{reinterpret_cast<std::byte*>(slot), sizeof(Stamp)}, desc_tag_);
    mem_->ops_.push_back(q.desc_recv);
  }

  /// A stamped receive is in: compare the stamp, then move the data to the caller's buffer. A
  /// message without a stamp (the peer sent a large message of the same total size: a differing
  /// call) is explained by the peer's separate descriptor.
  void unstage(Op& op) {
    auto& s = mem_->staged_[static_cast<std::size_t>(op.staged)];
    if (!s.buf) return;  // waited for before
    const auto theirs = read_stamp(s.buf, sizeof(Stamp));
    if (!theirs) {
      check_separate(op.peer, /*post=*/true);
      throw Error(ErrorCode::mismatch, ErrorContext{g_.rank, op.peer, describe(stamp_.desc)},
                  "the first message from rank " + std::to_string(op.peer) + " carries no descriptor");
    }
    compare(op.peer, *theirs);
    exec::copy_host(op.dst.data, s.buf + sizeof(Stamp), op.dst.size);
    s.buf = nullptr;
  }

  /// An operation failed with mismatch (another size, or a difference another rank reported):
  /// find the peer's descriptor (a stamp written before a size mismatch failed the receive, else
  /// its separate descriptor) and throw mismatch naming both if it differs.
  void explain_failure(const Op& op) {
    if (peer(op.peer).checked) return;
    if (op.recv) {
      const std::byte* staged = op.staged >= 0 ? mem_->staged_[static_cast<std::size_t>(op.staged)].buf : nullptr;
      // A receive into device memory (a link that takes it directly) is never read on the host.
      const auto theirs = staged                                ? read_stamp(staged, sizeof(Stamp))
                          : op.dst.kind == MemoryKind::host ? read_stamp(op.dst.data, op.dst.size)
                                                               : std::nullopt;
      if (theirs) return compare(op.peer, *theirs);
    }
    check_separate(op.peer, /*post=*/true);
  }

 public:
  /// Waits for `r`, checking with the other ranks each time it stalls (first with the separate
  /// descriptors that have arrived); the request's own timeout still bounds the whole wait.
  void wait_request(Request& r, int peer = -1) {
    if (!r.valid()) return;
    if (r.state()->done()) return r.wait();  // throws its error; no clock read
    if (on_stall_ || peer >= 0) {
      using Clock = std::chrono::steady_clock;
      auto now = Clock::now();
      const auto deadline = now + r.state()->timeout();
      while (now < deadline) {
        if (r.state()->wait_before(std::min(deadline, now + kStallCheck))) return;
        for (int p = 0; peer >= 0 && mem_ && p < g_.size(); ++p) {
          Peer& q = this->peer(p);
          if (!q.checked && q.desc_recv.valid() && q.desc_recv.test()) check_separate(p);
        }
        if (on_stall_) on_stall_(stamp_.desc);
        now = Clock::now();
      }
      return r.state()->wait_until(deadline);  // throws timeout (the transport aborts) unless done
    }
    r.wait();
  }

 private:
  /// Waits for `peer`'s separate descriptor and compares; with `post`, posts its receive first
  /// when that has not happened (a failure that no stamp explains). Nothing to do once checked.
  void check_separate(int peer, bool post = false) {
    Peer& q = this->peer(peer);
    if (q.checked) return;
    if (!q.desc_recv.valid()) {
      if (!post) return;
      recv_desc(peer, g_.transport->link(g_.members[peer]));
    }
    wait_request(q.desc_recv);
    const Stamp& theirs = mem_->theirs_[static_cast<std::size_t>(peer)];
    if (theirs.magic != DescriptorPolicy::kMagic)
      throw Error(ErrorCode::peer_failure, ErrorContext{g_.rank, peer, describe(stamp_.desc)},
                  "rank " + std::to_string(peer) + " sent a malformed collective descriptor");
    compare(peer, theirs.desc);
  }

  /// Equal: the peer is checked. Different: mismatch, thrown (the communicator spreads it).
  void compare(int peer, const CollectiveDesc& theirs) {
    if (theirs == stamp_.desc) {
      this->peer(peer).checked = true;
      return;
    }
    Error e(ErrorCode::mismatch, ErrorContext{g_.rank, peer, describe(stamp_.desc)},
            describe_difference(g_.rank, stamp_.desc, peer, theirs));
    throw e;
  }

  const algo::Group<T>& g_;
  Stamp stamp_;
  Tag desc_tag_;
  std::size_t inline_bytes_;
  OnStall on_stall_;
  std::shared_ptr<ChannelMemory>& owner_;  ///< the communicator's handle on mem_
  ChannelMemory* mem_ = nullptr;           ///< null when descriptors are off
  ChannelMemory* lists_ = nullptr;         ///< the same memory, for the op lists (descriptors or not)
};

}  // namespace chorus::mismatch
