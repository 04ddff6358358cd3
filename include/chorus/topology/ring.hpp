// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// Ring order and the chunk arithmetic of ring reduce-scatter and all-gather.
///
/// Pure rank arithmetic: no I/O, no allocation, every function constexpr (compare UCC's
/// coll_patterns/ring.h). Preconditions, stated once for the whole file: `n >= 1` is the world size,
/// ranks `r` and chunk indices `i` lie in [0, n), steps `k` lie in [0, n - 1).
///
/// Step convention (the one sentence to remember): at reduce-scatter step k rank r sends chunk
/// (r - k - 1) mod n to next(r) and receives chunk (r - k - 2) mod n from prev(r), reducing it into
/// its own copy, so that after the n - 1 steps rank r holds chunk r fully reduced; at all-gather step
/// k rank r sends chunk (r - k) mod n (at step 0 the one it owns, later the one it received last) and
/// receives chunk (r - k - 1) mod n.
///
/// Ring all-reduce for n = 3 (chunks a, b, c owned by ranks 0, 1, 2):
/// ```
///   reduce-scatter  step 0: 0 sends c, 1 sends a, 2 sends b    (each the chunk of its prev)
///                   step 1: 0 sends b, 1 sends c, 2 sends a    (what it reduced at step 0)
///                   now rank 0 holds a = a0+a1+a2, rank 1 b, rank 2 c
///   all-gather      step 0: 0 sends a, 1 sends b, 2 sends c    (the chunk it owns)
///                   step 1: 0 sends c, 1 sends a, 2 sends b    (what it received at step 0)
/// ```

#include <cstddef>

namespace chorus::topology {

/// The rank after r in ring order: the peer r sends to.
constexpr int next(int r, int n) { return r + 1 == n ? 0 : r + 1; }

/// The rank before r in ring order: the peer r receives from.
constexpr int prev(int r, int n) { return r == 0 ? n - 1 : r - 1; }

/// Number of steps of a ring reduce-scatter (and of a ring all-gather): n - 1.
constexpr int ring_steps(int n) { return n - 1; }

/// `x mod n` in [0, n) for any int x, negative too (unlike the % operator).
constexpr int wrap(int x, int n) {
  const int m = x % n;
  return m < 0 ? m + n : m;
}

// ---------------------------------------------------------------------------------------------
// Chunks: a buffer of `count` elements cut into n contiguous chunks whose sizes differ by at most
// one, the first count % n chunks one element larger. With count < n the last n - count chunks are
// empty (begin == end), which the algorithms must tolerate (they send zero bytes).
// ---------------------------------------------------------------------------------------------

/// Size of chunk i: count / n, plus one for the first count % n chunks.
constexpr std::size_t chunk_size(int i, std::size_t count, int n) {
  const auto un = static_cast<std::size_t>(n);
  const auto ui = static_cast<std::size_t>(i);
  return count / un + (ui < count % un ? 1 : 0);
}

/// First element of chunk i; chunk i is [chunk_begin(i), chunk_end(i)).
constexpr std::size_t chunk_begin(int i, std::size_t count, int n) {
  const auto un = static_cast<std::size_t>(n);
  const auto ui = static_cast<std::size_t>(i);
  const std::size_t rem = count % un;
  return ui * (count / un) + (ui < rem ? ui : rem);
}

/// One past the last element of chunk i; chunk_end(n - 1, count, n) == count.
constexpr std::size_t chunk_end(int i, std::size_t count, int n) {
  return chunk_begin(i, count, n) + chunk_size(i, count, n);
}

// ---------------------------------------------------------------------------------------------
// Ring reduce-scatter and all-gather schedules (see the step convention at the top).
// ---------------------------------------------------------------------------------------------

/// The chunk rank r holds fully reduced after the reduce-scatter: chunk r, which is also the
/// chunk it contributes first in the all-gather. Matches the reduce_scatter collective, whose
/// output on rank r is chunk r.
constexpr int owned_chunk(int r, int n) { return wrap(r, n); }

/// Reduce-scatter step k: the chunk r sends to next(r). At step 0 this is r's own input of chunk
/// prev(r); at step k > 0 it is the chunk r received and reduced at step k - 1.
constexpr int reduce_scatter_send_chunk(int r, int k, int n) { return wrap(r - k - 1, n); }

/// Reduce-scatter step k: the chunk r receives from prev(r) and reduces into its own copy; equal to
/// reduce_scatter_send_chunk(prev(r), k, n). At the last step (k = n - 2) it is owned_chunk(r).
constexpr int reduce_scatter_recv_chunk(int r, int k, int n) { return wrap(r - k - 2, n); }

/// All-gather step k: the chunk r sends to next(r): owned_chunk(r) at step 0, then the chunk it
/// received at step k - 1.
constexpr int all_gather_send_chunk(int r, int k, int n) { return wrap(r - k, n); }

/// All-gather step k: the chunk r receives from prev(r) and stores; equal to
/// all_gather_send_chunk(prev(r), k, n). Over the n - 1 steps r receives every chunk but its own.
constexpr int all_gather_recv_chunk(int r, int k, int n) { return wrap(r - k - 1, n); }

// ---------------------------------------------------------------------------------------------
// Rotation relative to a root: rooted algorithms (binomial broadcast, reduce, scatter, gather) are
// written for root 0 in "virtual" ranks and run for any root by rotating, v = (r - root) mod n.
// ---------------------------------------------------------------------------------------------

/// Virtual rank of real rank r when `root` plays virtual rank 0.
constexpr int to_virtual(int r, int root, int n) { return wrap(r - root, n); }

/// Real rank of virtual rank v when `root` plays virtual rank 0; inverse of to_virtual.
constexpr int to_real(int v, int root, int n) { return wrap(v + root, n); }

}  // namespace chorus::topology
