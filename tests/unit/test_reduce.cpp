// SPDX-License-Identifier: BSD-3-Clause
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "chorus/reduce/host.hpp"

// This file's own names: the files of tests/unit/ are compiled together (unity build).
namespace unit_test_reduce {

// The references here are written independently of reduce/ops.hpp:
//   integers: computed in int64/uint64 and wrapped explicitly (mask, then sign-extend), 64-bit
//             products from 32-bit halves;
//   float:    computed in double and rounded once to float (53 >= 2*24+2 bits, so this is the
//             correctly rounded result);
//   double:   the IEEE operation itself;
//   float16, bfloat16: computed in double (the exact sum or product of two halves, within 53 bits
//             for the sum of two bfloat16 of far-apart exponents) and rounded once with the
//             narrowing constructor (tested in test_types.cpp);
//   min, max: the IEEE 754-2019 minimum/maximum rule spelled out with std::isnan / std::signbit;
//   avg (narrow): checked as "nearest representable, ties to even" with exact products.
// Every result is compared bit for bit; a NaN result must be the canonical NaN (positive, quiet,
// zero payload). Every sweep counts mismatches and reports the first.

namespace {

using chorus::bfloat16;
using chorus::DataType;
using chorus::float16;
using chorus::ReduceOp;

constexpr std::size_t kCounts[] = {0, 1, 2, 3, 7, 13, 1000, 4099};
constexpr ReduceOp kOps[] = {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max, ReduceOp::avg};

template <class T>
constexpr bool kNarrow = std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>;

template <class T>
std::uint64_t raw(T v) {
  std::uint64_t u = 0;
  std::memcpy(&u, &v, sizeof v);
  return u;
}

template <class T>
std::string show(T v) {
  std::string s = "0x";
  const char* digits = "0123456789abcdef";
  const std::uint64_t u = raw(v);
  for (int i = static_cast<int>(sizeof(T)) * 2 - 1; i >= 0; --i) s += digits[(u >> (4 * i)) & 0xf];
  if constexpr (std::is_floating_point_v<T> || kNarrow<T>) {
    s += " (" + std::to_string(static_cast<double>(v)) + ")";
  } else {
    s += " (" + std::to_string(v) + ")";
  }
  return s;
}

// ---------------------------------------------------------------------------------------------
// Reference
// ---------------------------------------------------------------------------------------------

/// The low bits of v as T: mask to the width of T, then two's complement sign extension.
template <class T>
T wrap_to(std::uint64_t v) {
  constexpr int kBits = static_cast<int>(sizeof(T) * 8);
  if constexpr (kBits < 64) v &= (std::uint64_t{1} << kBits) - 1;
  if constexpr (std::is_signed_v<T>) {
    T r;
    if constexpr (kBits == 64) {
      std::memcpy(&r, &v, sizeof r);
    } else {
      const bool negative = ((v >> (kBits - 1)) & 1u) != 0;
      const std::int64_t s =
          negative ? static_cast<std::int64_t>(v) - (std::int64_t{1} << kBits) : static_cast<std::int64_t>(v);
      r = static_cast<T>(s);
    }
    return r;
  } else {
    return static_cast<T>(v);
  }
}

/// a * b mod 2^64 from 32-bit halves: (al + ah 2^32)(bl + bh 2^32) = al bl + (al bh + ah bl) 2^32.
std::uint64_t mul_mod64(std::uint64_t a, std::uint64_t b) {
  const std::uint64_t al = a & 0xffffffffu, ah = a >> 32, bl = b & 0xffffffffu, bh = b >> 32;
  const std::uint64_t cross = (al * bh + ah * bl) & 0xffffffffu;
  return al * bl + (cross << 32);
}

/// The one NaN a floating-point reduction may produce: positive, quiet, zero payload.
template <class T>
T canonical_nan() {
  if constexpr (std::is_same_v<T, float16>) {
    return float16::from_bits(0x7e00);
  } else if constexpr (std::is_same_v<T, bfloat16>) {
    return bfloat16::from_bits(0x7fc0);
  } else if constexpr (std::is_same_v<T, float>) {
    const std::uint32_t u = 0x7fc00000u;
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
  } else {
    const std::uint64_t u = 0x7ff8000000000000ull;
    double d;
    std::memcpy(&d, &u, sizeof d);
    return d;
  }
}

/// IEEE 754-2019 minimum (is_min) / maximum on floating-point T.
template <class T>
T ref_min_max(T a, T b, bool is_min) {
  const double x = static_cast<double>(a), y = static_cast<double>(b);
  if (std::isnan(x) || std::isnan(y)) return canonical_nan<T>();
  if (x == y) {  // equal values; for +0 / -0 the sign decides
    const bool pick_a = is_min ? std::signbit(x) : !std::signbit(x);
    return pick_a ? a : b;
  }
  return (is_min ? x < y : x > y) ? a : b;
}

template <class T>
T ref_op(ReduceOp op, T a, T b) {
  if (op == ReduceOp::avg) op = ReduceOp::sum;
  if constexpr (std::is_integral_v<T>) {
    const auto ua = static_cast<std::uint64_t>(a);  // sign-extended for negative values
    const auto ub = static_cast<std::uint64_t>(b);
    switch (op) {
      case ReduceOp::sum:
        return wrap_to<T>(ua + ub);
      case ReduceOp::prod:
        return wrap_to<T>(mul_mod64(ua, ub));
      case ReduceOp::min:
        if constexpr (std::is_signed_v<T>) {
          return static_cast<std::int64_t>(a) <= static_cast<std::int64_t>(b) ? a : b;
        } else {
          return static_cast<std::uint64_t>(a) <= static_cast<std::uint64_t>(b) ? a : b;
        }
      case ReduceOp::max:
        if constexpr (std::is_signed_v<T>) {
          return static_cast<std::int64_t>(a) >= static_cast<std::int64_t>(b) ? a : b;
        } else {
          return static_cast<std::uint64_t>(a) >= static_cast<std::uint64_t>(b) ? a : b;
        }
      default:
        break;
    }
  } else {
    switch (op) {
      case ReduceOp::min:
        return ref_min_max(a, b, true);
      case ReduceOp::max:
        return ref_min_max(a, b, false);
      case ReduceOp::sum:
      case ReduceOp::prod: {
        const double x = static_cast<double>(a), y = static_cast<double>(b);
        const double r = op == ReduceOp::sum ? x + y : x * y;
        if (std::isnan(r)) return canonical_nan<T>();
        if constexpr (std::is_same_v<T, double>) {
          return r;
        } else {
          return T(r);  // float: one rounding of the double; narrow: the narrowing constructor
        }
      }
      default:
        break;
    }
  }
  FAIL("unreachable");
  return a;
}

// ---------------------------------------------------------------------------------------------
// Inputs
// ---------------------------------------------------------------------------------------------

template <class T>
std::vector<T> special_values() {
  if constexpr (std::is_integral_v<T>) {
    using L = std::numeric_limits<T>;
    return {L::min(),
            L::max(),
            T(0),
            T(1),
            static_cast<T>(L::max() - 1),
            static_cast<T>(L::min() + 1),
            static_cast<T>(L::max() / 2 + 1),
            static_cast<T>(-1)};
  } else if constexpr (std::is_same_v<T, float16>) {
    std::vector<T> v;
    for (std::uint16_t b : {0x0000, 0x8000, 0x7c00, 0xfc00, 0x7e00, 0xfe00, 0x7d01, 0x7e3f, 0x7bff, 0xfbff,
                            0x0001, 0x8001, 0x03ff, 0x0400, 0x3c00, 0xbc00, 0x3c01, 0x6800, 0x7800, 0x1400})
      v.push_back(float16::from_bits(b));
    return v;
  } else if constexpr (std::is_same_v<T, bfloat16>) {
    std::vector<T> v;
    for (std::uint16_t b : {0x0000, 0x8000, 0x7f80, 0xff80, 0x7fc0, 0xffc0, 0x7f81, 0x7fd5, 0x7f7f, 0xff7f,
                            0x0001, 0x8001, 0x007f, 0x0080, 0x3f80, 0xbf80, 0x3f81, 0x4b00, 0x4b80, 0x1f80})
      v.push_back(bfloat16::from_bits(b));
    return v;
  } else {
    using L = std::numeric_limits<T>;
    using U = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
    const U payload_nan = sizeof(T) == 4 ? U(0x7fc12345u) : U(0x7ff8000012345678ull);
    const U signalling = sizeof(T) == 4 ? U(0x7f800001u) : U(0x7ff0000000000001ull);
    T pn, sn;
    std::memcpy(&pn, &payload_nan, sizeof pn);
    std::memcpy(&sn, &signalling, sizeof sn);
    return {T(0),     -T(0), L::infinity(), -L::infinity(), L::quiet_NaN(),  -L::quiet_NaN(),
            pn,       sn,    L::max(),      -L::max(),      L::denorm_min(), -L::denorm_min(),
            L::min(), T(1),  T(-1),         T(0.1)};
  }
}

template <class T>
double max_finite() {
  if constexpr (std::is_same_v<T, float16>) {
    return 65504.0;
  } else if constexpr (std::is_same_v<T, bfloat16>) {
    return static_cast<double>(static_cast<float>(bfloat16::from_bits(0x7f7f)));
  } else {
    return static_cast<double>(std::numeric_limits<T>::max());
  }
}

/// A mix: special values, random bit patterns (NaN, inf, subnormals included), moderate values
/// (whose sums and products round), and values near the top of the range (overflow).
template <class T>
std::vector<T> make_input(std::mt19937_64& rng, std::size_t n) {
  const std::vector<T> specials = special_values<T>();
  std::vector<T> v(n);
  std::uniform_real_distribution<double> moderate(-1000.0, 1000.0);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t r = rng();
    const std::uint64_t bits = rng();
    switch (r % 4) {
      case 0:
        v[i] = specials[(r >> 8) % specials.size()];
        break;
      case 1:
        std::memcpy(&v[i], &bits, sizeof(T));
        break;  // any bit pattern
      case 2:
        if constexpr (std::is_integral_v<T>) {
          v[i] = static_cast<T>(static_cast<std::int64_t>(bits % 201) - 100);
        } else {
          v[i] = T(moderate(rng));
        }
        break;
      default:
        if constexpr (std::is_integral_v<T>) {
          v[i] = static_cast<T>(std::numeric_limits<T>::max() - static_cast<T>(bits % 4));
        } else {
          v[i] = T(max_finite<T>() * (0.25 + 0.5 * static_cast<double>(bits % 1024) / 1024));
        }
        break;
    }
  }
  return v;
}

template <class T>
T functor(ReduceOp op, T a, T b) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
    case ReduceOp::premul_sum:  // its steps sum (the scaling comes first)
      return chorus::Sum{}(a, b);
    case ReduceOp::prod:
      return chorus::Prod{}(a, b);
    case ReduceOp::min:
      return chorus::Min{}(a, b);
    case ReduceOp::max:
      return chorus::Max{}(a, b);
    case ReduceOp::band:
      return chorus::BitAnd{}(a, b);
    case ReduceOp::bor:
      return chorus::BitOr{}(a, b);
    case ReduceOp::bxor:
      return chorus::BitXor{}(a, b);
  }
  return a;
}

