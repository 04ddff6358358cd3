// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// Host reduction loops: elementwise `out[i] = op(a[i], b[i])` over host memory, typed and
/// type-erased, and avg's final division.
///
/// ```cpp
/// chorus::reduce_into<chorus::Sum>(acc, incoming, n);                 // acc[i] += incoming[i]
/// chorus::reduce(chorus::ReduceOp::max, chorus::DataType::bfloat16, out, a, b, count);
/// chorus::finalize_avg(chorus::DataType::float32, acc, count, world_size);
/// ```
///
/// Determinism: each element is combined on its own, in the operand order given (a before b), by
/// the functors of ops.hpp; nothing is reassociated across elements. Splitting a range into pieces
/// and reducing each gives the same bits as one call, and the vector body, the scalar tail and the
/// CUDA kernel give the same bits for the same element.
///
/// What vectorises (g++ 12, default x86-64 target = SSE2; checked with -fopt-info-vec-optimized at
/// -O2 and -O3, in a TU of its own and in the many-instantiation TU of bench/micro/reduce_bench):
///   GCC 12 at -O2 uses the "very cheap" cost model, which refuses loops with an unknown trip count
///   (they would need a scalar epilogue or alias versioning). So every loop is cut into blocks of
///   HostReduceTuning::kBlockBytes with a constant-trip inner loop, plus a scalar tail; pointers
///   are __restrict (with separate kernels for out == a and out == b); the kernels are
///   [[gnu::flatten]] so the per-element code is inlined wherever they are instantiated:
///   - sum, prod, min, max for float, double, int8, uint8, int32, uint32 (16-byte vectors);
///   - sum for int64, uint64; their prod, min and max stay scalar (SSE2 has no 64-bit multiply
///     or compare);
///   - sum, prod, min, max for float16 and bfloat16, through the branch-free conversions below
///     (types.hpp's float16 conversions branch and shift by per-element amounts, so they do not
///     vectorise; these are bit-identical, checked over all 2^32 floats and 2^16 halves). SSE2 has
///     no 16 <-> 32-bit conversions, so this is slow (~35 instructions an element for float16);
///     on CPUs with AVX2 and F16C (checked once at run time) whole blocks instead go through a
///     float buffer with vcvtph2ps / vcvtps2ph (float16) or 32-byte vectors (bfloat16): about
///     17x (float16) and 2.4x (bfloat16) faster, same bits;
///   - finalize_avg for float, double, float16 and bfloat16 (world sizes up to 2048 / 256 for the
///     narrow ones); integer division has no SIMD instruction and stays scalar;
///   - nothing for fp8, whose loops look their results up in tables (reduce/fp8.hpp).
/// The scalar tail and the vector body compute the same operations, so the bits do not depend on
/// where a block boundary falls. FP contraction (-ffp-contract=fast, the GNU-mode default) changes
/// nothing: each op is one operation, and the one multiply-subtract in float_to_half_bits_v is
/// exact either way.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "chorus/config.hpp"
#include "chorus/core/error.hpp"
#include "chorus/core/types.hpp"
#include "chorus/reduce/fp8.hpp"
#include "chorus/reduce/ops.hpp"

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#define CHORUS_DETAIL_HOST_X86_NARROW 1
#else
#define CHORUS_DETAIL_HOST_X86_NARROW 0
#endif

