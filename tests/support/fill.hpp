// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// Rank-unique inputs whose collective results are known exactly, and the one checker every
/// collective test uses (after nccl-tests' verifiable/).
///
///   using namespace chorus::test;
///   std::vector<float> v(n);
///   for (std::size_t i = 0; i < n; ++i) v[i] = input<float>(seed, world, rank, i, ReduceOp::sum);
///   comm.all_reduce(v, ReduceOp::sum);
///   check_equal<float>(v, [&](std::size_t i) { return expected_all_reduce<float>(seed, world, i,
///   ReduceOp::sum); },
///                      "all_reduce float32 sum", rank);
///
/// Reductions: input<T>(seed, world, rank, index, op) is chosen per op so that the exact result is
/// representable and reached in any order of evaluation, so one reference fits every algorithm:
///   integers   sum, prod, avg: the reference wraps modulo 2^bits like the library (full-range
///              random values, and small ones so that not everything wraps); avg is the documented
///              truncating division of the wrapped sum. min, max: full-range random values.
///   floats     sum, avg: m * 2^e with |m| <= (2^p - 1) / world (p: significand bits) and e the
///              same on every rank for one index, so every partial sum is exact; some elements
///              are -0 (and at some indices -0 on every rank, whose sum is -0). avg is the
///              correctly rounded sum / world (not a multiple of world: a division by the
///              reciprocal, or a second rounding that matters, is caught).
///              prod: +-2^k (k in -1..1) and one rank's factor 3, some +-0; |result| <= 3 * 2^world.
///              min, max: random bit patterns (subnormals, infinities), +-0 ties, and at some
///              indices one rank's NaN (random sign and payload), which wins (IEEE 754-2019
///              minimum/maximum) and comes out as the canonical NaN (positive, quiet, zero
///              payload: reduce/ops.hpp), except in a world of one, where nothing is combined
///              and the input comes out unchanged.
/// Data movement (broadcast, scatter, gather, all_gather, all_to_all): pattern<T>(seed, rank,
/// index), any bit pattern (NaNs included), different per rank and index.
///
/// The reference is computed here, independently of chorus's reduction functors: integer
/// arithmetic in uint64, float sums and products in double (exact by construction), avg by one
/// correctly rounded division (IEEE double, then a conversion to T that is innocuous as double
/// rounding: 53 >= 2p for division; Figueroa 1995).
///
/// check_equal compares bit for bit (so -0 vs +0 and NaN payloads count) and throws
/// chorus::test::Failure naming the rank, the number of mismatches and the first few indices with
/// both values.

#include <bit>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iomanip>
#include <limits>
#include <source_location>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>

#include "chorus/core/types.hpp"
#include "support/spawn.hpp"