/// Counts mismatches of `got` against the reference of (a, b) and against the functor of ops.hpp
/// (the host loops must be the functors), reporting the first.
template <class T>
void expect_reduced(ReduceOp op, const std::vector<T>& a, const std::vector<T>& b, const std::vector<T>& got,
                    const char* what) {
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const T want = ref_op(op, a[i], b[i]);
    if (raw(got[i]) != raw(want) || raw(got[i]) != raw(functor(op, a[i], b[i]))) {
      if (bad++ == 0) first = i;
    }
  }
  if (bad != 0) {
    FAIL_CHECK(what << ": " << bad << " of " << got.size() << " wrong; first at " << first << ": op("
                    << show(a[first]) << ", " << show(b[first]) << ") = " << show(got[first]) << ", want "
                    << show(ref_op(op, a[first], b[first])));
  }
}

template <class T>
bool bitwise_equal(const std::vector<T>& x, const std::vector<T>& y) {
  return x.size() == y.size() && (x.empty() || std::memcmp(x.data(), y.data(), x.size() * sizeof(T)) == 0);
}

/// Every op on T: out of place, in place (out == a, out == b, out == a == b), and split in two.
template <class T>
void sweep_type(std::uint64_t seed) {
  constexpr DataType kDt = chorus::data_type_of<T>;
  std::mt19937_64 rng(seed);
  for (std::size_t n : kCounts) {
    const std::vector<T> a = make_input<T>(rng, n);
    const std::vector<T> b = make_input<T>(rng, n);
    for (ReduceOp op : kOps) {
      CAPTURE(chorus::to_string(kDt));
      CAPTURE(chorus::to_string(op));
      CAPTURE(n);

      std::vector<T> out(n);
      chorus::reduce(op, kDt, out.data(), a.data(), b.data(), n);
      expect_reduced(op, a, b, out, "out of place");

      std::vector<T> inout = a;  // out == a, through the two-pointer overload
      chorus::reduce(op, kDt, inout.data(), b.data(), n);
      expect_reduced(op, a, b, inout, "in place (out == a)");
      CHECK(bitwise_equal(inout, out));

      inout = b;  // out == b: the operand order stays (a, b)
      chorus::reduce(op, kDt, inout.data(), a.data(), inout.data(), n);
      expect_reduced(op, a, b, inout, "in place (out == b)");
      CHECK(bitwise_equal(inout, out));

      inout = a;  // out == a == b
      chorus::reduce(op, kDt, inout.data(), inout.data(), inout.data(), n);
      expect_reduced(op, a, a, inout, "out == a == b");

      // Determinism: any split into two calls gives the bits of one call.
      for (std::size_t k : {std::size_t{1}, std::size_t{63}, n / 2, n > 0 ? n - 1 : 0}) {
        if (k > n) continue;
        std::vector<T> split(n);
        chorus::reduce(op, kDt, split.data(), a.data(), b.data(), k);
        chorus::reduce(op, kDt, split.data() + k, a.data() + k, b.data() + k, n - k);
        CHECK_MESSAGE(bitwise_equal(split, out), "split at " << k);
      }
    }
  }
}

}  // namespace