namespace chorus {

/// Host loop tuning.
struct HostReduceTuning {
  /// Bytes per vectorised block: the inner loop runs kBlockBytes / sizeof(T) iterations, a
  /// multiple of every vector width. Remainders (count % block) run in a scalar tail.
  static constexpr std::size_t kBlockBytes = 256;
};

// ---------------------------------------------------------------------------------------------
// Typed entry points
// ---------------------------------------------------------------------------------------------

/// out[i] = Op{}(a[i], b[i]) for i < n. out may be a or b (or both), or none of them; any other
/// overlap is a precondition violation (the loop then runs in index order).
template <class Op, Element T>
void reduce_to(T* out, const T* a, const T* b, std::size_t n);

/// inout[i] = Op{}(inout[i], in[i]) for i < n (in may equal inout).
template <class Op, Element T>
void reduce_into(T* inout, const T* in, std::size_t n);

/// data[i] = avg_divide(data[i], world_size): the last step of avg (see ops.hpp).
/// Throws Error(invalid_argument) when world_size < 1.
template <Element T>
void finalize_avg(T* data, std::size_t n, int world_size);

// ---------------------------------------------------------------------------------------------
// Type-erased entry points. avg reduces as sum; the caller runs finalize_avg once at the end.
// Throw Error(invalid_argument) for a DataType or ReduceOp outside its enumeration.
// ---------------------------------------------------------------------------------------------

/// inout[i] = op(inout[i], in[i]) for `count` elements of type dt.
inline void reduce(ReduceOp op, DataType dt, void* inout, const void* in, std::size_t count);

/// out[i] = op(a[i], b[i]); out may be a or b. (CHORUS_DECL: the body, which instantiates the
/// loops below for every type and op, is in reduce/impl/host.hpp.)
CHORUS_DECL void reduce(ReduceOp op, DataType dt, void* out, const void* a, const void* b, std::size_t count);

/// avg's final division over `count` elements of type dt. (CHORUS_DECL, as reduce above.)
CHORUS_DECL void finalize_avg(DataType dt, void* data, std::size_t count, int world_size);

/// premul_sum's first step: out[i] = in[i] * scalar (Prod: rounded once to dt, as the device's
/// premul kernel computes it), `scalar` pointing to one element of dt; out may be in.
inline void premul(DataType dt, void* out, const void* in, std::size_t count, const void* scalar);

// ---------------------------------------------------------------------------------------------
// Implementation
// ---------------------------------------------------------------------------------------------

namespace detail {

/// Branch-free select on 32-bit words: c ? x : y (the vectoriser handles these, not a chain of
/// conditional expressions).
constexpr std::uint32_t select_u32(bool c, std::uint32_t x, std::uint32_t y) noexcept {
  return y ^ ((x ^ y) & (0u - static_cast<std::uint32_t>(c)));
}

/// binary16 -> float; bit-identical to half_bits_to_float (types.hpp), but branch-free.
inline float half_bits_to_float_v(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  const std::uint32_t man = h & 0x03ffu;
  const std::uint32_t normal = ((exp + 112u) << 23) | (man << 13);
  const std::uint32_t inf_nan = 0x7f800000u | (man << 13);
  // Zero and subnormals: man * 2^-24, exact.
  const std::uint32_t sub =
      bits_of(static_cast<float>(static_cast<std::int32_t>(man)) * 5.9604644775390625e-8f);
  std::uint32_t r = select_u32(exp == 0u, sub, normal);
  r = select_u32(exp == 0x1fu, inf_nan, r);
  return float_from_bits(sign | r);
}

/// float -> binary16, round to nearest even; bit-identical to float_to_half_bits (types.hpp), but
/// branch-free and without per-element shift amounts (SSE2 has none).
inline std::uint16_t float_to_half_bits_v(float f) noexcept {
  const std::uint32_t u = bits_of(f);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  const std::uint32_t a = u & 0x7fffffffu;
  const std::uint32_t nan = 0x7e00u | ((a >> 13) & 0x03ffu);
  // Normal: rebias and round the 13 dropped bits to nearest even in one add.
  const std::uint32_t normal = (a - 0x38000000u + 0x0fffu + ((a >> 13) & 1u)) >> 13;
  // Subnormal (and zero): |f| * 2^24 is exact; round it to an integer, ties to even, with exact
  // operations only (truncation and the exact fraction), so the rounding mode plays no part.
  // Other inputs are replaced by 0 first: converting inf or a huge value to int is undefined.
  const bool is_sub = a < 0x38800000u;
  const float x = float_from_bits(select_u32(is_sub, a, 0u)) * 16777216.0f;
  const std::int32_t t = static_cast<std::int32_t>(x);
  const float frac = x - static_cast<float>(t);
  const auto tu = static_cast<std::uint32_t>(t);
  const std::uint32_t sub = tu + select_u32(frac > 0.5f, 1u, select_u32(frac == 0.5f, tu & 1u, 0u));
  std::uint32_t h = select_u32(is_sub, sub, normal);
  h = select_u32(a >= 0x477ff000u, 0x7c00u, h);  // >= 65520 (or inf): infinity
  h = select_u32(a > 0x7f800000u, nan, h);
  return static_cast<std::uint16_t>(sign | h);
}

/// Widening and narrowing for the host loops (bfloat16's from types.hpp already vectorise).
template <class T>
inline accumulator_t<T> widen_v(T v) noexcept {
  if constexpr (std::is_same_v<T, float16>) {
    return half_bits_to_float_v(v.bits);
  } else {
    return widen(v);
  }
}
template <class T>
inline T narrow_v(accumulator_t<T> v) noexcept {
  if constexpr (std::is_same_v<T, float16>) {
    return float16::from_bits(float_to_half_bits_v(v));
  } else {
    return narrow<T>(v);
  }
}

/// Op{}(a, b) computed as the host loops do: for float16/bfloat16 the float functor between the
/// vectorisable conversions, which is by construction Op{}(a, b) of ops.hpp, bit for bit.
template <class Op, class T>
inline T apply_v(T a, T b) noexcept {
  if constexpr (kIsNarrowFloat<T>) {
    return narrow_v<T>(Op{}(widen_v(a), widen_v(b)));
  } else {
    return Op{}(a, b);
  }
}

template <class T>
inline constexpr std::size_t kHostBlock = HostReduceTuning::kBlockBytes / sizeof(T);

/// out, a, b pairwise disjoint (a and b may overlap each other: both are only read).
template <class Op, class T>
[[gnu::flatten]] void reduce_disjoint(T* __restrict out, const T* __restrict a, const T* __restrict b,
                                      std::size_t n) {
  constexpr std::size_t kB = kHostBlock<T>;
  std::size_t i = 0;
  for (; i + kB <= n; i += kB) {
    for (std::size_t j = 0; j < kB; ++j) out[i + j] = apply_v<Op>(a[i + j], b[i + j]);
  }
  for (; i < n; ++i) out[i] = apply_v<Op>(a[i], b[i]);
}

/// In place: inout[i] = op(inout[i], in[i]) (kInoutFirst) or op(in[i], inout[i]); disjoint.
template <class Op, class T, bool kInoutFirst>
[[gnu::flatten]] void reduce_in_place(T* __restrict inout, const T* __restrict in, std::size_t n) {
  constexpr std::size_t kB = kHostBlock<T>;
  auto step = [](T x, T y) { return kInoutFirst ? apply_v<Op>(x, y) : apply_v<Op>(y, x); };
  std::size_t i = 0;
  for (; i + kB <= n; i += kB) {
    for (std::size_t j = 0; j < kB; ++j) inout[i + j] = step(inout[i + j], in[i + j]);
  }
  for (; i < n; ++i) inout[i] = step(inout[i], in[i]);
}

/// Any aliasing (out == a == b, or a partial overlap): plain loop in index order.
template <class Op, class T>
[[gnu::flatten]] void reduce_aliased(T* out, const T* a, const T* b, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) out[i] = apply_v<Op>(a[i], b[i]);
}

template <class T>
bool ranges_overlap(const T* p, const T* q, std::size_t n) noexcept {
  const auto x = reinterpret_cast<std::uintptr_t>(p);
  const auto y = reinterpret_cast<std::uintptr_t>(q);
  const std::uintptr_t bytes = n * sizeof(T);
  return x < y + bytes && y < x + bytes;
}

/// Calls f(Op{}) with the functor of op; avg and premul_sum map to Sum.
template <class F>
decltype(auto) dispatch_op(ReduceOp op, F&& f) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
    case ReduceOp::premul_sum:  // its inputs were scaled first (chorus::premul): the steps sum
      return static_cast<F&&>(f)(Sum{});
    case ReduceOp::prod:
      return static_cast<F&&>(f)(Prod{});
    case ReduceOp::min:
      return static_cast<F&&>(f)(Min{});
    case ReduceOp::max:
      return static_cast<F&&>(f)(Max{});
    case ReduceOp::band:
      return static_cast<F&&>(f)(BitAnd{});
    case ReduceOp::bor:
      return static_cast<F&&>(f)(BitOr{});
    case ReduceOp::bxor:
      return static_cast<F&&>(f)(BitXor{});
  }
  throw Error(ErrorCode::invalid_argument,
              "ReduceOp value " + std::to_string(static_cast<int>(op)) + " is not a valid ReduceOp");
}

