// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// The compiled part of chorus, for a program that builds it separately (chorus/compiled.hpp):
/// include this from exactly one .cpp of the program, compiled, like every other unit, with
/// CHORUS_SEPARATE_COMPILATION and BOOST_ASIO_SEPARATE_COMPILATION defined. It holds the
/// communicator of every transport, the bodies of the functions declared CHORUS_DECL (config.hpp),
/// the simulated device runtime (testing/sim_runtime.hpp) and
/// Boost.Asio's out-of-line code. (The CMake target chorus::compiled is the same, in three units:
/// cmake/compiled/.)

#if !defined(CHORUS_SEPARATE_COMPILATION)
#error "chorus/src.hpp is for a program compiled with CHORUS_SEPARATE_COMPILATION (see chorus/compiled.hpp)"
#endif

#include <boost/asio/impl/src.hpp>

#include "chorus/chorus.hpp"
#include "chorus/impl/bodies.hpp"  // the functions declared CHORUS_DECL

#define CHORUS_DETAIL_COMMUNICATOR(T) template class chorus::Communicator<T>; template class chorus::Persistent<T>;
CHORUS_COMPILED_TRANSPORTS(CHORUS_DETAIL_COMMUNICATOR)
#undef CHORUS_DETAIL_COMMUNICATOR

// The simulated device runtime's bodies (testing/sim_runtime.hpp).
#include "chorus/testing/sim_runtime.hpp"
#include "chorus/testing/sim_runtime/bodies.hpp"
