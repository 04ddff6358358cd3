// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// Collectives on device buffers through the peers' IPC windows (algo/intranode/window.hpp),
/// for a communicator whose every peer is reached over cuda_ipc: the idea of NCCL's intranode
/// protocols and of the "one-shot" and "two-shot" all-reduce of TensorRT-LLM and vLLM.
///
/// A collective is a sequence of steps. In a step each rank writes what its peers need into the
/// windows (device copies or kernels on its stream), the ranks synchronise, and then each reads
/// what it needs straight from its peers' windows (copies and reduce kernels on its own stream).
/// The reads of step k and the writes of step k + 1 are issued together.
///
/// Synchronisation:
/// * The first step of a call is synchronised on the host: each rank drains its stream and
///   takes part in a mailbox exchange with every peer (algo/intranode/one_shot.hpp) that carries the call's
///   descriptor and its number of steps, so ranks in different collectives, or running different
///   algorithms, get mismatch before any device work depends on the other ranks.
/// * Every later step is synchronised on the device, with no host round trip: after its writes
///   the rank's stream stores k + 1 into its window's step flag (write_value), then waits until
///   every peer's flag, read through the mapping, is at least k + 1 (wait_value), then reads. The
///   host enqueues the whole call at once, so the chunks of a large call follow one another on
///   each device without returning to the host, and a rank starts chunk j + 1 as soon as its
///   own reads of chunk j are done, while a slower peer may still be reading.
///
/// Why no read meets a write: the data of step k goes to slot k % 2, and is read only once its
/// writers finished it (the drain before the exchange, or the flag). Before anyone writes slot
/// k % 2 again, at step k + 2, its readers of step k must be done: a rank's writes of step k + 2
/// follow, on its stream or after its drain, its wait for every peer's flag of step k + 1 (or that
/// peer's post of it), and a peer stores that flag (or posts) only after its stream has done its
/// reads of step k. A rank also writes into a peer's slot: the all-gather half of two-shot writes
/// its reduced block into block r of every peer's slot (k + 1) % 2 during the reads of step k,
/// which follow the same wait, so the last reads of that slot (step k - 1) are over too.
///
/// | collective      | steps per chunk | what is read (and written)                                       |
/// |-----------------|-----------------|------------------------------------------------------------------|
/// | all_reduce 1-shot | 1             | every peer's chunk, reduced in rank order into out (one kernel)  |
/// | all_reduce 2-shot | 2             | block r of every peer's chunk, reduced into block r of this      |
/// |                 |                 | rank's next slot and written into block r of every peer's next   |
/// |                 |                 | slot; then this rank's own next slot, the whole chunk, into out  |
/// | reduce          | 1               | at the root: every peer's chunk, reduced in rank order           |
/// | broadcast       | 1               | the root's chunk                                                 |
/// | all_gather, gather | 1            | every peer's chunk (gather: at the root)                         |
/// | reduce_scatter  | 1               | block r of every peer's chunk, reduced in rank order             |
/// | scatter         | 1               | block r of the root's chunk                                      |
/// | all_to_all      | 1               | block r of every peer's chunk                                    |
/// Chunks are as large as one slot holds. Reductions run in rank order on every rank (the host
/// one-shot's order), so all ranks get the same bits; avg divides once, at the end.
///
/// Failure: every device wait is bounded (the timeout; then it records which peer it waited
/// for in the process's abort word, and every later wait gives up at once), and the host watches
/// while the stream runs: a peer whose link breaks (it died, or failed and aborted) makes the host
/// set the abort word, so the waits end, and the call fails with peer_failure naming it; a wait
/// that timed out fails the call with timeout naming the peer. Nothing on the device spins
/// forever. Cost: a call's first step drains the stream and crosses the host (about 10 us on a
/// GPU host, an estimate); each later step costs a flag store and a wait on the device.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstring>

#include "chorus/algo/common.hpp"
#include "chorus/algo/descriptor.hpp"
#include "chorus/algo/intranode/one_shot.hpp"
#include "chorus/algo/select.hpp"
#include "chorus/core/error.hpp"
#include "chorus/device/runtime.hpp"
#include "chorus/exec/bytes.hpp"
#include "chorus/exec/device.hpp"
#include "chorus/algo/intranode/window.hpp"