namespace chorus::test {

// ---------------------------------------------------------------------------------------------
// Hashing

/// splitmix64's finaliser: a bijection with good avalanche.
constexpr std::uint64_t mix64(std::uint64_t x) noexcept {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// A 64-bit hash of (seed, a, b, c): one finaliser over the four, each but the seed spread by an
/// odd multiplier first. The reference code hashes every rank's input of every element: with a
/// chain of three finalisers, one float sum's expected value at 8 ranks took 57 ns, with one 39.
constexpr std::uint64_t hash(std::uint64_t seed, std::uint64_t a, std::uint64_t b = 0,
                             std::uint64_t c = 0) noexcept {
  return mix64(seed ^ (a * 0x5851F42D4C957F2Dull) ^ (b * 0x9E6C63D0676A9A99ull) ^
               (c * 0xD6E8FEB86659FD93ull));
}

/// A seed from several small integers (collective, dtype, op, count, variant...).
template <class... I>
constexpr std::uint64_t seed_of(I... parts) noexcept {
  std::uint64_t s = 0x243F6A8885A308D3ull;
  ((s = mix64(s ^ static_cast<std::uint64_t>(parts))), ...);
  return s;
}

// ---------------------------------------------------------------------------------------------
// Element traits

template <class T>
inline constexpr bool kIsFloat8 = std::is_same_v<T, float8_e4m3> || std::is_same_v<T, float8_e5m2>;

template <class T>
inline constexpr bool kIsFloat = std::is_same_v<T, float16> || std::is_same_v<T, bfloat16> ||
                                 std::is_same_v<T, float> || std::is_same_v<T, double> || kIsFloat8<T>;

/// Significand bits (with the implicit one) of a floating-point element type.
template <class T>
inline constexpr int kSignificandBits = std::is_same_v<T, float16>       ? 11
                                        : std::is_same_v<T, bfloat16>    ? 8
                                        : std::is_same_v<T, float>       ? 24
                                        : std::is_same_v<T, float8_e4m3> ? 4
                                        : std::is_same_v<T, float8_e5m2> ? 3
                                                                         : 53;

/// The element's encoding, zero-extended.
template <Element T>
constexpr std::uint64_t bits_of(T v) noexcept {
  if constexpr (sizeof(T) == 1)
    return std::bit_cast<std::uint8_t>(v);
  else if constexpr (sizeof(T) == 2)
    return std::bit_cast<std::uint16_t>(v);
  else if constexpr (sizeof(T) == 4)
    return std::bit_cast<std::uint32_t>(v);
  else
    return std::bit_cast<std::uint64_t>(v);
}

/// The element with this encoding (the low sizeof(T) bytes of b).
template <Element T>
constexpr T from_bits(std::uint64_t b) noexcept {
  if constexpr (sizeof(T) == 1)
    return std::bit_cast<T>(static_cast<std::uint8_t>(b));
  else if constexpr (sizeof(T) == 2)
    return std::bit_cast<T>(static_cast<std::uint16_t>(b));
  else if constexpr (sizeof(T) == 4)
    return std::bit_cast<T>(static_cast<std::uint32_t>(b));
  else
    return std::bit_cast<T>(b);
}

/// Exact widening of a float element.
template <class T>
constexpr double to_double(T v) noexcept {
  if constexpr (std::is_same_v<T, float16> || std::is_same_v<T, bfloat16> || kIsFloat8<T>)
    return static_cast<double>(static_cast<float>(v));
  else
    return static_cast<double>(v);
}

/// d rounded to T once, to nearest even (exact where d is representable).
template <class T>
constexpr T from_double(double d) noexcept {
  if constexpr (std::is_same_v<T, double>)
    return d;
  else if constexpr (std::is_same_v<T, float>)
    return static_cast<float>(d);
  else
    return T(d);  // float16, bfloat16, fp8: one rounding (round-to-odd via float, then nearest even)
}

/// 2^e as a double (|e| < 1000), exactly, without libm.
constexpr double pow2(int e) noexcept {
  return std::bit_cast<double>(static_cast<std::uint64_t>(1023 + e) << 52);
}

/// "value (0xbits)" for messages.
template <Element T>
std::string show(T v) {
  std::ostringstream os;
  if constexpr (kIsFloat<T>) {
    os << std::setprecision(17) << to_double(v);
  } else if constexpr (sizeof(T) == 1) {
    os << static_cast<int>(v);
  } else {
    os << v;
  }
  os << " (0x" << std::hex << std::setw(static_cast<int>(2 * sizeof(T))) << std::setfill('0') << bits_of(v)
     << ")";
  return os.str();
}

template <Element T>
constexpr bool same_bits(T a, T b) noexcept {
  return bits_of(a) == bits_of(b);
}

// ---------------------------------------------------------------------------------------------
// Inputs

namespace detail {
/// pattern()'s value (below).
template <Element T>
constexpr T pattern_value(std::uint64_t seed, int rank, std::size_t index) noexcept {
  return from_bits<T>(hash(seed, static_cast<std::uint64_t>(rank) + 1, index, 0xDA7A));
}

template <class T>
constexpr bool is_nan_bits(std::uint64_t b) noexcept {
  if constexpr (std::is_same_v<T, float16>)
    return (b & 0x7c00u) == 0x7c00u && (b & 0x03ffu) != 0;
  else if constexpr (std::is_same_v<T, bfloat16>)
    return (b & 0x7f80u) == 0x7f80u && (b & 0x007fu) != 0;
  else if constexpr (std::is_same_v<T, float8_e4m3>)
    return (b & 0x7fu) == 0x7fu;  // one NaN per sign
  else if constexpr (std::is_same_v<T, float8_e5m2>)
    return (b & 0x7cu) == 0x7cu && (b & 0x03u) != 0;
  else if constexpr (std::is_same_v<T, float>)
    return (b & 0x7f800000u) == 0x7f800000u && (b & 0x007fffffu) != 0;
  else
    return (b & 0x7ff0000000000000ull) == 0x7ff0000000000000ull && (b & 0x000fffffffffffffull) != 0;
}

/// A quiet NaN of T with the sign and payload taken from h.
template <class T>
constexpr T quiet_nan(std::uint64_t h) noexcept {
  if constexpr (std::is_same_v<T, float16>)
    return from_bits<T>((h & 0x81ffu) | 0x7e00u);
  else if constexpr (std::is_same_v<T, bfloat16>)
    return from_bits<T>((h & 0x803fu) | 0x7fc0u);
  else if constexpr (std::is_same_v<T, float8_e4m3>)
    return from_bits<T>((h & 0x80u) | 0x7fu);
  else if constexpr (std::is_same_v<T, float8_e5m2>)
    return from_bits<T>((h & 0x81u) | 0x7eu);
  else if constexpr (std::is_same_v<T, float>)
    return from_bits<T>((h & 0x803fffffu) | 0x7fc00000u);
  else
    return from_bits<T>((h & 0x8007ffffffffffffull) | 0x7ff8000000000000ull);
}

/// Infinity; for float8_e4m3, which has none, its largest finite magnitude (448).
template <class T>
constexpr T infinity(bool negative) noexcept {
  if constexpr (std::is_same_v<T, float8_e4m3>)
    return from_bits<T>(negative ? 0xfeu : 0x7eu);
  else if constexpr (std::is_same_v<T, float8_e5m2>)
    return from_bits<T>(negative ? 0xfcu : 0x7cu);
  else if constexpr (std::is_same_v<T, float16>)
    return from_bits<T>(negative ? 0xfc00u : 0x7c00u);
  else if constexpr (std::is_same_v<T, bfloat16>)
    return from_bits<T>(negative ? 0xff80u : 0x7f80u);
  else if constexpr (std::is_same_v<T, float>)
    return negative ? -std::numeric_limits<float>::infinity() : std::numeric_limits<float>::infinity();
  else
    return negative ? -std::numeric_limits<double>::infinity() : std::numeric_limits<double>::infinity();
}

/// The canonical NaN that every floating-point reduction result that is NaN becomes.
template <class T>
constexpr T canonical_nan() noexcept {
  if constexpr (std::is_same_v<T, float16>)
    return from_bits<T>(0x7e00u);
  else if constexpr (std::is_same_v<T, bfloat16>)
    return from_bits<T>(0x7fc0u);
  else if constexpr (std::is_same_v<T, float8_e4m3>)
    return from_bits<T>(0x7fu);
  else if constexpr (std::is_same_v<T, float8_e5m2>)
    return from_bits<T>(0x7eu);
  else if constexpr (std::is_same_v<T, float>)
    return from_bits<T>(0x7fc00000u);
  else
    return from_bits<T>(0x7ff8000000000000ull);
}

/// Random encoding of T that is not a NaN (subnormals and infinities included).
template <class T>
constexpr T random_non_nan(std::uint64_t h) noexcept {
  std::uint64_t b = h;
  if (is_nan_bits<T>(b & ((sizeof(T) == 8) ? ~0ull : ((1ull << (8 * sizeof(T))) - 1)))) {
    // Clear the top exponent bit: a finite value of the same sign.
    constexpr std::uint64_t top_exp = kIsFloat8<T>                  ? 0x40u
                                      : std::is_same_v<T, float16>  ? 0x4000u
                                      : std::is_same_v<T, bfloat16> ? 0x4000u
                                      : std::is_same_v<T, float>    ? 0x40000000u
                                                                    : 0x4000000000000000ull;
    b &= ~top_exp;
  }
  return from_bits<T>(b);
}

/// Exponent range for sum/avg inputs: 2^e keeps every partial sum and avg normal and finite.
template <class T>
constexpr int sum_exponent_span() noexcept {
  return (std::is_same_v<T, float16> || kIsFloat8<T>) ? 3 : 24;
}

/// floor(x * n / 2^64): a place in [0, n) from x's high bits (multiply-shift range reduction):
/// one multiplication where `x % n` by a divisor known only at run time (it depends on the world
/// size) is a 64-bit division.
__extension__ typedef unsigned __int128 uint128;  // GCC and Clang (__extension__: no -Wpedantic note)
constexpr std::uint64_t below(std::uint64_t x, std::uint64_t n) noexcept {
  return static_cast<std::uint64_t>((static_cast<uint128>(x) * n) >> 64);
}

/// Largest |m| for sum/avg inputs in a world of `world` ranks: world * m stays below 2^p.
template <class T>
constexpr std::int64_t sum_magnitude(int world) noexcept {
  const std::int64_t limit = (std::int64_t{1} << kSignificandBits<T>)-1;
  const std::int64_t m = limit / (world < 1 ? 1 : world);
  return m < 1 ? 1 : m;
}

/// Integers: the same operation in uint64, wrapping; the result cast back is T's wrapped result.
template <class T>
constexpr std::uint64_t widen_int(T v) noexcept {
  if constexpr (std::is_signed_v<T>)
    return static_cast<std::uint64_t>(static_cast<std::int64_t>(v));
  else
    return static_cast<std::uint64_t>(v);
}

/// IEEE 754-2019 minimum/maximum on values (NaN first wins; -0 < +0), returning an operand.
template <class T>
constexpr bool float_less(T a, T b) noexcept {
  const double x = to_double(a), y = to_double(b);
  if (x != y) return x < y;
  return std::signbit(x) && !std::signbit(y);
}

/// input_from()'s value for a floating-point sum, avg, premul_sum or prod, as the double it is
/// made from: representable in T by construction, so from_double<T> of it is exact, and
/// expected_value() sums or multiplies these doubles without the round trip through T.
template <class T>
constexpr double arithmetic_input(std::uint64_t h, std::uint64_t hi, int world, int rank, std::size_t index,
                                  ReduceOp op) noexcept {
  if (op != ReduceOp::prod) {  // sum, avg, premul_sum: scaled by a power of two, a sum's inputs stay exact
    if (hi % 31 == 7) return -0.0;  // -0 on every rank: the sum is -0
    const int span = sum_exponent_span<T>();
    const int e = static_cast<int>((hi >> 8) % static_cast<std::uint64_t>(2 * span + 1)) - span;
    const std::int64_t mmax = sum_magnitude<T>(world);
    const std::int64_t m =
        static_cast<std::int64_t>(below(h, static_cast<std::uint64_t>(2 * mmax + 1))) - mmax;
    if (m == 0 && (h & 1u)) return -0.0;
    return static_cast<double>(m) * pow2(e);
  }
  if (((h >> 12) & 63u) == 0) return (h & 1u) ? -0.0 : 0.0;
  // |product| <= 3 * 2^world: within float8_e4m3's 448 up to 7 ranks, the others' up to 12.
  const int k = (world <= (std::is_same_v<T, float8_e4m3> ? 7 : 12)) ? static_cast<int>((h >> 1) % 3) - 1 : 0;
  double v = pow2(k) * ((h & 1u) ? -1.0 : 1.0);
  if (static_cast<std::size_t>(rank) == index % static_cast<std::size_t>(world)) v *= 3.0;
  return v;
}

/// input() given its two hashes: h (this rank's) and hi (the index's, the same on every rank).
template <Element T>
constexpr T input_from(std::uint64_t h, std::uint64_t hi, int world, int rank, std::size_t index,
                       ReduceOp op) noexcept {
  if constexpr (!kIsFloat<T>) {
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::avg:
      case ReduceOp::premul_sum:  // not of integers (is_valid_op); as sum
        // Mostly full range (wraps), one index in four small (no wrap: a sign error shows).
        if ((hi & 3u) == 0) return static_cast<T>(static_cast<std::int64_t>(h % 7) - 3);
        return from_bits<T>(h);
      case ReduceOp::prod: {
        switch (hi & 3u) {
          case 0:
            return from_bits<T>(h);  // full range
          case 1:
            return from_bits<T>(h | 1u);  // odd: the product never collapses to 0
          default: {
            // Small: one of -2, -1, 1, 2, 3; zero rarely.
            if (((h >> 8) & 63u) == 0) return T(0);
            constexpr int kSmall[] = {-2, -1, 1, 2, 3};
            return static_cast<T>(kSmall[h % 5]);
          }
        }
      }
      case ReduceOp::min:
      case ReduceOp::max:
      case ReduceOp::band:
      case ReduceOp::bor:
      case ReduceOp::bxor:
        return from_bits<T>(h);
    }
    return T(0);
  } else {
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::avg:
      case ReduceOp::premul_sum:
      case ReduceOp::prod:
        return from_double<T>(arithmetic_input<T>(h, hi, world, rank, index, op));  // exact
      case ReduceOp::min:
      case ReduceOp::max: {
        if (hi % 29 == 3 && static_cast<std::uint64_t>(rank) == below(hi, static_cast<std::uint64_t>(world)))
          return quiet_nan<T>(h);                                         // one NaN: it wins, bit for bit
        if (hi % 13 == 5) return from_double<T>((h & 1u) ? -0.0 : 0.0);   // +-0 ties
        if (hi % 17 == 9 && (h & 2u)) return infinity<T>((h & 1u) != 0);  // infinities
        if (hi % 7 == 1) return from_double<T>(static_cast<double>(static_cast<int>(h % 5) - 2));  // ties
        return random_non_nan<T>(h);
      }
      case ReduceOp::band:
      case ReduceOp::bor:
      case ReduceOp::bxor:
        break;  // integer types only
    }
    return T(0);
  }
}

constexpr std::uint64_t rank_hash(std::uint64_t seed, int rank, std::size_t index, ReduceOp op) noexcept {
  return hash(seed, static_cast<std::uint64_t>(rank) + 1, index, static_cast<std::uint64_t>(op) + 1);
}
constexpr std::uint64_t index_hash(std::uint64_t seed, std::size_t index, ReduceOp op) noexcept {
  return hash(seed, 0, index, 0x1DE7 + static_cast<std::uint64_t>(op));
}

/// input()'s value (below).
template <Element T>
constexpr T input_value(std::uint64_t seed, int world, int rank, std::size_t index, ReduceOp op) noexcept {
  return detail::input_from<T>(detail::rank_hash(seed, rank, index, op), detail::index_hash(seed, index, op),
                               world, rank, index, op);
}

/// expected_all_reduce()'s value (below).
template <Element T>
constexpr T expected_value(std::uint64_t seed, int world, std::size_t index, ReduceOp op) noexcept {
  const std::uint64_t hi = detail::index_hash(seed, index, op);
  auto input = [&](std::uint64_t, int, int r, std::size_t, ReduceOp) {
    return detail::input_from<T>(detail::rank_hash(seed, r, index, op), hi, world, r, index, op);
  };
  if constexpr (!kIsFloat<T>) {
    if (op == ReduceOp::min || op == ReduceOp::max) {
      T best = input(seed, world, 0, index, op);
      for (int r = 1; r < world; ++r) {
        const T v = input(seed, world, r, index, op);
        if (op == ReduceOp::min ? v < best : v > best) best = v;
      }
      return best;
    }
    if (is_bitwise(op)) {
      T acc = input(seed, world, 0, index, op);
      for (int r = 1; r < world; ++r) {
        const T v = input(seed, world, r, index, op);
        acc = static_cast<T>(op == ReduceOp::band ? (acc & v) : op == ReduceOp::bor ? (acc | v) : (acc ^ v));
      }
      return acc;
    }
    std::uint64_t acc = op == ReduceOp::prod ? 1u : 0u;
    for (int r = 0; r < world; ++r) {
      const std::uint64_t v = detail::widen_int(input(seed, world, r, index, op));
      acc = op == ReduceOp::prod ? acc * v : acc + v;
    }
    const T wrapped = static_cast<T>(acc);  // modulo 2^bits (well defined since C++20)
    if (op != ReduceOp::avg) return wrapped;
    if constexpr (std::is_signed_v<T>)
      return static_cast<T>(static_cast<std::int64_t>(wrapped) / world);
    else
      return static_cast<T>(static_cast<std::uint64_t>(wrapped) / static_cast<std::uint64_t>(world));
  } else {
    if (op == ReduceOp::min || op == ReduceOp::max) {
      T best = input(seed, world, 0, index, op);
      bool nan = detail::is_nan_bits<T>(bits_of(best));
      for (int r = 1; r < world && !nan; ++r) {
        const T v = input(seed, world, r, index, op);
        if (detail::is_nan_bits<T>(bits_of(v))) {
          best = v;
          nan = true;
        } else if (op == ReduceOp::min ? detail::float_less(v, best) : detail::float_less(best, v)) {
          best = v;
        }
      }
      if (nan && world > 1) return detail::canonical_nan<T>();
      return best;
    }
    // sum, avg, prod: exact in double by construction, so IEEE's zero signs come out as well.
    double acc = op == ReduceOp::prod ? 1.0 : 0.0;
    for (int r = 0; r < world; ++r) {
      const double v =
          detail::arithmetic_input<T>(detail::rank_hash(seed, r, index, op), hi, world, r, index, op);
      acc = (r == 0) ? v : (op == ReduceOp::prod ? acc * v : acc + v);
    }
    if (op == ReduceOp::avg) acc = acc / static_cast<double>(world);
    return from_double<T>(acc);
  }
}

}  // namespace detail

