// SPDX-License-Identifier: BSD-3-Clause
// The target that builds the tests' shared precompiled header (tests/CMakeLists.txt,
// chorus_test_pch); its one unit has nothing of its own.
namespace chorus::test {
int pch_unit_marker = 0;
}  // namespace chorus::test
