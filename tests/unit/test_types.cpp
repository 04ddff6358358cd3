// SPDX-License-Identifier: BSD-3-Clause
#include "chorus/core/types.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

// This file's own names: the files of tests/unit/ are compiled together (unity build).
namespace unit_test_types {

// References used here are independent of the code under test:
//   float16:  the compiler's _Float16 (g++: libgcc soft-fp) and the x86 F16C instructions, both
//             IEEE round to nearest even (F16C runs the big sweep, for speed); a long-double "pick
//             the nearer neighbour" model (ref_round below); explicit expected encodings.
//   bfloat16: the same long-double model, and `bits << 16` for widening.
// Every sweep counts mismatches and reports the first one, so a failure prints one useful line
// instead of millions.

namespace {

using chorus::bfloat16;
using chorus::DataType;
using chorus::float16;
using chorus::ReduceOp;

std::uint32_t bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
float from_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
// _Float16 where the compiler has it (g++ 12 on x86-64 and aarch64; clang from 15 on x86).
#if defined(__FLT16_MANT_DIG__)
#define TEST_HAS_FLOAT16 1
std::uint16_t bits(_Float16 h) {
  std::uint16_t u;
  std::memcpy(&u, &h, sizeof u);
  return u;
}
_Float16 half_from_bits(std::uint16_t u) {
  _Float16 h;
  std::memcpy(&h, &u, sizeof h);
  return h;
}
#else
#define TEST_HAS_FLOAT16 0
#endif

// The F16C instructions (vcvtps2ph with immediate 0 = round to nearest even, vcvtph2ps): a
// hardware reference, ~50x faster than _Float16's soft-float conversion in a Debug build.
#if defined(__x86_64__)
bool cpu_has_f16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & bit_F16C) != 0;
}
__attribute__((target("f16c"))) std::uint16_t f16c_half_bits(float x) {
  return static_cast<std::uint16_t>(_mm_cvtsi128_si32(_mm_cvtps_ph(_mm_set_ss(x), 0)) & 0xffff);
}
[[maybe_unused]] __attribute__((target("f16c"))) float f16c_half_to_float(std::uint16_t h) {
  return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
}
#else
bool cpu_has_f16c() { return false; }
std::uint16_t f16c_half_bits(float) { return 0; }
[[maybe_unused]] float f16c_half_to_float(std::uint16_t) { return 0; }
#endif

const bool kF16c = cpu_has_f16c();

/// Whether this build and CPU have an independent binary16 implementation to test against.
bool have_half_reference() { return TEST_HAS_FLOAT16 || kF16c; }

/// float -> binary16 by an independent implementation: F16C where the CPU has it, else _Float16.
std::uint16_t ref_half_bits(float x) {
  if (kF16c) return f16c_half_bits(x);
#if TEST_HAS_FLOAT16
  return bits(static_cast<_Float16>(x));
#else
  return 0;
#endif
}

/// binary16 -> float by an independent implementation: _Float16, else F16C.
float ref_half_to_float(std::uint16_t h) {
#if TEST_HAS_FLOAT16
  return static_cast<float>(half_from_bits(h));
#else
  return f16c_half_to_float(h);
#endif
}

bool is_nan16(std::uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x03ffu) != 0; }
bool is_nan_bf16(std::uint16_t b) { return (b & 0x7f80u) == 0x7f80u && (b & 0x007fu) != 0; }

/// Two 16-bit results agree: same bits, or both NaN.
bool same16(std::uint16_t a, std::uint16_t b, bool (*is_nan)(std::uint16_t)) {
  return a == b || (is_nan(a) && is_nan(b));
}

