// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// The communicators the tests use, compiled once in chorus::compiled (every test is built with
/// CHORUS_SEPARATE_COMPILATION: CMakeLists.txt) instead of in every test file; a test file that
/// includes this header (or chorus/chorus.hpp) before using them sees them declared extern.

#include <doctest/doctest.h>

#include "chorus/communicator.hpp"
#include "chorus/compiled.hpp"
#include "chorus/transport/hybrid/transport.hpp"
#include "chorus/transport/inproc/transport.hpp"
#include "chorus/transport/shm/transport.hpp"
#include "chorus/transport/tcp/transport.hpp"

// The names the test cases templated on a transport show ("<Inproc>"), in one place: the files
// of a folder are compiled together (see cmake/ChorusTesting.cmake).
TYPE_TO_STRING_AS("Inproc", chorus::inproc::Transport);
TYPE_TO_STRING_AS("Tcp", chorus::tcp::Transport);