TEST_CASE("functors: integer wrap-around, IEEE minimum/maximum, narrow rounding") {
  using chorus::Max;
  using chorus::Min;
  using chorus::Prod;
  using chorus::Sum;
  CHECK(Sum{}(std::int8_t{127}, std::int8_t{1}) == std::int8_t{-128});
  CHECK(Prod{}(std::uint8_t{255}, std::uint8_t{255}) == std::uint8_t{1});
  CHECK(Prod{}(std::int8_t{-128}, std::int8_t{-1}) == std::int8_t{-128});
  CHECK(Sum{}(std::int32_t{2147483647}, std::int32_t{1}) == std::int32_t{-2147483647 - 1});
  CHECK(Prod{}(std::int32_t{65536}, std::int32_t{65536}) == 0);
  CHECK(Prod{}(std::int64_t{-9223372036854775807 - 1}, std::int64_t{-1}) ==
        std::int64_t{-9223372036854775807 - 1});
  CHECK(Sum{}(std::uint64_t{~0ull}, std::uint64_t{2}) == 1u);
  CHECK(Min{}(std::int32_t{-5}, std::int32_t{3}) == -5);
  CHECK(Max{}(std::uint32_t{5}, std::uint32_t{0xffffffffu}) == 0xffffffffu);

  const float nan = std::numeric_limits<float>::quiet_NaN();
  CHECK(std::signbit(Min{}(0.0f, -0.0f)));
  CHECK(std::signbit(Min{}(-0.0f, 0.0f)));
  CHECK_FALSE(std::signbit(Max{}(0.0f, -0.0f)));
  CHECK_FALSE(std::signbit(Max{}(-0.0f, 0.0f)));
  CHECK(std::signbit(Min{}(0.0, -0.0)));
  CHECK_FALSE(std::signbit(Max{}(-0.0, 0.0)));
  CHECK(std::isnan(Min{}(nan, 1.0f)));
  CHECK(std::isnan(Min{}(1.0f, nan)));
  CHECK(std::isnan(Max{}(nan, -std::numeric_limits<float>::infinity())));
  CHECK(std::isnan(Max{}(std::numeric_limits<double>::infinity(), std::nan(""))));
  CHECK(Min{}(-std::numeric_limits<float>::infinity(), -3.0f) == -std::numeric_limits<float>::infinity());

  // float16: 2048 + 1 is a tie between 2048 and 2050 -> 2048 (even); 2048 + 3 -> 2052.
  CHECK(Sum{}(float16(2048.0f), float16(1.0f)).bits == float16(2048.0f).bits);
  CHECK(Sum{}(float16(2048.0f), float16(3.0f)).bits == float16(2052.0f).bits);
  CHECK(Sum{}(float16(65504.0f), float16(8.0f)).bits == 0x7bffu);   // 65512 rounds down
  CHECK(Sum{}(float16(65504.0f), float16(16.0f)).bits == 0x7c00u);  // 65520: the tie goes to inf
  // 1.0009765625 * 1.0009765625 = 1.00195408...: rounds to 1.001953125 (0x3c02), once.
  CHECK(Prod{}(float16::from_bits(0x3c01), float16::from_bits(0x3c01)).bits == 0x3c02u);
  CHECK(Sum{}(bfloat16(256.0f), bfloat16(1.0f)).bits == bfloat16(256.0f).bits);
  CHECK(Sum{}(bfloat16(256.0f), bfloat16(3.0f)).bits == bfloat16(260.0f).bits);
  CHECK(Min{}(float16::from_bits(0x0000), float16::from_bits(0x8000)).bits == 0x8000u);
  CHECK(Max{}(bfloat16::from_bits(0x8000), bfloat16::from_bits(0x0000)).bits == 0x0000u);
  CHECK(Min{}(float16::from_bits(0x7d01), float16(1.0f)).bits == 0x7e00u);  // NaN wins, canonical
  CHECK(Max{}(bfloat16(1.0f), bfloat16::from_bits(0xffc1)).bits == 0x7fc0u);

  // Any NaN result is the canonical one, in either operand order.
  const auto bits32 = [](float f) {
    std::uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    return u;
  };
  const float neg_nan = -std::numeric_limits<float>::quiet_NaN();
  float payload_nan;
  const std::uint32_t payload_bits = 0x7f812345u;  // signalling, with a payload
  std::memcpy(&payload_nan, &payload_bits, sizeof payload_nan);
  for (float x : {neg_nan, payload_nan}) {
    CHECK(bits32(Sum{}(x, payload_nan)) == 0x7fc00000u);
    CHECK(bits32(Sum{}(payload_nan, x)) == 0x7fc00000u);
    CHECK(bits32(Prod{}(x, 2.0f)) == 0x7fc00000u);
    CHECK(bits32(Min{}(x, 2.0f)) == 0x7fc00000u);
    CHECK(bits32(Max{}(-2.0f, x)) == 0x7fc00000u);
  }
  CHECK(bits32(Sum{}(std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity())) ==
        0x7fc00000u);
  CHECK(bits32(chorus::avg_divide(neg_nan, 3)) == 0x7fc00000u);
}

