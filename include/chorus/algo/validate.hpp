// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// The checks of a call's arguments, made before anything is sent: every rank that gets the same
/// bad call fails alike, with invalid_argument naming the rank and the operation, and the
/// communicator stays usable.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "chorus/algo/descriptor.hpp"
#include "chorus/core/buffer.hpp"
#include "chorus/core/error.hpp"
#include "chorus/core/types.hpp"

namespace chorus::detail {

inline void check_p2p_args(int rank, int size, int peer, int tag, const char* verb) {
  if (peer < 0 || peer >= size)
    throw Error(ErrorCode::invalid_argument, ErrorContext{rank, peer, std::string(verb) + " tag " + std::to_string(tag)},
                "peer " + std::to_string(peer) + " is not a rank of this communicator (size " + std::to_string(size) + ")");
  if (tag < 0)
    throw Error(ErrorCode::invalid_argument, ErrorContext{rank, peer, std::string(verb) + " tag " + std::to_string(tag)},
                "tags must be non-negative");
}

/// Rejects, before anything is sent (so every rank that gets the same bad call fails alike and
/// the communicator stays usable), what the type-erased API cannot check by its types: a DataType
/// or ReduceOp outside its enumeration, an op that does not apply to the dtype, a count whose
/// buffer size overflows, a null buffer that must hold count > 0 elements on this rank.
inline void check_collective_args(algo::CollectiveKind kind, const void* in, const void* out, std::size_t count,
                                  DataType dt, ReduceOp op, int root, int rank, int size) {
  const auto fail = [&](const std::string& why) {
    throw Error(ErrorCode::invalid_argument, ErrorContext{rank, -1, std::string(algo::to_string(kind))}, why);
  };
  if (kind == algo::CollectiveKind::barrier) return;
  if (std::find(kAllDataTypes.begin(), kAllDataTypes.end(), dt) == kAllDataTypes.end())
    fail("data type " + std::to_string(static_cast<int>(dt)) + " is not a chorus::DataType");
  const bool reduces = kind == algo::CollectiveKind::all_reduce || kind == algo::CollectiveKind::reduce ||
                       kind == algo::CollectiveKind::reduce_scatter;
  if (reduces) {
    if (to_string(op) == "unknown") fail("reduce op " + std::to_string(static_cast<int>(op)) + " is not a chorus::ReduceOp");
    if (!is_valid_op(dt, op))
      fail(std::string(to_string(op)) + " does not apply to " + std::string(to_string(dt)) +
           " (bitwise ops take integer types)");
  }
  // The largest buffer of the call holds count elements per rank for the collectives that
  // gather, scatter or exchange: count * size must not overflow, nor exceed what a message can.
  const bool per_rank = kind == algo::CollectiveKind::all_gather || kind == algo::CollectiveKind::gather ||
                        kind == algo::CollectiveKind::scatter || kind == algo::CollectiveKind::reduce_scatter ||
                        kind == algo::CollectiveKind::all_to_all;
  const std::uint64_t per_elem = size_of(dt) * static_cast<std::uint64_t>(per_rank ? size : 1);
  if (count > kMaxMessageBytes / per_elem)
    fail("count " + std::to_string(count) + " of " + std::string(to_string(dt)) + (per_rank ? " per rank" : "") +
         " is larger than a call can move (2^46 bytes)");
  if (count == 0) return;
  const bool is_root = rank == root;
  bool need_in = true, need_out = true;
  if (kind == algo::CollectiveKind::reduce || kind == algo::CollectiveKind::gather) need_out = is_root;
  if (kind == algo::CollectiveKind::scatter) need_in = is_root;
  if (kind == algo::CollectiveKind::broadcast) need_in = need_out = true;  // one buffer, in == out
  if (need_in && in == nullptr) fail("the input buffer is null but count is " + std::to_string(count));
  if (need_out && out == nullptr) fail("the output buffer is null but count is " + std::to_string(count));
}

/// The root of a rooted collective (broadcast, reduce, scatter, gather) is a rank of the group;
/// the others take -1 (or any rank below size).
inline void check_root(const algo::CollectiveDesc& d, int rank, int size) {
  const bool rooted = d.kind == algo::CollectiveKind::broadcast || d.kind == algo::CollectiveKind::reduce ||
                      d.kind == algo::CollectiveKind::scatter || d.kind == algo::CollectiveKind::gather;
  if (d.root >= size || (d.root < 0 && rooted))
    throw Error(ErrorCode::invalid_argument, ErrorContext{rank, -1, algo::describe(d)},
                "root " + std::to_string(d.root) + " is not a rank of this communicator (size " + std::to_string(size) + ")");
}

}  // namespace chorus::detail
