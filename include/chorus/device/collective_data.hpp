// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// The collective kernel's data phases (device/collective_body.hpp): how a block's threads split
/// its range in 16-byte packs and fold the ranks' values in rank order, for the direct protocol
/// (every rank's buffers addressed) and the windowed one (chunks through the areas' windows).

#include <cstddef>
#include <cstdint>

#include "chorus/config.hpp"
#include "chorus/device/collective.hpp"
#include "chorus/device/collective_sync.hpp"
#include "chorus/reduce/cuda/kernels.hpp"
#include "chorus/reduce/ops.hpp"

namespace chorus::device::kernel {

// --- the data phases ------------------------------------------------------------------------------

/// [lo, hi) cut into `parts` pieces at multiples of `pack` (lo is one): piece i.
CHORUS_HOST_DEVICE inline void piece(std::uint64_t lo, std::uint64_t hi, unsigned parts, unsigned i, std::uint64_t pack,
                                     std::uint64_t& from, std::uint64_t& to) {
  auto at = [&](unsigned j) -> std::uint64_t {
    if (j >= parts) return hi;
    const std::uint64_t x = (lo + (hi - lo) * j / parts) / pack * pack;
    return x < lo ? lo : x;
  };
  from = at(i);
  to = at(i + 1);
}

/// outs[0..m)[i] = ins[0][i] op ins[1][i] op ... op ins[k-1][i] (in that order; then avg_divide by
/// `world` when avg) for i in [lo, hi), thread t of `threads`: whole packs where every pointer is
/// 16-byte aligned (lo is a multiple of the pack), elements otherwise and for the tail. k = 1 copies.
template <class Op, class T>
CHORUS_HOST_DEVICE inline void fold(T* const* outs, int m, const T* const* ins, int k, std::uint64_t lo, std::uint64_t hi,
                                    bool avg, int world, unsigned t, unsigned threads) {
  constexpr std::uint64_t kPer = kKernelPack<T>;
  using Pack = chorus::detail::DevicePack<T>;
  std::uintptr_t addresses = 0;
  for (int j = 0; j < m; ++j) addresses |= reinterpret_cast<std::uintptr_t>(outs[j]);
  for (int j = 0; j < k; ++j) addresses |= reinterpret_cast<std::uintptr_t>(ins[j]);
  std::uint64_t done = lo;
  if ((addresses & 15u) == 0 && lo % kPer == 0) {
    const std::uint64_t first = lo / kPer, last = hi / kPer;
    for (std::uint64_t p = first + t; p < last; p += threads) {
      Pack x = reinterpret_cast<const Pack*>(ins[0])[p];
      for (int j = 1; j < k; ++j) {
        const Pack y = reinterpret_cast<const Pack*>(ins[j])[p];
        for (std::uint64_t e = 0; e < kPer; ++e) x.v[e] = Op{}(x.v[e], y.v[e]);
      }
      if (avg)
        for (std::uint64_t e = 0; e < kPer; ++e) x.v[e] = avg_divide(x.v[e], world);
      for (int j = 0; j < m; ++j) reinterpret_cast<Pack*>(outs[j])[p] = x;
    }
    done = last > first ? last * kPer : lo;
  }
  for (std::uint64_t i = done + t; i < hi; i += threads) {
    T x = ins[0][i];
    for (int j = 1; j < k; ++j) x = Op{}(x, ins[j][i]);
    if (avg) x = avg_divide(x, world);
    for (int j = 0; j < m; ++j) outs[j][i] = x;
  }
}

/// Block b's part of [0, count): the block's slice, in whole packs.
template <class T>
CHORUS_HOST_DEVICE inline void block_range(const CollectiveLaunch& a, unsigned b, std::uint64_t count, std::uint64_t& lo,
                                           std::uint64_t& hi) {
  piece(0, count, a.blocks, b, kKernelPack<T>, lo, hi);
}

template <class T>
CHORUS_HOST_DEVICE inline T* at(std::uint64_t address, std::uint64_t elems) {
  return reinterpret_cast<T*>(address) + elems;
}

/// The direct data phase of block b: every rank's buffers addressed through sh.in / sh.out.
template <class Op, class T>
CHORUS_HOST_DEVICE inline void direct_phase(const CollectiveLaunch& a, const BlockShared& sh, unsigned b, unsigned t,
                                            unsigned threads) {
  const int n = a.ranks, r = a.rank;
  const bool avg = a.op == ReduceOp::avg;
  const std::uint64_t C = a.count;
  std::uint64_t lo, hi;
  block_range<T>(a, b, C, lo, hi);
  T* outs[kMaxKernelRanks];
  const T* ins[kMaxKernelRanks];
  switch (a.kind) {
    case KernelCollective::all_reduce:
    case KernelCollective::reduce: {
      // This rank's share of the block, reduced from every input, into every output (the root's).
      std::uint64_t s0, s1;
      piece(lo, hi, static_cast<unsigned>(n), static_cast<unsigned>(r), kKernelPack<T>, s0, s1);
      for (int q = 0; q < n; ++q) ins[q] = at<const T>(sh.in[q], 0);
      int m = 0;
      if (a.kind == KernelCollective::reduce)
        outs[m++] = at<T>(sh.out[a.root], 0);
      else
        for (int q = 0; q < n; ++q) outs[m++] = at<T>(sh.out[q], 0);
      fold<Op, T>(outs, m, ins, n, s0, s1, avg, n, t, threads);
      return;
    }
    case KernelCollective::reduce_scatter: {
      for (int q = 0; q < n; ++q) ins[q] = at<const T>(sh.in[q], static_cast<std::uint64_t>(r) * C);
      outs[0] = at<T>(sh.out[r], 0);
      fold<Op, T>(outs, 1, ins, n, lo, hi, avg, n, t, threads);
      return;
    }
    case KernelCollective::all_gather:
      for (int q = 0; q < n; ++q) {
        outs[0] = at<T>(sh.out[r], static_cast<std::uint64_t>(q) * C);
        ins[0] = at<const T>(sh.in[q], 0);
        if (outs[0] != ins[0]) fold<Sum, T>(outs, 1, ins, 1, lo, hi, false, n, t, threads);  // in place: already there
      }
      return;
    case KernelCollective::broadcast:
      if (r == a.root) return;
      outs[0] = at<T>(sh.out[r], 0);
      ins[0] = at<const T>(sh.in[a.root], 0);
      fold<Sum, T>(outs, 1, ins, 1, lo, hi, false, n, t, threads);
      return;
  }
}

/// Rank q's window as this rank addresses it.
template <class T>
CHORUS_HOST_DEVICE inline T* window(const CollectiveLaunch& a, int q) {
  return reinterpret_cast<T*>(a.areas[q] + area::kWindowOffset);
}

/// The windowed copy-in of block b for the chunk at `off` of c elements: what the peers read from
/// this rank's window. reduce_scatter's window holds n blocks of a.chunk elements.
template <class T>
CHORUS_HOST_DEVICE inline void window_in(const CollectiveLaunch& a, unsigned b, std::uint64_t off, std::uint64_t c,
                                         unsigned t, unsigned threads) {
  std::uint64_t lo, hi;
  block_range<T>(a, b, c, lo, hi);
  T* mine = window<T>(a, a.rank);
  const T* in = reinterpret_cast<const T*>(a.in);
  T* outs[1];
  const T* ins[1];
  if (a.kind == KernelCollective::reduce_scatter) {
    for (int q = 0; q < a.ranks; ++q) {
      outs[0] = mine + static_cast<std::uint64_t>(q) * a.chunk;
      ins[0] = in + static_cast<std::uint64_t>(q) * a.count + off;
      fold<Sum, T>(outs, 1, ins, 1, lo, hi, false, 1, t, threads);
    }
    return;
  }
  if (a.kind == KernelCollective::broadcast && a.rank != a.root) return;
  outs[0] = mine;
  ins[0] = in + off;
  fold<Sum, T>(outs, 1, ins, 1, lo, hi, false, 1, t, threads);
}

/// The windowed reads of block b for the chunk at `off` of c elements, into this rank's output.
template <class Op, class T>
CHORUS_HOST_DEVICE inline void window_out(const CollectiveLaunch& a, unsigned b, std::uint64_t off, std::uint64_t c,
                                          unsigned t, unsigned threads) {
  const int n = a.ranks, r = a.rank;
  const bool avg = a.op == ReduceOp::avg;
  std::uint64_t lo, hi;
  block_range<T>(a, b, c, lo, hi);
  T* out = reinterpret_cast<T*>(a.out);
  T* outs[1];
  const T* ins[kMaxKernelRanks];
  switch (a.kind) {
    case KernelCollective::reduce:
      if (r != a.root) return;
      [[fallthrough]];
    case KernelCollective::all_reduce:
      for (int q = 0; q < n; ++q) ins[q] = window<T>(a, q);
      outs[0] = out + off;
      fold<Op, T>(outs, 1, ins, n, lo, hi, avg, n, t, threads);
      return;
    case KernelCollective::reduce_scatter:
      for (int q = 0; q < n; ++q) ins[q] = window<T>(a, q) + static_cast<std::uint64_t>(r) * a.chunk;
      outs[0] = out + off;
      fold<Op, T>(outs, 1, ins, n, lo, hi, avg, n, t, threads);
      return;
    case KernelCollective::all_gather:
      for (int q = 0; q < n; ++q) {
        outs[0] = out + static_cast<std::uint64_t>(q) * a.count + off;
        ins[0] = window<T>(a, q);
        fold<Sum, T>(outs, 1, ins, 1, lo, hi, false, n, t, threads);
      }
      return;
    case KernelCollective::broadcast:
      if (r == a.root) return;
      outs[0] = out + off;
      ins[0] = window<T>(a, a.root);
      fold<Sum, T>(outs, 1, ins, 1, lo, hi, false, n, t, threads);
      return;
  }
}

}  // namespace chorus::device::kernel
