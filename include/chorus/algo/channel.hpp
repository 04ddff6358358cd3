// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// Channel: what an algorithm talks through during one collective call. It knows the group (its
/// ranks in the transport's numbering), the call's tag, its executor, and nothing of the
/// transport but the Link concept. Two layers sit behind each message:
/// * the mismatch protocol (algo/call_check.hpp): the call's descriptor rides on or before
///   the first message to each peer and is compared on arrival;
/// * staging (exec/executor.hpp): when the call's buffers are in memory links cannot read
///   (device memory), a send's bytes are downloaded into host staging first and a receive lands
///   in host staging and is uploaded into place once in (behind the executor's earlier work, so a
///   reduction issued after wait() sees it). Slices are staged one by one as the algorithm issues
///   them: the download of slice k+1 runs while slice k is on the wire.
/// * direct device memory: a link that takes the call's device memory as it is (a link with
///   device_memory(runtime, p, bytes): rdma with dma-buf registration, for messages above its
///   eager size) gets the buffer itself, with no staging. Before such a send or receive is posted
///   the executor's stream is waited for (sync): a send's data is then final, and no work issued
///   earlier still reads or writes memory that a receive is about to overwrite. A receive lands
///   in place, so a reduction issued after wait() follows on the stream as after an upload.
/// Algorithms are symmetric (a's k-th send to b on a lane is b's k-th receive from a on it), so a
/// first send and a first receive always meet.

#include <chrono>
#include <memory>
#include <span>
#include <vector>

#include "chorus/algo/descriptor.hpp"
#include "chorus/algo/group.hpp"
#include "chorus/core/concepts.hpp"
#include "chorus/device/runtime.hpp"
#include "chorus/exec/executor.hpp"
#include "chorus/algo/call_check.hpp"
#include "chorus/core/tag.hpp"

namespace chorus::algo {

using mismatch::ChannelMemory;

/// The blocking steps of a channel (algo::Channel, sim::Channel), written once over its own
/// isend, irecv and wait (CRTP).
template <class Derived>
class BlockingSteps {
 public:
  void wait_all(std::span<ChannelOp> ops) {
    for (auto& o : ops) self().wait(o);
  }
  void send(int peer, ConstBytes b, int lane = 0) {
    auto op = self().isend(peer, b, lane);
    self().wait(op);
  }
  void recv(int peer, MutableBytes b, int lane = 0) {
    auto op = self().irecv(peer, b, lane);
    self().wait(op);
  }
  /// Sends to one peer while receiving from another (or the same), then waits for both.
  void sendrecv(int to, ConstBytes out, int from, MutableBytes in) {
    ChannelOp ops[2] = {self().irecv(from, in), self().isend(to, out)};
    wait_all(ops);
  }

 private:
  Derived& self() { return static_cast<Derived&>(*this); }
};

template <Transport T>
class Channel : public BlockingSteps<Channel<T>> {
 public:
  using Op = ChannelOp;
  using OnStall = typename mismatch::CallCheck<T>::OnStall;
  static constexpr auto kStallCheck = mismatch::CallCheck<T>::kStallCheck;

  /// `memory`: the communicator's, reused across its calls (see mismatch::CallCheck).
  Channel(const Group<T>& g, CollectiveDesc desc, std::shared_ptr<ChannelMemory>& memory, exec::Executor& x,
          OnStall on_stall = {})
      : g_(g),
        x_(x),
        data_tag_(g.context | chorus::detail::kInternalTagBit | kTagClassData | (desc.seq & kSeqMask)),
        check_(g, desc,
               g.context | chorus::detail::kInternalTagBit | kTagClassDesc | (desc.seq & kSeqMask), memory,
               x.staged() ? 0 : mismatch::DescriptorPolicy::kInlineBytes, std::move(on_stall)) {}

  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  /// An empty list for operations in flight (list i of ChannelMemory::kOpLists), reused from call
  /// to call so an algorithm allocates none: lists that are alive at the same time need different
  /// indices, and getting a list again empties it.
  std::vector<Op>& ops(int i) {
    auto& v = check_.lists().op_lists_[static_cast<std::size_t>(i)];
    v.clear();
    return v;
  }

  int rank() const { return g_.rank; }
  int size() const { return g_.size(); }
  const CollectiveDesc& desc() const { return check_.desc(); }

  /// Lanes (0..kMaxLanes-1) separate independent streams between the same pair within one call
  /// (the two trees of a double binary tree): messages match in order per (peer, lane).
  Op isend(int peer, ConstBytes b, int lane = 0) {
    auto& link = g_.transport->link(g_.members[peer]);
    if (x_.staged())
      if (device::Runtime* rt = x_.runtime()) rt->note_round_trip();  // a host message of a device call
    if (x_.staged() && b.size != 0) {
      if (direct(link, b.data, b.size)) {
        x_.sync();  // the data is final
        b.kind = x_.kind();
      } else {
        std::byte* host = x_.stage(b.size);
        x_.download(host, b.data, b.size);
        b = ConstBytes{host, b.size};
      }
    }
    Op op{{}, peer, false, -1, {}, nullptr};
    if (!check_.send(link, op, lane, b, lane_tag(lane))) op.req = link.isend(b, lane_tag(lane));
    return op;
  }

  Op irecv(int peer, MutableBytes b, int lane = 0) {
    auto& link = g_.transport->link(g_.members[peer]);
    Op op{{}, peer, true, -1, b, nullptr};
    if (x_.staged() && b.size != 0) {
      if (direct(link, b.data, b.size)) {
        x_.sync();  // nothing issued before still uses the memory the peer writes
        b.kind = x_.kind();
        op.dst = b;
      } else {
        op.upload_to = b.data;
        b = MutableBytes{x_.stage(b.size), b.size};
        op.dst = b;
      }
    }
    if (!check_.recv(link, op, lane, b, lane_tag(lane))) op.req = link.irecv(b, lane_tag(lane));
    return op;
  }

  /// Completes the descriptor exchange; call once the algorithm is done (mismatch::CallCheck).
  void finish() { check_.finish(); }

  /// Waits for one operation (and checks the peer's descriptor, see mismatch::CallCheck::wait);
  /// a staged receive is then uploaded into place.
  void wait(Op& op) {
    check_.wait(op);
    if (op.upload_to) {
      x_.upload(op.upload_to, op.dst.data, op.dst.size);
      op.upload_to = nullptr;
    }
  }

 private:
  /// Whether `link` takes this message of the executor's memory as it is (see the top).
  template <class L>
  bool direct(L& link, const std::byte* p, std::size_t bytes) {
    if constexpr (LinkWithDeviceMemory<L>) {
      device::Runtime* rt = x_.runtime();
      return rt != nullptr && link.device_memory(*rt, p, bytes);
    } else {
      return false;
    }
  }

  Tag lane_tag(int lane) const { return data_tag_ | (static_cast<Tag>(lane & 0xff) << kLaneShift); }

  const Group<T>& g_;
  exec::Executor& x_;
  Tag data_tag_;
  mismatch::CallCheck<T> check_;
};

}  // namespace chorus::algo
