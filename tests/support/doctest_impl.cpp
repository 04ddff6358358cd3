// SPDX-License-Identifier: BSD-3-Clause
// doctest's implementation without its main, for the programs of tests/ that have no doctest cases
// but include doctest (the integration drivers: the test executables' precompiled header brings
// it, and support/spawn.hpp): chorus_test_doctest (tests/CMakeLists.txt).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