TEST_CASE("accumulator type") {
  static_assert(std::is_same_v<chorus::accumulator_t<float16>, float>);
  static_assert(std::is_same_v<chorus::accumulator_t<bfloat16>, float>);
  static_assert(std::is_same_v<chorus::accumulator_t<double>, double>);
  static_assert(std::is_same_v<chorus::accumulator_t<std::int8_t>, std::int8_t>);
  CHECK(true);
}

TEST_CASE("every dtype and op against the reference") {
  SUBCASE("int8") { sweep_type<std::int8_t>(1); }
  SUBCASE("uint8") { sweep_type<std::uint8_t>(2); }
  SUBCASE("int32") { sweep_type<std::int32_t>(3); }
  SUBCASE("uint32") { sweep_type<std::uint32_t>(4); }
  SUBCASE("int64") { sweep_type<std::int64_t>(5); }
  SUBCASE("uint64") { sweep_type<std::uint64_t>(6); }
  SUBCASE("float16") { sweep_type<float16>(7); }
  SUBCASE("bfloat16") { sweep_type<bfloat16>(8); }
  SUBCASE("float32") { sweep_type<float>(9); }
  SUBCASE("float64") { sweep_type<double>(10); }
}

namespace {

/// Every encoding of a narrow type against a permutation of every encoding, through the public
/// entry (AVX2/F16C blocks where the CPU has them) and through the portable vectorised loops
/// (detail::), compared with the reference and with each other.
template <class T>
void narrow_all_encodings() {
  constexpr DataType kDt = chorus::data_type_of<T>;
  constexpr std::size_t kN = 65536;
  std::vector<T> a(kN), b(kN);
  for (std::size_t i = 0; i < kN; ++i) a[i] = T::from_bits(static_cast<std::uint16_t>(i));
  for (std::uint32_t shift : {1u, 255u, 4097u, 40000u}) {
    for (std::size_t i = 0; i < kN; ++i) {
      b[i] = T::from_bits(
          static_cast<std::uint16_t>((i * 40503u + shift) & 0xffffu));  // odd factor: a bijection
    }
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max}) {
      CAPTURE(chorus::to_string(kDt));
      CAPTURE(chorus::to_string(op));
      CAPTURE(shift);
      std::vector<T> pub(kN), portable(kN), in_place = a;
      chorus::reduce(op, kDt, pub.data(), a.data(), b.data(), kN);
      chorus::reduce(op, kDt, in_place.data(), b.data(), kN);
      chorus::detail::dispatch_op(op, [&]<class Op>(Op) {
        // Only the four ops above run; the bitwise ones, which dispatch_op instantiates too, are
        // a copy of `a` for a float, a loop g++ -O2 warns about (aggressive-loop-optimizations).
        if constexpr (!std::is_same_v<Op, chorus::BitAnd> && !std::is_same_v<Op, chorus::BitOr> &&
                      !std::is_same_v<Op, chorus::BitXor>)
          chorus::detail::reduce_disjoint<Op>(portable.data(), a.data(), b.data(), kN);
      });
      expect_reduced(op, a, b, pub, "public entry");
      expect_reduced(op, a, b, portable, "portable loop");
      CHECK(bitwise_equal(pub, portable));
      CHECK(bitwise_equal(pub, in_place));
    }
  }
}

}  // namespace

