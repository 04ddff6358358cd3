// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// all_to_all_v: all-to-all with a count per rank (MPI_Alltoallv), over a communicator's
/// point-to-point operations.
///
///   // rank r sends send_counts[p] elements to rank p and receives recv_counts[p] from it
///   chorus::all_to_all_v(comm, in.data(), send_counts, out.data(), recv_counts, chorus::DataType::float32);
///
/// Block p of `in` (send_counts[p] elements; the blocks lie back to back in rank order) goes to
/// rank p and arrives there as block r of its `out` (recv_counts[r] elements, back to back).
/// Counts must agree: send_counts[p] on rank r == recv_counts[r] on rank p; where they do not,
/// the receive fails with `mismatch` naming both sizes (and the link is not trusted further).
/// Device buffers are staged through host memory, as the v-collectives' (v_collectives.hpp).
/// Blocking: returns when this rank's part is done, each message bounded by the communicator's
/// timeout; the first error is rethrown once every message has settled.
///
/// The messages travel on the point-to-point tag `tag` (kAllToAllVTag unless given), so they never
/// meet the collectives' internal traffic; a program that sends with that tag itself must pass
/// another. Calls match in order (messages are FIFO per peer and tag). Like send and recv, it is
/// not ordered with *_async collectives still in flight: wait for those first.

#include <cstddef>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "chorus/core/buffer.hpp"
#include "chorus/core/error.hpp"
#include "chorus/core/request.hpp"
#include "chorus/core/types.hpp"
#include "chorus/v_collectives.hpp"  // v_detail::wait_all

namespace chorus {

/// The default tag of all_to_all_v's messages (the top of the user tag range).
inline constexpr int kAllToAllVTag = 0x7ffffff0;

template <class Comm>
void all_to_all_v(Comm& comm, const void* in, std::span<const std::size_t> send_counts, void* out,
                  std::span<const std::size_t> recv_counts, DataType dt, int tag = kAllToAllVTag) {
  const int n = comm.size();
  const int me = comm.rank();
  const ErrorContext ctx{me, -1, "all_to_all_v " + std::string(to_string(dt))};
  const std::size_t es = size_of(dt);
  if (es == 0) throw Error(ErrorCode::invalid_argument, ctx, "not a valid DataType");
  if (send_counts.size() != static_cast<std::size_t>(n) || recv_counts.size() != static_cast<std::size_t>(n))
    throw Error(ErrorCode::invalid_argument, ctx,
                std::to_string(send_counts.size()) + " send and " + std::to_string(recv_counts.size()) +
                    " receive counts for a communicator of " + std::to_string(n) + " ranks");
  if (send_counts[me] != recv_counts[me])
    throw Error(ErrorCode::invalid_argument, ctx,
                "sends " + std::to_string(send_counts[me]) + " elements to itself but expects " +
                    std::to_string(recv_counts[me]));
  // Byte offsets of the blocks.
  std::vector<std::size_t> send_at(static_cast<std::size_t>(n)), recv_at(static_cast<std::size_t>(n));
  for (int p = 1; p < n; ++p) {
    send_at[p] = send_at[p - 1] + send_counts[p - 1] * es;
    recv_at[p] = recv_at[p - 1] + recv_counts[p - 1] * es;
  }
  // Device buffers: staged through host memory, as the v-collectives' (v_collectives.hpp).
  const std::size_t send_bytes = send_at[n - 1] + send_counts[n - 1] * es;
  const std::size_t recv_bytes = recv_at[n - 1] + recv_counts[n - 1] * es;
  v_detail::Staged sin(comm, in, send_bytes, true), sout(comm, out, recv_bytes, false);
  const auto* src = static_cast<const std::byte*>(sin.get());
  auto* dst = static_cast<std::byte*>(sout.get());
  // Receives first, then sends, both in the order of distance on the ring (every rank starts with
  // its neighbours), then this rank's own block.
  std::vector<Request> reqs;
  reqs.reserve(2 * static_cast<std::size_t>(n));
  for (int k = 1; k < n; ++k) {
    const int from = (me - k + n) % n;
    reqs.push_back(comm.irecv_bytes(
        MutableBytes{recv_counts[from] ? dst + recv_at[from] : nullptr, recv_counts[from] * es}, from, tag));
  }
  for (int k = 1; k < n; ++k) {
    const int to = (me + k) % n;
    reqs.push_back(comm.isend_bytes(
        ConstBytes{send_counts[to] ? src + send_at[to] : nullptr, send_counts[to] * es}, to, tag));
  }
  if (send_counts[me] != 0) std::memmove(dst + recv_at[me], src + send_at[me], send_counts[me] * es);
  v_detail::wait_all(reqs);
  sout.put_back(0, recv_bytes);
  sout.finish();
}

}  // namespace chorus
