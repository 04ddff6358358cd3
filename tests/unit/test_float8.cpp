// SPDX-License-Identifier: BSD-3-Clause
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "chorus/core/types.hpp"
#include "chorus/reduce/host.hpp"

// This file's own names: the files of tests/unit/ are compiled together (unity build).
namespace unit_test_float8 {

// The reference here is written from the OCP FP8 specification, independently of core/float.hpp:
// the value of each of the 256 encodings from its fields (std::ldexp), and rounding as "the
// nearest of those values, ties to the even encoding", found by search, with each format's rule
// out of range (E4M3 saturates at +-448, E5M2 overflows to infinity at 61440). Sums, products,
// minimum/maximum and avg are computed on those values in long double (exact for them) and
// rounded by that search. (core/float.hpp's narrowing was also compared, outside this suite, with
// CUDA 13's __nv_cvt_float_to_fp8 over all 2^32 floats: E4M3 with __NV_SATFINITE, E5M2 with
// __NV_NOSAT; no difference but the sign of E4M3's NaN, which CUDA drops.)

namespace {

using chorus::DataType;
using chorus::float8_e4m3;
using chorus::float8_e5m2;
using chorus::ReduceOp;

struct Format {
  int man_bits;
  int bias;
  bool has_inf;
  std::uint8_t max_finite;  // encoding of the largest finite value
  std::uint8_t canonical_nan;
};

template <class T>
constexpr Format kFormat =
    std::is_same_v<T, float8_e4m3> ? Format{3, 7, false, 0x7e, 0x7f} : Format{2, 15, true, 0x7b, 0x7e};

template <class T>
bool ref_is_nan(std::uint8_t b) {
  const Format f = kFormat<T>;
  const int e = (b & 0x7f) >> f.man_bits;
  const int m = b & ((1 << f.man_bits) - 1);
  const int top = (1 << (7 - f.man_bits)) - 1;
  return f.has_inf ? (e == top && m != 0) : (e == top && m == (1 << f.man_bits) - 1);
}

/// The value of an encoding from its fields (not for NaN).
template <class T>
long double field_value(std::uint8_t b) {
  const Format f = kFormat<T>;
  const int e = (b & 0x7f) >> f.man_bits;
  const int m = b & ((1 << f.man_bits) - 1);
  const int top = (1 << (7 - f.man_bits)) - 1;
  long double v;
  if (f.has_inf && e == top) {
    v = std::numeric_limits<long double>::infinity();
  } else if (e == 0) {
    v = std::ldexp(static_cast<long double>(m), 1 - f.bias - f.man_bits);
  } else {
    v = std::ldexp(static_cast<long double>((1 << f.man_bits) + m), e - f.bias - f.man_bits);
  }
  return (b & 0x80) ? -v : v;
}

/// field_value, computed once per encoding (the sweeps below look values up millions of times).
template <class T>
long double ref_value(std::uint8_t b) {
  static const std::vector<long double> table = [] {
    std::vector<long double> t(256);
    for (unsigned e = 0; e < 256; ++e)
      t[e] = ref_is_nan<T>(static_cast<std::uint8_t>(e)) ? 0 : field_value<T>(static_cast<std::uint8_t>(e));
    return t;
  }();
  return table[b];
}

/// x rounded to T: nearest finite value, ties to the even encoding; E4M3 saturates beyond 448,
/// E5M2 gives infinity at or beyond 61440. Not for NaN.
template <class T>
std::uint8_t ref_round(long double x) {
  const Format f = kFormat<T>;
  const std::uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const long double a = std::fabs(x);
  if (!f.has_inf && a > ref_value<T>(f.max_finite)) return sign | f.max_finite;
  if (f.has_inf && a >= 61440.0L) return sign | 0x7c;
  std::uint8_t best = 0;
  for (std::uint8_t b = 1; b <= f.max_finite; ++b) {
    const long double d = std::fabs(a - ref_value<T>(b)), db = std::fabs(a - ref_value<T>(best));
    if (d < db || (d == db && (b & 1) == 0)) best = b;
  }
  return sign | best;
}

/// x / world rounded to T (x finite): the encoding v minimising |x - v * world|, ties to even.
template <class T>
std::uint8_t ref_divide(long double x, long double world) {
  const Format f = kFormat<T>;
  const std::uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const long double a = std::fabs(x);
  std::uint8_t best = 0;
  for (std::uint8_t b = 1; b <= f.max_finite; ++b) {
    const long double d = std::fabs(a - ref_value<T>(b) * world),
                      db = std::fabs(a - ref_value<T>(best) * world);
    if (d < db || (d == db && (b & 1) == 0)) best = b;
  }
  return sign | best;
}

/// The reference of one pairwise reduction step (sum, prod, min, max).
template <class T>
std::uint8_t ref_op(ReduceOp op, std::uint8_t a, std::uint8_t b) {
  const Format f = kFormat<T>;
  if (ref_is_nan<T>(a) || ref_is_nan<T>(b)) return f.canonical_nan;
  const long double x = ref_value<T>(a), y = ref_value<T>(b);
  switch (op) {
    case ReduceOp::min:
    case ReduceOp::max: {
      if (x == y) {  // equal values: for +0 / -0 the sign decides
        const bool pick_a = op == ReduceOp::min ? std::signbit(x) : !std::signbit(x);
        return pick_a ? a : b;
      }
      return (op == ReduceOp::min ? x < y : x > y) ? a : b;
    }
    default: {
      const long double r = op == ReduceOp::prod ? x * y : x + y;
      if (std::isnan(r)) return f.canonical_nan;  // inf - inf, 0 * inf
      if (std::isinf(r)) return std::signbit(r) ? 0xfc : 0x7c;
      return ref_round<T>(r);
    }
  }
}

std::string hex(unsigned v) {
  const char* digits = "0123456789abcdef";
  return std::string("0x") + digits[(v >> 4) & 0xf] + digits[v & 0xf];
}

float float_of_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

/// Narrowing from float against ref_round on a sweep of all float encodings (a stride of 65521,
/// with both signs), every midpoint between neighbouring values and one float ulp either side of
/// it, and the specials.
template <class T>
void check_narrowing() {
  const Format f = kFormat<T>;
  std::size_t bad = 0;
  std::string first;
  auto check = [&](float x) {
    const std::uint8_t got = T(x).bits;
    std::uint8_t want;
    if (std::isnan(x)) {
      // NaN keeps its sign; E4M3 has one NaN per sign, E5M2's is quiet.
      const bool ok = ref_is_nan<T>(got) && ((got & 0x80) != 0) == std::signbit(x) &&
                      (f.has_inf ? (got & 0x02) != 0 : true);
      if (!ok && bad++ == 0) first = "NaN -> " + hex(got);
      return;
    }
    want = std::isinf(x) ? (f.has_inf ? (x < 0 ? 0xfc : 0x7c) : ((x < 0 ? 0x80 : 0) | f.max_finite))
                         : ref_round<T>(x);
    if (got != want && bad++ == 0) first = std::to_string(x) + " -> " + hex(got) + ", want " + hex(want);
  };
  for (std::uint64_t u = 0; u < (std::uint64_t{1} << 32); u += 65521)
    check(float_of_bits(static_cast<std::uint32_t>(u)));
  for (std::uint8_t b = 0; b < f.max_finite; ++b) {
    const long double lo = ref_value<T>(b), hi = ref_value<T>(static_cast<std::uint8_t>(b + 1));
    const auto mid = static_cast<float>((lo + hi) / 2);  // exact in float
    REQUIRE(static_cast<long double>(mid) == (lo + hi) / 2);
    for (float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e30f), static_cast<float>(lo),
                    static_cast<float>(hi)}) {
      check(x);
      check(-x);
    }
  }
  const float max = static_cast<float>(ref_value<T>(f.max_finite));
  for (float x : {0.0f, -0.0f, max, std::nextafter(max, 1e30f), 2 * max, 61439.996f, 61440.0f, 65536.0f,
                  1e30f, std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                  std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
                  float_of_bits(0x7f800001u), std::numeric_limits<float>::denorm_min()})
    check(x);
  CHECK_MESSAGE(bad == 0, bad << " wrong, first: " << first);
}

