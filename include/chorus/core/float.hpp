// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// The element types narrower than float, stored as their encodings and computed in float:
/// float16 (IEEE binary16), bfloat16, and the two 8-bit formats of the OCP FP8 specification,
/// float8_e4m3 (E4M3, no infinities) and float8_e5m2 (E5M2). Conversions are software only,
/// constexpr and CHORUS_HOST_DEVICE, so host and device give the same bits.
///
/// ```cpp
/// chorus::float16 h(0.1f);                    // nearest binary16
/// chorus::float8_e4m3 q(1000.0f);             // saturates: 448
/// float back = chorus::float8_e5m2(3.3f);     // 3.5 (2 mantissa bits)
/// ```

#include <bit>
#include <cstdint>
#include <type_traits>

#include "chorus/config.hpp"

namespace chorus {

// ---------------------------------------------------------------------------------------------
// float16 and bfloat16 (and the conversions the fp8 types share)
// ---------------------------------------------------------------------------------------------

namespace detail {

/// Bit casts usable on host and device (std::bit_cast is not device-callable; nvcc's front end
/// and g++ both provide __builtin_bit_cast).
CHORUS_HOST_DEVICE constexpr std::uint32_t bits_of(float f) noexcept {
#if CHORUS_DEVICE_COMPILE
  return __builtin_bit_cast(std::uint32_t, f);
#else
  return std::bit_cast<std::uint32_t>(f);
#endif
}

CHORUS_HOST_DEVICE constexpr float float_from_bits(std::uint32_t u) noexcept {
#if CHORUS_DEVICE_COMPILE
  return __builtin_bit_cast(float, u);
#else
  return std::bit_cast<float>(u);
#endif
}

/// float -> binary16, round to nearest, ties to even (contract: the block comment above struct
/// float16, further down).
CHORUS_HOST_DEVICE constexpr std::uint16_t float_to_half_bits(float f) noexcept {
  const std::uint32_t u = bits_of(f);
  const auto sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t a = u & 0x7fffffffu;  // magnitude bits
  if (a > 0x7f800000u) {
    // NaN: keep the sign and the top payload bits, force the quiet bit.
    return static_cast<std::uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x03ffu));
  }
  if (a >= 0x477ff000u) {
    // >= 65520, the midpoint between 65504 (largest half, odd mantissa) and 65536: the tie goes
    // to the even neighbour, 65536, which is out of range: infinity. Also covers +-inf.
    return static_cast<std::uint16_t>(sign | 0x7c00u);
  }
  if (a >= 0x38800000u) {
    // Normal half (>= 2^-14): rebias the exponent (127 -> 15), drop 13 mantissa bits rounding to
    // nearest even. A carry out of the mantissa correctly bumps the exponent.
    std::uint32_t h = (a - 0x38000000u) >> 13;
    const std::uint32_t rest = a & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u) != 0)) ++h;
    return static_cast<std::uint16_t>(sign | h);
  }
  if (a <= 0x33000000u) {
    // <= 2^-25, half the smallest subnormal (2^-24): rounds to (signed) zero; the tie goes to 0.
    return sign;
  }
  // Subnormal half: value = m * 2^(e-150) with the implicit bit in m; in units of 2^-24 that is
  // m >> (126 - e), shift in [14, 24]. Rounding up from 0x3ff gives 0x400, the smallest normal.
  const std::uint32_t e = a >> 23;
  const std::uint32_t m = (a & 0x007fffffu) | 0x00800000u;
  const std::uint32_t shift = 126u - e;
  std::uint32_t h = m >> shift;
  const std::uint32_t rest = m & ((1u << shift) - 1u);
  const std::uint32_t half_way = 1u << (shift - 1u);
  if (rest > half_way || (rest == half_way && (h & 1u) != 0)) ++h;
  return static_cast<std::uint16_t>(sign | h);
}

