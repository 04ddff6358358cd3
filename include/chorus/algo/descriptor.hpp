// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// The descriptor every collective carries in its first message to each peer, so that ranks that
/// called different collectives (or the same with other sizes, dtypes, roots or ops) learn it at
/// once: a `mismatch` error naming both ranks and both descriptors, instead of a hang or garbage.

#include <cstdint>
#include <sstream>
#include <string>
#include <string_view>

#include "chorus/core/types.hpp"

namespace chorus::algo {

enum class CollectiveKind : std::uint32_t {
  all_reduce = 1,
  broadcast,
  reduce,
  scatter,
  gather,
  all_gather,
  reduce_scatter,
  all_to_all,
  barrier,
  split,
};

constexpr std::string_view to_string(CollectiveKind k) noexcept {
  switch (k) {
    case CollectiveKind::all_reduce: return "all_reduce";
    case CollectiveKind::broadcast: return "broadcast";
    case CollectiveKind::reduce: return "reduce";
    case CollectiveKind::scatter: return "scatter";
    case CollectiveKind::gather: return "gather";
    case CollectiveKind::all_gather: return "all_gather";
    case CollectiveKind::reduce_scatter: return "reduce_scatter";
    case CollectiveKind::all_to_all: return "all_to_all";
    case CollectiveKind::barrier: return "barrier";
    case CollectiveKind::split: return "split";
  }
  return "unknown";
}

/// Fixed-size, trivially copyable: sent as raw bytes (both ends are little-endian, see tcp link).
struct CollectiveDesc {
  CollectiveKind kind = CollectiveKind::barrier;
  DataType dtype = DataType::uint8;
  ReduceOp op = ReduceOp::sum;
  std::int32_t root = -1;
  std::uint64_t count = 0;  ///< elements per rank, as the collective defines its count
  std::uint64_t seq = 0;    ///< collectives called so far on this communicator

  friend bool operator==(const CollectiveDesc&, const CollectiveDesc&) = default;
};
static_assert(sizeof(CollectiveDesc) == 32);

/// "all_reduce float32 sum count 13 seq 4" (root only where it matters).
inline std::string describe(const CollectiveDesc& d) {
  std::ostringstream os;
  os << to_string(d.kind);
  if (d.kind != CollectiveKind::barrier) os << ' ' << to_string(d.dtype);
  if (d.kind == CollectiveKind::all_reduce || d.kind == CollectiveKind::reduce ||
      d.kind == CollectiveKind::reduce_scatter)
    os << ' ' << to_string(d.op);
  if (d.root >= 0) os << " root " << d.root;
  if (d.kind != CollectiveKind::barrier) os << " count " << d.count;
  os << " seq " << d.seq;
  return os.str();
}

/// The text of a mismatch: "collectives differ: rank 0 called ..., rank 2 called ...".
inline std::string describe_difference(int rank, const CollectiveDesc& mine, int peer, const CollectiveDesc& theirs) {
  return "collectives differ: rank " + std::to_string(rank) + " called " + describe(mine) + ", rank " +
         std::to_string(peer) + " called " + describe(theirs);
}

}  // namespace chorus::algo
