#pragma once
/// Collectives on device buffers by direct reads of the peers' IPC windows
/// (transport/cuda_ipc/window.hpp), for a communicator whose every peer is reached over cuda_ipc:
/// the idea of NCCL's intranode protocols and of the "one-shot" and "two-shot" all-reduce of
/// TensorRT-LLM and vLLM, synchronised on the host through the shm links' mailboxes.
///
/// A collective is a sequence of steps. In a step each rank writes what its peers need into its
/// own window (device copies or kernels on its stream), drains its stream, and takes part in a
/// mailbox exchange with every peer (algo/one_shot.hpp: the call's descriptor, checked, so ranks
/// in different collectives get mismatch); after it, every rank reads its peers' data straight
/// from their windows (copies and reduce kernels on its own stream). The reads of step k and
/// the writes of step k + 1 are issued together, before the next exchange.
///
/// Why no read meets a write: the data of step k goes to slot k % 2. A rank writes it after the
/// exchange of step k - 1 completed, that is after every peer posted step k - 1, which a peer does
/// only once its stream has drained the reads of step k - 2: the last reads of that slot. And it
/// is read only after the exchange of step k, once its owner's stream has drained the writes.
///
/// | collective      | steps per chunk | what is read                                                     |
/// |-----------------|-----------------|------------------------------------------------------------------|
/// | all_reduce 1-shot | 1             | every peer's chunk, reduced in rank order into out (one kernel)  |
/// | all_reduce 2-shot | 2             | block r of every peer's chunk, reduced into the window; then     |
/// |                 |                 | every peer's reduced block copied into out                       |
/// | reduce          | 1               | at the root: every peer's chunk, reduced in rank order           |
/// | broadcast       | 1               | the root's chunk                                                 |
/// | all_gather, gather | 1            | every peer's chunk (gather: at the root)                         |
/// | reduce_scatter  | 1               | block r of every peer's chunk, reduced in rank order             |
/// | scatter         | 1               | block r of the root's chunk                                      |
/// | all_to_all      | 1               | block r of every peer's chunk                                    |
/// Chunks are as large as one slot holds. Reductions run in rank order on every rank (the host
/// one-shot's order), so all ranks get the same bits; avg divides once, at the end.
///
/// Cost: every step drains the stream and synchronises on the host (no kernel waits on a flag,
/// so nothing on the device can spin forever: every wait is a host wait bounded by the timeout,
/// and a peer's death breaks its link, which ends the wait with peer_failure). Chunks follow
/// one another; they are not overlapped.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstring>

#include "chorus/algo/common.hpp"
#include "chorus/algo/descriptor.hpp"
#include "chorus/algo/one_shot.hpp"
#include "chorus/algo/select.hpp"
#include "chorus/core/error.hpp"
#include "chorus/device/runtime.hpp"
#include "chorus/exec/device.hpp"
#include "chorus/transport/cuda_ipc/transport.hpp"
#include "chorus/transport/cuda_ipc/window.hpp"

