// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// The collective kernel's memory words, clock and barriers (device/collective_body.hpp says how
/// the body is written): the same code on the host (the simulated runtime, with GCC atomics) and
/// on the device (PTX acquire/release at system scope, %globaltimer).

#include <cstddef>
#include <cstdint>

#include "chorus/config.hpp"
#include "chorus/device/collective.hpp"

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
/// Between two polls of a spin (`spins`: the spin's polls so far): the host yields its core (ranks
/// may outnumber cores), and once the spin has gone on for 2^16 polls (a millisecond or more: a
/// late peer, a timeout to come) it sleeps 50 us between polls instead, so that a wait of seconds
/// does not keep a core busy. A GPU spins.
CHORUS_HOST_DEVICE inline void relax(unsigned spins) {
#if !defined(__CUDA_ARCH__)
  if (spins < (1u << 16))
    std::this_thread::yield();
  else
    std::this_thread::sleep_for(std::chrono::microseconds(50));
#else
  (void)spins;
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
      relax(spins);
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

}  // namespace chorus::device::kernel