inline void check_world_size(int world_size) {
  if (world_size < 1) {
    throw Error(ErrorCode::invalid_argument,
                "finalize_avg: world size " + std::to_string(world_size) + " is not positive");
  }
}

/// finalize_avg for float16/bfloat16 with a world size exact in the narrow type: the float
/// division of avg_divide, between the vectorisable conversions.
template <class T>
[[gnu::flatten]] void finalize_avg_narrow(T* __restrict data, std::size_t n, int world_size) {
  constexpr std::size_t kB = kHostBlock<T>;
  auto step = [world_size](T x) { return narrow_v<T>(avg_divide(widen_v(x), world_size)); };
  std::size_t i = 0;
  for (; i + kB <= n; i += kB) {
    for (std::size_t j = 0; j < kB; ++j) data[i + j] = step(data[i + j]);
  }
  for (; i < n; ++i) data[i] = step(data[i]);
}

#if CHORUS_DETAIL_HOST_X86_NARROW
/// Whether the CPU has AVX2 and F16C (checked once). The default build targets plain x86-64, so
/// the float16/bfloat16 loops for these CPUs are compiled apart (gnu::target) and picked here.
/// F16C is read from CPUID leaf 1 (ECX bit 29): clang 14's __builtin_cpu_supports does not know
/// "f16c".
inline bool cpu_has_avx2_f16c() noexcept {
  static const bool kHas = [] {
    __builtin_cpu_init();
    unsigned a = 0, b = 0, c = 0, d = 0;
    const bool f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
    return __builtin_cpu_supports("avx2") && f16c;
  }();
  return kHas;
}

