// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// The host byte copies of the layers above the executors, in one place: packing a message's
/// header in front of its payload (a stamped first message), a handshake struct into and out of
/// a mailbox. The algorithms name what goes where; the bytes move here (or in an executor), so
/// algo/ holds no memcpy of its own.

#include <cstddef>
#include <cstring>
#include <type_traits>

namespace chorus::exec {

/// Copies n host bytes from src to dst (ranges may overlap; n may be 0).
inline void copy_host(void* dst, const void* src, std::size_t n) noexcept {
  if (n != 0 && dst != src) std::memmove(dst, src, n);
}

/// Writes a trivially copyable value to raw host memory (no alignment needed).
template <class V>
  requires std::is_trivially_copyable_v<V>
inline void store(void* dst, const V& v) noexcept {
  std::memcpy(dst, &v, sizeof v);
}

/// Reads a trivially copyable value from raw host memory (no alignment needed).
template <class V>
  requires std::is_trivially_copyable_v<V> && std::is_default_constructible_v<V>
inline V load(const void* src) noexcept {
  V v;
  std::memcpy(&v, src, sizeof v);
  return v;
}

}  // namespace chorus::exec