/// Every pair of encodings through the type-erased host reduction (out of place and in place),
/// the functor of ops.hpp, and the reference.
template <class T>
void check_all_pairs() {
  constexpr DataType kDt = chorus::data_type_of<T>;
  std::vector<T> a(65536), b(65536);
  for (std::size_t i = 0; i < 65536; ++i) {
    a[i] = T::from_bits(static_cast<std::uint8_t>(i >> 8));
    b[i] = T::from_bits(static_cast<std::uint8_t>(i));
  }
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max}) {
    CAPTURE(chorus::to_string(op));
    std::vector<T> out(a.size()), in_place = a;
    chorus::reduce(op, kDt, out.data(), a.data(), b.data(), a.size());
    chorus::reduce(op, kDt, in_place.data(), b.data(), a.size());
    std::size_t bad = 0;
    std::string first;
    for (std::size_t i = 0; i < a.size(); ++i) {
      const std::uint8_t want = ref_op<T>(op, a[i].bits, b[i].bits);
      if ((out[i].bits != want || in_place[i].bits != want) && bad++ == 0)
        first = hex(a[i].bits) + ", " + hex(b[i].bits) + " -> " + hex(out[i].bits) + ", want " + hex(want);
    }
    CHECK_MESSAGE(bad == 0, bad << " wrong, first: " << first);
  }
}

}  // namespace

