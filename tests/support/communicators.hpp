// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// The communicators the tests use, instantiated once in support/communicators.cpp (part of the
/// chorus_test_main library) instead of in every test file: a test file that includes this header
/// before using them compiles in about two thirds of the time.

#include <doctest/doctest.h>

#include "chorus/communicator.hpp"
#include "chorus/transport/hybrid/transport.hpp"
#include "chorus/transport/inproc/transport.hpp"
#include "chorus/transport/shm/transport.hpp"
#include "chorus/transport/tcp/transport.hpp"

extern template class chorus::Communicator<chorus::inproc::Transport>;
extern template class chorus::Communicator<chorus::tcp::Transport>;
extern template class chorus::Communicator<chorus::shm::Transport>;
extern template class chorus::Communicator<chorus::hybrid::Transport>;

// The names the test cases templated on a transport show ("<Inproc>"), in one place: the files
// of a folder are compiled together (see cmake/ChorusTesting.cmake).
TYPE_TO_STRING_AS("Inproc", chorus::inproc::Transport);
TYPE_TO_STRING_AS("Tcp", chorus::tcp::Transport);
