// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// Element vocabulary: DataType, ReduceOp, the 2-byte float types float16 and bfloat16, and the
/// traits that map between C++ element types and DataType values.
///
/// ```cpp
/// static_assert(chorus::data_type_of<float> == chorus::DataType::float32);
/// auto dt = chorus::parse_data_type("half");            // DataType::float16
/// std::size_t bytes = count * chorus::size_of(*dt);
/// chorus::dispatch(*dt, [&]<class T>(std::type_identity<T>) { fill<T>(buf, count); });
/// ```

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

#include "chorus/config.hpp"
#include "chorus/core/error.hpp"

namespace chorus {

// ---------------------------------------------------------------------------------------------
// DataType
// ---------------------------------------------------------------------------------------------

/// The element types every collective accepts (the same set as NCCL minus fp8).
enum class DataType { int8, uint8, int32, uint32, int64, uint64, float16, bfloat16, float32, float64 };

inline constexpr std::array<DataType, 10> kAllDataTypes = {
    DataType::int8,    DataType::uint8,   DataType::int32,    DataType::uint32,  DataType::int64,
    DataType::uint64,  DataType::float16, DataType::bfloat16, DataType::float32, DataType::float64,
};

/// Bytes per element; 0 for a value outside the enumeration.
constexpr std::size_t size_of(DataType t) noexcept {
  switch (t) {
    case DataType::int8: case DataType::uint8: return 1;
    case DataType::float16: case DataType::bfloat16: return 2;
    case DataType::int32: case DataType::uint32: case DataType::float32: return 4;
    case DataType::int64: case DataType::uint64: case DataType::float64: return 8;
  }
  return 0;
}

/// The canonical name ("int8", ..., "float16", "bfloat16", "float32", "float64"); "unknown" for a
/// value outside the enumeration.
constexpr std::string_view to_string(DataType t) noexcept {
  switch (t) {
    case DataType::int8: return "int8";
    case DataType::uint8: return "uint8";
    case DataType::int32: return "int32";
    case DataType::uint32: return "uint32";
    case DataType::int64: return "int64";
    case DataType::uint64: return "uint64";
    case DataType::float16: return "float16";
    case DataType::bfloat16: return "bfloat16";
    case DataType::float32: return "float32";
    case DataType::float64: return "float64";
  }
  return "unknown";
}

/// Parses a canonical name, or one of the nccl-tests spellings: "char" (int8), "int" (int32),
/// "uint" (uint32), "half" (float16), "bf16" (bfloat16), "float" (float32), "double" (float64).
/// Case-sensitive; nullopt for anything else.
constexpr std::optional<DataType> parse_data_type(std::string_view s) noexcept {
  for (DataType t : kAllDataTypes) {
    if (s == to_string(t)) return t;
  }
  if (s == "char") return DataType::int8;
  if (s == "int") return DataType::int32;
  if (s == "uint") return DataType::uint32;
  if (s == "half") return DataType::float16;
  if (s == "bf16") return DataType::bfloat16;
  if (s == "float") return DataType::float32;
  if (s == "double") return DataType::float64;
  return std::nullopt;
}

// ---------------------------------------------------------------------------------------------
// ReduceOp
// ---------------------------------------------------------------------------------------------

/// Reduction operators. avg is sum followed by division by the number of ranks. band, bor and
/// bxor (bitwise and, or, exclusive or) apply to the integer types only (is_valid_op).
/// premul_sum (NCCL's ncclRedOpCreatePreMulSum): each rank's input multiplied by the call's scalar
/// (Call::scalar: one element of the call's dtype, which each rank gives for itself), rounded once,
/// then summed; floating-point types only. It needs its scalar, so it is in neither list below,
/// and only the calls that take a chorus::Call carry it (Communicator::start, persistent).
enum class ReduceOp { sum, prod, min, max, avg, band, bor, bxor, premul_sum };

/// The arithmetic operators, valid for every DataType.
inline constexpr std::array<ReduceOp, 5> kAllReduceOps = {
    ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max, ReduceOp::avg,
};

/// The bitwise operators, valid for the integer DataTypes only.
inline constexpr std::array<ReduceOp, 3> kBitwiseReduceOps = {ReduceOp::band, ReduceOp::bor, ReduceOp::bxor};

constexpr bool is_bitwise(ReduceOp op) noexcept {
  return op == ReduceOp::band || op == ReduceOp::bor || op == ReduceOp::bxor;
}

/// "sum", "prod", "min", "max", "avg"; "unknown" for a value outside the enumeration.
constexpr std::string_view to_string(ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::prod: return "prod";
    case ReduceOp::min: return "min";
    case ReduceOp::max: return "max";
    case ReduceOp::avg: return "avg";
    case ReduceOp::band: return "band";
    case ReduceOp::bor: return "bor";
    case ReduceOp::bxor: return "bxor";
    case ReduceOp::premul_sum: return "premul_sum";
  }
  return "unknown";
}

