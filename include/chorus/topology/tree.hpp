// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// Trees and exchange patterns over ranks: binomial tree, binary and double binary tree, recursive
/// doubling / halving with the fold for non-powers of two, and the dissemination barrier.
///
/// Pure rank arithmetic: no I/O, no allocation, every function constexpr (compare UCC's
/// coll_patterns/double_binary_tree.h and recursive_knomial.h). Preconditions, stated once for the
/// whole file: `n >= 1` is the world size (at most 2^31 - 1), ranks lie in [0, n). A missing rank
/// (the root's parent, an absent child, a rank with no partner) is kNoRank.

#include <array>
#include <bit>

#include "chorus/topology/ring.hpp"

namespace chorus::topology {

/// "No such rank": the parent of a root, an unused child slot, the fold partner of a rank that has none.
inline constexpr int kNoRank = -1;

// ---------------------------------------------------------------------------------------------
// Powers of two
// ---------------------------------------------------------------------------------------------

/// The largest power of two p <= n (n >= 1): 1, 2, 2, 4, 4, 4, 4, 8, ...
constexpr int largest_power_of_two_le(int n) {
  return static_cast<int>(std::bit_floor(static_cast<unsigned>(n)));
}

/// floor(log2 n) for n >= 1.
constexpr int floor_log2(int n) { return std::bit_width(static_cast<unsigned>(n)) - 1; }

/// ceil(log2 n) for n >= 1: the number of rounds of a binomial broadcast or a dissemination barrier.
constexpr int ceil_log2(int n) { return std::bit_width(static_cast<unsigned>(n) - 1u); }

// ---------------------------------------------------------------------------------------------
// Binomial tree, in virtual ranks (root = virtual 0; rotate with to_virtual / to_real, or use the
// *_rooted forms below). The parent of v > 0 is v with its lowest set bit cleared; the children of
// v are v + 2^j for every 2^j below v's lowest set bit (every 2^j < n for v = 0) with v + 2^j < n.
//
//   n = 8:   0 ── 4 ── 6 ── 7         broadcast rounds: 1: 0→4
//            │    └─── 5                                2: 0→2, 4→6
//            ├─ 2 ── 3                                  3: 0→1, 2→3, 4→5, 6→7
//            └─ 1
//
// Children come largest subtree first (child v + 2^j roots a subtree of up to 2^j ranks): a node
// that receives in round t and sends to its children in this order finishes a broadcast in
// ceil_log2(n) rounds, the minimum. Depth (edges from the root) is at most ceil_log2(n).
// ---------------------------------------------------------------------------------------------

/// A node's children, in the order it should send to them. Up to 31 for any int world size.
struct Children {
  int ranks[32] = {};
  int count = 0;

