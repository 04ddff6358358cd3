// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// Reduction functors: one body per operator, callable on the host and (under nvcc) on the device.
/// The host loops (reduce/host.hpp) and the CUDA kernels (reduce/cuda/reduce.cuh) both call these,
/// so the element-level semantics below are the only ones there are.
///
/// ```cpp
/// float s = chorus::Sum{}(1.0f, 2.0f);                               // 3
/// chorus::float16 m = chorus::Max{}(chorus::float16(1.0f), chorus::float16(2.0f));
/// std::int32_t avg = chorus::avg_divide(std::int32_t{-7}, 2);         // -3: avg = sum, then this
/// ```

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "chorus/config.hpp"
#include "chorus/core/types.hpp"

namespace chorus {

// ---------------------------------------------------------------------------------------------
// Accumulation type
// ---------------------------------------------------------------------------------------------

/// The type arithmetic on T is carried out in: float for float16, bfloat16 and the fp8 types (no
/// hardware half-precision or fp8 instruction is used, on host or device), T itself for every
/// other element.
template <class T>
struct Accumulator {
  using type = T;
};
template <>
struct Accumulator<float16> {
  using type = float;
};
template <>
struct Accumulator<bfloat16> {
  using type = float;
};
template <>
struct Accumulator<float8_e4m3> {
  using type = float;
};
template <>
struct Accumulator<float8_e5m2> {
  using type = float;
};

template <class T>
using accumulator_t = typename Accumulator<T>::type;

/// True for float16 and bfloat16: stored in 2 bytes, computed in float.
template <class T>
inline constexpr bool kIsNarrowFloat = std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>;

/// True for float8_e4m3 and float8_e5m2: stored in 1 byte, computed in float.
template <class T>
inline constexpr bool kIsFloat8 = std::is_same_v<T, float8_e4m3> || std::is_same_v<T, float8_e5m2>;

/// True for the element types stored narrower than float and computed in float (accumulator_t):
/// float16, bfloat16, float8_e4m3, float8_e5m2.
template <class T>
inline constexpr bool kComputedInFloat = kIsNarrowFloat<T> || kIsFloat8<T>;

namespace detail {

/// Unsigned type integer arithmetic is carried out in, so that overflow wraps (modulo 2^bits)
/// instead of being undefined: at least `unsigned int`, so that int8/uint8 operands are not
/// promoted to (signed) int before a multiplication.
template <class T>
using WrapType = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;

/// Narrow float <-> its accumulator: exact widening; narrowing rounds to nearest even.
template <class T>
CHORUS_HOST_DEVICE constexpr accumulator_t<T> widen(T v) noexcept {
  if constexpr (kComputedInFloat<T>) {
    return static_cast<float>(v);
  } else {
    return v;
  }
}
template <class T>
CHORUS_HOST_DEVICE constexpr T narrow(accumulator_t<T> v) noexcept {
  if constexpr (kComputedInFloat<T>) {
    return T(v);
  } else {
    return v;
  }
}

/// Bitwise or/and of two floats of the same value: picks the sign for min(+0, -0) / max(+0, -0)
/// without a sign-bit test (a 64-bit compare, which SSE2 lacks, and the double loops would not
/// vectorise). For equal non-zero values both operands are the same bits and so is the result.
template <class F>
CHORUS_HOST_DEVICE constexpr F bits_or(F a, F b) noexcept {
  using U = std::conditional_t<sizeof(F) == 4, std::uint32_t, std::uint64_t>;
  return __builtin_bit_cast(F, static_cast<U>(__builtin_bit_cast(U, a) | __builtin_bit_cast(U, b)));
}
template <class F>
CHORUS_HOST_DEVICE constexpr F bits_and(F a, F b) noexcept {
  using U = std::conditional_t<sizeof(F) == 4, std::uint32_t, std::uint64_t>;
  return __builtin_bit_cast(F, static_cast<U>(__builtin_bit_cast(U, a) & __builtin_bit_cast(U, b)));
}

/// The canonical NaN every floating-point reduction result that is NaN becomes: positive, quiet,
/// zero payload (float 0x7fc00000, double 0x7ff8000000000000; narrowed: float16 0x7e00,
/// bfloat16 0x7fc0, float8_e4m3 0x7f, float8_e5m2 0x7e).
template <class F>
CHORUS_HOST_DEVICE constexpr F canonical_nan() noexcept {
  if constexpr (sizeof(F) == 4) {
    return __builtin_bit_cast(F, std::uint32_t{0x7fc00000u});
  } else {
    return __builtin_bit_cast(F, std::uint64_t{0x7ff8000000000000ull});
  }
}
/// `is_nan ? canonical_nan : r`. For float written as a select on the bits, for double as a
/// conditional expression: the forms g++ vectorises (the float16 loops of host.hpp keep a branch
/// with the conditional expression; for double the mask form needs a 64-bit compare SSE2 lacks).
template <class F>
CHORUS_HOST_DEVICE constexpr F nan_or(bool is_nan, F r) noexcept {
  if constexpr (sizeof(F) == 4) {
    const std::uint32_t mask = 0u - static_cast<std::uint32_t>(is_nan);
    return __builtin_bit_cast(F, (__builtin_bit_cast(std::uint32_t, r) & ~mask) | (0x7fc00000u & mask));
  } else {
    return is_nan ? canonical_nan<F>() : r;
  }
}
template <class F>
CHORUS_HOST_DEVICE constexpr F canonicalize(F r) noexcept {
  return nan_or(r != r, r);
}

}  // namespace detail

/*
 * Contract of the reduction functors
 * ----------------------------------
 * `Op{}(a, b)` combines two elements of one Element type T and returns a T. It is a pure function
 * of the two values (no state; the default floating-point environment: round to nearest even, no
 * flush to zero), with the same body on host and device. Reductions apply it elementwise with an
 * order of operands the algorithm fixes, and never reassociate across elements: that is what makes
 * every rank's result, and every run's, bit-identical.
 *
 * Integers (int8 ... uint64): sum and prod wrap modulo 2^bits, two's complement for the signed
 *   types (computed in the unsigned type, so overflow is never undefined behaviour); min and max
 *   are the numeric ones.
 *
 * float, double: sum and prod are the IEEE operations (rounded once, to nearest even). min and max
 *   are IEEE 754-2019 minimum/maximum, like torch.minimum/maximum: a NaN operand wins (NaN
 *   propagates), and -0 is below +0, so min(+0, -0) = -0 and max(+0, -0) = +0 in either order.
 *   Otherwise they return an operand unchanged.
 *
 * NaN: every floating-point result that is NaN is the canonical NaN (detail::canonical_nan:
 *   positive, quiet, zero payload), whatever the operands' signs and payloads. Hardware does not
 *   make NaN payloads reproducible: x86 keeps the first operand's NaN of two, but compilers swap
 *   the operands of `a + b` freely (so a vector body and a scalar tail disagree), and CUDA returns
 *   its own canonical NaN. Canonicalising costs one compare and blend per element and makes every
 *   functor commutative bit for bit, and host and device results identical.
 *
 * float16, bfloat16, float8_e4m3, float8_e5m2 (kComputedInFloat): widened exactly to float
 *   (accumulator_t), combined there by the float functor, and rounded back to nearest even once per
 *   operation: a reduction step (one pairwise combination) accumulates in fp32 and rounds once.
 *   float has at least 2p+2 significand bits for all four (p = 11, 8, 4, 3), so the double rounding
 *   of sum and prod is innocuous (Figueroa, 1995): the result is the correctly rounded exact a+b or
 *   a*b, as a native unit of the narrow type gives. Out of range, the narrowing rules of
 *   core/float.hpp apply: float8_e4m3 saturates at +-448, the others overflow to infinity. min and
 *   max return an operand unchanged (narrowing a widened value is exact), NaN aside.
 *
 * So every functor is commutative bit for bit; integer sum/prod and min/max are associative too,
 *   floating-point sum/prod are not, which is why algorithms fix the order of operands.
 *
 * band, bor, bxor: the bitwise operators, for the integer types only (is_valid_op in types.hpp;
 *   the communicator and the type-erased reduce() reject them for floating-point types). Their
 *   floating-point instantiations exist only so that dispatch over every type compiles; they
 *   return `a`.
 *
 * avg is not a functor: it reduces with Sum, then divides once at the end by the number of ranks
 *   (avg_divide below; finalize_avg in host.hpp and cuda/reduce.cuh), as NCCL does for integers.
 */

/// a + b (wrapping for integers).
struct Sum {
  template <class T>
  CHORUS_HOST_DEVICE constexpr T operator()(T a, T b) const noexcept {
    if constexpr (std::is_integral_v<T>) {
      using W = detail::WrapType<T>;
      return static_cast<T>(static_cast<W>(static_cast<W>(a) + static_cast<W>(b)));
    } else if constexpr (kComputedInFloat<T>) {
      return detail::narrow<T>((*this)(detail::widen(a), detail::widen(b)));
    } else {
      return detail::canonicalize(a + b);
    }
  }
};

/// a * b (wrapping for integers).
struct Prod {
  template <class T>
  CHORUS_HOST_DEVICE constexpr T operator()(T a, T b) const noexcept {
    if constexpr (std::is_integral_v<T>) {
      using W = detail::WrapType<T>;
      return static_cast<T>(static_cast<W>(static_cast<W>(a) * static_cast<W>(b)));
    } else if constexpr (kComputedInFloat<T>) {
      return detail::narrow<T>((*this)(detail::widen(a), detail::widen(b)));
    } else {
      return detail::canonicalize(a * b);
    }
  }
};

/// The smaller operand; NaN wins, -0 < +0.
struct Min {
  template <class T>
  CHORUS_HOST_DEVICE constexpr T operator()(T a, T b) const noexcept {
    if constexpr (std::is_integral_v<T>) {
      return b < a ? b : a;
    } else if constexpr (kComputedInFloat<T>) {
      return detail::narrow<T>((*this)(detail::widen(a), detail::widen(b)));
    } else if constexpr (sizeof(T) == 4) {
      // float: minps-shaped select, then the -0 of a tie or'ed in under a mask (the form g++
      // vectorises best; same result as the double branch).
      const T m = a < b ? a : b;
      const std::uint32_t tie = 0u - static_cast<std::uint32_t>(a == b);
      const T r = __builtin_bit_cast(
          T, __builtin_bit_cast(std::uint32_t, m) | (tie & __builtin_bit_cast(std::uint32_t, a)));
      return detail::nan_or(a != a || b != b, r);
    } else {
      const T r = a < b ? a : (a == b ? detail::bits_or(a, b) : b);
      return detail::nan_or(a != a || b != b, r);
    }
  }
};

/// The larger operand; NaN wins, +0 > -0.
struct Max {
  template <class T>
  CHORUS_HOST_DEVICE constexpr T operator()(T a, T b) const noexcept {
    if constexpr (std::is_integral_v<T>) {
      return a < b ? b : a;
    } else if constexpr (kComputedInFloat<T>) {
      return detail::narrow<T>((*this)(detail::widen(a), detail::widen(b)));
    } else if constexpr (sizeof(T) == 4) {
      // float: maxps-shaped select, then the +0 of a tie and'ed in under a mask (see Min).
      const T m = a > b ? a : b;
      const std::uint32_t differ = 0u - static_cast<std::uint32_t>(!(a == b));
      const T r = __builtin_bit_cast(
          T, __builtin_bit_cast(std::uint32_t, m) & (differ | __builtin_bit_cast(std::uint32_t, a)));
      return detail::nan_or(a != a || b != b, r);
    } else {
      const T r = a > b ? a : (a == b ? detail::bits_and(a, b) : b);
      return detail::nan_or(a != a || b != b, r);
    }
  }
};

/// a & b (integer types; see the contract above for the others).
struct BitAnd {
  template <class T>
  CHORUS_HOST_DEVICE constexpr T operator()(T a, T b) const noexcept {
    if constexpr (std::is_integral_v<T>) {
      return static_cast<T>(a & b);
    } else {
      return (void)b, a;
    }
  }
};

/// a | b (integer types).
struct BitOr {
  template <class T>
  CHORUS_HOST_DEVICE constexpr T operator()(T a, T b) const noexcept {
    if constexpr (std::is_integral_v<T>) {
      return static_cast<T>(a | b);
    } else {
      return (void)b, a;
    }
  }
};

/// a ^ b (integer types).
struct BitXor {
  template <class T>
  CHORUS_HOST_DEVICE constexpr T operator()(T a, T b) const noexcept {
    if constexpr (std::is_integral_v<T>) {
      return static_cast<T>(a ^ b);
    } else {
      return (void)b, a;
    }
  }
};

namespace detail {
/// Largest world size avg_divide divides a kComputedInFloat type by in float: 2^p, so that every
/// integer up to it is exact in the narrow type (p = 11, 8, 4 and 3 significand bits for float16,
/// bfloat16, float8_e4m3, float8_e5m2), and then float (24 >= 2p + 1 bits) rounds the quotient
/// innocuously (Figueroa, 1995).
template <class T>
inline constexpr int kAvgFloatDivisionLimit = std::is_same_v<T, float16>       ? 2048
                                              : std::is_same_v<T, bfloat16>    ? 256
                                              : std::is_same_v<T, float8_e4m3> ? 16
                                                                               : 8;
}  // namespace detail

/// One element of avg's final step, x / world_size (precondition: world_size >= 1); NaN in, the
/// canonical NaN out.
/// Integers: division truncating toward zero (C++ `/`, as NCCL and torch), on the wrapped sum.
/// float, double: a true division by the world size, which is exact in the type (world sizes below
/// 2^24 for float): the correctly rounded quotient. Not a multiplication by the reciprocal, which
/// rounds twice and misses by an ulp (float: 5 / 3 = 1.66666663, but 5 * (1 / 3) = 1.66666675).
/// float16, bfloat16, fp8: the correctly rounded quotient for every world size, rounded once: divided
/// in float up to kAvgFloatDivisionLimit, beyond that in double (a narrow value over a 31-bit
/// integer is never within double precision of a rounding midpoint without being on it).
template <class T>
CHORUS_HOST_DEVICE constexpr T avg_divide(T x, int world_size) noexcept {
  if constexpr (std::is_integral_v<T>) {
    if constexpr (std::is_signed_v<T>) {
      return static_cast<T>(static_cast<std::int64_t>(x) / static_cast<std::int64_t>(world_size));
    } else {
      return static_cast<T>(static_cast<std::uint64_t>(x) / static_cast<std::uint64_t>(world_size));
    }
  } else if constexpr (kComputedInFloat<T>) {
    if (world_size <= detail::kAvgFloatDivisionLimit<T>) {
      return detail::narrow<T>(avg_divide(detail::widen(x), world_size));
    }
    return T(avg_divide(static_cast<double>(detail::widen(x)), world_size));
  } else {
    return detail::canonicalize(x / static_cast<T>(world_size));
  }
}

}  // namespace chorus
