// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// The collective kernel's body (device/collective.hpp says what it does), as host+device code
/// written one block at a time: `collective_block<Op, T>(args, exec)` runs block exec.index of
/// one rank's kernel. The Exec type says how the block's threads run:
/// * on the GPU (device/collective.cuh) every thread calls it; exec.single(f) runs f on thread 0
///   and then __syncthreads(), exec.each(f) runs f(threadIdx.x, blockDim.x) and then
///   __syncthreads();
/// * in the simulated runtime (testing/sim_runtime/collective.hpp) one host thread per block calls
///   it; single(f) runs f, each(f) runs f(t, kKernelThreads) for every t in turn.
/// So the code between two syncs must be correct in any interleaving of the block's threads,
/// including one thread after another: no thread of a phase waits for a later thread of its own
/// block (each LL thread waits only for lines that a peer's threads write in a phase that waits for
/// nothing).
///
/// Why two LL buffers are enough: rank r writes call c's lines into buffer c % 2 of rank q, whose
/// last reader of it was q's call c - 2. r started call c after its call c - 1 read q's lines of
/// c - 1, which q wrote only after its call c - 2 was over (one communicator's kernels run one
/// after another on every rank). This needs every rank to send to every rank in each LL call,
/// which is why only all_reduce, all_gather and reduce_scatter take LL.
///
/// Why the flag lines need no more: a barrier publishes its number with a release store after the
/// block's writes (a system-scope fence first); peers acquire it. A rank passes barrier m + 1 only
/// after every peer arrived at m + 1, so a peer's flag line still holds the call's addresses and
/// descriptor (published with its first barrier) while any rank reads them.

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "chorus/config.hpp"
#include "chorus/device/collective.hpp"
#include "chorus/reduce/cuda/kernels.hpp"
#include "chorus/reduce/ops.hpp"

#if !defined(__CUDA_ARCH__)
#include <chrono>
#include <thread>
#endif

namespace chorus::device::kernel {

// --- memory and time, the same words on the host (the simulated runtime) and the device ---------

CHORUS_HOST_DEVICE inline std::uint64_t load_acquire(const std::uint64_t* p) {
#if defined(__CUDA_ARCH__)
  std::uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
#else
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
#endif
}
CHORUS_HOST_DEVICE inline void store_release(std::uint64_t* p, std::uint64_t v) {
#if defined(__CUDA_ARCH__)
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
#else
  __atomic_store_n(p, v, __ATOMIC_RELEASE);
#endif
}
/// A word read or written whole, with no order around it (an LL line's half, a published address).
CHORUS_HOST_DEVICE inline std::uint64_t load_word(const std::uint64_t* p) {
#if defined(__CUDA_ARCH__)
  return *static_cast<const volatile std::uint64_t*>(p);
#else
  return __atomic_load_n(p, __ATOMIC_RELAXED);
#endif
}
CHORUS_HOST_DEVICE inline void store_word(std::uint64_t* p, std::uint64_t v) {
#if defined(__CUDA_ARCH__)
  *static_cast<volatile std::uint64_t*>(p) = v;
#else
  __atomic_store_n(p, v, __ATOMIC_RELAXED);
#endif
}
CHORUS_HOST_DEVICE inline std::uint32_t load_flag(const std::uint32_t* p) {
#if defined(__CUDA_ARCH__)
  return *static_cast<const volatile std::uint32_t*>(p);
#else
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
#endif
}
CHORUS_HOST_DEVICE inline void store_flag(std::uint32_t* p, std::uint32_t v) {
#if defined(__CUDA_ARCH__)
  __threadfence_system();
  *static_cast<volatile std::uint32_t*>(p) = v;
#else
  __atomic_store_n(p, v, __ATOMIC_RELEASE);
#endif
}
/// Every write of this thread before it is seen before any after it, by every process and device.
CHORUS_HOST_DEVICE inline void fence() {
#if defined(__CUDA_ARCH__)
  __threadfence_system();
#else
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
#endif
}
CHORUS_HOST_DEVICE inline std::uint64_t now_ns() {
#if defined(__CUDA_ARCH__)
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
#else
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count());
#endif
}
/// Between two polls of a spin: the host yields its core (ranks may outnumber cores).
CHORUS_HOST_DEVICE inline void relax() {
#if !defined(__CUDA_ARCH__)
  std::this_thread::yield();
#endif
}

