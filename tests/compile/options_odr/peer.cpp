// SPDX-License-Identifier: BSD-3-Clause
// A function that takes a communicator, compiled without CHORUS_WITH_RDMA (CMakeLists.txt here).
#include "train.hpp"

int train(chorus::Communicator<chorus::DefaultTransport>* comm) { return comm == nullptr ? 0 : 1; }
