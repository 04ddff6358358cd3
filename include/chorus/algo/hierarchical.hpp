// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// Hierarchical algorithms: inside each host over its fast links (shm), between hosts over the
/// slower ones (tcp, rdma), for all_reduce, reduce_scatter, all_gather, broadcast and reduce. The
/// host layout is topology::Hosts (which ranks share a host, the rails); the phases are the flat
/// algorithms of ring.hpp and tree.hpp run over sub-groups of the call's channel (SubChannel), one
/// after the other, every phase on lane 0 (the phases of a rank meet the same phases of its
/// peers in the same order).
///
/// Bandwidth forms (large messages): the inter-host part is split across the rails, each local
/// rank carrying its own slice over its own connections, so a host sends 2(H-1)/H of the buffer
/// per all_reduce over H hosts (the network's limit), where a flat ring sends 2(P-1)/P:
///   all_reduce      host reduce-scatter (R parts) -> rail l all-reduces part l -> host all-gather
///   reduce_scatter  blocks ordered by rail part; host reduce-scatter -> rail reduce-scatter ->
///                   each block to its rank inside the host
///   all_gather      the reverse of reduce_scatter, then the blocks back in rank order
///   reduce          host reduce-scatter -> rail reduce-scatter and gather to the root's host ->
///                   the parts to the root
///   broadcast       a pipelined chain that crosses each host boundary once (root, its host, then
///                   host by host)
/// Latency forms (small messages): reduce to a leader per host, recursive doubling (all_reduce)
/// or a binomial tree (reduce, broadcast) among the leaders, broadcast inside each host.
/// Hosts of different sizes work: R, the rails, is the smallest host's size (topology/hosts.hpp);
/// the other local ranks hand their share to a rail member of their host.
///
/// Results: every rank gets the same bits; reductions combine the same values in another order
/// than the flat algorithms (as the flat algorithms do among themselves), so the results equal
/// theirs bit for bit wherever the reduction is exact (integers; floats whose sums are exact).
///
/// The bandwidth forms run in pipelined segments: the engine (stages, the window of segments in
/// flight, the work area) is algo/hierarchical_pipeline.hpp, included here.

#include <algorithm>
#include <memory>
#include <span>
#include <vector>

#include "chorus/algo/common.hpp"
#include "chorus/algo/hierarchical_pipeline.hpp"
#include "chorus/algo/ring.hpp"
#include "chorus/algo/tree.hpp"
#include "chorus/topology/hosts.hpp"

namespace chorus::algo {

/// A sub-group of a channel's group: its rank i is the channel's rank members[i]. Messages go
/// through the channel (descriptor checks, staging, its op lists), so phases on sub-groups run
/// one after the other, never at once.
template <class Ch>
class SubChannel {
 public:
  using Op = ChannelOp;

  SubChannel(Ch& ch, std::span<const int> members, int rank) : ch_(ch), members_(members), rank_(rank) {}

  int rank() const { return rank_; }
  int size() const { return static_cast<int>(members_.size()); }
  std::vector<Op>& ops(int i) { return ch_.ops(i); }
  Op isend(int peer, ConstBytes b, int lane = 0) { return ch_.isend(to(peer), b, lane); }
  Op irecv(int peer, MutableBytes b, int lane = 0) { return ch_.irecv(to(peer), b, lane); }
  void wait(Op& op) { ch_.wait(op); }
  void wait_all(std::span<Op> ops) { ch_.wait_all(ops); }
  void send(int peer, ConstBytes b, int lane = 0) { ch_.send(to(peer), b, lane); }
  void recv(int peer, MutableBytes b, int lane = 0) { ch_.recv(to(peer), b, lane); }
  void sendrecv(int to_peer, ConstBytes out, int from, MutableBytes in) { ch_.sendrecv(to(to_peer), out, to(from), in); }

