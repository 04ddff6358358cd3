// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// Pipelined tree all-reduce over NCCL's double binary tree (topology/tree.hpp): the buffer is cut
/// in two halves, each reduced up one binary tree and broadcast back down it, slice by slice, so
/// that a slice travels down while later slices still travel up. Every rank is an inner node in
/// at most one tree (for even P), so its links carry about the same load in both trees. Latency:
/// 2 log2 P steps plus one per slice; each rank sends about 2x the buffer (vs 2(P-1)/P for ring),
/// which pays for mid-sized messages at large P, where the ring's 2(P-1) steps dominate.

#include <algorithm>
#include <array>
#include <vector>

#include "chorus/algo/channel.hpp"
#include "chorus/algo/common.hpp"
#include "chorus/topology/tree.hpp"

namespace chorus::algo {

namespace detail {

/// One tree's share of the work: elements [begin, begin + count) of out, reduced up the tree and
/// broadcast back down, slice by slice.
///
/// Schedule. All ranks run the same global steps t = 0, 1, ...; a node at depth k (D = the bound
/// ceil_log2(P) on the depth) does up(j) at step j + D - k and down(j) at step j + D + k. So a
/// child does up(j) one step before its parent and down(j) one step after it: what a step waits
/// for was sent one step earlier, and no step waits for a round trip through the tree. A rank's
/// critical path is D + slices + D steps, each moving a slice per link.
///
/// The receives of the children's slices are posted kWindow slices ahead, into kWindow slots per
/// child, so a slice that arrives early lands in place (no unexpected-message copy) and a
/// rendezvous-sized slice is never held up waiting for its receive.
template <class Ch>
class TreePipeline {
 public:
  static constexpr std::size_t kWindow = 2;  ///< slices whose receives are posted ahead, per child

  static std::size_t slot_bytes(const Args& a) { return 2 * kWindow * a.bytes(slice_elems(a)); }

  TreePipeline(Ch& ch, const Args& a, topology::TreeNode node, int depth, int max_depth, int lane,
               std::size_t begin, std::size_t count, std::byte* slots)
      : ch_(ch),
        a_(a),
        node_(node),
        up_at_(static_cast<std::size_t>(max_depth - depth)),
        down_at_(static_cast<std::size_t>(max_depth + depth)),
        lane_(lane),
        begin_(begin),
        count_(count),
        se_(slice_elems(a)),
        slots_(slots),
        up_sends_(ch.ops(2 * lane)),  // lists 0-1 for lane 0's tree, 2-3 for lane 1's
        down_sends_(ch.ops(2 * lane + 1)) {
    slices_ = std::max<std::size_t>(1, (count_ + se_ - 1) / se_);  // one message even when empty
    up_sends_.resize(slices_);
    for (std::size_t j = 0; j < std::min(kWindow, slices_); ++j) post_up_recvs(j);
  }

  std::size_t steps() const { return slices_ + down_at_; }

  void step(std::size_t t) {
    if (t >= up_at_ && t - up_at_ < slices_) up(t - up_at_);
    if (t >= down_at_ && t - down_at_ < slices_) down(t - down_at_);
  }

  void finish() { ch_.wait_all(down_sends_); }

 private:
  std::size_t off(std::size_t j) const { return std::min(j * se_, count_); }
  std::size_t len(std::size_t j) const { return std::min(se_, count_ - off(j)); }
  std::byte* at(std::size_t j) const { return a_.out + a_.bytes(begin_ + off(j)); }
  std::byte* slot(int c, std::size_t j) const { return slots_ + (c * kWindow + j % kWindow) * a_.bytes(se_); }

  void post_up_recvs(std::size_t j) {
    for (int c = 0; c < node_.child_count; ++c)
      in_[c][j % kWindow] = ch_.irecv(node_.children[c], mbytes(slot(c, j), a_.bytes(len(j))), lane_);
  }

  /// Up: add the children's slice j into ours (children in a fixed order), pass it to the parent.
  void up(std::size_t j) {
    for (int c = 0; c < node_.child_count; ++c) {
      ch_.wait(in_[c][j % kWindow]);
      a_.x().reduce(a_.op, a_.dtype, at(j), at(j), slot(c, j), len(j));
    }
    if (j + kWindow < slices_) post_up_recvs(j + kWindow);  // the slots of slice j are free again
    if (node_.parent != topology::kNoRank) up_sends_[j] = ch_.isend(node_.parent, cbytes(at(j), a_.bytes(len(j))), lane_);
  }

  /// Down: take the final slice j from the parent (the root has it: finish avg there), pass it on.
  void down(std::size_t j) {
    const std::size_t bytes = a_.bytes(len(j));
    if (node_.parent != topology::kNoRank) {
      ch_.wait(up_sends_[j]);  // the slice's region is about to be overwritten
      ch_.recv(node_.parent, mbytes(at(j), bytes), lane_);
    } else if (a_.op == ReduceOp::avg) {
      a_.x().finalize_avg(a_.dtype, at(j), len(j), ch_.size());
    }
    for (int c = 0; c < node_.child_count; ++c)
      down_sends_.push_back(ch_.isend(node_.children[c], cbytes(at(j), bytes), lane_));
  }

  Ch& ch_;
  const Args& a_;
  topology::TreeNode node_;
  std::size_t up_at_, down_at_;
  int lane_;
  std::size_t begin_, count_, se_, slices_;
  std::byte* slots_;
  ChannelOp in_[2][kWindow];
  std::vector<ChannelOp>& up_sends_;
  std::vector<ChannelOp>& down_sends_;
};

}  // namespace detail

/// All-reduce over the double binary tree: half the buffer on each tree, both pipelines advanced
/// in lock step (lanes 0 and 1 keep their messages apart where two ranks are linked in both).
template <class Ch>
void double_tree_all_reduce(Ch& ch, const Args& a) {
  const int n = ch.size(), r = ch.rank();
  a.x().copy(a.out, a.in, a.bytes(a.count));
  const std::size_t half = a.count / 2;
  const std::size_t per_tree = detail::TreePipeline<Ch>::slot_bytes(a);
  std::byte* slots = a.x().slots(2 * per_tree);
  const auto nodes = topology::double_binary_tree(r, n);
  const int max_depth = topology::ceil_log2(n);
  detail::TreePipeline<Ch> t0(ch, a, nodes[0], topology::binary_tree_depth(r, n, 0), max_depth, 0, 0, half, slots);
  detail::TreePipeline<Ch> t1(ch, a, nodes[1], topology::binary_tree_depth(r, n, 1), max_depth, 1, half,
                             a.count - half, slots + per_tree);
  for (std::size_t t = 0; t < std::max(t0.steps(), t1.steps()); ++t) {
    if (t < t0.steps()) t0.step(t);
    if (t < t1.steps()) t1.step(t);
  }
  t0.finish();
  t1.finish();
}

}  // namespace chorus::algo