// --- what a block's threads share ----------------------------------------------------------------

/// Written by thread 0 (or, for status, by any thread that gives up), read by all after a sync.
struct BlockShared {
  std::uint32_t status;  ///< KernelStatus: not ok once any thread gave up
  std::int32_t peer;
  std::uint64_t peer_desc[4];
  std::uint64_t start;  ///< the kernel's start (now_ns), for the deadline
  std::uint64_t in[kMaxKernelRanks];   ///< direct: every rank's buffers as this rank addresses them
  std::uint64_t out[kMaxKernelRanks];
};

/// A thread gives up: the first reason stays (the rest follow from it).
CHORUS_HOST_DEVICE inline void give_up(BlockShared& sh, KernelStatus why, int peer) {
  volatile std::uint32_t* status = &sh.status;
  if (*status != 0) return;
  sh.peer = peer;
  *status = static_cast<std::uint32_t>(why);
}
CHORUS_HOST_DEVICE inline bool failed(const BlockShared& sh) { return *static_cast<const volatile std::uint32_t*>(&sh.status) != 0; }

CHORUS_HOST_DEVICE inline std::uint64_t* flag_line(std::byte* area, unsigned block) {
  return reinterpret_cast<std::uint64_t*>(area + area::kFlagsOffset + block * area::kFlagLineBytes);
}
CHORUS_HOST_DEVICE inline std::uint32_t* abort_word(std::byte* area) {
  return reinterpret_cast<std::uint32_t*>(area + area::kAbortOffset);
}

/// One poll's worth of the reasons a spin on peer q gives up; true when it must. `own` false: a
/// failure of another thread of the block is not one (the spin reads what that failure needs).
CHORUS_HOST_DEVICE inline bool must_give_up(const CollectiveLaunch& a, BlockShared& sh, int q, bool own = true) {
  if (own && failed(sh)) return true;
  if (load_flag(a.abort) != 0) return give_up(sh, KernelStatus::aborted, -1), true;
  if (load_flag(abort_word(a.areas[q])) != 0) return give_up(sh, KernelStatus::peer_failure, q), true;
  if (now_ns() - sh.start >= a.timeout_ns) return give_up(sh, KernelStatus::timeout, q), true;
  return false;
}

/// Spins until *word >= target; false when it gave up (sh says why).
CHORUS_HOST_DEVICE inline bool wait_at_least(const CollectiveLaunch& a, BlockShared& sh, const std::uint64_t* word,
                                             std::uint64_t target, int q) {
  for (unsigned spins = 0;; ++spins) {
    if (load_acquire(word) >= target) return true;
    if ((spins & 31) == 31) {
      if (must_give_up(a, sh, q)) return false;
      relax();
    }
  }
}

/// Gives up (peer_failure) where a peer's abort word is set.
CHORUS_HOST_DEVICE inline void peers_alive(const CollectiveLaunch& a, BlockShared& sh) {
  for (int q = 0; q < a.ranks; ++q)
    if (q != a.rank && load_flag(abort_word(a.areas[q])) != 0) return give_up(sh, KernelStatus::peer_failure, q);
}

