// SPDX-License-Identifier: BSD-3-Clause
// chorus::compiled (CMakeLists.txt): the communicator of every transport and the bodies of the
// functions declared CHORUS_DECL, compiled once. One unit
// for all of them, so that what they share (the algorithms, the executors, the inline code of the
// headers) is compiled once too.
#include "chorus/chorus.hpp"
#include "chorus/impl/bodies.hpp"  // the functions declared CHORUS_DECL (config.hpp)

#define CHORUS_DETAIL_COMMUNICATOR(T) template class chorus::Communicator<T>; template class chorus::Persistent<T>;
CHORUS_COMPILED_TRANSPORTS(CHORUS_DETAIL_COMMUNICATOR)
#undef CHORUS_DETAIL_COMMUNICATOR
