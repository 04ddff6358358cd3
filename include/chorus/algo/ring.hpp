// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// Ring algorithms (Patarasuk & Yuan): reduce-scatter, all-gather, and all-reduce as the two in
/// sequence. The buffer is cut into P chunks (topology/ring.hpp); each step moves one chunk to the
/// next rank, cut into slices so that sending, receiving and reducing overlap. Every rank sends
/// (P-1)/P of the buffer per phase: 2(P-1)/P for all-reduce, the bandwidth optimum.

#include <algorithm>
#include <span>

#include "chorus/algo/channel.hpp"
#include "chorus/algo/common.hpp"
#include "chorus/topology/ring.hpp"

namespace chorus::algo {

/// Pipeline depth: receives posted ahead of the one being reduced. Four, not two: with the
/// waiting thread making the progress, a rank that reduces a slice does not answer its peers'
/// rendezvous meanwhile, and two slices in flight left the sender idle (4 ranks on 2 cores, tcp,
/// 64 MiB: 0.60 GB/s busbw with two, 0.71 with four, 0.65 before caller-driven progress; eight
/// gained nothing). Scratch: four slices.
struct RingPolicy {
  static constexpr int kSlotsInFlight = 4;
};

/// How a ring cuts its buffer into one chunk per rank: chunk i is [begin(i), begin(i) + size(i))
/// elements. Even: the flat rings' cut (topology/ring.hpp). The hierarchical algorithms cut
/// otherwise (algo/hierarchical.hpp): only the first chunks hold data, or chunks of given sizes.
struct EvenChunks {
  std::size_t count;
  int n;
  std::size_t begin(int i) const { return topology::chunk_begin(i, count, n); }
  std::size_t size(int i) const { return topology::chunk_size(i, count, n); }
};

/// The buffer cut evenly into `parts` chunks, given to ranks 0..parts-1; the others' are empty.
struct FirstChunks {
  std::size_t count;
  int parts;
  std::size_t begin(int i) const { return i < parts ? topology::chunk_begin(i, count, parts) : count; }
  std::size_t size(int i) const { return i < parts ? topology::chunk_size(i, count, parts) : 0; }
};

/// Chunk i is [at[i], at[i + 1]).
struct OffsetChunks {
  std::span<const std::size_t> at;
  std::size_t begin(int i) const { return at[static_cast<std::size_t>(i)]; }
  std::size_t size(int i) const { return at[static_cast<std::size_t>(i) + 1] - at[static_cast<std::size_t>(i)]; }
};

namespace detail {

/// One ring step: send chunk `send_c` of `from` to next while receiving chunk `recv_c` from prev;
/// with `reduce`, buf's chunk becomes own's chunk (this rank's contribution: buf itself, or the
/// input of an out-of-place call) reduced with the received slices, else the slices land in buf.
template <class Ch, class Chunks>
void ring_step(Ch& ch, const Args& a, std::byte* buf, const std::byte* from, const std::byte* own,
               const Chunks& chunks, int send_c, int recv_c, bool reduce) {
  const int n = ch.size(), r = ch.rank();
  const int next = topology::next(r, n), prev = topology::prev(r, n);
  const std::size_t es = a.elem(), se = slice_elems(a);
  const std::size_t s_begin = chunks.begin(send_c), s_size = chunks.size(send_c);
  const std::size_t r_begin = chunks.begin(recv_c), r_size = chunks.size(recv_c);
  // At least one message per step, even for an empty chunk, so that every pair of neighbours
  // exchanges descriptors and a mismatched count is caught, not waited on.
  const std::size_t s_slices = std::max<std::size_t>(1, (s_size + se - 1) / se);
  const std::size_t r_slices = std::max<std::size_t>(1, (r_size + se - 1) / se);

  // Send every slice of the outgoing chunk: the chunk is final for this step.
  auto& sends = ch.ops(0);
  for (std::size_t j = 0; j < s_slices; ++j) {
    const std::size_t off = std::min(j * se, s_size), len = std::min(se, s_size - off);
    sends.push_back(ch.isend(next, cbytes(from + (s_begin + off) * es, len * es)));
  }
  if (!reduce) {
    // Receive straight into place.
    auto& recvs = ch.ops(1);
    for (std::size_t j = 0; j < r_slices; ++j) {
      const std::size_t off = std::min(j * se, r_size), len = std::min(se, r_size - off);
      recvs.push_back(ch.irecv(prev, mbytes(buf + (r_begin + off) * es, len * es)));
    }
    ch.wait_all(recvs);
  } else {
    // Receive into slots of scratch, reduce each slice as it lands, keep kSlotsInFlight posted.
    constexpr int kSlots = RingPolicy::kSlotsInFlight;
    std::byte* slots = a.x().slots(kSlots * se * es);
    auto& inflight = ch.ops(1);
    inflight.resize(kSlots);
    auto post = [&](std::size_t j) {
      const std::size_t off = std::min(j * se, r_size), len = std::min(se, r_size - off);
      inflight[j % kSlots] = ch.irecv(prev, mbytes(slots + (j % kSlots) * se * es, len * es));
    };
    for (std::size_t j = 0; j < std::min<std::size_t>(kSlots, r_slices); ++j) post(j);
    for (std::size_t j = 0; j < r_slices; ++j) {
      ch.wait(inflight[j % kSlots]);
      const std::size_t off = std::min(j * se, r_size), len = std::min(se, r_size - off);
      const std::size_t at = (r_begin + off) * es;
      a.x().reduce(a.op, a.dtype, buf + at, own + at, slots + (j % kSlots) * se * es, len);
      if (j + kSlots < r_slices) post(j + kSlots);
    }
  }
  ch.wait_all(sends);
}

}  // namespace detail

/// Reduce-scatter over the whole buffer `buf` (count elements): afterwards rank r's chunk r of
/// buf holds the reduction of every rank's chunk r. This rank's contribution is read from `in`
/// (buf itself when null): every chunk is received once, and the one never received is the one
/// sent first, so buf need not hold a copy of in (only the chunks received are written).
template <class Ch, class Chunks>
void ring_reduce_scatter_in_place(Ch& ch, const Args& a, std::byte* buf, const Chunks& chunks, const std::byte* in = nullptr) {
  const int n = ch.size(), r = ch.rank();
  const std::byte* own = in ? in : buf;
  for (int k = 0; k < n - 1; ++k)
    detail::ring_step(ch, a, buf, k == 0 ? own : buf, own, chunks, topology::reduce_scatter_send_chunk(r, k, n),
                      topology::reduce_scatter_recv_chunk(r, k, n), /*reduce=*/true);
}
template <class Ch>
void ring_reduce_scatter_in_place(Ch& ch, const Args& a, std::byte* buf, std::size_t count, const std::byte* in = nullptr) {
  ring_reduce_scatter_in_place(ch, a, buf, EvenChunks{count, ch.size()}, in);
}

/// All-gather over `buf` whose chunk r (of count elements cut into P) this rank holds.
template <class Ch, class Chunks>
void ring_all_gather_in_place(Ch& ch, const Args& a, std::byte* buf, const Chunks& chunks) {
  const int n = ch.size(), r = ch.rank();
  for (int k = 0; k < n - 1; ++k)
    detail::ring_step(ch, a, buf, buf, buf, chunks, topology::all_gather_send_chunk(r, k, n),
                      topology::all_gather_recv_chunk(r, k, n), /*reduce=*/false);
}
template <class Ch>
void ring_all_gather_in_place(Ch& ch, const Args& a, std::byte* buf, std::size_t count) {
  ring_all_gather_in_place(ch, a, buf, EvenChunks{count, ch.size()});
}

/// All-reduce: out = reduce over ranks of in (count elements).
template <class Ch>
void ring_all_reduce(Ch& ch, const Args& a) {
  const int n = ch.size(), r = ch.rank();
  // 1. Reduce-scatter: rank r ends with chunk r of out fully reduced. Out of place, it reads this
  //    rank's contribution from in: no copy of in to out first.
  ring_reduce_scatter_in_place(ch, a, a.out, a.count, a.in);
  // 2. avg: divide the owned chunk once, before it is copied everywhere.
  if (a.op == ReduceOp::avg)
    a.x().finalize_avg(a.dtype, a.out + a.bytes(topology::chunk_begin(r, a.count, n)), topology::chunk_size(r, a.count, n), n);
  // 3. All-gather: every rank receives every reduced chunk.
  ring_all_gather_in_place(ch, a, a.out, a.count);
}

/// Reduce-scatter: in holds P blocks of count elements; out (count) gets block r reduced over
/// all ranks. Works in the work area, reading in (never writing it).
template <class Ch>
void ring_reduce_scatter(Ch& ch, const Args& a) {
  const int n = ch.size(), r = ch.rank();
  const std::size_t total = a.count * static_cast<std::size_t>(n);
  std::byte* work = a.x().work(a.bytes(total));
  ring_reduce_scatter_in_place(ch, a, work, total, a.in);  // P equal chunks: chunk r is block r
  if (a.op == ReduceOp::avg) a.x().finalize_avg(a.dtype, work + a.bytes(a.count) * r, a.count, n);
  a.x().copy(a.out, work + a.bytes(a.count) * r, a.bytes(a.count));
}

/// All-gather: in (count elements) goes to block r of out (P blocks), from every rank.
template <class Ch>
void ring_all_gather(Ch& ch, const Args& a) {
  const int n = ch.size(), r = ch.rank();
  a.x().copy(a.out + a.bytes(a.count) * r, a.in, a.bytes(a.count));
  ring_all_gather_in_place(ch, a, a.out, a.count * static_cast<std::size_t>(n));
}

}  // namespace chorus::algo