namespace chorus::algo {

/// True when every peer of `g` is reached over a link that maps device memory (cuda_ipc) and has
/// mailboxes.
template <Transport T>
bool has_ipc(const Group<T>& g) {
  if constexpr (requires(T& t) {
                  t.link(0).cuda_ipc();
                  t.link(0).shm_link();
                }) {
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

/// The model's pick for a direct all_reduce of `bytes` over n ranks: one-shot reads (n - 1) B in
/// one step per chunk, two-shot 2 (n - 1) / n B in two.
inline Algorithm ipc_all_reduce_algorithm(std::size_t bytes, int n, std::size_t slot_bytes) {
  const TransportModel& m = cuda_ipc::Transport::kDirectModel;
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
    switch (desc_.kind) {
      case CollectiveKind::all_reduce: return alg == Algorithm::two_shot ? two_shot() : one_shot();
      case CollectiveKind::reduce: return reduce();
      case CollectiveKind::broadcast: return broadcast();
      case CollectiveKind::all_gather: return gather_like(/*everyone=*/true);
      case CollectiveKind::gather: return gather_like(/*everyone=*/false);
      case CollectiveKind::reduce_scatter: return blocks(/*reduce=*/true, /*from_root=*/false);
      case CollectiveKind::scatter: return blocks(/*reduce=*/false, /*from_root=*/true);
      case CollectiveKind::all_to_all: return blocks(/*reduce=*/false, /*from_root=*/false);
      case CollectiveKind::barrier:
      case CollectiveKind::split: return exchange();
    }
  }

 private:
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
    const Hello mine{w_.create(), w_.slot_bytes()};
    mailbox_post(g_, desc_, sizeof(Hello), [&](std::byte* data) { std::memcpy(data, &mine, sizeof mine); });
    mailbox_wait(g_, desc_, sizeof(Hello), timeout_, on_stall_);
    for (int q = 0; q < n_; ++q) {
      if (q == r_) continue;
      Hello theirs;
      std::memcpy(&theirs, mailbox_data(g_, q), sizeof theirs);
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

  /// Drains the stream (this step's writes are in the window, the last step's reads done) and
  /// exchanges step `w_.step` with every peer.
  void exchange() {
    x_.wait_stream();
    mailbox_post(g_, desc_, steps_, [](std::byte*) {});
    mailbox_wait(g_, desc_, steps_, timeout_, on_stall_);
    ++steps_;
    ++w_.step;
  }
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

  void one_shot() {
    chunks(a_.count, chunk_elems(1), [&](std::size_t off, std::size_t c) {
      a_.x().copy(next(), a_.in + bytes(off), bytes(c));
      exchange();
      reduce_all(a_.out + bytes(off), [&](int q) { return last(q); }, c);
    });
  }
  void two_shot() {
    chunks(a_.count, chunk_elems(1), [&](std::size_t off, std::size_t c) {
      a_.x().copy(next(), a_.in + bytes(off), bytes(c));
      exchange();
      const auto mine = block(c, r_);
      const std::size_t lo = mine.first, hi = mine.second;  // (named, not bound: lambdas capture them)
      reduce_all(next() + bytes(lo), [&](int q) { return last(q) + bytes(lo); }, hi - lo);
      exchange();
      for (int q = 0; q < n_; ++q) {
        const auto theirs = block(c, q);
        a_.x().copy(a_.out + bytes(off + theirs.first), last(q) + bytes(theirs.first), bytes(theirs.second - theirs.first));
      }
    });
  }
  void reduce() {
    chunks(a_.count, chunk_elems(1), [&](std::size_t off, std::size_t c) {
      a_.x().copy(next(), a_.in + bytes(off), bytes(c));
      exchange();
      if (r_ == a_.root) reduce_all(a_.out + bytes(off), [&](int q) { return last(q); }, c);
    });
  }
  void broadcast() {
    chunks(a_.count, chunk_elems(1), [&](std::size_t off, std::size_t c) {
      if (r_ == a_.root) a_.x().copy(next(), a_.in + bytes(off), bytes(c));
      exchange();
      if (r_ != a_.root) a_.x().copy(a_.out + bytes(off), last(a_.root) + bytes(0), bytes(c));
    });
  }
  /// all_gather (everyone) and gather (the root): every rank's chunk lands in block q of out.
  void gather_like(bool everyone) {
    chunks(a_.count, chunk_elems(1), [&](std::size_t off, std::size_t c) {
      a_.x().copy(next(), a_.in + bytes(off), bytes(c));
      exchange();
      if (!everyone && r_ != a_.root) return;
      for (int q = 0; q < n_; ++q)
        a_.x().copy(a_.out + bytes(static_cast<std::size_t>(q) * a_.count + off), last(q), bytes(c));
    });
  }
  /// reduce_scatter, scatter and all_to_all: in holds n blocks of count; each chunk puts the same
  /// part of every block into the slot (block q at q * c), and rank r reads block r.
  void blocks(bool reduce, bool from_root) {
    chunks(a_.count, chunk_elems(static_cast<std::size_t>(n_)), [&](std::size_t off, std::size_t c) {
      if (!from_root || r_ == a_.root)
        for (int q = 0; q < n_; ++q)
          a_.x().copy(next() + bytes(static_cast<std::size_t>(q) * c), a_.in + bytes(static_cast<std::size_t>(q) * a_.count + off),
                      bytes(c));
      exchange();
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
  std::size_t steps_ = 0;  ///< steps of this call (each exchange says which it is)
};

}  // namespace chorus::algo
