// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// chorus's version: the one place it is written. CMakeLists.txt reads the three numbers below as
/// the project version (project(chorus VERSION ...), the package's chorusConfigVersion.cmake and
/// chorus.pc), so a checkout used with a plain `-I include` sees the same version as every CMake
/// way in. tests/unit/test_version.cpp checks that the two agree.
///
///     #include <chorus/version.hpp>
///     #if CHORUS_VERSION >= CHORUS_VERSION_CODE(0, 2, 0)   // compile-time choice
///     std::printf("chorus %s\n", chorus::version().string);  // "chorus 0.1.0"
///
/// Pre-1.0, a minor version may break the API (the CMake package accepts the same major version).

#include <compare>

// Only decimal numbers on these three lines: CMakeLists.txt matches them with a regex.
#define CHORUS_VERSION_MAJOR 0
#define CHORUS_VERSION_MINOR 1
#define CHORUS_VERSION_PATCH 0

/// One integer for `#if` comparisons (like NCCL_VERSION_CODE): 0.1.0 -> 100, 1.2.3 -> 10203.
#define CHORUS_VERSION_CODE(major, minor, patch) ((major) * 10000 + (minor) * 100 + (patch))
#define CHORUS_VERSION CHORUS_VERSION_CODE(CHORUS_VERSION_MAJOR, CHORUS_VERSION_MINOR, CHORUS_VERSION_PATCH)

#define CHORUS_VERSION_DETAIL_STR(x) #x
#define CHORUS_VERSION_DETAIL_XSTR(x) CHORUS_VERSION_DETAIL_STR(x)
/// "0.1.0", made from the three numbers above.
#define CHORUS_VERSION_STRING                                                                  \
  CHORUS_VERSION_DETAIL_XSTR(CHORUS_VERSION_MAJOR)                                             \
  "." CHORUS_VERSION_DETAIL_XSTR(CHORUS_VERSION_MINOR) "." CHORUS_VERSION_DETAIL_XSTR(CHORUS_VERSION_PATCH)

namespace chorus {

/// A release version. Ordered by (major, minor, patch); `string` is the same three numbers as text
/// and takes no part in comparisons.
struct Version {
  int major;
  int minor;
  int patch;
  const char* string;  ///< "major.minor.patch", static storage

  friend constexpr bool operator==(const Version& a, const Version& b) noexcept {
    return a.major == b.major && a.minor == b.minor && a.patch == b.patch;
  }
  friend constexpr std::strong_ordering operator<=>(const Version& a, const Version& b) noexcept {
    if (auto c = a.major <=> b.major; c != 0) return c;
    if (auto c = a.minor <=> b.minor; c != 0) return c;
    return a.patch <=> b.patch;
  }
};

/// The version of the chorus headers this translation unit was compiled with. constexpr: usable in
/// a static_assert. chorus is header-only, so there is no separate library version to disagree with.
constexpr Version version() noexcept {
  return {CHORUS_VERSION_MAJOR, CHORUS_VERSION_MINOR, CHORUS_VERSION_PATCH, CHORUS_VERSION_STRING};
}

}  // namespace chorus
