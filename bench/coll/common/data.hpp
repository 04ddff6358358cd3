// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// Inputs with exactly known results, and the checker (after nccl-tests' verifiable/).
///
/// Element i of rank r's input is a small integer drawn from hash(seed, r, i), chosen per op so
/// that the result is exact in every order of evaluation and so the same for every algorithm:
///   sum, avg, min, max   integers in [-k, k] ([0, k] for unsigned types), k = min(64, L / n) with
///                        L the largest integer below which the type counts exactly (float16 2048,
///                        bfloat16 256, float 2^24, double 2^53, float8_e4m3 16, float8_e5m2 8):
///                        every partial sum of n of them
///                        is exact. Integer types wrap modulo 2^bits, which is exact anyway.
///   prod                 +-1, and +-2 one time in eight (unsigned: 1 or 2): every partial
///                        product is a power of two (or overflows to infinity in every order;
///                        float8_e4m3 saturates at 448 instead, and stays there, in every order).
/// The reference is computed here, not with chorus's functors: integers in uint64 (wrapping
/// like the library), floats in double (exact by construction); avg is the truncating division of
/// the wrapped sum for integers and the correctly rounded sum / n for floats (a double division,
/// then a conversion that rounds innocuously: 53 >= 2p + 2). Outputs are compared bit for bit.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <type_traits>

#include "coll/common/descriptor.hpp"

