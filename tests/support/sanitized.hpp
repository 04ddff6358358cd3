// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// kSanitized: true in the AddressSanitizer and ThreadSanitizer builds, which run 3-10x slower.
/// Tests shrink their data volume there (sizes, counts, repetitions), never their code paths: the
/// release build runs the full volume. kThreadSanitized: the ThreadSanitizer build alone, where the
/// dtype matrices (the device matrix, device_matrix.hpp; the grid emulator's kernel bodies,
/// unit/test_kernels.cpp) run four of the ten dtypes (runs_under_tsan): their code paths differ in
/// the element type, not in the threads TSan watches, and the release and ASan builds run all ten.

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

/// The four dtypes a sanitizer build keeps where it cuts a matrix: a 32-bit float, a 16-bit float
/// and a 64- and an 8-bit integer.
inline constexpr bool in_sanitized_subset(DataType dt) {
  return dt == DataType::float32 || dt == DataType::bfloat16 || dt == DataType::int64 || dt == DataType::uint8;
}

/// Whether a dtype matrix runs `dt` in this build: every dtype, but under TSan the four above.
inline constexpr bool runs_under_tsan(DataType dt) { return !kThreadSanitized || in_sanitized_subset(dt); }

/// Whether a test whose largest counts dominate its time runs them for `dt` in this build: every
/// dtype, but under either sanitizer the four of runs_under_tsan (the smaller counts still run for
/// all ten). tests/collective/test_hierarchical.cpp: its 65537-element rows, the bandwidth form.
inline constexpr bool largest_counts_for(DataType dt) { return !kSanitized || in_sanitized_subset(dt); }

}  // namespace chorus::test
