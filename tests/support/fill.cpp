// SPDX-License-Identifier: BSD-3-Clause
// The reference values of support/fill.hpp (pattern, input, expected_all_reduce), compiled once for
// the twelve element types: chorus_test_reference (tests/CMakeLists.txt) builds this unit at -O2 and
// without sanitizer instrumentation, and every test that links chorus_test_support calls it.
#define CHORUS_TEST_REFERENCE_DEFINE
#include "support/fill.hpp"

namespace chorus::test {

#define CHORUS_TEST_REFERENCE(T)                                                \
  template T pattern<T>(std::uint64_t, int, std::size_t) noexcept;              \
  template T input<T>(std::uint64_t, int, int, std::size_t, ReduceOp) noexcept; \
  template T expected_all_reduce<T>(std::uint64_t, int, std::size_t, ReduceOp) noexcept;

CHORUS_TEST_REFERENCE(std::int8_t)
CHORUS_TEST_REFERENCE(std::uint8_t)
CHORUS_TEST_REFERENCE(std::int32_t)
CHORUS_TEST_REFERENCE(std::uint32_t)
CHORUS_TEST_REFERENCE(std::int64_t)
CHORUS_TEST_REFERENCE(std::uint64_t)
CHORUS_TEST_REFERENCE(float16)
CHORUS_TEST_REFERENCE(bfloat16)
CHORUS_TEST_REFERENCE(float)
CHORUS_TEST_REFERENCE(double)
CHORUS_TEST_REFERENCE(float8_e4m3)
CHORUS_TEST_REFERENCE(float8_e5m2)

#undef CHORUS_TEST_REFERENCE

}  // namespace chorus::test
