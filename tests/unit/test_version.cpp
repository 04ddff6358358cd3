// SPDX-License-Identifier: BSD-3-Clause
#include "chorus/version.hpp"

#include <doctest/doctest.h>

#include <string>
#include <string_view>

// tests/CMakeLists.txt passes the CMake project version (PROJECT_VERSION, which CMakeLists.txt
// reads from chorus/version.hpp) to unit_tests as CHORUS_TEST_PROJECT_VERSION: a regex in
// CMakeLists.txt that misreads the header, or a version written anywhere else, fails here.
#if !defined(CHORUS_TEST_PROJECT_VERSION)
#error "CHORUS_TEST_PROJECT_VERSION is not defined: tests/CMakeLists.txt passes it to unit_tests"
#endif

// This file's own names: the files of tests/unit/ are compiled together (unity build).
namespace unit_test_version {

static_assert(chorus::version() == chorus::Version{CHORUS_VERSION_MAJOR, CHORUS_VERSION_MINOR, CHORUS_VERSION_PATCH, ""});
static_assert(CHORUS_VERSION == CHORUS_VERSION_CODE(CHORUS_VERSION_MAJOR, CHORUS_VERSION_MINOR, CHORUS_VERSION_PATCH));

TEST_CASE("version: chorus::version() is the CMake project version") {
  constexpr std::string_view cmake = CHORUS_TEST_PROJECT_VERSION;
  const chorus::Version v = chorus::version();
  INFO("CMake project version " << std::string(cmake) << ", chorus::version() " << std::string(v.string));
  CHECK(std::string_view(v.string) == cmake);
  CHECK(std::string_view(CHORUS_VERSION_STRING) == cmake);
  const std::string numbers =
      std::to_string(v.major) + "." + std::to_string(v.minor) + "." + std::to_string(v.patch);
  CHECK(numbers == cmake);
}

TEST_CASE("version: ordered by major, then minor, then patch; the text takes no part") {
  using chorus::Version;
  CHECK(Version{0, 1, 0, "a"} == Version{0, 1, 0, "b"});
  CHECK(Version{0, 1, 9, ""} < Version{0, 2, 0, ""});
  CHECK(Version{0, 9, 9, ""} < Version{1, 0, 0, ""});
  CHECK(Version{1, 0, 1, ""} > Version{1, 0, 0, ""});
  CHECK(chorus::version() >= Version{0, 1, 0, ""});
  CHECK(CHORUS_VERSION_CODE(1, 2, 3) == 10203);
}

}  // namespace unit_test_version
