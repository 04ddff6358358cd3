// SPDX-License-Identifier: BSD-3-Clause
// The one instance of the default communicator (the README's CHORUS_EXTERN_TEMPLATES recipe) and a
// function that takes one, compiled without CHORUS_WITH_RDMA (CMakeLists.txt here).
#include "train.hpp"

#include "chorus/chorus.hpp"

template class chorus::Communicator<chorus::DefaultTransport>;

void train(chorus::Communicator<chorus::DefaultTransport>& comm) { comm.barrier(); }
