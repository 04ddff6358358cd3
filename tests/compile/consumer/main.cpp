// SPDX-License-Identifier: BSD-3-Clause
// Uses chorus as a user would: the umbrella header and one public type. Prints the version, which
// consumer_check.cmake compares with the project version. With CHORUS_CONSUMER_ALL_REDUCE (the
// pkg-config consumer, whose link line is chorus.pc's and nothing else) it also runs a one-rank
// all_reduce, which instantiates the communicator and links what it needs (libcrypto, pthreads).
#include <chorus/chorus.hpp>

#include <cstdio>
#include <memory>
#include <vector>

int main() {
  chorus::Options options{};
#if defined(CHORUS_CONSUMER_ALL_REDUCE)
  options.rank = 0;
  options.world_size = 1;
  options.store = std::make_shared<chorus::MemoryStore>();
  auto comm = chorus::init(options);
  std::vector<float> v{1.0f, 2.0f, 3.0f};
  comm.all_reduce(v, chorus::ReduceOp::sum);
  if (v != std::vector<float>{1.0f, 2.0f, 3.0f}) {
    std::printf("chorus consumer: a one-rank all_reduce changed its input\n");
    return 1;
  }
  std::printf("chorus consumer: one-rank all_reduce over %s ok\n", options.transport.c_str());
#endif
  std::printf("chorus consumer ok (chorus %s, transport=%s)\n", chorus::version().string, options.transport.c_str());
  return 0;
}
