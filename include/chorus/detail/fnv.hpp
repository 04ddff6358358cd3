// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// FNV-1a over bytes: a short signature that every rank computes alike from the same input (a
/// group's calls, a list of ranks in a store key). Not a digest: nothing rests on its strength.

#include <cstdint>
#include <string_view>

namespace chorus::detail {

inline constexpr std::uint64_t kFnvBasis = 0xcbf29ce484222325ull;

/// `h` carried on over `bytes` (start from kFnvBasis).
inline std::uint64_t fnv1a(std::uint64_t h, std::string_view bytes) {
  for (unsigned char c : bytes) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

}  // namespace chorus::detail