 private:
  int to(int peer) const { return members_[static_cast<std::size_t>(peer)]; }
  Ch& ch_;
  std::span<const int> members_;
  int rank_;
};

namespace detail {

/// The sub-phases reduce with sum where the call asks for avg; the one division by P comes last.
inline Args summing(const Args& a) {
  Args s = a;
  if (s.op == ReduceOp::avg) s.op = ReduceOp::sum;
  return s;
}

/// Where the blocks of a block-per-rank collective (reduce_scatter, all_gather) sit in the work
/// area: by rail part p (R parts), then host, then local rank; block of local rank j of a host
/// belongs to part j mod R. `order[k]` is the rank whose block is k-th; `region[p]` the first
/// block of part p; `slot[p * (H + 1) + h]` the first block of host h within part p.
struct BlockOrder {
  std::vector<int> order;
  std::vector<std::size_t> region, slot;
  std::vector<int> position;  ///< rank -> its block's index in order

  explicit BlockOrder(const topology::Hosts& hosts) {
    const int H = hosts.host_count(), R = hosts.rails();
    position.resize(static_cast<std::size_t>(hosts.ranks()));
    slot.resize(static_cast<std::size_t>(R) * (H + 1));
    for (int p = 0; p < R; ++p) {
      region.push_back(order.size());
      for (int h = 0; h < H; ++h) {
        slot[static_cast<std::size_t>(p) * (H + 1) + h] = order.size();
        const auto m = hosts.members(h);
        for (std::size_t j = static_cast<std::size_t>(p); j < m.size(); j += static_cast<std::size_t>(R)) {
          position[static_cast<std::size_t>(m[j])] = static_cast<int>(order.size());
          order.push_back(m[j]);
        }
      }
      slot[static_cast<std::size_t>(p) * (H + 1) + H] = order.size();
    }
    region.push_back(order.size());
  }

  /// A host ring's chunks (L ranks), in elements of `count` per block: part i for local rank
  /// i < R, empty for the others.
  std::vector<std::size_t> host_chunks(int L, int R, std::size_t count) const {
    std::vector<std::size_t> at(static_cast<std::size_t>(L) + 1);
    for (int i = 0; i <= L; ++i) at[static_cast<std::size_t>(i)] = region[static_cast<std::size_t>(std::min(i, R))] * count;
    return at;
  }
  /// Rail p's chunks (H ranks): host g's blocks of part p.
  std::vector<std::size_t> rail_chunks(int p, int H, std::size_t count) const {
    std::vector<std::size_t> at(static_cast<std::size_t>(H) + 1);
    for (int g = 0; g <= H; ++g) at[static_cast<std::size_t>(g)] = slot[static_cast<std::size_t>(p) * (H + 1) + g] * count;
    return at;
  }
};

/// Where this rank stands: its rank and the group's size, its host, local rank and the host's
/// size, the hosts and the rails.
struct Place {
  int me, P, h, l, L, H, R;
};
template <class Ch>
Place place(const Ch& ch, const topology::Hosts& hosts) {
  const int me = ch.rank();
  return {me, ch.size(), hosts.host_of(me), hosts.local_rank(me), hosts.local_size(me), hosts.host_count(), hosts.rails()};
}

/// The prologue of the block forms (reduce_scatter, all_gather): where this rank stands (Place),
/// its host's members, the blocks' order, the sub-channels of its host and of its rail (a rail of
/// no rank for local ranks >= R), and the K segments (a piece of every block each). Neither copied
/// nor moved: the sub-channels see `local` and `rail`.
template <class Ch>
struct HostLayout : Place {
  HostLayout(Ch& ch, const Args& a, const topology::Hosts& hosts)
      : Place(place(ch, hosts)),
        local(hosts.members(h)),
        bo(hosts),
        rail(l < R ? hosts.rail(l) : std::vector<int>{}),
        intra(ch, local, l),
        rc(ch, rail, h),
        K(Pipeline::segments(a.bytes(a.count) * static_cast<std::size_t>(P), R, H)),
        seg{a.count, K} {}
  HostLayout(const HostLayout&) = delete;
  HostLayout& operator=(const HostLayout&) = delete;

