#pragma once
/// Ring algorithms (Patarasuk & Yuan): reduce-scatter, all-gather, and all-reduce as the two in
/// sequence. The buffer is cut into P chunks (topology/ring.hpp); each step moves one chunk to the
/// next rank, cut into slices so that sending, receiving and reducing overlap. Every rank sends
/// (P-1)/P of the buffer per phase: 2(P-1)/P for all-reduce, the bandwidth optimum.

#include <algorithm>

#include "chorus/algo/channel.hpp"
#include "chorus/algo/common.hpp"
#include "chorus/reduce/host.hpp"
#include "chorus/topology/ring.hpp"

namespace chorus::algo {

/// Pipeline depth: receives posted ahead of the one being reduced.
struct RingPolicy {
  static constexpr int kSlotsInFlight = 2;
};

namespace detail {

/// One ring step: send chunk `send_c` of `buf` to next while receiving chunk `recv_c` from prev;
/// with `reduce`, the received slices are reduced into buf's chunk, else copied there directly.
template <Transport T>
void ring_step(Channel<T>& ch, const Args& a, std::byte* buf, std::size_t count, int send_c, int recv_c,
               bool reduce, Scratch& scratch) {
  const int n = ch.size(), r = ch.rank();
  const int next = topology::next(r, n), prev = topology::prev(r, n);
  const std::size_t es = a.elem(), se = slice_elems(a);
  const std::size_t s_begin = topology::chunk_begin(send_c, count, n), s_size = topology::chunk_size(send_c, count, n);
  const std::size_t r_begin = topology::chunk_begin(recv_c, count, n), r_size = topology::chunk_size(recv_c, count, n);
  // At least one message per step, even for an empty chunk, so that every pair of neighbours
  // exchanges descriptors and a mismatched count is caught, not waited on.
  const std::size_t s_slices = std::max<std::size_t>(1, (s_size + se - 1) / se);
  const std::size_t r_slices = std::max<std::size_t>(1, (r_size + se - 1) / se);

  // Send every slice of the outgoing chunk: the chunk is final for this step.
  std::vector<typename Channel<T>::Op> sends;
  sends.reserve(s_slices);
  for (std::size_t j = 0; j < s_slices; ++j) {
    const std::size_t off = std::min(j * se, s_size), len = std::min(se, s_size - off);
    sends.push_back(ch.isend(next, cbytes(buf + (s_begin + off) * es, len * es)));
  }
  if (!reduce) {
    // Receive straight into place.
    std::vector<typename Channel<T>::Op> recvs;
    recvs.reserve(r_slices);
    for (std::size_t j = 0; j < r_slices; ++j) {
      const std::size_t off = std::min(j * se, r_size), len = std::min(se, r_size - off);
      recvs.push_back(ch.irecv(prev, mbytes(buf + (r_begin + off) * es, len * es)));
    }
    ch.wait_all(recvs);
  } else {
    // Receive into slots of scratch, reduce each slice as it lands, keep kSlotsInFlight posted.
    constexpr int kSlots = RingPolicy::kSlotsInFlight;
    std::byte* slots = scratch.get(kSlots * se * es);
    std::vector<typename Channel<T>::Op> inflight(kSlots);
    auto post = [&](std::size_t j) {
      const std::size_t off = std::min(j * se, r_size), len = std::min(se, r_size - off);
      inflight[j % kSlots] = ch.irecv(prev, mbytes(slots + (j % kSlots) * se * es, len * es));
    };
    for (std::size_t j = 0; j < std::min<std::size_t>(kSlots, r_slices); ++j) post(j);
    for (std::size_t j = 0; j < r_slices; ++j) {
      ch.wait(inflight[j % kSlots]);
      const std::size_t off = std::min(j * se, r_size), len = std::min(se, r_size - off);
      chorus::reduce(a.op, a.dtype, buf + (r_begin + off) * es, slots + (j % kSlots) * se * es, len);
      if (j + kSlots < r_slices) post(j + kSlots);
    }
  }
  ch.wait_all(sends);
}

}  // namespace detail

/// Reduce-scatter over the whole buffer `buf` (count elements, reduced in place): afterwards
/// rank r's chunk r of buf holds the reduction of every rank's chunk r.
template <Transport T>
void ring_reduce_scatter_in_place(Channel<T>& ch, const Args& a, std::byte* buf, std::size_t count, Scratch& s) {
  const int n = ch.size(), r = ch.rank();
  for (int k = 0; k < n - 1; ++k)
    detail::ring_step(ch, a, buf, count, topology::reduce_scatter_send_chunk(r, k, n),
                      topology::reduce_scatter_recv_chunk(r, k, n), /*reduce=*/true, s);
}

/// All-gather over `buf` whose chunk r (of count elements cut into P) this rank holds.
template <Transport T>
void ring_all_gather_in_place(Channel<T>& ch, const Args& a, std::byte* buf, std::size_t count, Scratch& s) {
  const int n = ch.size(), r = ch.rank();
  for (int k = 0; k < n - 1; ++k)
    detail::ring_step(ch, a, buf, count, topology::all_gather_send_chunk(r, k, n),
                      topology::all_gather_recv_chunk(r, k, n), /*reduce=*/false, s);
}

/// All-reduce: out = reduce over ranks of in (count elements).
template <Transport T>
void ring_all_reduce(Channel<T>& ch, const Args& a, Scratch& s) {
  const int n = ch.size(), r = ch.rank();
  copy_if_distinct(a.out, a.in, a.bytes(a.count));
  // 1. Reduce-scatter: rank r ends with chunk r fully reduced.
  ring_reduce_scatter_in_place(ch, a, a.out, a.count, s);
  // 2. avg: divide the owned chunk once, before it is copied everywhere.
  if (a.op == ReduceOp::avg)
    chorus::finalize_avg(a.dtype, a.out + a.bytes(topology::chunk_begin(r, a.count, n)), topology::chunk_size(r, a.count, n), n);
  // 3. All-gather: every rank receives every reduced chunk.
  ring_all_gather_in_place(ch, a, a.out, a.count, s);
}

/// Reduce-scatter: in holds P blocks of count elements; out (count) gets block r reduced over
/// all ranks. Works on a copy of in (the work area), so in is never written.
template <Transport T>
void ring_reduce_scatter(Channel<T>& ch, const Args& a, Scratch& s) {
  const int n = ch.size(), r = ch.rank();
  const std::size_t total = a.count * static_cast<std::size_t>(n);
  std::byte* work = s.work(a.bytes(total));
  copy_if_distinct(work, a.in, a.bytes(total));
  ring_reduce_scatter_in_place(ch, a, work, total, s);  // P equal chunks: chunk r is block r
  if (a.op == ReduceOp::avg) chorus::finalize_avg(a.dtype, work + a.bytes(a.count) * r, a.count, n);
  copy_if_distinct(a.out, work + a.bytes(a.count) * r, a.bytes(a.count));
}

/// All-gather: in (count elements) goes to block r of out (P blocks), from every rank.
template <Transport T>
void ring_all_gather(Channel<T>& ch, const Args& a, Scratch& s) {
  const int n = ch.size(), r = ch.rank();
  copy_if_distinct(a.out + a.bytes(a.count) * r, a.in, a.bytes(a.count));
  ring_all_gather_in_place(ch, a, a.out, a.count * static_cast<std::size_t>(n), s);
}

}  // namespace chorus::algo