namespace chorus::algo {

/// True when every peer of `g` is reached over a link that maps device memory (cuda_ipc) and has
/// mailboxes.
template <Transport T>
bool has_ipc(const Group<T>& g) {
  if constexpr (LinkWithIpc<LinkOf<T>> && LinkWithMailboxes<LinkOf<T>>) {
    for (int p = 0; p < g.size(); ++p) {
      if (p == g.rank) continue;
      auto& l = g.transport->link(g.members[static_cast<std::size_t>(p)]);
      if (!l.cuda_ipc() || l.shm_link() == nullptr) return false;
    }
    return g.size() > 1;
  } else {
    return false;
  }
}

/// One step of a direct collective: at most a drain of the device stream and a mailbox exchange
/// on the host (about 10 us on a GPU host: an estimate, not measured), then reads of peer memory
/// (200 GB/s: an estimate for one device's memory or NVLink, not measured).
inline constexpr TransportModel kDirectReadModel{10e-6, 1.0 / 200e9, 0};

/// The model's pick for a direct all_reduce of `bytes` over n ranks: one-shot reads (n - 1) B in
/// one step per chunk, two-shot 2 (n - 1) / n B in two.
inline Algorithm ipc_all_reduce_algorithm(std::size_t bytes, int n, std::size_t slot_bytes) {
  const TransportModel& m = kDirectReadModel;
  const double B = static_cast<double>(bytes), P = n;
  const double chunks = std::max(1.0, std::ceil(B / static_cast<double>(slot_bytes)));
  const double one = chunks * m.alpha + (P - 1) * B * m.beta;
  const double two = 2 * chunks * m.alpha + 2 * (P - 1) / P * B * m.beta;
  return one <= two ? Algorithm::one_shot : Algorithm::two_shot;
}

/// Runs one collective through the windows (has_ipc(g); a's buffers in device memory, a.exec is
/// `x`). Sets the windows up first where they are not (the communicator's first direct call).
template <Transport T, class OnStall>
class IpcCollective {
 public:
  IpcCollective(Group<T>& g, const CollectiveDesc& desc, const Args& a, cuda_ipc::Windows& w, exec::DeviceExecutor& x,
                std::chrono::milliseconds timeout, const OnStall& on_stall)
      : g_(g), desc_(desc), a_(a), w_(w), x_(x), timeout_(timeout), on_stall_(on_stall), n_(g.size()), r_(g.rank),
        es_(size_of(a.dtype)) {}

  void run(Algorithm alg) {
    if (w_.closed())  // an earlier direct call failed; the communicator was aborted then
      throw Error(ErrorCode::aborted, ErrorContext{r_, -1, describe(desc_)},
                  "the IPC windows were closed when an earlier call failed");
    if (!w_.ready()) set_up();
    std::atomic_ref<std::uint32_t>(*w_.abort_word()).store(0, std::memory_order_release);
    const bool two = desc_.kind == CollectiveKind::all_reduce && alg == Algorithm::two_shot;
    const bool per_block = desc_.kind == CollectiveKind::reduce_scatter || desc_.kind == CollectiveKind::scatter ||
                           desc_.kind == CollectiveKind::all_to_all;
    const bool one_step = desc_.kind == CollectiveKind::barrier || desc_.kind == CollectiveKind::split;
    planned_ = one_step ? 1 : chunk_count(a_.count, chunk_elems(per_block ? static_cast<std::size_t>(n_) : 1)) * (two ? 2 : 1);
    try {
      issue(two);
    } catch (const Error&) {
      // Device waits issued before the failure must not outlive the call: they give up now.
      if (device_steps_) std::atomic_ref<std::uint32_t>(*w_.abort_word()).store(kHostAbort, std::memory_order_release);
      throw;
    }
    finish();
  }

 private:
  /// Issues every step of the call.
  void issue(bool two) {
    switch (desc_.kind) {
      case CollectiveKind::all_reduce: two ? two_shot() : one_shot(); break;
      case CollectiveKind::reduce: reduce(); break;
      case CollectiveKind::broadcast: broadcast(); break;
      case CollectiveKind::all_gather: gather_like(/*everyone=*/true); break;
      case CollectiveKind::gather: gather_like(/*everyone=*/false); break;
      case CollectiveKind::reduce_scatter: blocks(/*reduce=*/true, /*from_root=*/false); break;
      case CollectiveKind::scatter: blocks(/*reduce=*/false, /*from_root=*/true); break;
      case CollectiveKind::all_to_all: blocks(/*reduce=*/false, /*from_root=*/false); break;
      case CollectiveKind::barrier:
      case CollectiveKind::split: exchange(); break;
    }
  }

