// SPDX-License-Identifier: BSD-3-Clause
// chorus/cuda.hpp, as a program includes it from one .cu file: the CUDA runtime becomes the
// process's default device runtime, and it tells device memory from host memory.
#include "chorus/cuda.hpp"

#include <doctest/doctest.h>

#include <string>

#include "cuda/gpu_test.hpp"

TEST_CASE("chorus/cuda.hpp makes the CUDA runtime the default") {
  chorus::device::Runtime* rt = chorus::device::default_runtime();
  REQUIRE(rt != nullptr);
  CHECK(std::string(rt->name()) == "cuda");
  REQUIRE(rt->device_count() > 0);
  void* d = rt->alloc_device(64);
  int host = 0;
  CHECK(rt->kind_of(d) == chorus::MemoryKind::device);
  CHECK(rt->kind_of(&host) == chorus::MemoryKind::host);
  rt->free_device(d);
}