/// Barrier `number` of block `b` (thread 0 only): this rank arrives, then waits for every peer.
/// The call's first barrier (`first`) also publishes the call's buffers and descriptor and checks
/// every peer's descriptor against this rank's.
CHORUS_HOST_DEVICE inline void barrier(const CollectiveLaunch& a, BlockShared& sh, unsigned b, std::uint64_t number,
                                       bool first) {
  std::uint64_t* mine = flag_line(a.areas[a.rank], b);
  if (first) {
    store_word(&mine[1], a.in_shared);
    store_word(&mine[2], a.out_shared);
    for (int w = 0; w < 4; ++w) store_word(&mine[3 + w], a.desc[w]);
  }
  fence();
  store_release(&mine[0], number);
  for (int q = 0; q < a.ranks; ++q) {
    if (q == a.rank) continue;
    const std::uint64_t* theirs = flag_line(a.areas[q], b);
    if (!wait_at_least(a, sh, &theirs[0], number, q)) return;
    if (!first) continue;
    bool same = true;
    for (int w = 0; w < 4; ++w) {
      sh.peer_desc[w] = load_word(&theirs[3 + w]);
      same = same && sh.peer_desc[w] == a.desc[w];
    }
    if (!same) return give_up(sh, KernelStatus::mismatch, q);
    sh.in[q] = load_word(&theirs[1]);
    sh.out[q] = load_word(&theirs[2]);
  }
  // A peer that arrived and then gave up (it aborted, or found a mismatch with another rank) may
  // have let its buffers go since. (After every descriptor was compared: a mismatch of this
  // rank's own is the better report.)
  if (first) peers_alive(a, sh);
  if (first) {
    sh.in[a.rank] = a.in_shared;
    sh.out[a.rank] = a.out_shared;
  }
}

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
      relax();
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

// --- one block -----------------------------------------------------------------------------------

/// Thread 0 of a block that gave up: its result, the peer's descriptor for a mismatch, and (for a
/// failure of its own, not an abort) the abort words, of this process and in this rank's area.
CHORUS_HOST_DEVICE inline void report(const CollectiveLaunch& a, const BlockShared& sh, unsigned b) {
  if (sh.status == static_cast<std::uint32_t>(KernelStatus::mismatch))
    for (int w = 0; w < 4; ++w) *static_cast<volatile std::uint64_t*>(&a.report[b].peer_desc[w]) = sh.peer_desc[w];
  *static_cast<volatile std::int32_t*>(&a.result[b].peer) = sh.peer;
  store_flag(&a.result[b].status, sh.status);
  if (sh.status == static_cast<std::uint32_t>(KernelStatus::aborted)) return;
  store_flag(a.abort, 1);
  store_flag(abort_word(a.areas[a.rank]), 1);
}

/// Block ex.index of one rank's collective kernel.
template <class Op, class T, class Exec>
CHORUS_HOST_DEVICE inline void collective_block(const CollectiveLaunch& a, BlockShared& sh, Exec& ex) {
  const unsigned b = ex.index;
  ex.single([&] {
    sh.status = 0;
    sh.peer = -1;
    sh.start = now_ns();
    // An earlier call failed, or the host gave up: nothing more runs (sticky, like a stream error).
    if (load_flag(a.abort) != 0) {
      sh.status = static_cast<std::uint32_t>(KernelStatus::aborted);
      report(a, sh, b);
    }
  });
  if (failed(sh)) return;
  if (a.protocol == KernelProtocol::ll) {
    ll_call<Op, T>(a, sh, ex);
  } else if (a.protocol == KernelProtocol::direct) {
    ex.single([&] { barrier(a, sh, b, a.barrier_base + 1, true); });
    if (!failed(sh)) {
      ex.each([&](unsigned t, unsigned threads) { direct_phase<Op, T>(a, sh, b, t, threads); });
      ex.single([&] { barrier(a, sh, b, a.barrier_base + 2, false); });
    }
  } else {
    const std::uint64_t C = a.count, chunk = a.chunk;
    std::uint64_t number = a.barrier_base, off = 0;
    do {
      const std::uint64_t c = C - off < chunk ? C - off : chunk;
      ex.each([&](unsigned t, unsigned threads) { window_in<T>(a, b, off, c, t, threads); });
      ex.single([&] { barrier(a, sh, b, ++number, off == 0); });
      if (failed(sh)) break;
      ex.each([&](unsigned t, unsigned threads) { window_out<Op, T>(a, b, off, c, t, threads); });
      ex.single([&] { barrier(a, sh, b, ++number, false); });
      if (failed(sh)) break;
      off += c;
    } while (off < C);
  }
  ex.single([&] {
    if (failed(sh)) report(a, sh, b);
  });
}

}  // namespace chorus::device::kernel
