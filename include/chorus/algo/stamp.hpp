// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// The collective descriptor as it travels: a stamp (magic + CollectiveDesc) in front of a
/// first message, or on its own as a separate descriptor message (see call_check.hpp).

#include <cstdint>
#include <cstring>
#include <optional>

#include "chorus/algo/descriptor.hpp"
#include "chorus/exec/bytes.hpp"

namespace chorus::mismatch {

using algo::CollectiveDesc;

/// How descriptors travel (the protocol: call_check.hpp).
struct DescriptorPolicy {
  /// First messages up to this size carry the stamp in front of their data (staged: two copies
  /// of at most this many bytes); larger ones are preceded by a separate descriptor. Below every
  /// transport's eager limit, so a stamped message is always written whole on a size mismatch.
  static constexpr std::size_t kInlineBytes = 4096;
  static constexpr std::uint64_t kMagic = 0x43484f5255534453;  ///< "CHORUSDS"
  static constexpr int kMaxLanes = 64;
};

/// What a stamped message starts with, and what a separate descriptor message is.
struct Stamp {
  std::uint64_t magic = DescriptorPolicy::kMagic;
  CollectiveDesc desc;
};
static_assert(sizeof(Stamp) == 40);

/// The stamp at the front of `n` bytes from a peer, if they hold one. Any 32 bytes after the
/// magic are a descriptor: its enumerations have fixed underlying types, and describe() names
/// values outside them "unknown".
inline std::optional<CollectiveDesc> read_stamp(const std::byte* head, std::size_t n) {
  if (n < sizeof(Stamp)) return std::nullopt;
  const auto s = exec::load<Stamp>(head);
  if (s.magic != DescriptorPolicy::kMagic) return std::nullopt;
  return s.desc;
}

/// A descriptor written to (read from) raw memory: a one-shot mailbox slot's header.
inline void put_desc(void* dst, const CollectiveDesc& d) { exec::store(dst, d); }
inline CollectiveDesc get_desc(const void* src) { return exec::load<CollectiveDesc>(src); }

}  // namespace chorus::mismatch
