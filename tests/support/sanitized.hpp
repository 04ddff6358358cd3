// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// kSanitized: true in the AddressSanitizer and ThreadSanitizer builds, which run 3-10x slower.
/// Tests shrink their data volume there (sizes, counts, repetitions), never their code paths: the
/// release build runs the full volume. kThreadSanitized: the ThreadSanitizer build alone, where the
/// device matrix (device_matrix.hpp) runs a few of the ten dtypes: their code paths differ in the
/// reduction kernels, not in the threads TSan watches, and the release and ASan builds run all ten.

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

}  // namespace chorus::test
