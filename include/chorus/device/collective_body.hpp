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

#include "chorus/config.hpp"
#include "chorus/device/collective.hpp"
#include "chorus/device/collective_data.hpp"
#include "chorus/device/collective_ll.hpp"
#include "chorus/device/collective_sync.hpp"


namespace chorus::device::kernel {

// --- one block -----------------------------------------------------------------------------------

/// The value a block that found a mismatch leaves in this process's abort word: this call's own,
/// so that the call's later blocks still publish their descriptors (below) while every later call
/// gives up at once.
CHORUS_HOST_DEVICE inline std::uint32_t mismatch_mark(const CollectiveLaunch& a) {
  return 0x80000000u | static_cast<std::uint32_t>((a.barrier_base + 1) & 0x7fffffffu);
}

/// Thread 0 of a block that gave up: its result, the peer's descriptor for a mismatch, and (for a
/// failure of its own, not an abort) the abort words, of this process and in this rank's area. A
/// mismatch leaves this rank's area alone: every block of every rank publishes its descriptor and
/// the peers find the difference themselves, where an abort word seen first would tell them only
/// that this rank gave up.
CHORUS_HOST_DEVICE inline void report(const CollectiveLaunch& a, const BlockShared& sh, unsigned b) {
  if (sh.status == static_cast<std::uint32_t>(KernelStatus::mismatch))
    for (int w = 0; w < 4; ++w) *static_cast<volatile std::uint64_t*>(&a.report[b].peer_desc[w]) = sh.peer_desc[w];
  *static_cast<volatile std::int32_t*>(&a.result[b].peer) = sh.peer;
  store_flag(&a.result[b].status, sh.status);
  if (sh.status == static_cast<std::uint32_t>(KernelStatus::aborted)) return;
  if (sh.status == static_cast<std::uint32_t>(KernelStatus::mismatch)) {
    if (load_flag(a.abort) == 0) store_flag(a.abort, mismatch_mark(a));
    return;
  }
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
    // (A mismatch another block of this call found is no reason: this block still publishes its
    // descriptor at its first barrier, then gives up as aborted there.)
    const std::uint32_t abort = load_flag(a.abort);
    if (abort != 0 && abort != mismatch_mark(a)) {
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
