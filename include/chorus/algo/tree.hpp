// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// Tree algorithms: binomial broadcast and reduce (latency ceil(log2 P) steps), and recursive
/// doubling all-reduce for small messages (log2 P steps, the whole buffer each step), folded for
/// world sizes that are not powers of two.

#include <algorithm>

#include "chorus/algo/channel.hpp"
#include "chorus/algo/common.hpp"
#include "chorus/topology/tree.hpp"

namespace chorus::algo {

/// Broadcast down the binomial tree rooted at a.root: receive from the parent, then send to the
/// children, largest subtree first. buf = a.out (count elements).
template <class Ch>
void binomial_broadcast(Ch& ch, const Args& a) {
  const int n = ch.size(), r = ch.rank();
  const std::size_t bytes = a.bytes(a.count);
  // 1. Receive the buffer from the parent (the root has it).
  if (const int parent = topology::binomial_parent_rooted(r, a.root, n); parent != topology::kNoRank)
    ch.recv(parent, mbytes(a.out, bytes));
  // 2. Pass it on to every child at once.
  const auto children = topology::binomial_children_rooted(r, a.root, n);
  auto& sends = ch.ops(0);
  for (int c : children) sends.push_back(ch.isend(c, cbytes(a.out, bytes)));
  ch.wait_all(sends);
}

/// Reduce up the binomial tree to a.root: accumulate the children's partial results (smallest
/// subtree first, a fixed order, so the result is the same from run to run), then send to the
/// parent. The root's result goes to a.out; other ranks leave a.out untouched.
template <class Ch>
void binomial_reduce(Ch& ch, const Args& a) {
  const int n = ch.size(), r = ch.rank();
  const std::size_t bytes = a.bytes(a.count);
  const int parent = topology::binomial_parent_rooted(r, a.root, n);
  // 1. The accumulator: out on the root, scratch elsewhere; a second scratch half receives.
  std::byte* work = a.x().slots(2 * bytes);
  std::byte* acc = parent == topology::kNoRank ? a.out : work;
  std::byte* incoming = work + bytes;
  a.x().copy(acc, a.in, bytes);
  // 2. Fold in the children, smallest subtree first.
  const auto children = topology::binomial_children_rooted(r, a.root, n);
  for (int i = children.size() - 1; i >= 0; --i) {
    ch.recv(children[i], mbytes(incoming, bytes));
    a.x().reduce(a.op, a.dtype, acc, acc, incoming, a.count);
  }
  // 3. Pass the partial result up, or finish on the root.
  if (parent != topology::kNoRank)
    ch.send(parent, cbytes(acc, bytes));
  else if (a.op == ReduceOp::avg)
    a.x().finalize_avg(a.dtype, acc, a.count, n);
}

/// All-reduce by recursive doubling: at step k exchange the whole buffer with r ^ 2^k and reduce.
/// Ranks beyond the largest power of two p first hand their data to a proxy (r - p) and get the
/// result back at the end. For small messages: log2 P latency terms, P log2 P bytes.
template <class Ch>
void recursive_doubling_all_reduce(Ch& ch, const Args& a) {
  const int n = ch.size(), r = ch.rank();
  const std::size_t bytes = a.bytes(a.count);
  std::byte* incoming = a.x().slots(bytes);
  a.x().copy(a.out, a.in, bytes);
  const auto role = topology::fold_role(r, n);
  const int partner = topology::fold_partner(r, n);
  // 1. Fold: extra ranks hand their data to their proxy and wait for the result.
  if (role == topology::FoldRole::extra) {
    ch.send(partner, cbytes(a.out, bytes));
    ch.recv(partner, mbytes(a.out, bytes));
    return;
  }
  if (role == topology::FoldRole::proxy) {
    ch.recv(partner, mbytes(incoming, bytes));
    a.x().reduce(a.op, a.dtype, a.out, a.out, incoming, a.count);
  }
  // 2. Recursive doubling among the p core ranks. Both partners compute a op b (commutative,
  //    IEEE-exact either way round), so every rank ends with the same bits.
  for (int k = 0; k < topology::recursive_doubling_steps(n); ++k) {
    const int peer = topology::recursive_doubling_partner(r, k, n);
    ch.sendrecv(peer, cbytes(a.out, bytes), peer, mbytes(incoming, bytes));
    a.x().reduce(a.op, a.dtype, a.out, a.out, incoming, a.count);
  }
  if (a.op == ReduceOp::avg) a.x().finalize_avg(a.dtype, a.out, a.count, n);
  // 3. Unfold: proxies return the result.
  if (role == topology::FoldRole::proxy) ch.send(partner, cbytes(a.out, bytes));
}

}  // namespace chorus::algo