/// binary16 -> float, exact.
CHORUS_HOST_DEVICE constexpr float half_bits_to_float(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  const std::uint32_t man = h & 0x03ffu;
  if (exp == 0x1fu) return float_from_bits(sign | 0x7f800000u | (man << 13));  // inf, NaN payload kept
  if (exp != 0) return float_from_bits(sign | ((exp + 112u) << 23) | (man << 13));
  // Zero or subnormal: man * 2^-24, exact in float (man < 2^10, scaling by a power of two).
  const float mag = static_cast<float>(man) * 5.9604644775390625e-8f;  // 2^-24
  return float_from_bits(sign | bits_of(mag));
}

/// float -> bfloat16, round to nearest, ties to even.
CHORUS_HOST_DEVICE constexpr std::uint16_t float_to_bfloat16_bits(float f) noexcept {
  const std::uint32_t u = bits_of(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    // NaN: keep the sign and the top payload bits, force the quiet bit.
    return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
  }
  // Adding 0x7fff (+1 when the kept lsb is odd) carries into bit 16 exactly when the dropped half
  // is above the midpoint, or at it with an odd kept part. A carry out of the largest finite
  // magnitude yields infinity; subnormals need no special case; infinity maps to itself.
  const std::uint32_t bias = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>((u + bias) >> 16);
}

/// bfloat16 -> float, exact (bfloat16 is the top half of a float).
CHORUS_HOST_DEVICE constexpr float bfloat16_bits_to_float(std::uint16_t b) noexcept {
  return float_from_bits(static_cast<std::uint32_t>(b) << 16);
}

/// Number of significant bits of x (0 for 0). A loop, so that it is callable on the device.
CHORUS_HOST_DEVICE constexpr int bit_width_u64(std::uint64_t x) noexcept {
  int n = 0;
  while (x != 0) {
    x >>= 1;
    ++n;
  }
  return n;
}

/// Converts to float rounding to odd: truncate toward zero and, if anything was dropped, set the
/// lowest mantissa bit. Rounding to odd into a format with at least 2 more significand bits than
/// the final one and then rounding to nearest even gives the correctly rounded final result
/// (Boldo & Melquiond), so double and 64-bit integers reach float16/bfloat16 in one rounding.
CHORUS_HOST_DEVICE constexpr float to_float_round_to_odd(double d) noexcept {
  const float f = static_cast<float>(d);
  const double back = static_cast<double>(f);
  if (back == d || d != d) return f;  // exact, or NaN (already quiet after the conversion)
  std::uint32_t u = bits_of(f);
  const bool too_big = (d > 0) ? (back > d) : (back < d);
  if (too_big) --u;  // one step toward zero in magnitude (sign-magnitude encoding)
  return float_from_bits(u | 1u);
}

template <class I>
CHORUS_HOST_DEVICE constexpr float integer_to_float_round_to_odd(I i) noexcept {
  bool negative = false;
  if constexpr (std::is_signed_v<I>) negative = i < 0;
  // |i| as unsigned, without overflow for the most negative value.
  const std::uint64_t mag =
      negative ? std::uint64_t{0} - static_cast<std::uint64_t>(i) : static_cast<std::uint64_t>(i);
  const int width = bit_width_u64(mag);
  float r = 0.0f;
  if (width <= 24) {
    r = static_cast<float>(mag);  // exact
  } else {
    const int shift = width - 24;
    std::uint64_t m = mag >> shift;
    if ((mag & ((std::uint64_t{1} << shift) - 1u)) != 0) m |= 1u;               // sticky -> odd
    r = static_cast<float>(m) * static_cast<float>(std::uint64_t{1} << shift);  // both exact
  }
  return negative ? -r : r;
}

/// Any arithmetic value the 2-byte float types can be constructed from, as a float that rounds
/// correctly on the second step (see to_float_round_to_odd).
template <class T>
CHORUS_HOST_DEVICE constexpr float to_float_for_narrowing(T v) noexcept {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else if constexpr (std::is_same_v<T, double>) {
    return to_float_round_to_odd(v);
  } else {
    return integer_to_float_round_to_odd(v);
  }
}

template <class T>
concept NarrowingSource = std::is_same_v<T, float> || std::is_same_v<T, double> ||
    (std::is_integral_v<T> && !std::is_same_v<T, bool> && sizeof(T) <= 8);