  /// Every rank allocates and exports its window, sends the handle and its slot size through the
  /// mailboxes, and opens its peers'.
  void set_up() {
    struct Hello {
      device::IpcHandle handle;
      std::uint64_t slot_bytes;
    };
    if (w_.slot_bytes() < static_cast<std::size_t>(n_) * 16)  // a chunk of one element per block must fit
      throw Error(ErrorCode::invalid_argument, ErrorContext{r_, -1, describe(desc_)},
                  "CHORUS_CUDA_IPC_SLOT_BYTES=" + std::to_string(w_.slot_bytes()) + " is too small for " +
                      std::to_string(n_) + " ranks (at least 16 bytes per rank)");
    const Hello mine{w_.create(x_.stream()), w_.slot_bytes()};
    x_.runtime()->note_round_trip();
    mailbox_post(g_, desc_, sizeof(Hello), [&](std::byte* data) { exec::store(data, mine); });
    mailbox_wait(g_, desc_, sizeof(Hello), timeout_, on_stall_);
    for (int q = 0; q < n_; ++q) {
      if (q == r_) continue;
      const auto theirs = exec::load<Hello>(mailbox_data(g_, q));
      const ErrorContext ctx{r_, q, describe(desc_)};
      if (theirs.slot_bytes != mine.slot_bytes)
        throw Error(ErrorCode::invalid_argument, ctx,
                    "CHORUS_CUDA_IPC_SLOT_BYTES differs between ranks: " + std::to_string(mine.slot_bytes) + " here, " +
                        std::to_string(theirs.slot_bytes) + " on rank " + std::to_string(q));
      try {
        w_.open(q, theirs.handle);
      } catch (const Error& e) {
        throw Error(ErrorCode::peer_failure, ctx,
                    "cannot map the device memory of rank " + std::to_string(q) + " (CUDA IPC): " + e.what());
      }
    }
  }

  /// Synchronises step `w_.step` (this step's writes issued, the last step's reads before them):
  /// the call's first step on the host (the stream drained, a mailbox exchange that carries the
  /// descriptor and the call's number of steps), every later one on the device (this rank's flag
  /// stored behind its writes, then a wait for every peer's).
  void exchange() {
    x_.join();  // a prefetched write is part of this step's writes
    if (steps_ == 0) {
      x_.wait_stream();
      x_.runtime()->note_round_trip();
      mailbox_post(g_, desc_, planned_, [](std::byte*) {});
      mailbox_wait(g_, desc_, planned_, timeout_, on_stall_);
    } else {
      const std::uint64_t flag = w_.step + 1;
      x_.write_value(w_.ready(r_), flag);
      for (int q = 0; q < n_; ++q)
        if (q != r_) x_.wait_value(w_.ready(q), flag, w_.abort_word(), static_cast<std::uint32_t>(q) + 1, timeout_);
      device_steps_ = true;
    }
    ++steps_;
    ++w_.step;
  }

  /// Waits for the stream where device steps were issued, watching the peers: a broken link sets
  /// the abort word (the device waits give up) and fails the call with peer_failure; a device wait
  /// that timed out fails it with timeout. Either way the stream is done before this throws, so
  /// nothing reads or writes a window afterwards.
  void finish() {
    if (!device_steps_) return;
    std::atomic_ref<std::uint32_t> abort(*w_.abort_word());
    int broken = -1;
    auto stall_check = std::chrono::steady_clock::now() + Channel<T>::kStallCheck;
    const auto watch = [&] {
      for (int q = 0; q < n_; ++q)
        if (q != r_ && mailbox_link(g_, q).broken()) {
          broken = q;
          return false;
        }
      if (const auto now = std::chrono::steady_clock::now(); now >= stall_check) {
        on_stall_(desc_);
        stall_check = now + Channel<T>::kStallCheck;
      }
      return true;
    };
    bool done = false;
    try {
      // The device waits give up after the timeout each, and the first that does makes every
      // later one give up at once: the stream ends within about one timeout. The host's bound
      // is a second line.
      done = x_.wait_stream(2 * timeout_ + std::chrono::seconds(1), watch);
    } catch (const Error&) {
      abort.store(kHostAbort, std::memory_order_release);
      throw;
    }
    std::uint32_t gave_up = 0;
    if (!done) {
      // A device wait that already timed out says more than the link that broke since (a peer
      // that timed out on the same late rank and aborted): keep its word.
      gave_up = abort.exchange(kHostAbort, std::memory_order_acq_rel);
      x_.wait_stream();  // the waits give up at once now
      if (gave_up == 0 || gave_up == kHostAbort) {
        const std::string why = mailbox_link(g_, broken).failure().second;
        throw Error(ErrorCode::peer_failure, ErrorContext{r_, broken, describe(desc_)},
                    "rank " + std::to_string(broken) + " failed while this rank's device waited for its data: " + why);
      }
    } else {
      gave_up = abort.load(std::memory_order_acquire);
    }
    if (gave_up != 0) {
      const int q = static_cast<int>(gave_up) - 1;
      throw Error(ErrorCode::timeout, ErrorContext{r_, q, describe(desc_)},
                  "this rank's device waited more than " + std::to_string(timeout_.count()) + " ms for the data of rank " +
                      std::to_string(q) + " (a step flag in its IPC window; CHORUS_TIMEOUT)");
    }
  }
  /// The host's value in the abort word (a device wait stores 1 + the peer it waited for).
  static constexpr std::uint32_t kHostAbort = 0xffffffffu;
  /// Slot of rank q with the data of the step just exchanged; this rank's slot for the next.
  std::byte* last(int q) const { return w_.slot(q, w_.step - 1); }
  std::byte* next() const { return w_.slot(r_, w_.step); }
  std::size_t bytes(std::size_t elems) const { return elems * es_; }