/// Parses the names to_string gives (case-sensitive); nullopt for anything else.
constexpr std::optional<ReduceOp> parse_reduce_op(std::string_view s) noexcept {
  for (ReduceOp op : kAllReduceOps) {
    if (s == to_string(op)) return op;
  }
  for (ReduceOp op : kBitwiseReduceOps) {
    if (s == to_string(op)) return op;
  }
  if (s == to_string(ReduceOp::premul_sum)) return ReduceOp::premul_sum;
  return std::nullopt;
}

// ---------------------------------------------------------------------------------------------
// float16 and bfloat16
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
  const std::uint64_t mag = negative ? std::uint64_t{0} - static_cast<std::uint64_t>(i)
                                     : static_cast<std::uint64_t>(i);
  const int width = bit_width_u64(mag);
  float r = 0.0f;
  if (width <= 24) {
    r = static_cast<float>(mag);  // exact
  } else {
    const int shift = width - 24;
    std::uint64_t m = mag >> shift;
    if ((mag & ((std::uint64_t{1} << shift) - 1u)) != 0) m |= 1u;  // sticky -> odd
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

  CHORUS_HOST_DEVICE constexpr operator float() const noexcept { return detail::bfloat16_bits_to_float(bits); }
};

static_assert(sizeof(float16) == 2 && alignof(float16) == 2);
static_assert(sizeof(bfloat16) == 2 && alignof(bfloat16) == 2);
static_assert(std::is_trivially_copyable_v<float16> && std::is_trivial_v<float16>);
static_assert(std::is_trivially_copyable_v<bfloat16> && std::is_trivial_v<bfloat16>);
static_assert(std::is_standard_layout_v<float16> && std::is_standard_layout_v<bfloat16>);

// ---------------------------------------------------------------------------------------------
// Traits: C++ element type <-> DataType
// ---------------------------------------------------------------------------------------------

namespace detail {
template <class T>
inline constexpr bool kIsElement =
    std::is_same_v<T, std::int8_t> || std::is_same_v<T, std::uint8_t> || std::is_same_v<T, std::int32_t> ||
    std::is_same_v<T, std::uint32_t> || std::is_same_v<T, std::int64_t> || std::is_same_v<T, std::uint64_t> ||
    std::is_same_v<T, float16> || std::is_same_v<T, bfloat16> || std::is_same_v<T, float> ||
    std::is_same_v<T, double>;
}  // namespace detail

/// True for exactly the ten element types (unqualified): std::int8_t, std::uint8_t, std::int32_t,
/// std::uint32_t, std::int64_t, std::uint64_t, float16, bfloat16, float, double. Note that `char`
/// and (where int64_t is `long`) `long long` are distinct types and not elements.
template <class T>
concept Element = detail::kIsElement<T>;