/// float -> an 8-bit format with M mantissa bits and exponent bias B, for |f| (bits a) below the
/// format's overflow point: round to nearest, ties to even, subnormals included (no flush to zero).
/// A carry out of the mantissa bumps the exponent, as in float_to_half_bits.
template <int M, int B>
CHORUS_HOST_DEVICE constexpr std::uint8_t round_to_fp8_magnitude(std::uint32_t a) noexcept {
  constexpr std::uint32_t kMinNormal = static_cast<std::uint32_t>(127 + 1 - B) << 23;    // 2^(1-B)
  constexpr std::uint32_t kHalfQuantum = static_cast<std::uint32_t>(127 - B - M) << 23;  // 2^(-B-M)
  if (a >= kMinNormal) {
    constexpr std::uint32_t kDrop = 23u - M;
    std::uint32_t h = (a - (static_cast<std::uint32_t>(127 - B) << 23)) >> kDrop;
    const std::uint32_t rest = a & ((1u << kDrop) - 1u);
    const std::uint32_t half_way = 1u << (kDrop - 1u);
    if (rest > half_way || (rest == half_way && (h & 1u) != 0)) ++h;
    return static_cast<std::uint8_t>(h);
  }
  if (a <= kHalfQuantum) return 0;  // at most half the smallest subnormal: zero (the tie goes to 0)
  // Subnormal: value = m * 2^(e-150) with the implicit bit in m; in units of the smallest
  // subnormal 2^(1-B-M) that is m >> (151 - B - M - e). Rounding up from the largest subnormal
  // gives the smallest normal.
  const std::uint32_t e = a >> 23;
  const std::uint32_t m = (a & 0x007fffffu) | 0x00800000u;
  const std::uint32_t shift = static_cast<std::uint32_t>(151 - B - M) - e;
  std::uint32_t h = m >> shift;
  const std::uint32_t rest = m & ((1u << shift) - 1u);
  const std::uint32_t half_way = 1u << (shift - 1u);
  if (rest > half_way || (rest == half_way && (h & 1u) != 0)) ++h;
  return static_cast<std::uint8_t>(h);
}

/// float -> float8_e4m3 (contract: the block comment above struct float8_e4m3).
CHORUS_HOST_DEVICE constexpr std::uint8_t float_to_e4m3_bits(float f) noexcept {
  const std::uint32_t u = bits_of(f);
  const auto sign = static_cast<std::uint8_t>((u >> 24) & 0x80u);
  const std::uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<std::uint8_t>(sign | 0x7fu);   // NaN: the one NaN encoding
  if (a >= 0x43e00000u) return static_cast<std::uint8_t>(sign | 0x7eu);  // >= 448, inf: saturate to 448
  return static_cast<std::uint8_t>(sign | round_to_fp8_magnitude<3, 7>(a));
}

/// float8_e4m3 -> float, exact.
CHORUS_HOST_DEVICE constexpr float e4m3_bits_to_float(std::uint8_t b) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(b & 0x80u) << 24;
  const std::uint32_t exp = (b >> 3) & 0x0fu;
  const std::uint32_t man = b & 0x07u;
  if (exp == 0x0fu && man == 0x07u) return float_from_bits(sign | 0x7fc00000u);  // NaN
  if (exp != 0) return float_from_bits(sign | ((exp + 120u) << 23) | (man << 20));
  const float mag = static_cast<float>(man) * 0.001953125f;  // man * 2^-9, exact
  return float_from_bits(sign | bits_of(mag));
}

