// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// The host loops of the fp8 types (float8_e4m3, float8_e5m2): a table lookup per element instead
/// of a conversion, for reduce/host.hpp.
///
/// ```cpp
/// chorus::detail::reduce_fp8<chorus::Sum>(out, a, b, n);   // out[i] = Sum{}(a[i], b[i])
/// ```

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "chorus/reduce/ops.hpp"

namespace chorus::detail {

/// A binary op's results for all 256 x 256 operand pairs, in a 64 KiB table made on first use
/// from the functor itself (so the same bits as Op{}(a, b): the unit tests' fp8 cases compare every
/// pair with a reference). No SSE2 or AVX2 instruction converts fp8; a lookup is about 10x faster
/// than the conversions (docs/performance.md, "fp8 reductions on the host"). The table is made by
/// a function, not a lambda: a lambda is constexpr, and g++ would try its 65536 calls at compile
/// time before giving up (a header-only program took 35% longer to compile).
template <class Op>
inline constexpr bool kFp8Table =
    std::is_same_v<Op, Sum> || std::is_same_v<Op, Prod> || std::is_same_v<Op, Min> || std::is_same_v<Op, Max>;

template <class Op, class T>
std::vector<std::uint8_t> make_fp8_table() {
  std::vector<std::uint8_t> t(65536);
  for (unsigned i = 0; i < 65536; ++i)
    t[i] = Op{}(T::from_bits(std::uint8_t(i >> 8)), T::from_bits(std::uint8_t(i))).bits;
  return t;
}
template <class Op, class T>
const std::uint8_t* fp8_table() {
  static const std::vector<std::uint8_t> table = make_fp8_table<Op, T>();  // thread-safe, once
  return table.data();
}

/// out[i] = Op{}(a[i], b[i]) in index order, any aliasing (each element is read before written).
template <class Op, class T>
void reduce_fp8(T* out, const T* a, const T* b, std::size_t n) {
  const std::uint8_t* t = fp8_table<Op, T>();
  for (std::size_t i = 0; i < n; ++i)
    out[i] = T::from_bits(t[(static_cast<unsigned>(a[i].bits) << 8) | b[i].bits]);
}

/// out[i] = f(in[i]) for a unary f of an fp8 type, through a table of its 256 results.
template <class T, class F>
void map_fp8(T* out, const T* in, std::size_t n, F&& f) {
  std::uint8_t t[256];
  for (unsigned v = 0; v < 256; ++v) t[v] = f(T::from_bits(static_cast<std::uint8_t>(v))).bits;
  for (std::size_t i = 0; i < n; ++i) out[i] = T::from_bits(t[in[i].bits]);
}

}  // namespace chorus::detail