/// float16/bfloat16 with AVX2 (+ F16C): each block is widened into a float buffer, combined there
/// by the float functor, and narrowed back; returns how many elements it did (whole blocks only).
/// A block is read whole before it is written, so out may be a or b. Same bits as the portable
/// loops: vcvtps2ph with an immediate rounding of 0 rounds to nearest even whatever MXCSR says,
/// and equals float_to_half_bits on every float; vcvtph2ps is exact and differs only in quieting
/// a signalling NaN, which the functor turns into the canonical NaN either way.
template <class Op, class T>
[[gnu::target("avx2,f16c"), gnu::flatten]] std::size_t reduce_narrow_avx2(T* out, const T* a, const T* b,
                                                                          std::size_t n) {
  constexpr std::size_t kB = kHostBlock<T>;
  alignas(32) float fa[kB];
  alignas(32) float fb[kB];
  std::size_t i = 0;
  for (; i + kB <= n; i += kB) {
    if constexpr (std::is_same_v<T, float16>) {
      for (std::size_t j = 0; j < kB; j += 8) {
        _mm256_store_ps(fa + j,
                        _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i + j))));
        _mm256_store_ps(fb + j,
                        _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + i + j))));
      }
    } else {
      for (std::size_t j = 0; j < kB; ++j) fa[j] = widen_v(a[i + j]);
      for (std::size_t j = 0; j < kB; ++j) fb[j] = widen_v(b[i + j]);
    }
    for (std::size_t j = 0; j < kB; ++j) fa[j] = Op{}(fa[j], fb[j]);
    if constexpr (std::is_same_v<T, float16>) {
      for (std::size_t j = 0; j < kB; j += 8) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i + j),
                         _mm256_cvtps_ph(_mm256_load_ps(fa + j), _MM_FROUND_TO_NEAREST_INT));
      }
    } else {
      for (std::size_t j = 0; j < kB; ++j) out[i + j] = narrow_v<T>(fa[j]);
    }
  }
  return i;
}

/// finalize_avg's float division (world size up to kAvgFloatDivisionLimit) for the same CPUs.
template <class T>
[[gnu::target("avx2,f16c"), gnu::flatten]] std::size_t finalize_avg_narrow_avx2(T* data, std::size_t n,
                                                                                int world_size) {
  constexpr std::size_t kB = kHostBlock<T>;
  alignas(32) float f[kB];
  std::size_t i = 0;
  for (; i + kB <= n; i += kB) {
    if constexpr (std::is_same_v<T, float16>) {
      for (std::size_t j = 0; j < kB; j += 8) {
        _mm256_store_ps(f + j,
                        _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(data + i + j))));
      }
    } else {
      for (std::size_t j = 0; j < kB; ++j) f[j] = widen_v(data[i + j]);
    }
    for (std::size_t j = 0; j < kB; ++j) f[j] = avg_divide(f[j], world_size);
    if constexpr (std::is_same_v<T, float16>) {
      for (std::size_t j = 0; j < kB; j += 8) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(data + i + j),
                         _mm256_cvtps_ph(_mm256_load_ps(f + j), _MM_FROUND_TO_NEAREST_INT));
      }
    } else {
      for (std::size_t j = 0; j < kB; ++j) data[i + j] = narrow_v<T>(f[j]);
    }
  }
  return i;
}
#endif  // CHORUS_DETAIL_HOST_X86_NARROW