/// float -> float8_e5m2 (contract: the block comment above struct float8_e4m3).
CHORUS_HOST_DEVICE constexpr std::uint8_t float_to_e5m2_bits(float f) noexcept {
  const std::uint32_t u = bits_of(f);
  const auto sign = static_cast<std::uint8_t>((u >> 24) & 0x80u);
  const std::uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) {
    // NaN: keep the sign and the top payload bit, force the quiet bit.
    return static_cast<std::uint8_t>(sign | 0x7eu | ((a >> 21) & 0x01u));
  }
  // >= 61440, the midpoint between 57344 (largest finite, odd mantissa) and 65536: the tie goes
  // to the even neighbour, 65536, which is out of range: infinity. Also covers +-inf.
  if (a >= 0x47700000u) return static_cast<std::uint8_t>(sign | 0x7cu);
  return static_cast<std::uint8_t>(sign | round_to_fp8_magnitude<2, 15>(a));
}

/// float8_e5m2 -> float, exact (an E5M2 value is the top byte of a binary16).
CHORUS_HOST_DEVICE constexpr float e5m2_bits_to_float(std::uint8_t b) noexcept {
  return half_bits_to_float(static_cast<std::uint16_t>(b << 8));
}

}  // namespace detail

/*
 * Contract of the float16 / bfloat16 conversions
 * ----------------------------------------------
 * Storage: `bits` holds the IEEE 754 binary16 encoding (float16: 1 sign, 5 exponent, 10 mantissa
 * bits) or the bfloat16 encoding (the top 16 bits of a binary32: 1 sign, 8 exponent, 7 mantissa).
 * Both types are trivially copyable, 2 bytes, and their default constructor leaves `bits`
 * uninitialised, like a built-in arithmetic type; `from_bits` builds one from an encoding.
 *
 * Narrowing (explicit constructor from float, double or an integer of at most 64 bits):
 *   - rounds to nearest, ties to even, whatever the current floating-point rounding mode;
 *   - magnitudes at or beyond the midpoint between the largest finite value and the next power
 *     of two become infinity with the input's sign (float16: |x| >= 65520), as IEEE requires;
 *   - results below the smallest normal are rounded into the subnormal range, down to signed
 *     zero (no flush to zero);
 *   - signed zeros and infinities keep their sign;
 *   - NaN becomes a quiet NaN with the input's sign and the top bits of its payload.
 *   double and integer inputs are rounded once (via round-to-odd into float), never twice.
 *
 * Widening (`operator float`): exact for every encoding: subnormals become normal floats,
 * infinities and signed zeros are preserved, NaN stays NaN with its sign and payload.
 *
 * Comparisons and arithmetic go through the implicit conversion to float, so they follow float
 * semantics (+0 == -0, NaN unordered). Compare `bits` for bitwise identity.
 *
 * Everything is constexpr and CHORUS_HOST_DEVICE; no hardware half-precision instruction is used,
 * so host and device give bit-identical results.
 */

/// IEEE 754 binary16.
struct float16 {
  std::uint16_t bits;

  float16() = default;

  template <detail::NarrowingSource T>
  CHORUS_HOST_DEVICE constexpr explicit float16(T v) noexcept
      : bits(detail::float_to_half_bits(detail::to_float_for_narrowing(v))) {}

  CHORUS_HOST_DEVICE static constexpr float16 from_bits(std::uint16_t b) noexcept {
    float16 h;
    h.bits = b;
    return h;
  }

  CHORUS_HOST_DEVICE constexpr operator float() const noexcept { return detail::half_bits_to_float(bits); }
};

/// bfloat16 ("brain float"): the top half of an IEEE binary32.
struct bfloat16 {
  std::uint16_t bits;

  bfloat16() = default;

  template <detail::NarrowingSource T>
  CHORUS_HOST_DEVICE constexpr explicit bfloat16(T v) noexcept
      : bits(detail::float_to_bfloat16_bits(detail::to_float_for_narrowing(v))) {}

  CHORUS_HOST_DEVICE static constexpr bfloat16 from_bits(std::uint16_t b) noexcept {
    bfloat16 h;
    h.bits = b;
    return h;
  }

  CHORUS_HOST_DEVICE constexpr operator float() const noexcept {
    return detail::bfloat16_bits_to_float(bits);
  }
};