  /// dst = src(0) op src(1) op ... op src(n-1), count elements, in rank order: one reduce_many
  /// kernel for up to kMaxReduceInputs ranks (more fold on into dst, kMaxReduceInputs - 1 at a
  /// time: the same bits).
  template <class Src>
  void reduce_all(std::byte* dst, const Src& src, std::size_t count) {
    if (count == 0) return;
    const std::byte* in[kMaxReduceInputs];
    int q = 0, k = 0;
    for (; q < n_ && k < kMaxReduceInputs; ++q) in[k++] = src(q);
    a_.x().reduce_many(a_.op, a_.dtype, dst, in, k, count);
    while (q < n_) {
      k = 0;
      in[k++] = dst;
      for (; q < n_ && k < kMaxReduceInputs; ++q) in[k++] = src(q);
      if (k == 2)
        a_.x().reduce(a_.op, a_.dtype, dst, in[0], in[1], count);
      else
        a_.x().reduce_many(a_.op, a_.dtype, dst, in, k, count);
    }
    if (a_.op == ReduceOp::avg) a_.x().finalize_avg(a_.dtype, dst, count, n_);
  }
  /// Elements per chunk: a slot holds `per` blocks of them.
  std::size_t chunk_elems(std::size_t per) const { return std::max<std::size_t>(1, w_.slot_bytes() / (es_ * per)); }
  /// Calls body(offset, elems) for each chunk of `count` elements; one empty chunk when count is 0
  /// (every call takes at least one step: a mismatch is still found).
  static std::size_t chunk_count(std::size_t count, std::size_t per_chunk) {
    return count == 0 ? 1 : (count + per_chunk - 1) / per_chunk;
  }
  template <class Body>
  static void chunks(std::size_t count, std::size_t per_chunk, const Body& body) {
    if (count == 0) return body(std::size_t{0}, std::size_t{0});
    for (std::size_t off = 0; off < count; off += per_chunk) body(off, std::min(per_chunk, count - off));
  }
  /// Block q of c elements split n ways: [lo, hi).
  std::pair<std::size_t, std::size_t> block(std::size_t c, int q) const {
    const std::size_t N = static_cast<std::size_t>(n_), Q = static_cast<std::size_t>(q);
    return {c * Q / N, c * (Q + 1) / N};
  }

  /// Copies into the windows: on the main stream, or on the side stream for a prefetch.
  void put(std::byte* dst, const std::byte* src, std::size_t n, bool side) {
    if (side)
      x_.side_copy(dst, src, n);
    else
      a_.x().copy(dst, src, n);
  }
  /// Runs the call chunk by chunk. write(off, c, side) puts chunk [off, off + c)'s data for its
  /// first step into this rank's next slot; steps(off, c, prefetch) takes the chunk's steps and
  /// reads, and calls prefetch() right after its last exchange: that issues the next chunk's write
  /// on the side stream, into the slot whose readers that exchange has seen done, so it overlaps
  /// this chunk's reads; the next exchange joins it first.
  template <class Write, class Steps>
  void pipelined(std::size_t per_chunk, const Write& write, const Steps& steps) {
    const std::size_t count = a_.count;
    write(std::size_t{0}, std::min(per_chunk, count), false);
    chunks(count, per_chunk, [&](std::size_t off, std::size_t c) {
      const auto prefetch = [&] {
        const std::size_t next = off + c;
        if (next >= count) return;
        x_.fork();
        write(next, std::min(per_chunk, count - next), true);
      };
      steps(off, c, prefetch);
    });
  }
  /// The write of the collectives whose first step holds the input's chunk (all but the per-block
  /// ones): every rank's, or the root's alone.
  auto chunk_write(bool root_only) {
    return [this, root_only](std::size_t off, std::size_t c, bool side) {
      if (!root_only || r_ == a_.root) put(next(), a_.in + bytes(off), bytes(c), side);
    };
  }

