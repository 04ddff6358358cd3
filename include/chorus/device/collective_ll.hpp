// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// The collective kernel's LL protocol (device/collective.hpp, device/collective_body.hpp): lines
/// of 16 bytes, each 64-bit half four bytes of data beside the call's flag, written into the peers'
/// areas and read where they land; the first four carry the call's descriptor.

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "chorus/config.hpp"
#include "chorus/device/collective.hpp"
#include "chorus/device/collective_sync.hpp"
#include "chorus/reduce/ops.hpp"

namespace chorus::device::kernel {

// --- LL ------------------------------------------------------------------------------------------

/// Line k of the LL buffer `parity` of rank q's area that rank `src` writes.
CHORUS_HOST_DEVICE inline std::uint64_t* ll_line(std::byte* area, unsigned parity, int src, std::uint64_t k) {
  return reinterpret_cast<std::uint64_t*>(area + area::kLLOffset +
                                          (parity * kMaxKernelRanks + static_cast<unsigned>(src)) * area::kLLBufferBytes +
                                          k * kLLLineBytes);
}
/// The bytes this rank sends to rank q: its input (reduce_scatter: block q of it).
template <class T>
CHORUS_HOST_DEVICE inline const std::byte* ll_payload(const CollectiveLaunch& a, int q) {
  const std::uint64_t block = a.kind == KernelCollective::reduce_scatter ? static_cast<std::uint64_t>(q) : 0;
  return a.in + block * a.count * sizeof(T);
}
/// Eight bytes of `p` from byte `at` (zeros past `bytes`).
CHORUS_HOST_DEVICE inline std::uint64_t eight(const std::byte* p, std::uint64_t at, std::uint64_t bytes) {
  std::uint64_t v = 0;
  const std::uint64_t n = bytes - at < 8 ? bytes - at : 8;
  for (std::uint64_t i = 0; i < n; ++i) v |= static_cast<std::uint64_t>(static_cast<unsigned char>(p[at + i])) << (8 * i);
  return v;
}
/// Spins until line `line` holds the call's flag in both halves; its eight bytes of data in `v`.
CHORUS_HOST_DEVICE inline bool ll_read(const CollectiveLaunch& a, BlockShared& sh, const std::uint64_t* line, int q,
                                       std::uint64_t& v, bool own = true) {
  const std::uint64_t want = static_cast<std::uint64_t>(a.ll_flag) << 32;
  for (unsigned spins = 0;; ++spins) {
    const std::uint64_t w0 = load_word(&line[0]), w1 = load_word(&line[1]);
    if ((w0 & 0xffffffff00000000ull) == want && (w1 & 0xffffffff00000000ull) == want) {
      v = (w0 & 0xffffffffull) | (w1 << 32);
      return true;
    }
    if ((spins & 31) == 31) {
      if (must_give_up(a, sh, q, own)) return false;
      relax(spins);
    }
  }
}

template <class T>
CHORUS_HOST_DEVICE inline T element(std::uint64_t v, unsigned j) {
  T x;
  std::memcpy(&x, reinterpret_cast<const unsigned char*>(&v) + j * sizeof(T), sizeof(T));
  return x;
}

/// The LL call (one block): write every peer's lines, check their descriptors, then read theirs.
template <class Op, class T, class Exec>
CHORUS_HOST_DEVICE inline void ll_call(const CollectiveLaunch& a, BlockShared& sh, Exec& ex) {
  const int n = a.ranks, r = a.rank;
  const std::uint64_t C = a.count, bytes = C * sizeof(T), lines = kLLDescLines + (bytes + 7) / 8;
  const unsigned parity = a.ll_flag & 1u;
  const std::uint64_t flag = static_cast<std::uint64_t>(a.ll_flag) << 32;
  // 1. Write: line k to every peer, both halves with the flag.
  ex.each([&](unsigned t, unsigned threads) {
    for (std::uint64_t k = t; k < lines; k += threads)
      for (int q = 0; q < n; ++q) {
        if (q == r) continue;
        const std::uint64_t v = k < kLLDescLines ? a.desc[k] : eight(ll_payload<T>(a, q), 8 * (k - kLLDescLines), bytes);
        std::uint64_t* line = ll_line(a.areas[q], parity, r, k);
        store_word(&line[0], (v & 0xffffffffull) | flag);
        store_word(&line[1], (v >> 32) | flag);
      }
  });
  // 2. The peers' descriptors (before any data is used).
  ex.each([&](unsigned t, unsigned) {
    if (t >= kLLDescLines) return;
    for (int q = 0; q < n; ++q) {
      if (q == r) continue;
      std::uint64_t v = 0;
      if (!ll_read(a, sh, ll_line(a.areas[r], parity, q, t), q, v)) return;
      if (v != a.desc[t]) {
        give_up(sh, KernelStatus::mismatch, q);
        return;
      }
    }
  });
  // A peer that wrote its lines and then gave up: the call fails here too, as a barrier's would.
  ex.single([&] {
    if (!failed(sh)) peers_alive(a, sh);
  });
  if (failed(sh)) {
    ex.single([&] {  // the differing peer's whole descriptor, for the report
      if (sh.status != static_cast<std::uint32_t>(KernelStatus::mismatch)) return;
      for (std::uint64_t k = 0; k < kLLDescLines; ++k)
        if (!ll_read(a, sh, ll_line(a.areas[r], parity, sh.peer, k), sh.peer, sh.peer_desc[k], /*own=*/false)) return;
    });
    return;
  }
  // 3. Data: each line's elements from every rank, in rank order.
  constexpr unsigned kPerLine = 8 / sizeof(T);
  const bool avg = a.op == ReduceOp::avg;
  const T* own = reinterpret_cast<const T*>(ll_payload<T>(a, r));
  T* out = reinterpret_cast<T*>(a.out);
  ex.each([&](unsigned t, unsigned threads) {
    for (std::uint64_t k = kLLDescLines + t; k < lines; k += threads) {
      std::uint64_t v[kMaxKernelRanks] = {};
      for (int q = 0; q < n; ++q)
        if (q != r && !ll_read(a, sh, ll_line(a.areas[r], parity, q, k), q, v[q])) return;
      const std::uint64_t first = (k - kLLDescLines) * kPerLine;
      for (unsigned j = 0; j < kPerLine && first + j < C; ++j) {
        const std::uint64_t i = first + j;
        if (a.kind == KernelCollective::all_gather) {
          for (int q = 0; q < n; ++q) out[static_cast<std::uint64_t>(q) * C + i] = q == r ? own[i] : element<T>(v[q], j);
          continue;
        }
        T x = r == 0 ? own[i] : element<T>(v[0], j);
        for (int q = 1; q < n; ++q) x = Op{}(x, q == r ? own[i] : element<T>(v[q], j));
        out[i] = avg ? avg_divide(x, n) : x;
      }
    }
  });
}

}  // namespace chorus::device::kernel