TEST_CASE("float16 and bfloat16: every encoding, every host path") {
  narrow_all_encodings<float16>();
  narrow_all_encodings<bfloat16>();
}

TEST_CASE("typed entry points") {
  std::vector<float> acc = {1.0f, 2.0f, -0.0f};
  const std::vector<float> in = {0.5f, -2.0f, 0.0f};
  chorus::reduce_into<chorus::Sum>(acc.data(), in.data(), acc.size());
  CHECK(acc == std::vector<float>{1.5f, 0.0f, 0.0f});
  std::vector<std::int32_t> x = {1, -7, 3}, y = {2, 5, -9}, z(3);
  chorus::reduce_to<chorus::Max>(z.data(), x.data(), y.data(), z.size());
  CHECK(z == std::vector<std::int32_t>{2, 5, 3});
  chorus::reduce_to<chorus::Min>(x.data(), x.data(), y.data(), x.size());  // out == a
  CHECK(x == std::vector<std::int32_t>{1, -7, -9});
  chorus::reduce_into<chorus::Prod>(y.data(), y.data(), y.size());  // in == inout
  CHECK(y == std::vector<std::int32_t>{4, 25, 81});
}

namespace {

template <class T>
void check_finalize_integer(std::mt19937_64& rng) {
  for (int world : {1, 2, 3, 7, 64, 1000003}) {
    for (std::size_t n : kCounts) {
      const std::vector<T> x = make_input<T>(rng, n);
      std::vector<T> got = x;
      chorus::finalize_avg(chorus::data_type_of<T>, got.data(), n, world);
      std::size_t bad = 0;
      for (std::size_t i = 0; i < n; ++i) {
        // Truncation toward zero, spelled out on magnitudes.
        T want;
        if constexpr (std::is_signed_v<T>) {
          const std::int64_t v = static_cast<std::int64_t>(x[i]);
          const std::uint64_t mag = v < 0 ? 0 - static_cast<std::uint64_t>(v) : static_cast<std::uint64_t>(v);
          const std::uint64_t q = mag / static_cast<std::uint64_t>(world);
          want = static_cast<T>(v < 0 ? static_cast<std::int64_t>(0 - q) : static_cast<std::int64_t>(q));  // 0 - q: no overflow at INT64_MIN
        } else {
          want = static_cast<T>(static_cast<std::uint64_t>(x[i]) / static_cast<std::uint64_t>(world));
        }
        if (got[i] != want) ++bad;
      }
      CHECK_MESSAGE(bad == 0, chorus::to_string(chorus::data_type_of<T>) << " world " << world << " n " << n);
    }
  }
}

template <class T>
void check_finalize_float(std::mt19937_64& rng) {
  for (int world : {1, 2, 3, 5, 7, 1000, 65537}) {
    for (std::size_t n : kCounts) {
      const std::vector<T> x = make_input<T>(rng, n);
      std::vector<T> got = x;
      chorus::finalize_avg(chorus::data_type_of<T>, got.data(), n, world);
      std::size_t bad = 0;
      for (std::size_t i = 0; i < n; ++i) {
        T want;
        if constexpr (std::is_same_v<T, float>) {
          want = static_cast<float>(static_cast<double>(x[i]) / world);  // 53 >= 2*24+2: one rounding
        } else {
          want = x[i] / static_cast<double>(world);
        }
        if (std::isnan(want)) want = canonical_nan<T>();
        if (raw(got[i]) != raw(want)) ++bad;
      }
      CHECK_MESSAGE(bad == 0, chorus::to_string(chorus::data_type_of<T>) << " world " << world << " n " << n);
    }
  }
}

/// float16/bfloat16: the result must be the representable value nearest to x / world (ties to an
/// even encoding), with x's sign. Checked against both neighbours with exact long double products.
template <class T>
void check_finalize_narrow() {
  constexpr std::uint16_t kInf = std::is_same_v<T, float16> ? 0x7c00 : 0x7f80;
  std::size_t bad = 0;
  std::string first;
  for (int world : {1, 2, 3, 5, 7, 255, 256, 257, 1000, 2047, 2048, 2049, 3000, 65537, 1000003, 2147483647}) {
    std::vector<T> x(65536);
    for (std::uint32_t i = 0; i < 65536; ++i) x[i] = T::from_bits(static_cast<std::uint16_t>(i));
    std::vector<T> got = x;
    chorus::finalize_avg(chorus::data_type_of<T>, got.data(), got.size(), world);
    for (std::uint32_t i = 0; i < 65536; ++i) {
      const auto xb = static_cast<std::uint16_t>(i);
      const std::uint16_t gb = got[i].bits;
      bool ok;
      if ((xb & 0x7fff) > kInf) {
        ok = gb == canonical_nan<T>().bits;
      } else if ((xb & 0x7fff) == kInf) {
        ok = gb == xb;  // inf / world = inf
      } else if ((gb & 0x8000) != (xb & 0x8000) || (gb & 0x7fff) >= kInf) {
        ok = false;
      } else {
        const long double xm = std::fabs(static_cast<long double>(static_cast<float>(x[i])));
        const std::uint16_t hm = gb & 0x7fff;
        auto err = [&](std::uint16_t m) {
          return std::fabs(xm - static_cast<long double>(static_cast<float>(T::from_bits(m))) * world);
        };
        const long double e = err(hm);
        ok = true;
        for (int d : {-1, 1}) {
          if ((hm == 0 && d < 0) || hm + d >= kInf) continue;
          const long double en = err(static_cast<std::uint16_t>(hm + d));
          if (en < e || (en == e && (hm & 1) != 0)) ok = false;
        }
      }
      if (!ok && bad++ == 0) {
        first = "world " + std::to_string(world) + ": " + show(x[i]) + " -> " + show(got[i]);
      }
    }
    // The public entry, the portable loop and the element function avg_divide (the device's)
    // agree bit for bit.
    std::vector<T> portable = x;
    if (world <= chorus::detail::kAvgFloatDivisionLimit<T>) {
      chorus::detail::finalize_avg_narrow(portable.data(), portable.size(), world);
    } else {
      for (T& v : portable) v = chorus::avg_divide(v, world);
    }
    for (std::uint32_t i = 0; i < 65536; ++i) {
      if (got[i].bits != chorus::avg_divide(x[i], world).bits && bad++ == 0) first = "avg_divide differs";
      if (got[i].bits != portable[i].bits && bad++ == 0) first = "portable loop differs";
    }
  }
  CHECK_MESSAGE(bad == 0, bad << " wrong, first: " << first);
}

}  // namespace

