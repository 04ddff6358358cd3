// SPDX-License-Identifier: BSD-3-Clause
// Calls train() of peer.cpp, which may have been compiled in the other CHORUS_WITH_RDMA mode
// (CMakeLists.txt here): the call names the transport's options namespace.
#include "train.hpp"

#include <cstdio>

int main() {
  if (train(nullptr) != 0) return 1;
  std::puts("chorus options pair ok");
  return 0;
}
