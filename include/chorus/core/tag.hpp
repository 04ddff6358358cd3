// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// The 64-bit tag of a message on a link, its whole layout in one place:
///
/// | bits   | holds                                                                    |
/// |--------|--------------------------------------------------------------------------|
/// | 63..48 | the communicator's context id (0: the world; split() gives each group its own) |
/// | 47     | internal: chorus's own traffic (collectives, barrier, herald); 0: a user tag |
/// | 46..40 | internal tags: the class (barrier, data, descriptor, error)               |
/// | 39..32 | internal tags: the lane of a channel (several messages of one call to one peer) |
/// | 31..0  | internal tags: the call's sequence number; user tags: the user's tag (31 bits) |
///
/// So user tags never meet internal messages, and sub-communicators share their parent's links.

#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>

namespace chorus {

/// A tag on a link (layout above).
using Tag = std::uint64_t;

namespace detail {

inline constexpr Tag kInternalTagBit = Tag(1) << 47;
inline constexpr int kContextShift = 48;

/// "tag 5 (context 2)" or "internal tag 0x...": the tag part of an error message.
inline std::string describe_tag(Tag t) {
  std::ostringstream os;
  const Tag low = t & (kInternalTagBit - 1);
  if (t & kInternalTagBit)
    os << "internal tag 0x" << std::hex << low;
  else
    os << "tag " << low;
  if (const Tag ctx = t >> kContextShift; ctx != 0) os << " (context " << std::dec << ctx << ")";
  return os.str();
}

/// "send tag 5 (1024 bytes)": the operation part of an error message.
inline std::string describe_op(const char* verb, Tag tag, std::size_t bytes) {
  std::ostringstream os;
  os << verb << ' ' << describe_tag(tag) << " (" << bytes << " bytes)";
  return os.str();
}

}  // namespace detail

namespace algo {

/// Internal tag classes (bits 46..40 of a link tag, below the internal bit).
inline constexpr Tag kTagClassBarrier = Tag(1) << 40;
inline constexpr Tag kTagClassData = Tag(2) << 40;
inline constexpr Tag kTagClassDesc = Tag(3) << 40;
inline constexpr Tag kTagClassError = Tag(4) << 40;
inline constexpr Tag kSeqMask = (Tag(1) << 32) - 1;  ///< bits 31..0: the call's sequence number
inline constexpr int kLaneShift = 32;                  ///< bits 39..32: the lane (see Channel)

/// Whether `t` is the tag of an error notice (diag/herald.hpp): the receives of those are posted
/// on every link at creation and need no connection of their own (tcp's lazy links do not
/// connect for them).
inline constexpr bool is_notice_tag(Tag t) {
  return (t & detail::kInternalTagBit) != 0 && (t & (Tag(0x7f) << 40)) == kTagClassError;
}

}  // namespace algo
}  // namespace chorus