static_assert(chorus::Element<float8_e4m3> && chorus::Element<float8_e5m2>);
static_assert(chorus::data_type_of<float8_e4m3> == DataType::float8_e4m3);
static_assert(std::is_same_v<chorus::element_t<DataType::float8_e5m2>, float8_e5m2>);
static_assert(std::is_same_v<chorus::accumulator_t<float8_e4m3>, float>);
static_assert(float8_e4m3(448.0f).bits == 0x7e && float8_e5m2(57344.0f).bits == 0x7b);
static_assert(float8_e4m3(1.0f).bits == 0x38 && float8_e5m2(1.0f).bits == 0x3c);

TEST_CASE("fp8: widening is exact for all 256 encodings of both formats") {
  for (unsigned b = 0; b < 256; ++b) {
    const auto e = static_cast<std::uint8_t>(b);
    CAPTURE(b);
    const float x = float8_e4m3::from_bits(e), y = float8_e5m2::from_bits(e);
    if (ref_is_nan<float8_e4m3>(e)) {
      CHECK(std::isnan(x));
    } else {
      CHECK(static_cast<long double>(x) == ref_value<float8_e4m3>(e));
      CHECK(std::signbit(x) == ((b & 0x80) != 0));
    }
    if (ref_is_nan<float8_e5m2>(e)) {
      CHECK(std::isnan(y));
    } else {
      CHECK(static_cast<long double>(y) == ref_value<float8_e5m2>(e));
      CHECK(std::signbit(y) == ((b & 0x80) != 0));
    }
  }
}

TEST_CASE("fp8: narrowing round-trips every encoding; NaN stays NaN with its sign") {
  for (unsigned b = 0; b < 256; ++b) {
    const auto e = static_cast<std::uint8_t>(b);
    CAPTURE(b);
    const std::uint8_t x = float8_e4m3(static_cast<float>(float8_e4m3::from_bits(e))).bits;
    const std::uint8_t y = float8_e5m2(static_cast<float>(float8_e5m2::from_bits(e))).bits;
    CHECK(x == e);  // E4M3's NaN is one encoding per sign
    if (ref_is_nan<float8_e5m2>(e)) {
      CHECK(ref_is_nan<float8_e5m2>(y));
      CHECK((y & 0x80) == (e & 0x80));
      CHECK((y & 0x02) != 0);  // quiet
    } else {
      CHECK(y == e);
    }
  }
}