  constexpr const int* begin() const { return ranks; }
  constexpr const int* end() const { return ranks + count; }
  constexpr int operator[](int i) const { return ranks[i]; }
  constexpr int size() const { return count; }
  constexpr bool contains(int r) const {
    for (int i = 0; i < count; ++i)
      if (ranks[i] == r) return true;
    return false;
  }
};

/// Parent of virtual rank v in the binomial tree rooted at virtual 0; kNoRank for v == 0.
constexpr int binomial_parent(int v, int /*n*/) { return v == 0 ? kNoRank : v & (v - 1); }

/// Children of virtual rank v in the binomial tree rooted at virtual 0, largest subtree first.
constexpr Children binomial_children(int v, int n) {
  Children c;
  // Masks strictly below v's lowest set bit; for the root, every power of two below n.
  const long long limit = v == 0 ? static_cast<long long>(n) : static_cast<long long>(v & -v);
  long long mask = 1;
  while (mask * 2 < limit) mask *= 2;
  for (; mask >= 1 && mask < limit; mask /= 2)
    if (v + mask < n) c.ranks[c.count++] = static_cast<int>(v + mask);
  return c;
}

/// Parent of real rank r in the binomial tree rooted at real rank `root`; kNoRank for the root.
constexpr int binomial_parent_rooted(int r, int root, int n) {
  const int p = binomial_parent(to_virtual(r, root, n), n);
  return p == kNoRank ? kNoRank : to_real(p, root, n);
}

/// Children (real ranks) of real rank r in the binomial tree rooted at `root`, largest subtree first.
constexpr Children binomial_children_rooted(int r, int root, int n) {
  Children c = binomial_children(to_virtual(r, root, n), n);
  for (int i = 0; i < c.count; ++i) c.ranks[i] = to_real(c.ranks[i], root, n);
  return c;
}

// ---------------------------------------------------------------------------------------------
// Binary tree and double binary tree (NCCL's construction, src/graph/trees.cc, rewritten here).
//
// Tree 0 is an in-order binary tree: rank 0 is the root and has a single child, the largest power
// of two below n; every other rank r, with lowest set bit b, has children r - b/2 (always present)
// and r + b/2 (or, where that is >= n, the first of r + b/4, r + b/8, ..., r + 1 below n). Left
// subtrees hold smaller ranks, right subtrees larger ones; the leaves are exactly the odd ranks.
//
//   n = 14:  0 ── 8 ─┬─ 4 ─┬─ 2 ─┬─ 1              depth (edges from the root) <= ceil_log2(n)
//                    │     │     └─ 3
//                    │     └─ 6 ─┬─ 5
//                    │           └─ 7
//                    └─ 12 ┬─ 10 ┬─ 9
//                          │     └─ 11
//                          └─ 13
//
// Tree 1 is tree 0 mirrored (rank r plays n - 1 - r) when n is even, shifted by one (rank r plays
// r - 1 mod n) when n is odd. Roots: tree 0 at rank 0; tree 1 at rank n - 1 (n even) or rank 1
// (n odd, n > 1); both trees are rank 0 alone for n == 1. Each root has one child (for n > 1).
//
// What the pair guarantees (tested in tests/unit/test_topology.cpp):
//   - every rank has at most 2 children in each tree, and at most 2 children over both trees, so
//     pipelining half the data through each tree keeps every rank's send and receive load even;
//   - for even n, every rank is a leaf in at least one of the two trees (the interior nodes of one
//     tree are leaves of the other); for odd n > 1 this holds for every rank except rank 0, which
//     is the root of tree 0 (one child) and an interior node with one child in tree 1. With a
//     one-child root each tree has only (n - 1) / 2 leaves for odd n, too few to cover n ranks.
// ---------------------------------------------------------------------------------------------

/// A node of a binary tree: parent (kNoRank at the root) and children[0 .. child_count).
/// Unused child slots hold kNoRank.
struct TreeNode {
  int parent = kNoRank;
  int children[2] = {kNoRank, kNoRank};
  int child_count = 0;
};

namespace detail {

/// Tree 0 of the header comment: in-order binary tree rooted at rank 0.
constexpr TreeNode in_order_tree_node(int r, int n) {
  TreeNode node;
  if (r == 0) {
    if (n > 1) node.children[node.child_count++] = largest_power_of_two_le(n - 1);
    return node;
  }
  const int low = r & -r;
  // Natural parent: clear the lowest bit and set the next one (xx01 -> xx10, xx11 -> xx10); where
  // that lies beyond the last rank, the parent is r with its lowest bit cleared, which then has r
  // as its right child.
  const long long up = static_cast<long long>(r ^ low) | (static_cast<long long>(low) << 1);
  node.parent = up < n ? static_cast<int>(up) : (r ^ low);
  if (low > 1) {
    node.children[node.child_count++] = r - low / 2;
    int step = low / 2;
    while (step > 0 && r + static_cast<long long>(step) >= n) step /= 2;
    if (step > 0) node.children[node.child_count++] = r + step;
  }
  return node;
}

/// Applies the rank map f to every rank a node names.
template <class F>
constexpr TreeNode map_tree_node(TreeNode node, F f) {
  if (node.parent != kNoRank) node.parent = f(node.parent);
  for (int i = 0; i < node.child_count; ++i) node.children[i] = f(node.children[i]);
  return node;
}

}  // namespace detail

/// Root of binary tree `tree_index` (0 or 1) of the double binary tree over n ranks.
constexpr int binary_tree_root(int n, int tree_index) {
  if (tree_index == 0 || n == 1) return 0;
  return n % 2 == 0 ? n - 1 : 1;
}

/// Rank r's node in binary tree `tree_index` (0: in-order tree rooted at 0; 1: its mirror for even
/// n, its shift by one for odd n). See the block comment above.
constexpr TreeNode binary_tree_node(int r, int n, int tree_index) {
  if (tree_index == 0) return detail::in_order_tree_node(r, n);
  if (n % 2 == 0) {
    const auto mirror = [n](int x) { return n - 1 - x; };
    return detail::map_tree_node(detail::in_order_tree_node(mirror(r), n), mirror);
  }
  return detail::map_tree_node(detail::in_order_tree_node(wrap(r - 1, n), n),
                               [n](int x) { return wrap(x + 1, n); });
}

/// Rank r's nodes in both trees of the double binary tree: [0] in tree 0, [1] in tree 1.
constexpr std::array<TreeNode, 2> double_binary_tree(int r, int n) {
  return {binary_tree_node(r, n, 0), binary_tree_node(r, n, 1)};
}

/// Rank r's depth in binary tree `tree_index`: edges from the root (0 at the root), at most
/// ceil_log2(n).
constexpr int binary_tree_depth(int r, int n, int tree_index) {
  int depth = 0;
  for (int v = binary_tree_node(r, n, tree_index).parent; v != kNoRank; v = binary_tree_node(v, n, tree_index).parent)
    ++depth;
  return depth;
}

// ---------------------------------------------------------------------------------------------
// Recursive doubling and recursive halving-doubling, with the fold for non-powers of two.
//
// Let p = largest_power_of_two_le(n) and e = n - p. The ranks [p, n) are "extra": each pairs with
// the proxy r - p in [0, e). An all-reduce then runs in three phases:
//   1. fold in:  extra r sends its whole input to proxy r - p, which reduces it into its own;
//   2. core:     the p ranks [0, p) run log2(p) steps of recursive doubling (step k: exchange with
//                r ^ 2^k and reduce) or of recursive halving then doubling (below);
//   3. fold out: proxy r sends the result to extra r + p.
// For n a power of two there are no extra ranks and phases 1 and 3 are empty.
//
// Recursive halving (Rabenseifner's reduce-scatter among the p core ranks, the buffer cut into p
// blocks): at step k rank r exchanges with r ^ (p / 2^(k+1)); it sends the half of its current
// window that halving_window(partner, k) names and receives and reduces the half
// halving_window(r, k) names. After log2(p) steps rank r holds block r fully reduced. The
// all-gather by recursive doubling runs the same steps in reverse order (k = log2(p) - 1 .. 0),
// each rank sending halving_window(r, k) and receiving halving_window(partner, k).
// ---------------------------------------------------------------------------------------------

/// A rank's part in the fold: `core` ranks only take part in phase 2, `proxy` ranks (in [0, e))
/// also absorb an extra rank, `extra` ranks (in [p, n)) sit phase 2 out.
enum class FoldRole { core, proxy, extra };

/// Rank r's role in the fold for n ranks.
constexpr FoldRole fold_role(int r, int n) {
  const int p = largest_power_of_two_le(n);
  if (r >= p) return FoldRole::extra;
  return r < n - p ? FoldRole::proxy : FoldRole::core;
}

/// Rank r's partner in phases 1 and 3: r - p for an extra rank, r + p for a proxy, kNoRank for a
/// core rank.
constexpr int fold_partner(int r, int n) {
  const int p = largest_power_of_two_le(n);
  if (r >= p) return r - p;
  return r < n - p ? r + p : kNoRank;
}

/// Number of steps of phase 2: log2(largest_power_of_two_le(n)).
constexpr int recursive_doubling_steps(int n) { return floor_log2(n); }

/// Phase 2 partner of core rank r at recursive-doubling step k: r ^ 2^k (distance grows).
constexpr int recursive_doubling_partner(int r, int k, int /*n*/) { return r ^ (1 << k); }

/// Phase 2 partner of core rank r at recursive-halving step k: r ^ (p / 2^(k+1)) (distance shrinks).
constexpr int recursive_halving_partner(int r, int k, int n) {
  return r ^ (largest_power_of_two_le(n) >> (k + 1));
}

/// A range of blocks [first, first + count) of the p blocks of recursive halving.
struct BlockRange {
  int first = 0;
  int count = 0;
};

/// The blocks core rank r keeps after recursive-halving step k: the p / 2^(k+1) blocks around r
/// that agree with r in their top k + 1 bits. Before step 0 the window is all p blocks.
constexpr BlockRange halving_window(int r, int k, int n) {
  const int size = largest_power_of_two_le(n) >> (k + 1);
  return {r & ~(size - 1), size};
}

// ---------------------------------------------------------------------------------------------
// Dissemination barrier (Hensgen, Finkel and Manber): ceil_log2(n) rounds; in round k rank r
// signals (r + 2^k) mod n and waits for (r - 2^k) mod n. After round k every rank has heard,
// directly or not, from the 2^(k+1) - 1 ranks before it, so after the last round from all.
// ---------------------------------------------------------------------------------------------

/// Number of rounds of the dissemination barrier.
constexpr int dissemination_rounds(int n) { return ceil_log2(n); }

/// The rank r signals in round k.
constexpr int dissemination_send_peer(int r, int k, int n) {
  return static_cast<int>((static_cast<long long>(r) + (1LL << k)) % n);
}

/// The rank r waits for in round k.
constexpr int dissemination_recv_peer(int r, int k, int n) {
  const long long x = (static_cast<long long>(r) - (1LL << k)) % n;
  return static_cast<int>(x < 0 ? x + n : x);
}

}  // namespace chorus::topology
