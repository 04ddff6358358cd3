// SPDX-License-Identifier: BSD-3-Clause
// Uses chorus as a user would: the umbrella header and one public type.
#include <chorus/chorus.hpp>

#include <cstdio>

int main() {
  chorus::Options options{};
  std::printf("chorus consumer ok (transport=%s)\n", options.transport.c_str());
  return 0;
}
