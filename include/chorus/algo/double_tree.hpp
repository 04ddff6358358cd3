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
#include "chorus/reduce/host.hpp"
#include "chorus/topology/tree.hpp"

namespace chorus::algo {

namespace detail {

/// One tree's share of the work: elements [begin, begin + count) of out, reduced up the tree and
/// broadcast back down, slice by slice. step(t) does the up-part of slice t and the down-part of
/// slice t - kLag; run(t) for t = 0 .. slices + kLag - 1 finishes.
template <Transport T>
class TreePipeline {
 public:
  static constexpr std::size_t kLag = 1;  ///< slices in flight between the up and down phases

  TreePipeline(Channel<T>& ch, const Args& a, topology::TreeNode node, int lane, std::size_t begin, std::size_t count,
               std::byte* slots)
      : ch_(ch), a_(a), node_(node), lane_(lane), begin_(begin), count_(count), se_(slice_elems(a)), slots_(slots) {
    slices_ = std::max<std::size_t>(1, (count_ + se_ - 1) / se_);  // one message even when empty
    up_sends_.resize(slices_);
  }

  std::size_t steps() const { return slices_ + kLag; }

  void step(std::size_t t) {
    if (t < slices_) up(t);
    if (t >= kLag && t - kLag < slices_) down(t - kLag);
  }

  void finish() { ch_.wait_all(down_sends_); }

 private:
  std::size_t off(std::size_t j) const { return std::min(j * se_, count_); }
  std::size_t len(std::size_t j) const { return std::min(se_, count_ - off(j)); }
  std::byte* at(std::size_t j) const { return a_.out + a_.bytes(begin_ + off(j)); }

  /// Up: add the children's slice j into ours (children in a fixed order), pass it to the parent.
  void up(std::size_t j) {
    const std::size_t bytes = a_.bytes(len(j));
    typename Channel<T>::Op in[2];
    for (int c = 0; c < node_.child_count; ++c)
      in[c] = ch_.irecv(node_.children[c], mbytes(slots_ + c * a_.bytes(se_), bytes), lane_);
    for (int c = 0; c < node_.child_count; ++c) {
      ch_.wait(in[c]);
      chorus::reduce(a_.op, a_.dtype, at(j), slots_ + c * a_.bytes(se_), len(j));
    }
    if (node_.parent != topology::kNoRank) up_sends_[j] = ch_.isend(node_.parent, cbytes(at(j), bytes), lane_);
  }

  /// Down: take the final slice j from the parent (the root has it: finish avg there), pass it on.
  void down(std::size_t j) {
    const std::size_t bytes = a_.bytes(len(j));
    if (node_.parent != topology::kNoRank) {
      ch_.wait(up_sends_[j]);  // the slice's region is about to be overwritten
      ch_.recv(node_.parent, mbytes(at(j), bytes), lane_);
    } else if (a_.op == ReduceOp::avg) {
      chorus::finalize_avg(a_.dtype, at(j), len(j), ch_.size());
    }
    for (int c = 0; c < node_.child_count; ++c)
      down_sends_.push_back(ch_.isend(node_.children[c], cbytes(at(j), bytes), lane_));
  }

  Channel<T>& ch_;
  const Args& a_;
  topology::TreeNode node_;
  int lane_;
  std::size_t begin_, count_, se_, slices_;
  std::byte* slots_;
  std::vector<typename Channel<T>::Op> up_sends_;
  std::vector<typename Channel<T>::Op> down_sends_;
};

}  // namespace detail

/// All-reduce over the double binary tree: half the buffer on each tree, both pipelines advanced
/// in lock step (lanes 0 and 1 keep their messages apart where two ranks are linked in both).
template <Transport T>
void double_tree_all_reduce(Channel<T>& ch, const Args& a, Scratch& s) {
  const int n = ch.size(), r = ch.rank();
  copy_if_distinct(a.out, a.in, a.bytes(a.count));
  const std::size_t half = a.count / 2;
  std::byte* slots = s.get(4 * a.bytes(slice_elems(a)));  // two children per tree
  const auto nodes = topology::double_binary_tree(r, n);
  detail::TreePipeline<T> t0(ch, a, nodes[0], 0, 0, half, slots);
  detail::TreePipeline<T> t1(ch, a, nodes[1], 1, half, a.count - half, slots + 2 * a.bytes(slice_elems(a)));
  for (std::size_t t = 0; t < std::max(t0.steps(), t1.steps()); ++t) {
    if (t < t0.steps()) t0.step(t);
    if (t < t1.steps()) t1.step(t);
  }
  t0.finish();
  t1.finish();
}

}  // namespace chorus::algo
