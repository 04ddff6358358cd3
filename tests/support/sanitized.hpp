// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// kSanitized: true in the AddressSanitizer and ThreadSanitizer builds, which run 3-10x slower.
/// Tests shrink their data volume there (sizes, counts, repetitions), never their code paths: the
/// release build runs the full volume.

namespace chorus::test {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif

}  // namespace chorus::test