namespace detail {
template <Element T>
consteval DataType data_type_of_impl() {
  if constexpr (std::is_same_v<T, std::int8_t>) return DataType::int8;
  else if constexpr (std::is_same_v<T, std::uint8_t>) return DataType::uint8;
  else if constexpr (std::is_same_v<T, std::int32_t>) return DataType::int32;
  else if constexpr (std::is_same_v<T, std::uint32_t>) return DataType::uint32;
  else if constexpr (std::is_same_v<T, std::int64_t>) return DataType::int64;
  else if constexpr (std::is_same_v<T, std::uint64_t>) return DataType::uint64;
  else if constexpr (std::is_same_v<T, float16>) return DataType::float16;
  else if constexpr (std::is_same_v<T, bfloat16>) return DataType::bfloat16;
  else if constexpr (std::is_same_v<T, float>) return DataType::float32;
  else return DataType::float64;
}

template <DataType D> struct ElementOf;
template <> struct ElementOf<DataType::int8> { using type = std::int8_t; };
template <> struct ElementOf<DataType::uint8> { using type = std::uint8_t; };
template <> struct ElementOf<DataType::int32> { using type = std::int32_t; };
template <> struct ElementOf<DataType::uint32> { using type = std::uint32_t; };
template <> struct ElementOf<DataType::int64> { using type = std::int64_t; };
template <> struct ElementOf<DataType::uint64> { using type = std::uint64_t; };
template <> struct ElementOf<DataType::float16> { using type = float16; };
template <> struct ElementOf<DataType::bfloat16> { using type = bfloat16; };
template <> struct ElementOf<DataType::float32> { using type = float; };
template <> struct ElementOf<DataType::float64> { using type = double; };
}  // namespace detail

/// The DataType of an element type: `data_type_of<float> == DataType::float32`.
template <Element T>
inline constexpr DataType data_type_of = detail::data_type_of_impl<T>();

/// The element type of a DataType: `element_t<DataType::bfloat16>` is `bfloat16`.
template <DataType D>
using element_t = typename detail::ElementOf<D>::type;

/// Runtime-to-compile-time dispatch: calls `f(std::type_identity<T>{})` with T = element_t<t> and
/// returns its result (every instantiation must return the same type). Throws
/// Error(invalid_argument) for a value outside the enumeration.
///
/// ```cpp
/// std::size_t n = chorus::dispatch(dt, []<class T>(std::type_identity<T>) { return sizeof(T); });
/// ```
template <class F>
constexpr decltype(auto) dispatch(DataType t, F&& f) {
  switch (t) {
    case DataType::int8: return static_cast<F&&>(f)(std::type_identity<std::int8_t>{});
    case DataType::uint8: return static_cast<F&&>(f)(std::type_identity<std::uint8_t>{});
    case DataType::int32: return static_cast<F&&>(f)(std::type_identity<std::int32_t>{});
    case DataType::uint32: return static_cast<F&&>(f)(std::type_identity<std::uint32_t>{});
    case DataType::int64: return static_cast<F&&>(f)(std::type_identity<std::int64_t>{});
    case DataType::uint64: return static_cast<F&&>(f)(std::type_identity<std::uint64_t>{});
    case DataType::float16: return static_cast<F&&>(f)(std::type_identity<float16>{});
    case DataType::bfloat16: return static_cast<F&&>(f)(std::type_identity<bfloat16>{});
    case DataType::float32: return static_cast<F&&>(f)(std::type_identity<float>{});
    case DataType::float64: return static_cast<F&&>(f)(std::type_identity<double>{});
  }
  throw Error(ErrorCode::invalid_argument,
              "DataType value " + std::to_string(static_cast<int>(t)) + " is not a valid DataType");
}

/// Whether `op` applies to elements of type `dt`: the arithmetic operators to every type, the
/// bitwise ones to the integer types (int8 ... uint64) only, premul_sum to the floating-point
/// types (float16, bfloat16, float32, float64) only.
constexpr bool is_valid_op(DataType dt, ReduceOp op) noexcept {
  if (op == ReduceOp::premul_sum)
    return dt == DataType::float16 || dt == DataType::bfloat16 || dt == DataType::float32 || dt == DataType::float64;
  if (!is_bitwise(op)) return to_string(op) != "unknown";
  switch (dt) {
    case DataType::int8: case DataType::uint8: case DataType::int32: case DataType::uint32:
    case DataType::int64: case DataType::uint64: return true;
    default: return false;
  }
}

}  // namespace chorus
