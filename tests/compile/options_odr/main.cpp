// SPDX-License-Identifier: BSD-3-Clause
// Compiled with CHORUS_EXTERN_TEMPLATES: the communicator's members come from peer.cpp, which may
// have been compiled in the other CHORUS_WITH_RDMA mode (CMakeLists.txt here).
#include "train.hpp"

#include <cstdio>

#include "chorus/chorus.hpp"

int main(int argc, char**) {
  if (argc > 1) {  // never taken by the test, which checks the link and the run without arguments
    auto comm = chorus::init();
    train(comm);
  }
  std::puts("chorus options pair ok");
  return 0;
}