// The three functions every collective test calls once or more per element. Where the tests'
// build defines CHORUS_TEST_REFERENCE_COMPILED (chorus_test_support does), they are declared here
// and compiled once, for the twelve element types, in support/fill.cpp: at -O2 and without the
// sanitizers' instrumentation (tests/CMakeLists.txt, chorus_test_reference). In the dtype
// matrices they were over a third of the tests' CPU time, compiled at the tests' -O1 in every
// unit that called them (and instrumented in the sanitizer builds).

/// Data for collectives that only move elements: any encoding (NaNs too), unique per rank/index.
template <Element T>
T pattern(std::uint64_t seed, int rank, std::size_t index) noexcept;

/// Input of `rank` (of `world`) at `index` for a reduction with `op` (see the top of the file).
template <Element T>
T input(std::uint64_t seed, int world, int rank, std::size_t index, ReduceOp op) noexcept;

/// The exact result at `index` of reducing input<T>(seed, world, r, index, op) over r in
/// [0, world): all_reduce's out[index], reduce's on the root; reduce_scatter's out[i] on rank r is
/// expected_all_reduce(seed, world, r * count + i, op).
template <Element T>
T expected_all_reduce(std::uint64_t seed, int world, std::size_t index, ReduceOp op) noexcept;

#if !defined(CHORUS_TEST_REFERENCE_COMPILED) || defined(CHORUS_TEST_REFERENCE_DEFINE)
template <Element T>
T pattern(std::uint64_t seed, int rank, std::size_t index) noexcept {
  return detail::pattern_value<T>(seed, rank, index);
}
template <Element T>
T input(std::uint64_t seed, int world, int rank, std::size_t index, ReduceOp op) noexcept {
  return detail::input_value<T>(seed, world, rank, index, op);
}
template <Element T>
T expected_all_reduce(std::uint64_t seed, int world, std::size_t index, ReduceOp op) noexcept {
  return detail::expected_value<T>(seed, world, index, op);
}
#endif