TEST_CASE("finalize_avg") {
  std::mt19937_64 rng(42);
  SUBCASE("integers truncate toward zero") {
    check_finalize_integer<std::int8_t>(rng);
    check_finalize_integer<std::uint8_t>(rng);
    check_finalize_integer<std::int32_t>(rng);
    check_finalize_integer<std::uint32_t>(rng);
    check_finalize_integer<std::int64_t>(rng);
    check_finalize_integer<std::uint64_t>(rng);
    std::int32_t v[] = {-7, 7, -1};
    chorus::finalize_avg(v, 3, 2);
    CHECK(v[0] == -3);
    CHECK(v[1] == 3);
    CHECK(v[2] == 0);
  }
  SUBCASE("float and double divide, correctly rounded") {
    check_finalize_float<float>(rng);
    check_finalize_float<double>(rng);
    float five = 5.0f;
    chorus::finalize_avg(&five, 1, 3);
    CHECK(five == 5.0f / 3.0f);  // not 5 * (1/3), which is one ulp above
  }
  SUBCASE("float16 and bfloat16: every encoding, nearest representable quotient") {
    check_finalize_narrow<float16>();
    check_finalize_narrow<bfloat16>();
  }
  SUBCASE("avg = sum, then finalize") {
    // Three ranks' int8 contributions that wrap: (100 + 100) wraps to -56, + 100 = 44, / 3 = 14.
    std::int8_t acc[] = {100, -128};
    const std::int8_t r1[] = {100, -1}, r2[] = {100, -1};
    chorus::reduce(ReduceOp::avg, DataType::int8, acc, r1, 2);
    chorus::reduce(ReduceOp::avg, DataType::int8, acc, r2, 2);
    chorus::finalize_avg(DataType::int8, acc, 2, 3);
    CHECK(acc[0] == 14);
    CHECK(acc[1] == 42);  // -130 wraps to 126, / 3 = 42
  }
  SUBCASE("bad world size") {
    float f = 1.0f;
    CHECK_THROWS_AS(chorus::finalize_avg(&f, 1, 0), chorus::Error);
    CHECK_THROWS_AS(chorus::finalize_avg(DataType::float32, &f, 1, -2), chorus::Error);
  }
}