  void one_shot() {
    pipelined(chunk_elems(1), chunk_write(false), [&](std::size_t off, std::size_t c, const auto& prefetch) {
      exchange();
      prefetch();
      reduce_all(a_.out + bytes(off), [&](int q) { return last(q); }, c);
    });
  }
  void two_shot() {
    pipelined(chunk_elems(1), chunk_write(false), [&](std::size_t off, std::size_t c, const auto& prefetch) {
      exchange();
      // Reduce-scatter by reads: block r of every peer's chunk, reduced into block r of this
      // rank's next slot; all-gather by writes: that block into block r of every peer's next slot.
      const auto mine = block(c, r_);
      const std::size_t lo = mine.first, hi = mine.second;  // (named, not bound: lambdas capture them)
      reduce_all(next() + bytes(lo), [&](int q) { return last(q) + bytes(lo); }, hi - lo);
      for (int q = 0; q < n_; ++q)
        if (q != r_) a_.x().copy(w_.slot(q, w_.step) + bytes(lo), next() + bytes(lo), bytes(hi - lo));
      exchange();
      prefetch();
      a_.x().copy(a_.out + bytes(off), last(r_), bytes(c));
    });
  }
  void reduce() {
    pipelined(chunk_elems(1), chunk_write(false), [&](std::size_t off, std::size_t c, const auto& prefetch) {
      exchange();
      prefetch();
      if (r_ == a_.root) reduce_all(a_.out + bytes(off), [&](int q) { return last(q); }, c);
    });
  }
  void broadcast() {
    pipelined(chunk_elems(1), chunk_write(true), [&](std::size_t off, std::size_t c, const auto& prefetch) {
      exchange();
      prefetch();
      if (r_ != a_.root) a_.x().copy(a_.out + bytes(off), last(a_.root), bytes(c));
    });
  }
  /// all_gather (everyone) and gather (the root): every rank's chunk lands in block q of out.
  void gather_like(bool everyone) {
    pipelined(chunk_elems(1), chunk_write(false), [&](std::size_t off, std::size_t c, const auto& prefetch) {
      exchange();
      prefetch();
      if (!everyone && r_ != a_.root) return;
      for (int q = 0; q < n_; ++q)
        a_.x().copy(a_.out + bytes(static_cast<std::size_t>(q) * a_.count + off), last(q), bytes(c));
    });
  }
  /// reduce_scatter, scatter and all_to_all: in holds n blocks of count; each chunk puts the same
  /// part of every block into the slot (block q at q * c), and rank r reads block r.
  void blocks(bool reduce, bool from_root) {
    const auto write = [&](std::size_t off, std::size_t c, bool side) {
      if (from_root && r_ != a_.root) return;
      for (int q = 0; q < n_; ++q)
        put(next() + bytes(static_cast<std::size_t>(q) * c), a_.in + bytes(static_cast<std::size_t>(q) * a_.count + off),
            bytes(c), side);
    };
    pipelined(chunk_elems(static_cast<std::size_t>(n_)), write, [&](std::size_t off, std::size_t c, const auto& prefetch) {
      exchange();
      prefetch();
      const std::size_t mine = bytes(static_cast<std::size_t>(r_) * c);
      if (reduce)
        reduce_all(a_.out + bytes(off), [&](int q) { return last(q) + mine; }, c);
      else if (from_root)
        a_.x().copy(a_.out + bytes(off), last(a_.root) + mine, bytes(c));
      else
        for (int q = 0; q < n_; ++q)
          a_.x().copy(a_.out + bytes(static_cast<std::size_t>(q) * a_.count + off), last(q) + mine, bytes(c));
    });
  }

  Group<T>& g_;
  const CollectiveDesc& desc_;
  const Args& a_;
  cuda_ipc::Windows& w_;
  exec::DeviceExecutor& x_;
  std::chrono::milliseconds timeout_;
  const OnStall& on_stall_;
  const int n_, r_;
  const std::size_t es_;
  std::size_t steps_ = 0;    ///< steps of this call taken
  std::size_t planned_ = 0;  ///< ... and to take (every rank checks the others plan the same)
  bool device_steps_ = false;
};

}  // namespace chorus::algo