namespace chorus::algo {

/// Broadcast along a pipelined chain root -> root+1 -> ... : the buffer is cut into slices and
/// every rank forwards slice j while slice j+1 is still arriving. Each rank sends B once:
/// bandwidth-optimal for large messages; latency (P-1) alpha + (slices) steps.
template <class Ch>
void chain_broadcast(Ch& ch, const Args& a) {
  const int n = ch.size(), r = ch.rank();
  const int v = topology::to_virtual(r, a.root, n);
  const int from = v == 0 ? -1 : topology::to_real(v - 1, a.root, n);
  const int to = v == n - 1 ? -1 : topology::to_real(v + 1, a.root, n);
  const std::size_t se = slice_elems(a);
  const std::size_t slices = std::max<std::size_t>(1, (a.count + se - 1) / se);
  auto slice = [&](std::size_t j) {
    const std::size_t off = std::min(j * se, a.count);
    return std::pair{a.out + a.bytes(off), a.bytes(std::min(se, a.count - off))};
  };
  // 1. Post every receive from the predecessor at once (they land in place, in order).
  auto& recvs = ch.ops(0);
  auto& sends = ch.ops(1);
  if (from >= 0)
    for (std::size_t j = 0; j < slices; ++j) recvs.push_back(ch.irecv(from, mbytes(slice(j).first, slice(j).second)));
  // 2. Forward each slice as soon as it is here.
  for (std::size_t j = 0; j < slices; ++j) {
    if (from >= 0) ch.wait(recvs[j]);
    if (to >= 0) sends.push_back(ch.isend(to, cbytes(slice(j).first, slice(j).second)));
  }
  ch.wait_all(sends);
}

/// Reduce to the root as a ring reduce-scatter (every rank ends with one reduced chunk) followed
/// by a gather of the chunks to the root: (P-1)/P B per phase per rank, instead of the binomial
/// tree's B per level, for large messages.
template <class Ch>
void ring_reduce(Ch& ch, const Args& a) {
  const int n = ch.size(), r = ch.rank();
  std::byte* work = a.x().work(a.bytes(a.count));
  // 1. Reduce-scatter into the work area, reading in: chunk r is complete here.
  ring_reduce_scatter_in_place(ch, a, work, a.count, a.in);
  const std::size_t begin = topology::chunk_begin(r, a.count, n), len = topology::chunk_size(r, a.count, n);
  if (a.op == ReduceOp::avg) a.x().finalize_avg(a.dtype, work + a.bytes(begin), len, n);
  // 2. Gather the chunks at the root (one message per rank, empty chunks included).
  if (r != a.root) return ch.send(a.root, cbytes(work + a.bytes(begin), a.bytes(len)));
  auto& recvs = ch.ops(0);
  for (int p = 0; p < n; ++p) {
    if (p == r) continue;
    recvs.push_back(ch.irecv(p, mbytes(a.out + a.bytes(topology::chunk_begin(p, a.count, n)),
                                       a.bytes(topology::chunk_size(p, a.count, n)))));
  }
  a.x().copy(a.out + a.bytes(begin), work + a.bytes(begin), a.bytes(len));
  ch.wait_all(recvs);
}

}  // namespace chorus::algo