TEST_CASE("fp8: narrowing from float against the nearest-value model") {
  SUBCASE("e4m3") { check_narrowing<float8_e4m3>(); }
  SUBCASE("e5m2") { check_narrowing<float8_e5m2>(); }
}

TEST_CASE("fp8: out of range, underflow and specials") {
  CHECK(float8_e4m3(448.0f).bits == 0x7e);
  CHECK(float8_e4m3(464.0f).bits == 0x7e);  // the midpoint to 480: saturates
  CHECK(float8_e4m3(1e6f).bits == 0x7e);
  CHECK(float8_e4m3(-std::numeric_limits<float>::infinity()).bits == 0xfe);
  CHECK(float8_e4m3(0.001953125f).bits == 0x01);   // 2^-9, the smallest subnormal
  CHECK(float8_e4m3(0.0009765625f).bits == 0x00);  // 2^-10, half of it: the tie goes to 0
  CHECK(float8_e4m3(-0.0009766f).bits == 0x81);    // just above half: rounds up, sign kept
  CHECK(float8_e4m3(-1e-30f).bits == 0x80);
  CHECK(float8_e4m3(std::numeric_limits<float>::quiet_NaN()).bits == 0x7f);
  CHECK(float8_e5m2(57344.0f).bits == 0x7b);
  CHECK(float8_e5m2(61439.0f).bits == 0x7b);
  CHECK(float8_e5m2(61440.0f).bits == 0x7c);  // the tie with 65536 goes to infinity
  CHECK(float8_e5m2(-std::numeric_limits<float>::infinity()).bits == 0xfc);
  CHECK(float8_e5m2(0.0000152587890625f).bits == 0x01);   // 2^-16
  CHECK(float8_e5m2(0.00000762939453125f).bits == 0x00);  // 2^-17: tie to 0
  CHECK(float8_e5m2(3.3f).bits == float8_e5m2(3.5f).bits);
  CHECK(static_cast<float>(float8_e5m2(3.3f)) == 3.5f);
}

TEST_CASE("fp8: narrowing from double and integers rounds once") {
  for (unsigned b = 0; b < 0x7b; ++b) {
    const long double lo = ref_value<float8_e5m2>(static_cast<std::uint8_t>(b));
    const long double hi = ref_value<float8_e5m2>(static_cast<std::uint8_t>(b + 1));
    const auto mid = static_cast<double>((lo + hi) / 2);
    CAPTURE(b);
    // Past float's resolution on either side of a tie: a conversion through float would see the
    // tie itself.
    CHECK(float8_e5m2(mid + mid * 0x1p-40).bits == b + 1);
    CHECK(float8_e5m2(mid - mid * 0x1p-40).bits == b);
  }
  for (int i = -600; i <= 600; ++i) {
    CAPTURE(i);
    CHECK(float8_e4m3(i).bits == ref_round<float8_e4m3>(i));
    CHECK(float8_e5m2(static_cast<std::int64_t>(i) * 97).bits == ref_round<float8_e5m2>(i * 97.0L));
  }
  CHECK(float8_e5m2(std::numeric_limits<std::int64_t>::max()).bits == 0x7c);
  CHECK(float8_e4m3(std::numeric_limits<std::uint64_t>::max()).bits == 0x7e);
  // E5M2's neighbours of 19 and 18 are 16 and 20.
  CHECK(float8_e5m2(19).bits == float8_e5m2(20.0f).bits);
  CHECK(float8_e5m2(18).bits == float8_e5m2(16.0f).bits);  // the tie goes to the even encoding
}

TEST_CASE("fp8: every pair of encodings through sum, prod, min and max") {
  SUBCASE("e4m3") { check_all_pairs<float8_e4m3>(); }
  SUBCASE("e5m2") { check_all_pairs<float8_e5m2>(); }
}