TEST_CASE("invalid enumerations are invalid_argument") {
  float a = 1.0f, b = 2.0f;
  try {
    chorus::reduce(static_cast<ReduceOp>(99), DataType::float32, &a, &b, 1);
    FAIL("no throw");
  } catch (const chorus::Error& e) {
    CHECK(e.code() == chorus::ErrorCode::invalid_argument);
  }
  CHECK_THROWS_AS(chorus::reduce(ReduceOp::sum, static_cast<DataType>(99), &a, &b, 1), chorus::Error);
  chorus::reduce(ReduceOp::sum, DataType::float32, nullptr, nullptr, 0);  // count 0: nothing touched
}

namespace {

/// band, bor, bxor of one integer type through the typed and type-erased entries (out of place
/// and in place), against the operators themselves, over counts that end inside and outside a
/// vector block.
template <class T>
void bitwise_sweep(std::uint64_t seed) {
  constexpr DataType kDt = chorus::data_type_of<T>;
  std::mt19937_64 rng(seed);
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{31}, std::size_t{257},
                        std::size_t{1031}}) {
    std::vector<T> a(n), b(n);
    for (std::size_t i = 0; i < n; ++i) {
      a[i] = static_cast<T>(rng());
      b[i] = static_cast<T>(rng());
    }
    for (ReduceOp op : chorus::kBitwiseReduceOps) {
      CAPTURE(chorus::to_string(kDt));
      CAPTURE(chorus::to_string(op));
      CAPTURE(n);
      std::vector<T> out(n), in_place = a;
      chorus::reduce(op, kDt, out.data(), a.data(), b.data(), n);
      chorus::reduce(op, kDt, in_place.data(), b.data(), n);
      for (std::size_t i = 0; i < n; ++i) {
        const T want = op == ReduceOp::band  ? static_cast<T>(a[i] & b[i])
                       : op == ReduceOp::bor ? static_cast<T>(a[i] | b[i])
                                             : static_cast<T>(a[i] ^ b[i]);
        if (out[i] != want || in_place[i] != want) {
          CAPTURE(i);
          FAIL("bitwise result differs from the operator");
        }
      }
    }
  }
}

}  // namespace