  std::span<const int> local;
  BlockOrder bo;
  std::vector<int> rail;
  SubChannel<Ch> intra, rc;
  int K;
  EvenChunks seg;
};

}  // namespace detail

/// all_reduce: out = reduction over ranks of in. `latency`: the small-message form.
template <class Ch>
void hierarchical_all_reduce(Ch& ch, const Args& a, const topology::Hosts& hosts, bool latency) {
  const detail::Place pl = detail::place(ch, hosts);
  [[maybe_unused]] const int me = pl.me, P = pl.P, h = pl.h, l = pl.l, L = pl.L, H = pl.H, R = pl.R;
  const std::size_t bytes = a.bytes(a.count);
  SubChannel intra(ch, hosts.members(h), l);
  const Args s = detail::summing(a);
  if (latency) {
    // 1. Reduce to the host's leader (local rank 0); the other ranks leave out untouched.
    if (L > 1) {
      Args r = s;
      r.root = 0;
      binomial_reduce(intra, r);
    } else {
      a.x().copy(a.out, a.in, bytes);
    }
    // 2. The leaders all-reduce the hosts' results.
    if (l == 0) {
      const std::vector<int> leaders = hosts.rail(0);
      if (H > 1) {
        SubChannel lead(ch, leaders, h);
        Args x = s;
        x.in = a.out;
        recursive_doubling_all_reduce(lead, x);
      }
      if (a.op == ReduceOp::avg) a.x().finalize_avg(a.dtype, a.out, a.count, P);
    }
    // 3. Each leader broadcasts inside its host.
    if (L > 1) {
      Args b = a;
      b.root = 0;
      binomial_broadcast(intra, b);
    }
    return;
  }
  // Per segment: 1. host reduce-scatter: local rank i < R ends with part i reduced over its host;
  // 2. rail l all-reduces part l across the hosts (a ring of one rank per host); 3. host all-gather.
  using detail::Pipeline;
  using Ring = detail::AsyncRing<SubChannel<Ch>>;
  const int K = Pipeline::segments(bytes, R, H);
  const EvenChunks seg{a.count, K};
  const std::vector<int> rail = l < R ? hosts.rail(l) : std::vector<int>{};
  SubChannel rc(ch, rail, h);
  const detail::SegmentWork sw(a, 0, a.bytes(a.count / static_cast<std::size_t>(K) / static_cast<std::size_t>(R) + 4));
  auto part = [&](int k) { return FirstChunks{seg.size(k), R}; };
  detail::pipeline(K, 3, [&](int k, int stage) -> std::unique_ptr<detail::Stage> {
    const std::size_t b = seg.begin(k);
    const FirstChunks p = part(k);
    std::byte* out = a.out + a.bytes(b);
    if (stage == 0) {
      if (L == 1) {
        a.x().copy(out, a.in + a.bytes(b), a.bytes(seg.size(k)));
        return nullptr;
      }
      return std::make_unique<Ring>(intra, s, out, detail::offsets(p, L), Ring::Kind::reduce_scatter, Pipeline::lane(k, 0),
                                    sw.host_scratch(k), a.in + a.bytes(b));
    }
    if (stage == 1) {
      if (l >= R || H == 1) return nullptr;
      std::vector<std::size_t> at(static_cast<std::size_t>(H) + 1);
      for (int g = 0; g <= H; ++g) at[static_cast<std::size_t>(g)] = topology::chunk_begin(g, p.size(l), H);
      return std::make_unique<Ring>(rc, s, out + a.bytes(p.begin(l)), std::move(at), Ring::Kind::all_reduce,
                                    Pipeline::lane(k, 1), sw.rail_scratch(k));
    }
    if (l < R && a.op == ReduceOp::avg) a.x().finalize_avg(a.dtype, out + a.bytes(p.begin(l)), p.size(l), P);
    if (L == 1) return nullptr;
    return std::make_unique<Ring>(intra, a, out, detail::offsets(p, L), Ring::Kind::all_gather, Pipeline::lane(k, 2), nullptr);
  });
}

/// reduce_scatter: in holds P blocks of count; out (count) gets block r reduced over the ranks.
/// Per segment (a piece of every block): 1. the pieces in rail-part order in the work area, and a
/// host reduce-scatter: local rank i < R ends with part i reduced over its host; 2. rail l
/// reduce-scatters part l: host g's member ends with the pieces of host g's ranks; 3. each piece to
/// its rank inside the host.
template <class Ch>
void hierarchical_reduce_scatter(Ch& ch, const Args& a, const topology::Hosts& hosts) {
  using detail::Pipeline;
  using Ring = detail::AsyncRing<SubChannel<Ch>>;
  using Ops = detail::AsyncOps<SubChannel<Ch>>;
  detail::HostLayout<Ch> hl(ch, a, hosts);
  [[maybe_unused]] const int P = hl.P, l = hl.l, L = hl.L, H = hl.H, R = hl.R, K = hl.K;
  const Args s = detail::summing(a);
  const std::size_t region = a.bytes((a.count / static_cast<std::size_t>(K) + 1) * static_cast<std::size_t>(P));
  const detail::SegmentWork sw(a, region, region);
  detail::pipeline(K, 3, [&](int k, int stage) -> std::unique_ptr<detail::Stage> {
    const std::size_t c = hl.seg.size(k), b = hl.seg.begin(k);
    std::byte* w = sw.region(k);
    if (stage == 0) {
      for (std::size_t i = 0; i < hl.bo.order.size(); ++i)
        a.x().copy(w + a.bytes(i * c), a.in + a.bytes(static_cast<std::size_t>(hl.bo.order[i]) * a.count + b), a.bytes(c));
      if (L == 1) return nullptr;
      return std::make_unique<Ring>(hl.intra, s, w, hl.bo.host_chunks(L, R, c), Ring::Kind::reduce_scatter,
                                    Pipeline::lane(k, 0), sw.host_scratch(k));
    }
    if (stage == 1) {
      if (l >= R || H == 1) return nullptr;
      return std::make_unique<Ring>(hl.rc, s, w, hl.bo.rail_chunks(l, H, c), Ring::Kind::reduce_scatter,
                                    Pipeline::lane(k, 1), sw.rail_scratch(k));
    }
    std::byte* out = a.out + a.bytes(b);
    auto ops = std::make_unique<Ops>(hl.intra);
    if (l >= R) {
      ops->recv(l % R, mbytes(out, a.bytes(c)), Pipeline::lane(k, 2));
      return ops;
    }
    for (std::size_t j = static_cast<std::size_t>(l); j < hl.local.size(); j += static_cast<std::size_t>(R)) {
      std::byte* piece = w + a.bytes(static_cast<std::size_t>(hl.bo.position[static_cast<std::size_t>(hl.local[j])]) * c);
      if (a.op == ReduceOp::avg) a.x().finalize_avg(a.dtype, piece, c, P);
      if (static_cast<int>(j) == l) a.x().copy(out, piece, a.bytes(c));
      else ops->send(static_cast<int>(j), cbytes(piece, a.bytes(c)), Pipeline::lane(k, 2));
    }
    return ops;
  });
}

/// all_gather: in (count) goes to block r of out (P blocks), on every rank. Per segment (a piece
/// of every block): 1. the pieces of a host's part p meet at its local rank p; 2. rail l
/// all-gathers part l across the hosts; 3. a host all-gather of the parts, and the pieces into
/// their blocks.
template <class Ch>
void hierarchical_all_gather(Ch& ch, const Args& a, const topology::Hosts& hosts) {
  using detail::Pipeline;
  using Ring = detail::AsyncRing<SubChannel<Ch>>;
  using Ops = detail::AsyncOps<SubChannel<Ch>>;
  detail::HostLayout<Ch> hl(ch, a, hosts);
  [[maybe_unused]] const int P = hl.P, l = hl.l, L = hl.L, H = hl.H, R = hl.R, K = hl.K;
  const detail::SegmentWork sw(a, a.bytes((a.count / static_cast<std::size_t>(K) + 1) * static_cast<std::size_t>(P)), 0);
  detail::pipeline(K, 4, [&](int k, int stage) -> std::unique_ptr<detail::Stage> {
    const std::size_t c = hl.seg.size(k), b = hl.seg.begin(k);
    std::byte* w = sw.region(k);
    if (stage == 0) {
      const std::byte* in = a.in + a.bytes(b);
      auto ops = std::make_unique<Ops>(hl.intra);
      if (l >= R) {
        ops->send(l % R, cbytes(in, a.bytes(c)), Pipeline::lane(k, 0));
        return ops;
      }
      for (std::size_t j = static_cast<std::size_t>(l); j < hl.local.size(); j += static_cast<std::size_t>(R)) {
        std::byte* piece = w + a.bytes(static_cast<std::size_t>(hl.bo.position[static_cast<std::size_t>(hl.local[j])]) * c);
        if (static_cast<int>(j) == l) a.x().copy(piece, in, a.bytes(c));
        else ops->recv(static_cast<int>(j), mbytes(piece, a.bytes(c)), Pipeline::lane(k, 0));
      }
      return ops;
    }
    if (stage == 1) {
      if (l >= R || H == 1) return nullptr;
      return std::make_unique<Ring>(hl.rc, a, w, hl.bo.rail_chunks(l, H, c), Ring::Kind::all_gather, Pipeline::lane(k, 1),
                                    nullptr);
    }
    if (stage == 2) {
      if (L == 1) return nullptr;
      return std::make_unique<Ring>(hl.intra, a, w, hl.bo.host_chunks(L, R, c), Ring::Kind::all_gather, Pipeline::lane(k, 2),
                                    nullptr);
    }
    for (std::size_t i = 0; i < hl.bo.order.size(); ++i)
      a.x().copy(a.out + a.bytes(static_cast<std::size_t>(hl.bo.order[i]) * a.count + b), w + a.bytes(i * c), a.bytes(c));
    return nullptr;
  });
}

/// broadcast from a.root: a chain that crosses each host boundary once (bandwidth form), or a
/// binomial tree among one representative per host, then one inside each host (latency form).
template <class Ch>
void hierarchical_broadcast(Ch& ch, const Args& a, const topology::Hosts& hosts, bool latency) {
  const int me = ch.rank(), root = a.root;
  const int H = hosts.host_count(), root_host = hosts.host_of(root);
  // Hosts from the root's, round; the root's representative is the root, the others' local rank 0.
  std::vector<int> reps;
  for (int k = 0; k < H; ++k) {
    const int g = (root_host + k) % H;
    reps.push_back(g == root_host ? root : hosts.members(g)[0]);
  }
  Args b = a;
  b.root = 0;
  if (!latency) {
    std::vector<int> chain;
    for (int k = 0; k < H; ++k) {
      chain.push_back(reps[static_cast<std::size_t>(k)]);
      for (int r : hosts.members((root_host + k) % H))
        if (r != reps[static_cast<std::size_t>(k)]) chain.push_back(r);
    }
    const int pos = static_cast<int>(std::find(chain.begin(), chain.end(), me) - chain.begin());
    SubChannel c(ch, chain, pos);
    return chain_broadcast(c, b);
  }
  const int h = hosts.host_of(me);
  const int rep = reps[static_cast<std::size_t>((h - root_host + H) % H)];
  if (me == rep && H > 1) {
    SubChannel rc(ch, reps, (h - root_host + H) % H);
    binomial_broadcast(rc, b);
  }
  const auto local = hosts.members(h);
  if (local.size() > 1) {
    SubChannel intra(ch, local, hosts.local_rank(me));
    b.root = hosts.local_rank(rep);
    binomial_broadcast(intra, b);
  }
}

/// reduce to a.root: out (at the root) = reduction over ranks of in.
template <class Ch>
void hierarchical_reduce(Ch& ch, const Args& a, const topology::Hosts& hosts, bool latency) {
  const detail::Place pl = detail::place(ch, hosts);
  [[maybe_unused]] const int me = pl.me, P = pl.P, h = pl.h, l = pl.l, L = pl.L, H = pl.H, R = pl.R;
  const int root = a.root, root_host = hosts.host_of(root);
  const auto local = hosts.members(h);
  const std::size_t bytes = a.bytes(a.count);
  SubChannel intra(ch, local, l);
  const Args s = detail::summing(a);
  std::byte* w = me == root ? a.out : a.x().work(bytes);
  if (latency) {
    // 1. Reduce to the host's representative (the root on its host, else local rank 0).
    const int rep_local = h == root_host ? hosts.local_rank(root) : 0;
    if (L > 1) {
      Args r = s;
      r.root = rep_local;
      r.out = w;
      binomial_reduce(intra, r);
    } else {
      a.x().copy(w, a.in, bytes);
    }
    // 2. The representatives reduce to the root (the root's host's representative).
    if (l == rep_local) {
      std::vector<int> reps;
      for (int k = 0; k < H; ++k) {
        const int g = (root_host + k) % H;
        reps.push_back(g == root_host ? root : hosts.members(g)[0]);
      }
      if (H > 1) {
        SubChannel rc(ch, reps, (h - root_host + H) % H);
        Args x = s;
        x.root = 0;
        x.in = w;
        x.out = w;
        binomial_reduce(rc, x);
      }
      if (me == root && a.op == ReduceOp::avg) a.x().finalize_avg(a.dtype, a.out, a.count, P);
    }
    return;
  }
  // 1. Host reduce-scatter into w: local rank i < R ends with part i reduced over its host.
  const FirstChunks parts{a.count, R};
  if (L > 1) ring_reduce_scatter_in_place(intra, s, w, parts, a.in);
  else a.x().copy(w, a.in, bytes);
  const auto root_local = hosts.members(root_host);
  if (l < R) {
    std::byte* part = w + a.bytes(parts.begin(l));
    const std::size_t count = parts.size(l);
    // 2. Rail l reduce-scatters part l, then gathers it at its member on the root's host.
    if (H > 1) {
      const std::vector<int> rail = hosts.rail(l);
      SubChannel rc(ch, rail, h);
      ring_reduce_scatter_in_place(rc, s, part, EvenChunks{count, H});
      const std::size_t mine = topology::chunk_begin(h, count, H), len = topology::chunk_size(h, count, H);
      if (h != root_host) {
        rc.send(root_host, cbytes(part + a.bytes(mine), a.bytes(len)));
      } else {
        auto& recvs = ch.ops(0);
        for (int g = 0; g < H; ++g)
          if (g != h)
            recvs.push_back(rc.irecv(g, mbytes(part + a.bytes(topology::chunk_begin(g, count, H)),
                                               a.bytes(topology::chunk_size(g, count, H)))));
        ch.wait_all(recvs);
      }
    }
    // 3. The part to the root.
    if (h == root_host) {
      if (a.op == ReduceOp::avg) a.x().finalize_avg(a.dtype, part, count, P);
      if (me != root) intra.send(hosts.local_rank(root), cbytes(part, a.bytes(count)));
    }
  }
  if (me == root) {
    auto& recvs = ch.ops(0);
    for (int i = 0; i < R; ++i)
      if (root_local[static_cast<std::size_t>(i)] != root)
        recvs.push_back(intra.irecv(i, mbytes(a.out + a.bytes(parts.begin(i)), a.bytes(parts.size(i)))));
    ch.wait_all(recvs);
  }
}

}  // namespace chorus::algo