static_assert(sizeof(float16) == 2 && alignof(float16) == 2);
static_assert(sizeof(bfloat16) == 2 && alignof(bfloat16) == 2);
static_assert(std::is_trivially_copyable_v<float16> && std::is_trivial_v<float16>);
static_assert(std::is_trivially_copyable_v<bfloat16> && std::is_trivial_v<bfloat16>);
static_assert(std::is_standard_layout_v<float16> && std::is_standard_layout_v<bfloat16>);

/*
 * Contract of the float8_e4m3 / float8_e5m2 conversions
 * ------------------------------------------------------
 * Storage: `bits` holds the OCP FP8 encoding. float8_e4m3 (E4M3): 1 sign, 4 exponent (bias 7),
 * 3 mantissa bits; largest finite 448, smallest subnormal 2^-9; no infinities, and one NaN
 * encoding per sign (S.1111.111). float8_e5m2 (E5M2): 1 sign, 5 exponent (bias 15), 2 mantissa
 * bits, the top byte of a binary16; largest finite 57344, smallest subnormal 2^-16; infinities and
 * NaNs as in IEEE 754. These are the encodings of CUDA's __nv_fp8_e4m3 / __nv_fp8_e5m2, NCCL's
 * ncclFloat8e4m3 / ncclFloat8e5m2 and torch's float8_e4m3fn / float8_e5m2.
 *
 * Narrowing (explicit constructor from float, double or an integer of at most 64 bits): round to
 * nearest, ties to even, with subnormals (no flush to zero), signed zeros kept; double and integer
 * inputs rounded once (round-to-odd into float first, as for float16). Out of range:
 *   - float8_e4m3 saturates: every magnitude above 448, infinities included, becomes +-448, as
 *     CUDA's __nv_fp8_e4m3 constructor (__NV_SATFINITE) and NCCL's reductions do (torch's
 *     float8_e4m3fn gives NaN instead);
 *   - float8_e5m2 overflows to infinity as IEEE and float16 do: magnitudes at or beyond 61440 (the
 *     midpoint above 57344), and infinities, become +-inf (CUDA's __NV_NOSAT; torch's float8_e5m2).
 *   NaN becomes NaN with the input's sign (E5M2: quiet, with the top payload bit).
 *
 * Widening (`operator float`): exact for every encoding (E4M3's NaN gives a quiet float NaN).
 * Comparisons and arithmetic go through float, as for float16.
 */

/// OCP FP8 E4M3: 8 bits, max 448, no infinities.
struct float8_e4m3 {
  std::uint8_t bits;

  float8_e4m3() = default;

  template <detail::NarrowingSource T>
  CHORUS_HOST_DEVICE constexpr explicit float8_e4m3(T v) noexcept
      : bits(detail::float_to_e4m3_bits(detail::to_float_for_narrowing(v))) {}

  CHORUS_HOST_DEVICE static constexpr float8_e4m3 from_bits(std::uint8_t b) noexcept {
    float8_e4m3 h;
    h.bits = b;
    return h;
  }

  CHORUS_HOST_DEVICE constexpr operator float() const noexcept { return detail::e4m3_bits_to_float(bits); }
};

/// OCP FP8 E5M2: 8 bits, max 57344, with infinities.
struct float8_e5m2 {
  std::uint8_t bits;

  float8_e5m2() = default;

  template <detail::NarrowingSource T>
  CHORUS_HOST_DEVICE constexpr explicit float8_e5m2(T v) noexcept
      : bits(detail::float_to_e5m2_bits(detail::to_float_for_narrowing(v))) {}

  CHORUS_HOST_DEVICE static constexpr float8_e5m2 from_bits(std::uint8_t b) noexcept {
    float8_e5m2 h;
    h.bits = b;
    return h;
  }

  CHORUS_HOST_DEVICE constexpr operator float() const noexcept { return detail::e5m2_bits_to_float(bits); }
};

static_assert(sizeof(float8_e4m3) == 1 && sizeof(float8_e5m2) == 1);
static_assert(std::is_trivial_v<float8_e4m3> && std::is_trivial_v<float8_e5m2>);
static_assert(std::is_standard_layout_v<float8_e4m3> && std::is_standard_layout_v<float8_e5m2>);

}  // namespace chorus