TEST_CASE("fp8: a reduction step accumulates in float and rounds once") {
  // 448 + 448 saturates (E4M3) at the step; 57344 + 57344 overflows (E5M2).
  CHECK(chorus::Sum{}(float8_e4m3(448.0f), float8_e4m3(448.0f)).bits == 0x7e);
  CHECK(chorus::Sum{}(float8_e5m2(57344.0f), float8_e5m2(57344.0f)).bits == 0x7c);
  // 16 + 1 = 17 is a tie in E4M3 (16, 18): even, 16; 16 + 3 = 19 (18, 20): even, 20.
  CHECK(chorus::Sum{}(float8_e4m3(16.0f), float8_e4m3(1.0f)).bits == float8_e4m3(16.0f).bits);
  CHECK(chorus::Sum{}(float8_e4m3(16.0f), float8_e4m3(3.0f)).bits == float8_e4m3(20.0f).bits);
  CHECK(chorus::Prod{}(float8_e5m2(1.25f), float8_e5m2(1.25f)).bits == float8_e5m2(1.5f).bits);  // 1.5625
  CHECK(chorus::Min{}(float8_e5m2::from_bits(0x7d), float8_e5m2(1.0f)).bits == 0x7e);  // NaN wins, canonical
  CHECK(chorus::Max{}(float8_e4m3(1.0f), float8_e4m3::from_bits(0xff)).bits == 0x7f);
  CHECK(chorus::Min{}(float8_e4m3::from_bits(0x00), float8_e4m3::from_bits(0x80)).bits == 0x80);
}

TEST_CASE("fp8: avg's division is the nearest value for every encoding and world size") {
  auto run = [&]<class T>(std::type_identity<T>) {
    const Format f = kFormat<T>;
    std::size_t bad = 0;
    std::string first;
    for (int world : {1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 100, 1000003, 2147483647}) {
      std::vector<T> x(256);
      for (unsigned b = 0; b < 256; ++b) x[b] = T::from_bits(static_cast<std::uint8_t>(b));
      std::vector<T> got = x;
      chorus::finalize_avg(chorus::data_type_of<T>, got.data(), got.size(), world);
      for (unsigned b = 0; b < 256; ++b) {
        const auto e = static_cast<std::uint8_t>(b);
        std::uint8_t want;
        if (ref_is_nan<T>(e))
          want = f.canonical_nan;
        else if (std::isinf(ref_value<T>(e)))
          want = e;
        else
          want = ref_divide<T>(ref_value<T>(e), world);
        if ((got[b].bits != want || chorus::avg_divide(x[b], world).bits != want) && bad++ == 0)
          first = "world " + std::to_string(world) + ": " + hex(e) + " -> " + hex(got[b].bits) + ", want " +
                  hex(want);
      }
    }
    CHECK_MESSAGE(bad == 0, bad << " wrong, first: " << first);
  };
  run(std::type_identity<float8_e4m3>{});
  run(std::type_identity<float8_e5m2>{});
}

TEST_CASE("fp8: names, sizes, and the ops they take") {
  CHECK(chorus::to_string(DataType::float8_e4m3) == "float8_e4m3");
  CHECK(chorus::to_string(DataType::float8_e5m2) == "float8_e5m2");
  CHECK(chorus::parse_data_type("f8e4m3") == DataType::float8_e4m3);
  CHECK(chorus::parse_data_type("float8_e4m3fn") == DataType::float8_e4m3);
  CHECK(chorus::parse_data_type("f8e5m2") == DataType::float8_e5m2);
  CHECK(chorus::size_of(DataType::float8_e4m3) == 1);
  CHECK(chorus::size_of(DataType::float8_e5m2) == 1);
  for (DataType dt : {DataType::float8_e4m3, DataType::float8_e5m2}) {
    CHECK(chorus::is_floating(dt));
    for (ReduceOp op : chorus::kAllReduceOps) CHECK(chorus::is_valid_op(dt, op));
    CHECK(chorus::is_valid_op(dt, ReduceOp::premul_sum));
    for (ReduceOp op : chorus::kBitwiseReduceOps) CHECK_FALSE(chorus::is_valid_op(dt, op));
  }
  // The values of the older types (they travel in call descriptors) are unchanged.
  CHECK(static_cast<int>(DataType::float64) == 9);
  CHECK(static_cast<int>(DataType::float8_e4m3) == 10);
}

}  // namespace unit_test_float8