/// splitmix64: deterministic, fast even in a Debug build.
struct Rng {
  std::uint64_t s;
  std::uint64_t next() {
    std::uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
};

/// A binary format narrower than float: `precision` significand bits (implicit bit included),
/// smallest quantum 2^min_quantum_exp (the subnormal spacing), largest finite `max_finite`.
struct Format {
  int precision;
  int min_quantum_exp;
  long double max_finite;
};
constexpr Format kHalf{11, -24, 65504.0L};
constexpr Format kBf16{8, -133, 0x1.fep127L};

/// Correctly rounded (nearest, ties to even) value of finite x in format `f`, as a long double
/// (infinity on overflow). Works by finding the two representable neighbours with frexp/floor and
/// picking the nearer one; long double holds every int64, float and double exactly, and the
/// differences below are exact.
long double ref_round(long double x, Format f) {
  const long double m = std::fabs(x);
  if (m == 0) return x;
  int e = 0;
  std::frexp(m, &e);  // m = fr * 2^e, fr in [0.5, 1)
  const int qexp = std::max(e - f.precision, f.min_quantum_exp);
  const long double q = std::ldexp(1.0L, qexp);
  const long double k = std::floor(m / q);
  const long double lo = k * q;
  const long double hi = lo + q;
  long double r;
  if (m - lo < hi - m) r = lo;
  else if (m - lo > hi - m) r = hi;
  else r = (std::fmod(k, 2.0L) == 0) ? lo : hi;
  if (r > f.max_finite) r = std::numeric_limits<long double>::infinity();
  return std::signbit(x) ? -r : r;
}

/// bfloat16 bits of a value ref_round produced (exactly representable in float).
std::uint16_t bf16_bits_of_exact(long double v) { return static_cast<std::uint16_t>(bits(static_cast<float>(v)) >> 16); }
std::uint16_t half_bits_of_exact(long double v) { return ref_half_bits(static_cast<float>(v)); }

/// Calls f(u) for a deterministic sample of float bit patterns: every 257th pattern over the whole
/// 32-bit space (odd stride, so the low mantissa bits vary), then random mantissas for every
/// exponent from 2^-30 to 2^17 (the interesting range of float16), both signs, including the
/// patterns one step either side of float16's rounding boundaries.
template <class F>
void for_float_sample(F&& f) {
  for (std::uint64_t u = 0; u <= 0xffffffffull; u += 257) f(static_cast<std::uint32_t>(u));
  Rng rng{42};
  for (std::uint32_t sign = 0; sign < 2; ++sign) {
    for (std::uint32_t e = 127 - 30; e <= 127 + 17; ++e) {
      const std::uint32_t base = (sign << 31) | (e << 23);
      for (int i = 0; i < 2048; ++i) f(base | static_cast<std::uint32_t>(rng.next() & 0x7fffffu));
      for (std::uint32_t m = 0; m < (1u << 23); m += 0x1000u) {  // around every half/bf16 tie
        f(base | m);
        f(base | (m + 1u));
        f(base | ((m - 1u) & 0x7fffffu));
      }
    }
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// float16
// ---------------------------------------------------------------------------------------------

static_assert(float16(1.0f).bits == 0x3c00);
static_assert(float16(-2.0).bits == 0xc000);
static_assert(float16(65520.0f).bits == 0x7c00);
static_assert(float16(1).bits == 0x3c00);
static_assert(float(float16::from_bits(0x3555)) == 0.333251953125f);
static_assert(float(float16::from_bits(0x0001)) == 0x1p-24f);

TEST_CASE("float16: widening is exact for all 65536 encodings") {
  if (!have_half_reference()) {
    MESSAGE("skipped: neither _Float16 nor F16C is available to compare against");
    return;
  }
  int mismatches = 0;
  std::string first;
  for (std::uint32_t h = 0; h <= 0xffff; ++h) {
    const float got = float16::from_bits(static_cast<std::uint16_t>(h));
    const float want = ref_half_to_float(static_cast<std::uint16_t>(h));
    const bool ok = std::isnan(want) ? (std::isnan(got) && std::signbit(got) == std::signbit(want))
                                     : bits(got) == bits(want);
    if (!ok && mismatches++ == 0) first = "half " + std::to_string(h) + " -> " + std::to_string(bits(got));
  }
  INFO(first);
  CHECK(mismatches == 0);
}

TEST_CASE("float16: narrowing round-trips every encoding; NaN stays a quiet NaN with its sign") {
  int mismatches = 0;
  std::string first;
  for (std::uint32_t h = 0; h <= 0xffff; ++h) {
    const auto hb = static_cast<std::uint16_t>(h);
    const float f = float16::from_bits(hb);
    const std::uint16_t back = float16(f).bits;
    const std::uint16_t back_d = float16(static_cast<double>(f)).bits;
    bool ok;
    if (is_nan16(hb)) {
      ok = is_nan16(back) && (back & 0x0200u) != 0 && (back & 0x8000u) == (hb & 0x8000u) && back_d == back;
    } else {
      ok = back == hb && back_d == hb;
    }
    if (!ok && mismatches++ == 0) first = "half " + std::to_string(h) + " -> " + std::to_string(back);
  }
  INFO(first);
  CHECK(mismatches == 0);
}

TEST_CASE("float16: midpoints between neighbours round to even; one float ulp either side does not") {
  int mismatches = 0;
  std::string first;
  auto check = [&](float x, std::uint16_t want) {
    const std::uint16_t got = float16(x).bits;
    bool ok = got == want;
#if TEST_HAS_FLOAT16
    ok = ok && bits(static_cast<_Float16>(x)) == want;
#endif
    if (kF16c) ok = ok && f16c_half_bits(x) == want;
    if (!ok && mismatches++ == 0) {
      first = "x bits " + std::to_string(bits(x)) + " got " + std::to_string(got) + " want " + std::to_string(want);
    }
  };
  // Pairs (h, h+1) of adjacent finite values; h = 0x7bff pairs 65504 with 65536 (which rounds to
  // infinity, 0x7c00, the next encoding).
  for (std::uint16_t sign : {std::uint16_t{0}, std::uint16_t{0x8000}}) {
    for (std::uint16_t h = 0; h <= 0x7bff; ++h) {
      const std::uint16_t a = sign | h;
      const std::uint16_t b = sign | static_cast<std::uint16_t>(h + 1);
      const double lo = static_cast<float>(float16::from_bits(a));
      const double hi = (h == 0x7bff) ? (sign ? -65536.0 : 65536.0) : static_cast<float>(float16::from_bits(b));
      const float mid = static_cast<float>((lo + hi) / 2);  // exact: 12 significant bits
      REQUIRE(static_cast<double>(mid) == (lo + hi) / 2);
      const float toward_a = std::nextafter(mid, static_cast<float>(lo));
      const float toward_b = std::nextafter(mid, static_cast<float>(hi));
      check(mid, (h & 1u) ? b : a);
      check(toward_a, a);
      check(toward_b, b);
    }
  }
  INFO(first);
  CHECK(mismatches == 0);
}

TEST_CASE("float16: overflow, underflow and specials") {
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(float16(65504.0f).bits == 0x7bff);
  CHECK(float16(65519.99f).bits == 0x7bff);
  CHECK(float16(65520.0f).bits == 0x7c00);
  CHECK(float16(-65520.0f).bits == 0xfc00);
  CHECK(float16(1e10f).bits == 0x7c00);
  CHECK(float16(std::numeric_limits<float>::max()).bits == 0x7c00);
  CHECK(float16(inf).bits == 0x7c00);
  CHECK(float16(-inf).bits == 0xfc00);
  CHECK(float16(0x1p-24f).bits == 0x0001);           // smallest subnormal
  CHECK(float16(0x1p-25f).bits == 0x0000);           // tie with 0: even is 0
  CHECK(float16(std::nextafter(0x1p-25f, 1.0f)).bits == 0x0001);
  CHECK(float16(-0x1p-25f).bits == 0x8000);          // signed zero
  CHECK(float16(0x1.8p-24f).bits == 0x0002);         // 1.5 quanta: tie, up to even 2
  CHECK(float16(0x1p-14f).bits == 0x0400);           // smallest normal
  CHECK(float16(0x1.ff8p-15f).bits == 0x03ff);       // largest subnormal
  CHECK(float16(0x1.ffcp-15f).bits == 0x0400);       // ... + half quantum: tie, up to even (normal)
  CHECK(float16(std::numeric_limits<float>::denorm_min()).bits == 0x0000);
  CHECK(float16(-0.0f).bits == 0x8000);
  CHECK(float16(std::numeric_limits<float>::quiet_NaN()).bits == 0x7e00);
  CHECK(float16(-std::numeric_limits<float>::quiet_NaN()).bits == 0xfe00);
  const std::uint16_t snan = float16(std::numeric_limits<float>::signaling_NaN()).bits;
  CHECK(is_nan16(snan));
  CHECK((snan & 0x0200u) != 0);
  CHECK(std::isinf(float(float16::from_bits(0x7c00))));
  CHECK(std::signbit(float(float16::from_bits(0x8000))));
}

TEST_CASE("float16: narrowing from float matches F16C / _Float16 on a large sample") {
  if (!have_half_reference()) {
    MESSAGE("skipped: neither _Float16 nor F16C is available to compare against");
    return;
  }
  std::uint64_t n = 0;
  int mismatches = 0;
  std::string first;
  for_float_sample([&](std::uint32_t u) {
    ++n;
    const float x = from_bits(u);
    const std::uint16_t got = float16(x).bits;
    const std::uint16_t want = ref_half_bits(x);
    if (!same16(got, want, is_nan16) && mismatches++ == 0) {
      first = "float bits " + std::to_string(u) + " got " + std::to_string(got) + " want " + std::to_string(want);
    }
  });
  INFO(first);
  CHECK(n > 16'000'000);
  CHECK(mismatches == 0);
}

TEST_CASE("float16: narrowing from double and integers rounds once") {
  if (!have_half_reference()) {
    MESSAGE("skipped: neither _Float16 nor F16C is available to compare against");
    return;
  }
  int mismatches = 0;
  std::string first;
  auto check = [&](long double x, std::uint16_t got, const char* what) {
    const std::uint16_t want = half_bits_of_exact(ref_round(x, kHalf));
    if (got != want && mismatches++ == 0) {
      first = std::string(what) + " " + std::to_string(static_cast<double>(x)) + " got " +
              std::to_string(got) + " want " + std::to_string(want);
    }
  };
  Rng rng{7};
  for (int i = 0; i < 200'000; ++i) {
    // doubles near float16 ties: a half midpoint plus a tiny offset that float cannot hold, which
    // a conversion through float (double rounding) would lose.
    const auto h = static_cast<std::uint16_t>(rng.next() % 0x7bff);
    const double lo = static_cast<float>(float16::from_bits(h));
    const double hi = static_cast<float>(float16::from_bits(static_cast<std::uint16_t>(h + 1)));
    const double mid = (lo + hi) / 2;
    const double tiny = std::ldexp(mid, -40) * static_cast<double>(rng.next() % 3) * ((rng.next() & 1) ? 1 : -1);
    const double x = mid + tiny;
    check(x, float16(x).bits, "double");
#if TEST_HAS_FLOAT16
    if (float16(x).bits != bits(static_cast<_Float16>(x)) && mismatches++ == 0) {
      first = "double vs _Float16 " + std::to_string(x);  // converts double directly, one rounding
    }
#endif
    // random doubles over the whole range of float16 and beyond
    const double y = std::ldexp(static_cast<double>(rng.next() >> 11) / 0x1p53, static_cast<int>(rng.next() % 60) - 35);
    check(y, float16(y).bits, "double");
    // integers: every magnitude class
    const auto k = static_cast<std::int64_t>(rng.next()) >> (rng.next() % 64);
    check(static_cast<long double>(k), float16(k).bits, "int64");
    const auto s = static_cast<std::int32_t>(k);
    check(static_cast<long double>(s), float16(s).bits, "int32");
  }
  for (std::int32_t k = -70000; k <= 70000; ++k) check(k, float16(k).bits, "int32");
  check(static_cast<long double>(std::numeric_limits<std::int64_t>::min()),
        float16(std::numeric_limits<std::int64_t>::min()).bits, "int64 min");
  check(static_cast<long double>(std::numeric_limits<std::uint64_t>::max()),
        float16(std::numeric_limits<std::uint64_t>::max()).bits, "uint64 max");
  CHECK(float16(static_cast<std::int8_t>(-128)).bits == 0xd800);
  CHECK(float16(2049).bits == 0x6800);  // 2049: tie between 2048 and 2050, even is 2048
  CHECK(float16(2051).bits == 0x6802);  // tie between 2050 and 2052, even is 2052
  INFO(first);
  CHECK(mismatches == 0);
}

TEST_CASE("float16: comparisons and arithmetic go through float") {
  CHECK(float16(1.0f) < float16(2.0f));
  CHECK(float16(0.0f) == float16(-0.0f));
  CHECK(float16(std::numeric_limits<float>::quiet_NaN()) != float16(std::numeric_limits<float>::quiet_NaN()));
  CHECK(float16(float16(1.5f) + float16(2.25f)).bits == float16(3.75f).bits);
  CHECK(static_cast<double>(float16(0.1f)) == 0.0999755859375);
}

// ---------------------------------------------------------------------------------------------
// bfloat16
// ---------------------------------------------------------------------------------------------

static_assert(bfloat16(1.0f).bits == 0x3f80);
static_assert(bfloat16(-2.0).bits == 0xc000);
static_assert(float(bfloat16::from_bits(0x4049)) == 3.140625f);

TEST_CASE("bfloat16: widening is bits << 16 for all 65536 encodings") {
  int mismatches = 0;
  for (std::uint32_t b = 0; b <= 0xffff; ++b) {
    const float got = bfloat16::from_bits(static_cast<std::uint16_t>(b));
    if (bits(got) != (b << 16)) ++mismatches;
  }
  CHECK(mismatches == 0);
}

TEST_CASE("bfloat16: narrowing round-trips every encoding; NaN stays a quiet NaN with its sign") {
  int mismatches = 0;
  std::string first;
  for (std::uint32_t b = 0; b <= 0xffff; ++b) {
    const auto bb = static_cast<std::uint16_t>(b);
    const float f = bfloat16::from_bits(bb);
    const std::uint16_t back = bfloat16(f).bits;
    const std::uint16_t back_d = bfloat16(static_cast<double>(f)).bits;
    bool ok;
    if (is_nan_bf16(bb)) {
      ok = is_nan_bf16(back) && (back & 0x0040u) != 0 && (back & 0x8000u) == (bb & 0x8000u) &&
           is_nan_bf16(back_d) && (back_d & 0x8000u) == (bb & 0x8000u);
    } else {
      ok = back == bb && back_d == bb;
    }
    if (!ok && mismatches++ == 0) first = "bf16 " + std::to_string(b) + " -> " + std::to_string(back);
  }
  INFO(first);
  CHECK(mismatches == 0);
}

TEST_CASE("bfloat16: midpoints between neighbours round to even; one float ulp either side does not") {
  int mismatches = 0;
  std::string first;
  auto check = [&](float x, std::uint16_t want) {
    const std::uint16_t got = bfloat16(x).bits;
    if (got != want && mismatches++ == 0) {
      first = "x bits " + std::to_string(bits(x)) + " got " + std::to_string(got) + " want " + std::to_string(want);
    }
  };
  for (std::uint16_t sign : {std::uint16_t{0}, std::uint16_t{0x8000}}) {
    for (std::uint16_t b = 0; b <= 0x7f7f; ++b) {
      const std::uint16_t lo_bits = sign | b;
      const std::uint16_t hi_bits = sign | static_cast<std::uint16_t>(b + 1);
      const double lo = static_cast<float>(bfloat16::from_bits(lo_bits));
      const double hi = (b == 0x7f7f) ? std::ldexp(sign ? -1.0 : 1.0, 128)
                                      : static_cast<double>(static_cast<float>(bfloat16::from_bits(hi_bits)));
      const float mid = static_cast<float>((lo + hi) / 2);
      REQUIRE(static_cast<double>(mid) == (lo + hi) / 2);
      check(mid, (b & 1u) ? hi_bits : lo_bits);
      check(std::nextafter(mid, static_cast<float>(lo)), lo_bits);
      if (b != 0x7f7f) check(std::nextafter(mid, static_cast<float>(hi)), hi_bits);
      else check(std::nextafter(mid, std::copysign(std::numeric_limits<float>::infinity(), mid)), hi_bits);
    }
  }
  INFO(first);
  CHECK(mismatches == 0);
}

TEST_CASE("bfloat16: overflow, subnormals and specials") {
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(bfloat16(std::numeric_limits<float>::max()).bits == 0x7f80);
  CHECK(bfloat16(0x1.fep127f).bits == 0x7f7f);
  CHECK(bfloat16(0x1.fefffep127f).bits == 0x7f7f);
  CHECK(bfloat16(0x1.ffp127f).bits == 0x7f80);
  CHECK(bfloat16(-inf).bits == 0xff80);
  CHECK(bfloat16(1e300).bits == 0x7f80);
  CHECK(bfloat16(std::numeric_limits<float>::denorm_min()).bits == 0x0000);  // far below a quantum
  CHECK(bfloat16(0x1p-133f).bits == 0x0001);   // smallest bf16 subnormal
  CHECK(bfloat16(0x1p-134f).bits == 0x0000);   // tie with 0
  CHECK(bfloat16(0x1.8p-133f).bits == 0x0002);  // tie, up to even
  CHECK(bfloat16(-0.0f).bits == 0x8000);
  CHECK(bfloat16(std::numeric_limits<float>::quiet_NaN()).bits == 0x7fc0);
  CHECK(bfloat16(-std::numeric_limits<float>::quiet_NaN()).bits == 0xffc0);
  const std::uint16_t snan = bfloat16(from_bits(0x7f800001u)).bits;  // payload only in the low bits
  CHECK(is_nan_bf16(snan));
  CHECK((snan & 0x0040u) != 0);
}

TEST_CASE("bfloat16: narrowing from float matches nearest-neighbour models on a large sample") {
  // Full sample: the two neighbours are the truncated encoding and the next one; the nearer is
  // picked by comparing distances in double (exact for floats), ties by the even encoding.
  std::uint64_t n = 0;
  int mismatches = 0;
  std::string first;
  for_float_sample([&](std::uint32_t u) {
    ++n;
    const float x = from_bits(u);
    const std::uint16_t got = bfloat16(x).bits;
    std::uint16_t want;
    if (std::isnan(x)) {
      want = 0x7fc0;
    } else if (std::isinf(x)) {
      want = static_cast<std::uint16_t>(u >> 16);
    } else {
      // The nearer of the two neighbours, measured in double (exact for floats).
      const double m = std::fabs(static_cast<double>(x));
      const auto k = static_cast<std::uint16_t>((u & 0x7fffffffu) >> 16);  // magnitude toward zero
      const double lo = static_cast<float>(bfloat16::from_bits(k));
      const double hi = (k == 0x7f7f) ? std::ldexp(1.0, 128) : static_cast<double>(static_cast<float>(bfloat16::from_bits(k + 1)));
      std::uint16_t mag;
      if (m - lo < hi - m) mag = k;
      else if (m - lo > hi - m) mag = k + 1;
      else mag = (k & 1u) ? k + 1 : k;
      want = static_cast<std::uint16_t>(((u >> 16) & 0x8000u) | mag);
    }
    if (!same16(got, want, is_nan_bf16) && mismatches++ == 0) {
      first = "float bits " + std::to_string(u) + " got " + std::to_string(got) + " want " + std::to_string(want);
    }
  });
  // And a thinner slice against the frexp/floor model, which knows nothing about the encoding.
  Rng rng{3};
  for (int i = 0; i < 300'000; ++i) {
    const auto u = static_cast<std::uint32_t>(rng.next());
    const float x = from_bits(u);
    if (std::isnan(x)) continue;
    const std::uint16_t want = bf16_bits_of_exact(ref_round(x, kBf16));
    if (bfloat16(x).bits != want && mismatches++ == 0) {
      first = "model: float bits " + std::to_string(u) + " got " + std::to_string(bfloat16(x).bits);
    }
  }
  INFO(first);
  CHECK(n > 16'000'000);
  CHECK(mismatches == 0);
}

TEST_CASE("bfloat16: narrowing from double and integers rounds once") {
  int mismatches = 0;
  std::string first;
  auto check = [&](long double x, std::uint16_t got, const char* what) {
    const std::uint16_t want = bf16_bits_of_exact(ref_round(x, kBf16));
    if (got != want && mismatches++ == 0) {
      first = std::string(what) + " " + std::to_string(static_cast<double>(x)) + " got " +
              std::to_string(got) + " want " + std::to_string(want);
    }
  };
  Rng rng{11};
  for (int i = 0; i < 200'000; ++i) {
    const auto b = static_cast<std::uint16_t>(rng.next() % 0x7f7f);
    const double lo = static_cast<float>(bfloat16::from_bits(b));
    const double hi = static_cast<float>(bfloat16::from_bits(static_cast<std::uint16_t>(b + 1)));
    const double mid = (lo + hi) / 2;
    const double x = mid + std::ldexp(mid, -40) * static_cast<double>(rng.next() % 3) * ((rng.next() & 1) ? 1 : -1);
    check(x, bfloat16(x).bits, "double");
    const double y = std::ldexp(static_cast<double>(rng.next() >> 11) / 0x1p53, static_cast<int>(rng.next() % 300) - 150);
    check(y, bfloat16(y).bits, "double");
    const std::uint64_t w = rng.next() >> (rng.next() % 64);
    check(static_cast<long double>(w), bfloat16(w).bits, "uint64");
    const auto k = static_cast<std::int64_t>(w);
    check(static_cast<long double>(k), bfloat16(k).bits, "int64");
  }
  // int64 -> double would round 2^62 + 2^54 + 1 to the bf16 tie 2^62 + 2^54 and then to even
  // (2^62); the correct result is the upper neighbour 2^62 + 2^55.
  const std::int64_t tricky = (std::int64_t{1} << 62) + (std::int64_t{1} << 54) + 1;
  CHECK(bfloat16(tricky).bits == bfloat16((std::int64_t{1} << 62) + (std::int64_t{1} << 55)).bits);
  CHECK(bfloat16(0x1.0100000000001p0).bits == 0x3f81);  // double just above a tie: not via float
  CHECK(bfloat16(0x1.0100000000000p0).bits == 0x3f80);  // the tie itself: even
  check(static_cast<long double>(std::numeric_limits<std::int64_t>::min()),
        bfloat16(std::numeric_limits<std::int64_t>::min()).bits, "int64 min");
  INFO(first);
  CHECK(mismatches == 0);
}

// ---------------------------------------------------------------------------------------------
// DataType, ReduceOp, traits
// ---------------------------------------------------------------------------------------------

static_assert(chorus::Element<float> && chorus::Element<double> && chorus::Element<float16> &&
              chorus::Element<bfloat16> && chorus::Element<std::int8_t> && chorus::Element<std::uint64_t>);
static_assert(!chorus::Element<char> && !chorus::Element<bool> && !chorus::Element<std::int16_t> &&
              !chorus::Element<long double> && !chorus::Element<const float> && !chorus::Element<float&>);
static_assert(chorus::data_type_of<float> == DataType::float32);
static_assert(chorus::data_type_of<bfloat16> == DataType::bfloat16);
static_assert(std::is_same_v<chorus::element_t<DataType::float16>, float16>);
static_assert(std::is_same_v<chorus::element_t<DataType::int64>, std::int64_t>);
static_assert([]<std::size_t... I>(std::index_sequence<I...>) {
  using chorus::kAllDataTypes;
  return ((chorus::size_of(kAllDataTypes[I]) == sizeof(chorus::element_t<kAllDataTypes[I]>)) && ...) &&
         ((chorus::data_type_of<chorus::element_t<kAllDataTypes[I]>> == kAllDataTypes[I]) && ...);
}(std::make_index_sequence<chorus::kAllDataTypes.size()>{}));
static_assert(chorus::parse_data_type("half") == DataType::float16);

TEST_CASE("DataType: names, parsing, sizes and dispatch") {
  const char* names[] = {"int8",    "uint8",    "int32",   "uint32",  "int64",       "uint64",
                         "float16", "bfloat16", "float32", "float64", "float8_e4m3", "float8_e5m2"};
  REQUIRE(chorus::kAllDataTypes.size() == 12);
  for (std::size_t i = 0; i < chorus::kAllDataTypes.size(); ++i) {
    const DataType t = chorus::kAllDataTypes[i];
    CAPTURE(names[i]);
    CHECK(chorus::to_string(t) == names[i]);
    CHECK(chorus::parse_data_type(chorus::to_string(t)) == t);
    const std::size_t n = chorus::dispatch(t, [&]<class T>(std::type_identity<T>) {
      CHECK(chorus::data_type_of<T> == t);
      return sizeof(T);
    });
    CHECK(n == chorus::size_of(t));
  }
  CHECK(chorus::parse_data_type("half") == DataType::float16);
  CHECK(chorus::parse_data_type("float") == DataType::float32);
  CHECK(chorus::parse_data_type("double") == DataType::float64);
  CHECK(chorus::parse_data_type("int") == DataType::int32);
  CHECK(chorus::parse_data_type("uint") == DataType::uint32);
  CHECK(chorus::parse_data_type("char") == DataType::int8);
  CHECK(chorus::parse_data_type("bf16") == DataType::bfloat16);
  for (const char* junk : {"", "Float32", "float 32", "int16", "float32 ", "fp8", "sum", "halfx"}) {
    CAPTURE(junk);
    CHECK_FALSE(chorus::parse_data_type(junk).has_value());
  }
  const auto bad = static_cast<DataType>(99);
  CHECK(chorus::to_string(bad) == "unknown");
  CHECK(chorus::size_of(bad) == 0);
  CHECK_THROWS_AS(chorus::dispatch(bad, []<class T>(std::type_identity<T>) { return 0; }), chorus::Error);
}

TEST_CASE("ReduceOp: names and parsing") {
  const char* names[] = {"sum", "prod", "min", "max", "avg"};
  REQUIRE(chorus::kAllReduceOps.size() == 5);
  for (std::size_t i = 0; i < chorus::kAllReduceOps.size(); ++i) {
    const ReduceOp op = chorus::kAllReduceOps[i];
    CHECK(chorus::to_string(op) == names[i]);
    CHECK(chorus::parse_reduce_op(names[i]) == op);
  }
  for (const char* junk : {"", "SUM", "mean", "product", "sum ", "float"}) {
    CAPTURE(junk);
    CHECK_FALSE(chorus::parse_reduce_op(junk).has_value());
  }
  CHECK(chorus::to_string(static_cast<ReduceOp>(42)) == "unknown");
}

TEST_CASE("ReduceOp: bitwise ops, their names and the types they apply to") {
  const char* names[] = {"band", "bor", "bxor"};
  for (std::size_t i = 0; i < chorus::kBitwiseReduceOps.size(); ++i) {
    const ReduceOp op = chorus::kBitwiseReduceOps[i];
    CAPTURE(names[i]);
    CHECK(chorus::is_bitwise(op));
    CHECK(chorus::to_string(op) == names[i]);
    CHECK(chorus::parse_reduce_op(names[i]) == op);
    for (DataType dt : chorus::kAllDataTypes) {
      CAPTURE(chorus::to_string(dt));
      const bool integer = dt != DataType::float16 && dt != DataType::bfloat16 && dt != DataType::float32 &&
                           dt != DataType::float64 && dt != DataType::float8_e4m3 &&
                           dt != DataType::float8_e5m2;
      CHECK(chorus::is_valid_op(dt, op) == integer);
      CHECK(chorus::is_floating(dt) == !integer);
    }
  }
  for (ReduceOp op : chorus::kAllReduceOps) {
    CHECK_FALSE(chorus::is_bitwise(op));
    for (DataType dt : chorus::kAllDataTypes) CHECK(chorus::is_valid_op(dt, op));
  }
  CHECK_FALSE(chorus::is_valid_op(DataType::int32, static_cast<ReduceOp>(42)));
}

}  // namespace unit_test_types