TEST_CASE("bitwise ops on every integer type; floating-point types are invalid_argument") {
  bitwise_sweep<std::int8_t>(11);
  bitwise_sweep<std::uint8_t>(12);
  bitwise_sweep<std::int32_t>(13);
  bitwise_sweep<std::uint32_t>(14);
  bitwise_sweep<std::int64_t>(15);
  bitwise_sweep<std::uint64_t>(16);
  static_assert(chorus::BitAnd{}(std::uint8_t{0xf0}, std::uint8_t{0x3c}) == 0x30);
  static_assert(chorus::BitOr{}(std::int32_t{-8}, std::int32_t{3}) == -5);
  static_assert(chorus::BitXor{}(std::int64_t{-1}, std::int64_t{5}) == -6);
  for (DataType dt : {DataType::float16, DataType::bfloat16, DataType::float32, DataType::float64,
                      DataType::float8_e4m3, DataType::float8_e5m2}) {
    for (ReduceOp op : chorus::kBitwiseReduceOps) {
      CAPTURE(chorus::to_string(dt));
      CAPTURE(chorus::to_string(op));
      double a = 1.0, b = 2.0;  // 8 bytes: room for one element of any of them
      try {
        chorus::reduce(op, dt, &a, &b, 1);
        FAIL("no throw");
      } catch (const chorus::Error& e) {
        CHECK(e.code() == chorus::ErrorCode::invalid_argument);
      }
      CHECK(a == 1.0);
    }
  }
}

TEST_CASE("vectorisable float16 conversions are the types.hpp ones") {
  std::size_t bad = 0;
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const auto b = static_cast<std::uint16_t>(h);
    if (raw(chorus::detail::half_bits_to_float_v(b)) != raw(chorus::detail::half_bits_to_float(b))) ++bad;
  }
  CHECK(bad == 0);
  // Narrowing: every float whose low 12 bits are near a rounding boundary (this covers the exact
  // midpoints and their neighbours, for normal and subnormal results), plus a strided sweep.
  // (An exhaustive run over all 2^32 floats was done when this was written: no difference.)
  bad = 0;
  for (std::uint32_t hi = 0; hi < (1u << 20); ++hi) {
    for (std::uint32_t lo : {0x000u, 0x001u, 0x7ffu, 0x800u, 0x801u, 0xfffu}) {
      const float f = chorus::detail::float_from_bits((hi << 12) | lo);
      if (chorus::detail::float_to_half_bits_v(f) != chorus::detail::float_to_half_bits(f)) ++bad;
    }
  }
  for (std::uint64_t u = 0; u <= 0xffffffffu; u += 4093) {
    const float f = chorus::detail::float_from_bits(static_cast<std::uint32_t>(u));
    if (chorus::detail::float_to_half_bits_v(f) != chorus::detail::float_to_half_bits(f)) ++bad;
  }
  CHECK(bad == 0);
}

}  // namespace unit_test_reduce
