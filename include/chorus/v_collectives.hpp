// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// The v-collectives: a count (and optionally a displacement) per rank, as MPI's MPI_Gatherv,
/// MPI_Scatterv, MPI_Allgatherv and MPI_Reduce_scatter, over a communicator's point-to-point
/// operations (host buffers, and device buffers staged through host memory: below; all_to_all_v is
/// in all_to_all_v.hpp).
///
///   // rank r contributes counts[r] elements; every rank receives them all, block r at displs[r]
///   const auto f32 = chorus::DataType::float32;
///   chorus::all_gather_v(comm, in.data(), counts[comm.rank()], out.data(), counts, {}, f32);
///   // rank r receives block r (counts[r] elements) of the element-wise reduction of every rank's in
///   chorus::reduce_scatter_v(comm, in.data(), out.data(), counts, f32, chorus::ReduceOp::sum);
///
/// counts and displs count elements, one entry per rank. An empty displs places the blocks back to
/// back in rank order; given, it must have one entry per rank and the blocks must fit where they
/// are written (out must hold displs[p] + counts[p] elements for every p). gather_v reads counts and
/// displs on the root only, scatter_v likewise; all_gather_v and reduce_scatter_v on every rank.
///
/// Algorithm: direct (every block travels once, from its owner to its reader). reduce_scatter_v
/// reduces the blocks it receives in rank order (rank 0's, then 1's, ...), so a result is the same
/// bit for bit on every rank and run, and equals a reduction in rank order; avg sums, then divides
/// once. No other algorithm is chosen by message size.
///
/// Device buffers (device memory by the communicator's device_runtime(), as the collectives tell
/// them): staged through host memory, since the blocks travel over point-to-point, which takes
/// host memory. A device input is copied to the host before any message (on the default stream,
/// synchronised: work of other streams that writes it must be complete, as for any blocking call
/// on the default stream); a device output's blocks are received on the host and copied back
/// before the call returns; reduce_scatter_v reduces on the host. Host and device buffers mix
/// freely (in on the device, out on the host, ...).
///
/// Cross-rank checks: every block's size is checked by its receiver, so counts that disagree
/// between ranks (counts[p] on one rank against the count rank p contributes) fail with `mismatch`
/// naming both sizes, never a wrong result; each operation has a tag of its own, so ranks that call
/// two different v-collectives fail with a timeout naming the peer, never read each other's blocks.
/// Bad arguments (a count vector of the wrong length, a rank's own count that differs from its
/// entry, an op a dtype does not take, a root out of range) are `invalid_argument` naming the rank.
/// Blocking: returns when this rank's part is done, each message bounded by the communicator's
/// timeout; the first error is rethrown once every message has settled. Like all_to_all_v, it is
/// not ordered with *_async collectives still in flight: wait for those first.

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <exception>
#include <span>
#include <string>
#include <vector>

#include "chorus/core/buffer.hpp"
#include "chorus/core/error.hpp"
#include "chorus/core/request.hpp"
#include "chorus/core/types.hpp"
#include "chorus/device/runtime.hpp"
#include "chorus/reduce/host.hpp"