/// reduce_to for every type but fp8.
template <class Op, class T>
void reduce_any(T* out, const T* a, const T* b, std::size_t n) {
  // Overlaps hold alike for any common suffix of the three ranges.
  const bool out_a = detail::ranges_overlap(out, a, n);
  const bool out_b = detail::ranges_overlap(out, b, n);
#if CHORUS_DETAIL_HOST_X86_NARROW
  if constexpr (kIsNarrowFloat<T>) {
    if ((!out_a || out == a) && (!out_b || out == b) && detail::cpu_has_avx2_f16c()) {
      const std::size_t done = detail::reduce_narrow_avx2<Op>(out, a, b, n);
      out += done;
      a += done;
      b += done;
      n -= done;
      if (n == 0) return;
    }
  }
#endif
  if (!out_a && !out_b) {
    detail::reduce_disjoint<Op>(out, a, b, n);
  } else if (out == a && !out_b) {
    detail::reduce_in_place<Op, T, true>(out, b, n);
  } else if (out == b && !out_a) {
    detail::reduce_in_place<Op, T, false>(out, a, n);
  } else {
    detail::reduce_aliased<Op>(out, a, b, n);
  }
}

}  // namespace detail

template <class Op, Element T>
void reduce_to(T* out, const T* a, const T* b, std::size_t n) {
  if (n == 0) return;
  if constexpr (kIsFloat8<T>) {  // no other loop is instantiated for them (compile time)
    if constexpr (detail::kFp8Table<Op>) {
      detail::reduce_fp8<Op>(out, a, b, n);
    } else {
      detail::reduce_aliased<Op>(out, a, b, n);  // the bitwise ops, which no fp8 call takes
    }
  } else {
    detail::reduce_any<Op>(out, a, b, n);
  }
}

template <class Op, Element T>
void reduce_into(T* inout, const T* in, std::size_t n) {
  reduce_to<Op>(inout, inout, in, n);
}

template <Element T>
void finalize_avg(T* data, std::size_t n, int world_size) {
  detail::check_world_size(world_size);
  if constexpr (kIsFloat8<T>) {
    detail::map_fp8(data, data, n, [&](T v) { return avg_divide(v, world_size); });
    return;
  }
  if constexpr (kIsNarrowFloat<T>) {
    if (world_size <= detail::kAvgFloatDivisionLimit<T>) {
#if CHORUS_DETAIL_HOST_X86_NARROW
      if (detail::cpu_has_avx2_f16c()) {
        const std::size_t done = detail::finalize_avg_narrow_avx2(data, n, world_size);
        data += done;
        n -= done;
      }
#endif
      detail::finalize_avg_narrow(data, n, world_size);
      return;
    }
  }
  if constexpr (std::is_floating_point_v<T>) {
    // float, double: blocked so that it vectorises.
    constexpr std::size_t kB = detail::kHostBlock<T>;
    std::size_t i = 0;
    for (; i + kB <= n; i += kB) {
      for (std::size_t j = 0; j < kB; ++j) data[i + j] = avg_divide(data[i + j], world_size);
    }
    for (; i < n; ++i) data[i] = avg_divide(data[i], world_size);
  } else {
    for (std::size_t i = 0; i < n; ++i) data[i] = avg_divide(data[i], world_size);
  }
}

inline void reduce(ReduceOp op, DataType dt, void* inout, const void* in, std::size_t count) {
  reduce(op, dt, inout, inout, in, count);
}

inline void premul(DataType dt, void* out, const void* in, std::size_t count, const void* scalar) {
  dispatch(dt, [&]<class T>(std::type_identity<T>) {
    T s;
    std::memcpy(&s, scalar, sizeof(T));
    T* o = static_cast<T*>(out);
    const T* x = static_cast<const T*>(in);
    if constexpr (kIsFloat8<T>) {
      detail::map_fp8(o, x, count, [&](T v) { return Prod{}(v, s); });
    } else {
      for (std::size_t i = 0; i < count; ++i) o[i] = Prod{}(x[i], s);
    }
  });
}

}  // namespace chorus

#undef CHORUS_DETAIL_HOST_X86_NARROW

// The bodies of the two functions on a DataType (reduce/impl/host.hpp), which instantiate the
// loops above for every type and op: here in a header-only program; compiled once with
// CHORUS_SEPARATE_COMPILATION (config.hpp, CHORUS_DECL).
#if !defined(CHORUS_SEPARATE_COMPILATION)
#include "chorus/reduce/impl/host.hpp"
#endif
