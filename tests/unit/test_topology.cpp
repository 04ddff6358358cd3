// SPDX-License-Identifier: BSD-3-Clause
// Rank arithmetic of chorus/topology: ring order and chunks, binomial, binary and double binary
// trees, recursive doubling / halving with the fold, dissemination. Every schedule is checked by
// simulating it symbolically: a value is the set of ranks whose input it contains (a bit mask,
// hence world sizes up to 64), and a reduction that would add a rank twice is a failure.
#include "chorus/topology/tree.hpp"
#include "chorus/topology/ring.hpp"

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <vector>

// This file's own names: the files of tests/unit/ are compiled together (unity build).
namespace unit_test_topology {

namespace t = chorus::topology;

namespace {

constexpr int kMaxWorld = 64;

using Mask = std::uint64_t;
constexpr Mask all_ranks(int n) { return n == 64 ? ~Mask{0} : (Mask{1} << n) - 1; }
constexpr Mask only(int r) { return Mask{1} << r; }

/// Reduces `in` into `acc`; the two must not share a rank (no input counted twice).
void reduce_into(Mask& acc, Mask in) {
  CHECK((acc & in) == 0);
  acc |= in;
}

/// A rooted tree given as parent and children functions, checked as a whole.
struct TreeShape {
  std::vector<int> parent;
  std::vector<std::vector<int>> children;
};

/// Checks: exactly one root (the expected one); c is a child of p iff p is c's parent; every rank is
/// reachable from the root (so, with n - 1 edges, no cycles); returns the depth in edges.
int check_tree(const TreeShape& s, int root) {
  const int n = static_cast<int>(s.parent.size());
  int roots = 0;
  for (int r = 0; r < n; ++r) {
    if (s.parent[r] == t::kNoRank) {
      ++roots;
      CHECK(r == root);
    } else {
      REQUIRE(s.parent[r] >= 0);
      REQUIRE(s.parent[r] < n);
      CHECK(s.parent[r] != r);
    }
  }
  CHECK(roots == 1);
  int edges = 0;
  for (int p = 0; p < n; ++p) {
    for (int c : s.children[p]) {
      REQUIRE(c >= 0);
      REQUIRE(c < n);
      CHECK(s.parent[c] == p);
      ++edges;
    }
  }
  for (int c = 0; c < n; ++c) {
    if (s.parent[c] == t::kNoRank) continue;
    int seen = 0;
    for (int x : s.children[s.parent[c]]) seen += x == c ? 1 : 0;
    CHECK(seen == 1);
  }
  CHECK(edges == n - 1);
  // Breadth-first from the root: each rank reached once, depth recorded.
  std::vector<int> depth(n, -1);
  std::vector<int> queue{root};
  depth[root] = 0;
  int max_depth = 0;
  for (std::size_t i = 0; i < queue.size(); ++i) {
    const int p = queue[i];
    for (int c : s.children[p]) {
      REQUIRE(depth[c] == -1);
      depth[c] = depth[p] + 1;
      max_depth = depth[c] > max_depth ? depth[c] : max_depth;
      queue.push_back(c);
    }
  }
  CHECK(static_cast<int>(queue.size()) == n);
  return max_depth;
}

TreeShape binomial_shape(int root, int n) {
  TreeShape s{std::vector<int>(n), std::vector<std::vector<int>>(n)};
  for (int r = 0; r < n; ++r) {
    s.parent[r] = t::binomial_parent_rooted(r, root, n);
    for (int c : t::binomial_children_rooted(r, root, n)) s.children[r].push_back(c);
  }
  return s;
}

TreeShape binary_shape(int n, int tree_index) {
  TreeShape s{std::vector<int>(n), std::vector<std::vector<int>>(n)};
  for (int r = 0; r < n; ++r) {
    const t::TreeNode node = t::binary_tree_node(r, n, tree_index);
    s.parent[r] = node.parent;
    REQUIRE(node.child_count >= 0);
    REQUIRE(node.child_count <= 2);
    for (int i = 0; i < node.child_count; ++i) s.children[r].push_back(node.children[i]);
    for (int i = node.child_count; i < 2; ++i) CHECK(node.children[i] == t::kNoRank);
  }
  return s;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// constexpr-ness: these are evaluated by the compiler.
// ---------------------------------------------------------------------------------------------

static_assert(t::next(3, 4) == 0 && t::prev(0, 4) == 3 && t::next(0, 1) == 0 && t::prev(0, 1) == 0);
static_assert(t::chunk_size(0, 10, 4) == 3 && t::chunk_size(1, 10, 4) == 3 && t::chunk_size(2, 10, 4) == 2);
static_assert(t::chunk_begin(2, 10, 4) == 6 && t::chunk_begin(3, 10, 4) == 8 && t::chunk_end(3, 10, 4) == 10);
static_assert(t::chunk_size(5, 3, 8) == 0 && t::chunk_begin(5, 3, 8) == 3);
static_assert(t::reduce_scatter_send_chunk(0, 0, 4) == 3 && t::reduce_scatter_recv_chunk(0, 2, 4) == 0);
static_assert(t::all_gather_send_chunk(2, 0, 4) == t::owned_chunk(2, 4));
static_assert(t::to_real(t::to_virtual(1, 3, 5), 3, 5) == 1 && t::to_virtual(3, 3, 5) == 0);
static_assert(t::largest_power_of_two_le(1) == 1 && t::largest_power_of_two_le(7) == 4 &&
              t::largest_power_of_two_le(8) == 8);
static_assert(t::ceil_log2(1) == 0 && t::ceil_log2(2) == 1 && t::ceil_log2(5) == 3 && t::ceil_log2(8) == 3);
static_assert(t::binomial_parent(6, 8) == 4 && t::binomial_parent(0, 8) == t::kNoRank);
static_assert(t::binomial_children(0, 8).count == 3 && t::binomial_children(0, 8)[0] == 4);
static_assert(t::binomial_children(4, 7).count == 2 && t::binomial_children(4, 7)[1] == 5);
static_assert(t::binomial_parent_rooted(0, 2, 4) == 2);
static_assert(t::binary_tree_node(0, 14, 0).children[0] == 8 && t::binary_tree_node(13, 14, 0).parent == 12);
static_assert(t::binary_tree_root(8, 1) == 7 && t::binary_tree_root(9, 1) == 1);
static_assert(t::double_binary_tree(7, 8)[1].parent == t::kNoRank);
static_assert(t::fold_role(5, 6) == t::FoldRole::extra && t::fold_partner(5, 6) == 1 &&
              t::fold_role(1, 6) == t::FoldRole::proxy && t::fold_role(2, 6) == t::FoldRole::core);
static_assert(t::recursive_halving_partner(1, 0, 8) == 5 && t::halving_window(5, 0, 8).first == 4);
static_assert(t::dissemination_send_peer(3, 2, 5) == 2 && t::dissemination_recv_peer(0, 1, 5) == 3);

// ---------------------------------------------------------------------------------------------
// Ring
// ---------------------------------------------------------------------------------------------

TEST_CASE("ring: next and prev are inverse and walk the whole ring") {
  for (int n = 1; n <= kMaxWorld; ++n) {
    int r = 0;
    for (int i = 0; i < n; ++i) {
      CHECK(t::prev(t::next(r, n), n) == r);
      r = t::next(r, n);
      if (i + 1 < n) CHECK(r != 0);
    }
    CHECK(r == 0);
  }
}

TEST_CASE("ring: chunks tile the buffer, sizes differ by at most one, larger first") {
  for (int n = 1; n <= kMaxWorld; ++n) {
    for (std::size_t count = 0; count <= 200; ++count) {
      std::size_t expected_begin = 0;
      std::size_t total = 0;
      std::size_t lo = count, hi = 0;
      for (int i = 0; i < n; ++i) {
        const std::size_t size = t::chunk_size(i, count, n);
        CHECK(t::chunk_begin(i, count, n) == expected_begin);
        CHECK(t::chunk_end(i, count, n) == expected_begin + size);
        if (i > 0) CHECK(size <= t::chunk_size(i - 1, count, n));
        expected_begin += size;
        total += size;
        lo = size < lo ? size : lo;
        hi = size > hi ? size : hi;
      }
      CHECK(total == count);
      CHECK(hi - lo <= 1);
      CHECK(t::chunk_end(n - 1, count, n) == count);
    }
  }
}

TEST_CASE("ring: send and receive chunks agree between neighbours") {
  for (int n = 1; n <= kMaxWorld; ++n) {
    for (int r = 0; r < n; ++r) {
      for (int k = 0; k < t::ring_steps(n); ++k) {
        CHECK(t::reduce_scatter_recv_chunk(r, k, n) == t::reduce_scatter_send_chunk(t::prev(r, n), k, n));
        CHECK(t::all_gather_recv_chunk(r, k, n) == t::all_gather_send_chunk(t::prev(r, n), k, n));
        if (k > 0) {
          // Pipelined: what r sends at step k is what it received at step k - 1.
          CHECK(t::reduce_scatter_send_chunk(r, k, n) == t::reduce_scatter_recv_chunk(r, k - 1, n));
          CHECK(t::all_gather_send_chunk(r, k, n) == t::all_gather_recv_chunk(r, k - 1, n));
        }
      }
      if (n > 1) CHECK(t::reduce_scatter_recv_chunk(r, n - 2, n) == t::owned_chunk(r, n));
      CHECK(t::all_gather_send_chunk(r, 0, n) == t::owned_chunk(r, n));
      CHECK(t::owned_chunk(r, n) == r);
    }
  }
}

TEST_CASE("ring: reduce-scatter then all-gather, simulated on contributor sets") {
  for (int n = 1; n <= kMaxWorld; ++n) {
    CAPTURE(n);
    // have[r][c]: the ranks whose input rank r's copy of chunk c contains.
    std::vector<std::vector<Mask>> have(n, std::vector<Mask>(n));
    for (int r = 0; r < n; ++r)
      for (int c = 0; c < n; ++c) have[r][c] = only(r);

    for (int k = 0; k < t::ring_steps(n); ++k) {
      std::vector<Mask> sent(n);  // every rank sends at once: snapshot first
      for (int r = 0; r < n; ++r) sent[r] = have[r][t::reduce_scatter_send_chunk(r, k, n)];
      for (int r = 0; r < n; ++r) {
        const int c = t::reduce_scatter_recv_chunk(r, k, n);
        reduce_into(have[r][c], sent[t::prev(r, n)]);
      }
    }
    for (int r = 0; r < n; ++r) CHECK(have[r][t::owned_chunk(r, n)] == all_ranks(n));

    for (int k = 0; k < t::ring_steps(n); ++k) {
      std::vector<Mask> sent(n);
      for (int r = 0; r < n; ++r) {
        sent[r] = have[r][t::all_gather_send_chunk(r, k, n)];
        CHECK(sent[r] == all_ranks(n));  // only complete chunks travel in the all-gather
      }
      for (int r = 0; r < n; ++r) have[r][t::all_gather_recv_chunk(r, k, n)] = sent[t::prev(r, n)];
    }
    for (int r = 0; r < n; ++r)
      for (int c = 0; c < n; ++c) CHECK(have[r][c] == all_ranks(n));
  }
}

TEST_CASE("ring: all-reduce on real buffers through chunk offsets, including empty chunks") {
  for (int n : {1, 2, 3, 5, 8, 11}) {
    for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{2}, std::size_t{7}, std::size_t{10},
                              std::size_t{64}, std::size_t{1000}}) {
      CAPTURE(n);
      CAPTURE(count);
      const auto input = [](int r, std::size_t i) {
        return static_cast<long long>(r) * 1'000'003 + static_cast<long long>(i);
      };
      std::vector<std::vector<long long>> buf(n, std::vector<long long>(count));
      for (int r = 0; r < n; ++r)
        for (std::size_t i = 0; i < count; ++i) buf[r][i] = input(r, i);

      auto step = [&](int k, bool reduce) {
        const auto snapshot = buf;
        for (int r = 0; r < n; ++r) {
          const int c = reduce ? t::reduce_scatter_recv_chunk(r, k, n) : t::all_gather_recv_chunk(r, k, n);
          const int from = t::prev(r, n);
          CHECK(c ==
                (reduce ? t::reduce_scatter_send_chunk(from, k, n) : t::all_gather_send_chunk(from, k, n)));
          for (std::size_t i = t::chunk_begin(c, count, n); i < t::chunk_end(c, count, n); ++i)
            buf[r][i] = reduce ? buf[r][i] + snapshot[from][i] : snapshot[from][i];
        }
      };
      for (int k = 0; k < t::ring_steps(n); ++k) step(k, true);
      for (int k = 0; k < t::ring_steps(n); ++k) step(k, false);

      for (std::size_t i = 0; i < count; ++i) {
        long long sum = 0;
        for (int r = 0; r < n; ++r) sum += input(r, i);
        for (int r = 0; r < n; ++r) CHECK(buf[r][i] == sum);
      }
    }
  }
}

TEST_CASE("ring: to_virtual and to_real are inverse rotations") {
  for (int n = 1; n <= kMaxWorld; ++n) {
    for (int root = 0; root < n; ++root) {
      CHECK(t::to_virtual(root, root, n) == 0);
      CHECK(t::to_real(0, root, n) == root);
      for (int r = 0; r < n; ++r) {
        const int v = t::to_virtual(r, root, n);
        CHECK(v >= 0);
        CHECK(v < n);
        CHECK(t::to_real(v, root, n) == r);
        CHECK(t::to_virtual(t::next(r, n), root, n) == t::next(v, n));
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Powers of two
// ---------------------------------------------------------------------------------------------

TEST_CASE("powers of two") {
  for (int n = 1; n <= 1 << 12; ++n) {
    const int p = t::largest_power_of_two_le(n);
    CHECK((p & (p - 1)) == 0);
    CHECK(p <= n);
    CHECK(2 * p > n);
    CHECK((1 << t::floor_log2(n)) == p);
    const int c = t::ceil_log2(n);
    CHECK((1LL << c) >= n);
    if (c > 0) CHECK((1LL << (c - 1)) < n);
  }
  CHECK(t::largest_power_of_two_le(0x7fffffff) == 1 << 30);
  CHECK(t::ceil_log2(0x7fffffff) == 31);
}

// ---------------------------------------------------------------------------------------------
// Binomial tree
// ---------------------------------------------------------------------------------------------

TEST_CASE("binomial tree: a tree for every root, depth ceil(log2 n), broadcast in ceil(log2 n) rounds") {
  for (int n = 1; n <= kMaxWorld; ++n) {
    for (int root = 0; root < n; ++root) {
      CAPTURE(n);
      CAPTURE(root);
      const TreeShape s = binomial_shape(root, n);
      CHECK(check_tree(s, root) <= t::ceil_log2(n));

      // Broadcast timing: a rank that has the data after round t sends to its children in the
      // given order in rounds t + 1, t + 2, ...; the last rank must have it after ceil_log2(n).
      std::vector<int> ready(n, -1);
      std::vector<int> queue{root};
      ready[root] = 0;
      int last = 0;
      for (std::size_t i = 0; i < queue.size(); ++i) {
        const int p = queue[i];
        int when = ready[p];
        for (int c : s.children[p]) {
          ready[c] = ++when;
          last = when > last ? when : last;
          queue.push_back(c);
        }
      }
      CHECK(last == t::ceil_log2(n));
    }
  }
}

TEST_CASE("binomial tree: virtual-rank form is the root-0 tree, children largest subtree first") {
  for (int n = 1; n <= kMaxWorld; ++n) {
    for (int v = 0; v < n; ++v) {
      CHECK(t::binomial_parent(v, n) == t::binomial_parent_rooted(v, 0, n));
      const t::Children c = t::binomial_children(v, n);
      for (int i = 1; i < c.count; ++i) CHECK(c[i] < c[i - 1]);  // v + 2^j with j descending
      for (int x : c) CHECK(t::binomial_parent(x, n) == v);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Binary and double binary tree
// ---------------------------------------------------------------------------------------------

TEST_CASE("binary trees: both trees of the double binary tree are trees, depth <= ceil(log2 n)") {
  for (int n = 1; n <= kMaxWorld; ++n) {
    for (int tree = 0; tree < 2; ++tree) {
      CAPTURE(n);
      CAPTURE(tree);
      const int root = t::binary_tree_root(n, tree);
      const TreeShape s = binary_shape(n, tree);
      CHECK(check_tree(s, root) <= t::ceil_log2(n));
      if (n > 1) CHECK(s.children[root].size() == 1);
      // binary_tree_depth: 0 at the root, one more than the parent's, within the bound.
      CHECK(t::binary_tree_depth(root, n, tree) == 0);
      for (int r = 0; r < n; ++r) {
        const t::TreeNode node = t::binary_tree_node(r, n, tree);
        CHECK(t::binary_tree_depth(r, n, tree) <= t::ceil_log2(n));
        for (int c = 0; c < node.child_count; ++c)
          CHECK(t::binary_tree_depth(node.children[c], n, tree) == t::binary_tree_depth(r, n, tree) + 1);
      }
    }
    // Tree 0 is in order: left child smaller, right child larger; its leaves are the odd ranks.
    for (int r = 1; r < n; ++r) {
      const t::TreeNode node = t::binary_tree_node(r, n, 0);
      if (node.child_count > 0) CHECK(node.children[0] < r);
      if (node.child_count > 1) CHECK(node.children[1] > r);
      CHECK((node.child_count == 0) == (r % 2 == 1));
    }
  }
}

TEST_CASE("double binary tree: leaves and per-rank load") {
  for (int n = 1; n <= kMaxWorld; ++n) {
    CAPTURE(n);
    for (int r = 0; r < n; ++r) {
      CAPTURE(r);
      const auto nodes = t::double_binary_tree(r, n);
      for (int tree = 0; tree < 2; ++tree) {
        const t::TreeNode expected = t::binary_tree_node(r, n, tree);
        CHECK(nodes[tree].parent == expected.parent);
        CHECK(nodes[tree].child_count == expected.child_count);
        CHECK(nodes[tree].child_count <= 2);
      }
      // At most two children over both trees: every rank does the same work per byte.
      CHECK(nodes[0].child_count + nodes[1].child_count <= 2);
      // NCCL's property: every rank is a leaf in one of the trees; for odd n > 1 rank 0 is the
      // exception (root of tree 0, one child in tree 1).
      const bool leaf_somewhere = nodes[0].child_count == 0 || nodes[1].child_count == 0;
      if (n % 2 == 1 && n > 1 && r == 0) {
        CHECK_FALSE(leaf_somewhere);
        CHECK(nodes[0].child_count == 1);
        CHECK(nodes[1].child_count == 1);
      } else {
        CHECK(leaf_somewhere);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Recursive doubling / halving with the fold
// ---------------------------------------------------------------------------------------------

TEST_CASE("fold: roles and partners") {
  for (int n = 1; n <= kMaxWorld; ++n) {
    const int p = t::largest_power_of_two_le(n);
    int extra = 0, proxy = 0;
    for (int r = 0; r < n; ++r) {
      const int partner = t::fold_partner(r, n);
      switch (t::fold_role(r, n)) {
        case t::FoldRole::extra:
          ++extra;
          CHECK(r >= p);
          CHECK(t::fold_role(partner, n) == t::FoldRole::proxy);
          CHECK(t::fold_partner(partner, n) == r);
          break;
        case t::FoldRole::proxy:
          ++proxy;
          CHECK(r < p);
          CHECK(t::fold_role(partner, n) == t::FoldRole::extra);
          break;
        case t::FoldRole::core:
          CHECK(r < p);
          CHECK(partner == t::kNoRank);
          break;
      }
    }
    CHECK(extra == n - p);
    CHECK(proxy == n - p);
  }
}

TEST_CASE("recursive doubling with the fold, simulated: every rank ends with every input") {
  for (int n = 1; n <= kMaxWorld; ++n) {
    CAPTURE(n);
    const int p = t::largest_power_of_two_le(n);
    std::vector<Mask> have(n);
    for (int r = 0; r < n; ++r) have[r] = only(r);
    // Phase 1: fold in.
    for (int r = 0; r < n; ++r)
      if (t::fold_role(r, n) == t::FoldRole::extra) reduce_into(have[t::fold_partner(r, n)], have[r]);
    // Phase 2: recursive doubling among [0, p).
    for (int k = 0; k < t::recursive_doubling_steps(n); ++k) {
      const std::vector<Mask> sent = have;
      for (int r = 0; r < p; ++r) {
        const int partner = t::recursive_doubling_partner(r, k, n);
        REQUIRE(partner < p);
        CHECK(t::recursive_doubling_partner(partner, k, n) == r);
        reduce_into(have[r], sent[partner]);
      }
    }
    for (int r = 0; r < p; ++r) CHECK(have[r] == all_ranks(n));
    // Phase 3: fold out.
    for (int r = 0; r < n; ++r)
      if (t::fold_role(r, n) == t::FoldRole::proxy) have[t::fold_partner(r, n)] = have[r];
    for (int r = 0; r < n; ++r) CHECK(have[r] == all_ranks(n));
  }
}

TEST_CASE("recursive halving then doubling with the fold, simulated per block") {
  for (int n = 1; n <= kMaxWorld; ++n) {
    CAPTURE(n);
    const int p = t::largest_power_of_two_le(n);
    const int steps = t::recursive_doubling_steps(n);
    // have[r][b]: contributors of rank r's copy of block b (p blocks).
    std::vector<std::vector<Mask>> have(n, std::vector<Mask>(p));
    for (int r = 0; r < n; ++r)
      for (int b = 0; b < p; ++b) have[r][b] = only(r);
    for (int r = 0; r < n; ++r)
      if (t::fold_role(r, n) == t::FoldRole::extra)
        for (int b = 0; b < p; ++b) reduce_into(have[t::fold_partner(r, n)][b], have[r][b]);

    // Reduce-scatter by recursive halving.
    for (int k = 0; k < steps; ++k) {
      const auto sent = have;
      for (int r = 0; r < p; ++r) {
        const int partner = t::recursive_halving_partner(r, k, n);
        REQUIRE(partner < p);
        CHECK(t::recursive_halving_partner(partner, k, n) == r);
        const t::BlockRange mine = t::halving_window(r, k, n);
        const t::BlockRange theirs = t::halving_window(partner, k, n);
        CHECK(mine.count == theirs.count);
        CHECK((mine.first ^ theirs.first) == mine.count);  // the two halves of one window
        CHECK(r >= mine.first);
        CHECK(r < mine.first + mine.count);
        for (int b = mine.first; b < mine.first + mine.count; ++b) reduce_into(have[r][b], sent[partner][b]);
      }
    }
    for (int r = 0; r < p; ++r) CHECK(have[r][r] == all_ranks(n));

    // All-gather by recursive doubling: the same steps in reverse.
    for (int k = steps - 1; k >= 0; --k) {
      const auto sent = have;
      for (int r = 0; r < p; ++r) {
        const int partner = t::recursive_halving_partner(r, k, n);
        const t::BlockRange theirs = t::halving_window(partner, k, n);
        for (int b = theirs.first; b < theirs.first + theirs.count; ++b) {
          CHECK(sent[partner][b] == all_ranks(n));
          have[r][b] = sent[partner][b];
        }
      }
    }
    for (int r = 0; r < n; ++r)
      if (t::fold_role(r, n) == t::FoldRole::proxy) have[t::fold_partner(r, n)] = have[r];
    for (int r = 0; r < n; ++r)
      for (int b = 0; b < p; ++b) CHECK(have[r][b] == all_ranks(n));
  }
}

// ---------------------------------------------------------------------------------------------
// Dissemination barrier
// ---------------------------------------------------------------------------------------------

TEST_CASE("dissemination: every rank hears from all after ceil(log2 n) rounds, not before") {
  for (int n = 1; n <= kMaxWorld; ++n) {
    CAPTURE(n);
    std::vector<Mask> heard(n);
    for (int r = 0; r < n; ++r) heard[r] = only(r);
    const int rounds = t::dissemination_rounds(n);
    CHECK(rounds == t::ceil_log2(n));
    for (int k = 0; k < rounds; ++k) {
      if (k == rounds - 1) {
        bool all_done = true;
        for (int r = 0; r < n; ++r) all_done = all_done && heard[r] == all_ranks(n);
        CHECK_FALSE(all_done);  // the last round is needed
      }
      const std::vector<Mask> sent = heard;
      for (int r = 0; r < n; ++r) {
        const int to = t::dissemination_send_peer(r, k, n);
        CHECK(t::dissemination_recv_peer(to, k, n) == r);
        heard[to] |= sent[r];
      }
    }
    for (int r = 0; r < n; ++r) CHECK(heard[r] == all_ranks(n));
  }
}

}  // namespace unit_test_topology
