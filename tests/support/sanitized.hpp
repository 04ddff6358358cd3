// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// kSanitized: true in the AddressSanitizer and ThreadSanitizer builds, which run 3-10x slower.
/// Tests shrink their data volume there (sizes, counts, repetitions), never their code paths: the
/// release build runs the full volume. The dtype matrices (the collective and device matrices, the
/// grid emulator's kernel bodies, the hierarchical and one_shot cases) run every dtype in the
/// release build, six of the twelve under ASan and four under TSan (runs_dtype). The six hold every
/// element size (1, 2, 4 and 8 bytes), both 16-bit floats (their conversions differ), a 32-bit
/// float and integer, and the signed integers whose arithmetic UBSan checks (int32, int64); the six
/// dropped (int8, uint32, uint64, float64, float8_e4m3, float8_e5m2) take the code paths of a kept
/// dtype of their width (the fp8 conversions and reductions are the unit tests' fp8 cases, which
/// every build runs), and the release build runs all twelve.

#include <vector>

#include "chorus/core/types.hpp"

namespace chorus::test {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif

#if defined(__SANITIZE_THREAD__)
inline constexpr bool kThreadSanitized = true;
#else
inline constexpr bool kThreadSanitized = false;
#endif

/// The four dtypes the TSan build keeps where it cuts a matrix: a 32-bit float, a 16-bit float
/// and a 64- and an 8-bit integer.
inline constexpr bool in_sanitized_subset(DataType dt) {
  return dt == DataType::float32 || dt == DataType::bfloat16 || dt == DataType::int64 || dt == DataType::uint8;
}

/// The six the ASan build keeps: those four, a 32-bit signed integer (UBSan's overflow checks on
/// int32 arithmetic) and the other 16-bit float (float16's conversions differ from bfloat16's).
inline constexpr bool in_asan_subset(DataType dt) {
  return in_sanitized_subset(dt) || dt == DataType::int32 || dt == DataType::float16;
}

/// Whether a dtype matrix runs `dt` in this build: every dtype in release, six under ASan, four
/// under TSan.
inline constexpr bool runs_dtype(DataType dt) {
  if constexpr (kThreadSanitized) return in_sanitized_subset(dt);
  if constexpr (kSanitized) return in_asan_subset(dt);
  return true;
}

/// The dtypes a matrix runs in this build (runs_dtype), in kAllDataTypes's order.
inline std::vector<DataType> matrix_dtypes() {
  std::vector<DataType> v;
  for (DataType dt : kAllDataTypes)
    if (runs_dtype(dt)) v.push_back(dt);
  return v;
}

/// Whether a test whose largest counts dominate its time runs them for `dt` in this build: every
/// dtype, but under either sanitizer the four of in_sanitized_subset (the smaller counts still run
/// for those of runs_dtype). tests/collective/test_hierarchical.cpp: its 65537-element rows, the bandwidth form.
inline constexpr bool largest_counts_for(DataType dt) { return !kSanitized || in_sanitized_subset(dt); }

}  // namespace chorus::test
