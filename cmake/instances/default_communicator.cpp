// SPDX-License-Identifier: BSD-3-Clause
// The one instantiation of chorus::Communicator<chorus::DefaultTransport> that chorus's own
// programs (bench/, examples/) link: they are compiled with CHORUS_EXTERN_TEMPLATES, under which
// chorus.hpp only declares it, so each program does not compile the whole communicator again.
#include "chorus/chorus.hpp"

template class chorus::Communicator<chorus::DefaultTransport>;