namespace chorus {

/// The point-to-point tags of the v-collectives' messages (the top of the user tag range, beside
/// kAllToAllVTag); a program that sends with one of these itself must pass another.
inline constexpr int kAllGatherVTag = 0x7ffffff1;
inline constexpr int kGatherVTag = 0x7ffffff2;
inline constexpr int kScatterVTag = 0x7ffffff3;
inline constexpr int kReduceScatterVTag = 0x7ffffff4;

namespace v_detail {

/// The element offset of each rank's block: displs where given, else back to back.
inline std::vector<std::size_t> offsets(const ErrorContext& ctx, int n, std::span<const std::size_t> counts,
                                        std::span<const std::size_t> displs) {
  const auto un = static_cast<std::size_t>(n);
  if (counts.size() != un)
    throw Error(ErrorCode::invalid_argument, ctx,
                std::to_string(counts.size()) + " counts for a communicator of " + std::to_string(n) + " ranks");
  if (!displs.empty() && displs.size() != un)
    throw Error(ErrorCode::invalid_argument, ctx,
                std::to_string(displs.size()) + " displacements for a communicator of " + std::to_string(n) + " ranks");
  std::vector<std::size_t> at(un);
  for (std::size_t p = 0; p < un; ++p) at[p] = displs.empty() ? (p == 0 ? 0 : at[p - 1] + counts[p - 1]) : displs[p];
  return at;
}

inline std::size_t element_size(const ErrorContext& ctx, DataType dt) {
  const std::size_t es = size_of(dt);
  if (es == 0) throw Error(ErrorCode::invalid_argument, ctx, "not a valid DataType");
  return es;
}

inline void check_root(const ErrorContext& ctx, int root, int n) {
  if (root < 0 || root >= n)
    throw Error(ErrorCode::invalid_argument, ctx,
                "root " + std::to_string(root) + " is not a rank of a communicator of " + std::to_string(n));
}

/// A rank's own entry in counts must equal what it passes as its count (`verb`: "contributes" or
/// "receives").
inline void check_own_count(const ErrorContext& ctx, const char* verb, std::size_t count, std::size_t entry) {
  if (count != entry)
    throw Error(ErrorCode::invalid_argument, ctx,
                std::string(verb) + " " + std::to_string(count) + " elements but its entry in counts is " +
                    std::to_string(entry));
}

/// Waits for every request; rethrows the first error once all have settled (all_to_all_v too).
inline void wait_all(std::vector<Request>& reqs) {
  std::exception_ptr first;
  for (auto& r : reqs) {
    try {
      r.wait();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

/// A buffer as the v-collectives' host code sees it: device memory staged in host memory (copied
/// in at construction when `read`; its written ranges copied back by put_back, then finish), host
/// memory (or none) as it is.
class Staged {
 public:
  template <class Comm>
  Staged(Comm& comm, const void* user, std::size_t bytes, bool read) : user_(const_cast<void*>(user)) {
    if constexpr (requires { comm.device_runtime(); }) rt_ = comm.device_runtime();
    if (rt_ == nullptr || user == nullptr || bytes == 0 || rt_->kind_of(user) != MemoryKind::device) return;
    host_.resize(bytes);
    if (read) {
      rt_->copy(host_.data(), user, bytes, device::Stream{});
      rt_->synchronize(device::Stream{});
    }
  }
  void* get() { return host_.empty() ? user_ : host_.data(); }
  /// Copies bytes [offset, offset + bytes) back to the device buffer; nothing for a host one.
  void put_back(std::size_t offset, std::size_t bytes) {
    if (!host_.empty() && bytes != 0)
      rt_->copy(static_cast<std::byte*>(user_) + offset, host_.data() + offset, bytes, device::Stream{});
  }
  /// Waits for the copies back.
  void finish() {
    if (!host_.empty()) rt_->synchronize(device::Stream{});
  }

 private:
  device::Runtime* rt_ = nullptr;
  void* user_;
  std::vector<std::byte> host_;
};

/// Elements a layout's blocks reach: max over p of place[p] + counts[p].
inline std::size_t extent(std::span<const std::size_t> place, std::span<const std::size_t> counts) {
  std::size_t e = 0;
  for (std::size_t p = 0; p < counts.size(); ++p) e = std::max(e, counts[p] ? place[p] + counts[p] : 0);
  return e;
}

inline std::byte* at(void* base, std::size_t elements, std::size_t es, std::size_t count) {
  return count ? static_cast<std::byte*>(base) + elements * es : nullptr;
}

inline const std::byte* at(const void* base, std::size_t elements, std::size_t es, std::size_t count) {
  return count ? static_cast<const std::byte*>(base) + elements * es : nullptr;
}

}  // namespace v_detail

/// Every rank's `count` elements of `in` arrive at every rank, rank p's as counts[p] elements of
/// `out` at displs[p] (back to back when displs is empty). count must equal counts[rank()].
template <class Comm>
void all_gather_v(Comm& comm, const void* in, std::size_t count, void* out, std::span<const std::size_t> counts,
                  std::span<const std::size_t> displs, DataType dt, int tag = kAllGatherVTag) {
  const int n = comm.size(), me = comm.rank();
  const ErrorContext ctx{me, -1, "all_gather_v " + std::string(to_string(dt))};
  const std::size_t es = v_detail::element_size(ctx, dt);
  const auto place = v_detail::offsets(ctx, n, counts, displs);
  v_detail::check_own_count(ctx, "contributes", count, counts[me]);
  v_detail::Staged sin(comm, in, count * es, true),
      sout(comm, out, v_detail::extent(place, counts) * es, false);
  in = sin.get();
  out = sout.get();
  // Receives first, then sends, in the order of distance on the ring, then this rank's own block.
  std::vector<Request> reqs;
  reqs.reserve(2 * static_cast<std::size_t>(n));
  for (int k = 1; k < n; ++k) {
    const int from = (me - k + n) % n;
    reqs.push_back(comm.irecv_bytes(MutableBytes{v_detail::at(out, place[from], es, counts[from]), counts[from] * es},
                                    from, tag));
  }
  for (int k = 1; k < n; ++k)
    reqs.push_back(comm.isend_bytes(ConstBytes{v_detail::at(in, 0, es, count), count * es}, (me + k) % n, tag));
  if (count != 0) std::memmove(v_detail::at(out, place[me], es, count), in, count * es);
  v_detail::wait_all(reqs);
  for (int p = 0; p < n; ++p) sout.put_back(place[p] * es, counts[p] * es);
  sout.finish();
}

/// Every rank's `count` elements of `in` arrive at `root`, rank p's as counts[p] elements of `out`
/// at displs[p]. counts, displs and out are read on the root only (counts[root] must equal its
/// count); the other ranks may pass empty spans and a null out.
template <class Comm>
void gather_v(Comm& comm, const void* in, std::size_t count, void* out, std::span<const std::size_t> counts,
              std::span<const std::size_t> displs, DataType dt, int root, int tag = kGatherVTag) {
  const int n = comm.size(), me = comm.rank();
  const ErrorContext ctx{me, root, "gather_v " + std::string(to_string(dt)) + " to root " + std::to_string(root)};
  const std::size_t es = v_detail::element_size(ctx, dt);
  v_detail::check_root(ctx, root, n);
  v_detail::Staged sin(comm, in, count * es, true);
  in = sin.get();
  if (me != root) {
    comm.isend_bytes(ConstBytes{v_detail::at(in, 0, es, count), count * es}, root, tag).wait();
    return;
  }
  const auto place = v_detail::offsets(ctx, n, counts, displs);
  v_detail::check_own_count(ctx, "contributes", count, counts[me]);
  v_detail::Staged sout(comm, out, v_detail::extent(place, counts) * es, false);
  out = sout.get();
  std::vector<Request> reqs;
  reqs.reserve(static_cast<std::size_t>(n));
  for (int p = 0; p < n; ++p)
    if (p != me)
      reqs.push_back(comm.irecv_bytes(MutableBytes{v_detail::at(out, place[p], es, counts[p]), counts[p] * es}, p, tag));
  if (count != 0) std::memmove(v_detail::at(out, place[me], es, count), in, count * es);
  v_detail::wait_all(reqs);
  for (int p = 0; p < n; ++p) sout.put_back(place[p] * es, counts[p] * es);
  sout.finish();
}

/// The root's counts[p] elements of `in` at displs[p] arrive at rank p as `count` elements of
/// `out`. counts, displs and in are read on the root only (counts[root] must equal its count).
template <class Comm>
void scatter_v(Comm& comm, const void* in, std::span<const std::size_t> counts, std::span<const std::size_t> displs,
               void* out, std::size_t count, DataType dt, int root, int tag = kScatterVTag) {
  const int n = comm.size(), me = comm.rank();
  const ErrorContext ctx{me, root, "scatter_v " + std::string(to_string(dt)) + " from root " + std::to_string(root)};
  const std::size_t es = v_detail::element_size(ctx, dt);
  v_detail::check_root(ctx, root, n);
  v_detail::Staged sout(comm, out, count * es, false);
  out = sout.get();
  if (me != root) {
    comm.irecv_bytes(MutableBytes{v_detail::at(out, 0, es, count), count * es}, root, tag).wait();
    sout.put_back(0, count * es);
    sout.finish();
    return;
  }
  const auto place = v_detail::offsets(ctx, n, counts, displs);
  v_detail::check_own_count(ctx, "receives", count, counts[me]);
  v_detail::Staged sin(comm, in, v_detail::extent(place, counts) * es, true);
  in = sin.get();
  std::vector<Request> reqs;
  reqs.reserve(static_cast<std::size_t>(n));
  for (int k = 1; k < n; ++k) {
    const int p = (me + k) % n;
    reqs.push_back(comm.isend_bytes(ConstBytes{v_detail::at(in, place[p], es, counts[p]), counts[p] * es}, p, tag));
  }
  if (count != 0) std::memmove(out, v_detail::at(in, place[me], es, count), count * es);
  v_detail::wait_all(reqs);
  sout.put_back(0, count * es);
  sout.finish();
}

/// `in` holds one block per rank, back to back (counts[p] elements for rank p); rank r's `out`
/// receives counts[r] elements: block r of every rank's in, reduced element-wise with `op` in rank
/// order. counts must be the same on every rank (a disagreement is `mismatch`); out must not
/// overlap in (there is no in-place form).
template <class Comm>
void reduce_scatter_v(Comm& comm, const void* in, void* out, std::span<const std::size_t> counts, DataType dt,
                      ReduceOp op, int tag = kReduceScatterVTag) {
  const int n = comm.size(), me = comm.rank();
  const ErrorContext ctx{me, -1, "reduce_scatter_v " + std::string(to_string(dt)) + " " + std::string(to_string(op))};
  const std::size_t es = v_detail::element_size(ctx, dt);
  if (!is_valid_op(dt, op))
    throw Error(ErrorCode::invalid_argument, ctx, "the op does not apply to this dtype");
  const auto place = v_detail::offsets(ctx, n, counts, {});
  const std::size_t mine = counts[me];
  v_detail::Staged sin(comm, in, v_detail::extent(place, counts) * es, true),
      sout(comm, out, mine * es, false);
  in = sin.get();
  out = sout.get();
  // The other ranks' blocks for this rank, one buffer each, reduced in rank order once all are in.
  std::vector<std::vector<std::byte>> from(static_cast<std::size_t>(n));
  std::vector<Request> reqs;
  reqs.reserve(2 * static_cast<std::size_t>(n));
  for (int k = 1; k < n; ++k) {
    const int p = (me - k + n) % n;
    from[p].resize(mine * es);
    reqs.push_back(comm.irecv_bytes(MutableBytes{mine ? from[p].data() : nullptr, mine * es}, p, tag));
  }
  for (int k = 1; k < n; ++k) {
    const int p = (me + k) % n;
    reqs.push_back(comm.isend_bytes(ConstBytes{v_detail::at(in, place[p], es, counts[p]), counts[p] * es}, p, tag));
  }
  v_detail::wait_all(reqs);
  if (mine == 0) return;
  const ReduceOp step = op == ReduceOp::avg ? ReduceOp::sum : op;
  auto* acc = static_cast<std::byte*>(out);
  const std::byte* own = v_detail::at(in, place[me], es, mine);
  // acc = block of rank 0, then acc = acc op block of rank p for p = 1 .. n-1.
  std::memmove(acc, me == 0 ? own : from[0].data(), mine * es);
  for (int p = 1; p < n; ++p) reduce(step, dt, acc, acc, p == me ? own : from[p].data(), mine);
  if (op == ReduceOp::avg) finalize_avg(dt, acc, mine, n);
  sout.put_back(0, mine * es);
  sout.finish();
}

}  // namespace chorus