namespace chorus::bench {
namespace data {

inline std::uint64_t mix(std::uint64_t x) {  // splitmix64's finaliser
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

inline std::uint64_t hash(std::uint64_t seed, int rank, std::size_t index) {
  return mix(mix(seed * 0x9e3779b97f4a7c15ull + static_cast<std::uint64_t>(rank) + 1) + index);
}

template <class T>
inline constexpr bool kNarrow = std::is_same_v<T, float16> || std::is_same_v<T, bfloat16> ||
                                std::is_same_v<T, float8_e4m3> || std::is_same_v<T, float8_e5m2>;

template <class T>
double to_double(T v) {
  if constexpr (kNarrow<T>) {
    return static_cast<double>(static_cast<float>(v));
  } else {
    return static_cast<double>(v);
  }
}

/// The T nearest to d (ties to even); exact for the integers the inputs use.
template <class T>
T from_double(double d) {
  if constexpr (kNarrow<T>) {
    return T(d);
  } else {
    return static_cast<T>(d);
  }
}

template <class T>
T from_int(std::int64_t v) {
  if constexpr (std::is_integral_v<T>) {
    return static_cast<T>(v);
  } else {
    return from_double<T>(static_cast<double>(v));
  }
}

/// The generator of one call's inputs: element i of rank r is (*this)(r, i).
template <class T>
struct Inputs {
  std::uint64_t seed = 0;
  int n = 1;
  ReduceOp op = ReduceOp::sum;

  static constexpr bool kSigned = !std::is_integral_v<T> || std::is_signed_v<T>;

  std::int64_t magnitude() const {
    double limit = 0;
    if constexpr (std::is_same_v<T, float16>) limit = 2048;
    else if constexpr (std::is_same_v<T, bfloat16>) limit = 256;
    else if constexpr (std::is_same_v<T, float>) limit = 16777216.0;
    else if constexpr (std::is_same_v<T, double>) limit = 9007199254740992.0;
    else if constexpr (std::is_same_v<T, float8_e4m3>)
      limit = 16;
    else if constexpr (std::is_same_v<T, float8_e5m2>)
      limit = 8;
    else return 64;  // integers wrap: exact whatever the range
    return static_cast<std::int64_t>(std::clamp(limit / n, 1.0, 64.0));
  }

  T operator()(int rank, std::size_t i) const {
    const std::uint64_t h = hash(seed, rank, i);
    if (op == ReduceOp::prod) {
      const std::int64_t v = (h & 7) == 0 ? 2 : 1;
      return from_int<T>(kSigned && (h & 8) ? -v : v);
    }
    const std::int64_t k = magnitude();
    const std::uint64_t r = h >> 8;
    if constexpr (kSigned) {
      return from_int<T>(static_cast<std::int64_t>(r % static_cast<std::uint64_t>(2 * k + 1)) - k);
    } else {
      return from_int<T>(static_cast<std::int64_t>(r % static_cast<std::uint64_t>(k + 1)));
    }
  }

  /// v widened to 64 bits (sign-extended for signed types), for wrapping arithmetic.
  static std::uint64_t wide(T v) {
    if constexpr (std::is_signed_v<T>) {
      return static_cast<std::uint64_t>(static_cast<std::int64_t>(v));
    } else {
      return static_cast<std::uint64_t>(v);
    }
  }

  /// op over every rank's element i.
  T reduced(std::size_t i) const {
    if constexpr (std::is_integral_v<T>) {
      switch (op) {
        case ReduceOp::sum:
        case ReduceOp::avg:
        case ReduceOp::premul_sum: {  // not of integers, nor among -o's ops
          std::uint64_t acc = 0;
          for (int r = 0; r < n; ++r) acc += wide((*this)(r, i));
          const T s = static_cast<T>(acc);  // modulo 2^bits, as the library wraps
          if (op == ReduceOp::sum) return s;
          if constexpr (std::is_signed_v<T>) {
            return static_cast<T>(static_cast<std::int64_t>(s) / n);
          } else {
            return static_cast<T>(static_cast<std::uint64_t>(s) / static_cast<std::uint64_t>(n));
          }
        }
        case ReduceOp::prod: {
          std::uint64_t acc = 1;
          for (int r = 0; r < n; ++r) acc *= wide((*this)(r, i));
          return static_cast<T>(acc);
        }
        case ReduceOp::min:
        case ReduceOp::max: {
          T acc = (*this)(0, i);
          for (int r = 1; r < n; ++r) {
            const T v = (*this)(r, i);
            acc = op == ReduceOp::min ? std::min(acc, v) : std::max(acc, v);
          }
          return acc;
        }
        case ReduceOp::band:
        case ReduceOp::bor:
        case ReduceOp::bxor: {
          T acc = (*this)(0, i);
          for (int r = 1; r < n; ++r) {
            const T v = (*this)(r, i);
            acc = static_cast<T>(op == ReduceOp::band ? (acc & v) : op == ReduceOp::bor ? (acc | v) : (acc ^ v));
          }
          return acc;
        }
      }
      return T{};
    } else {
      double acc = to_double((*this)(0, i));
      for (int r = 1; r < n; ++r) {
        const double v = to_double((*this)(r, i));
        switch (op) {
          case ReduceOp::sum:
          case ReduceOp::avg:
          case ReduceOp::premul_sum: acc += v; break;  // not among -o's ops
          case ReduceOp::prod: acc *= v; break;
          case ReduceOp::min: acc = std::min(acc, v); break;
          case ReduceOp::max: acc = std::max(acc, v); break;
          case ReduceOp::band:
          case ReduceOp::bor:
          case ReduceOp::bxor: break;  // integer types only (is_valid_op)
        }
      }
      if (op == ReduceOp::avg) acc /= n;
      return from_double<T>(acc);
    }
  }
};

template <class T>
std::string show(T v) {
  char buf[64];
  if constexpr (std::is_integral_v<T>) {
    if constexpr (std::is_signed_v<T>) {
      std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(v));
    } else {
      std::snprintf(buf, sizeof buf, "%llu", static_cast<unsigned long long>(v));
    }
  } else {
    std::snprintf(buf, sizeof buf, "%.9g", to_double(v));
  }
  return buf;
}

}  // namespace data

/// Writes this rank's input of `call` (layout.send elements at call.in).
inline void fill_input(const Call& call, std::uint64_t seed) {
  dispatch(call.dtype, [&]<class T>(std::type_identity<T>) {
    const data::Inputs<T> gen{seed, call.size, call.op};
    T* p = reinterpret_cast<T*>(const_cast<std::byte*>(call.in));
    for (std::size_t i = 0; i < call.layout.send; ++i) p[i] = gen(call.rank, i);
  });
}

/// Counts the elements of call.out (layout.recv of them) that differ, bit for bit, from what the
/// collective expects; reports the first few on stderr.
inline std::int64_t count_wrong(const Collective& d, const Call& call, std::uint64_t seed, const char* what) {
  return dispatch(call.dtype, [&]<class T>(std::type_identity<T>) -> std::int64_t {
    const data::Inputs<T> gen{seed, call.size, call.op};
    const T* out = reinterpret_cast<const T*>(call.out);
    std::int64_t wrong = 0;
    for (std::size_t j = 0; j < call.layout.recv; ++j) {
      const Expect e = d.expect(call.layout, call.rank, call.size, call.root, j);
      if (e.kind == Expect::Kind::none) continue;
      const T want = e.kind == Expect::Kind::copy ? gen(e.rank, e.index) : gen.reduced(e.index);
      if (std::memcmp(&want, out + j, sizeof(T)) == 0) continue;
      if (++wrong <= 4)
        std::fprintf(stderr, "# rank %d: %s: element %zu is %s, expected %s\n", call.rank, what, j,
                     data::show(out[j]).c_str(), data::show(want).c_str());
    }
    return wrong;
  });
}

}  // namespace chorus::bench