// ---------------------------------------------------------------------------------------------
// Checking

/// Compares got[i] with expected(i) bit for bit for every i; on any difference throws Failure:
/// "what (rank r): k of n elements differ; [i] got G, expected E; ..." (the first few).
template <Element T, std::invocable<std::size_t> F>
void check_equal(std::span<const T> got, F&& expected, std::string_view what, int rank = -1,
                 std::size_t offset = 0, std::source_location loc = std::source_location::current()) {
  constexpr int kShow = 6;
  std::size_t bad = 0;
  std::ostringstream os;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const T want = expected(offset + i);
    if (same_bits(got[i], want)) continue;
    if (bad < kShow)
      os << "\n    [" << (offset + i) << "] got " << show(got[i]) << ", expected " << show(want);
    ++bad;
  }
  if (bad == 0) return;
  std::ostringstream msg;
  msg << ::chorus::test::detail::where(loc) << ": " << what;
  if (rank >= 0) msg << " (rank " << rank << ")";
  msg << ": " << bad << " of " << got.size() << " elements differ" << os.str();
  if (bad > kShow) msg << "\n    ...";
  throw Failure(msg.str());
}

/// Same, against a precomputed reference vector.
template <Element T>
void check_equal(std::span<const T> got, std::span<const T> want, std::string_view what, int rank = -1,
                 std::source_location loc = std::source_location::current()) {
  if (got.size() != want.size()) {
    throw Failure(::chorus::test::detail::where(loc) + ": " + std::string(what) + ": got " +
                  std::to_string(got.size()) + " elements, expected " + std::to_string(want.size()));
  }
  check_equal<T>(
      got, [&](std::size_t i) { return want[i]; }, what, rank, 0, loc);
}

}  // namespace chorus::test
