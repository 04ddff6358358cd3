// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// The one entry point of the shared driver (driver.cpp, nccl-tests' src/common.cu): a *_perf
/// program is a descriptor (descriptor.hpp) and its entry point (programs.hpp),
///   int chorus::bench::programs::all_reduce_perf(int argc, char** argv) {
///     return perf_main(describe<AllReduce>(), argc, argv);
///   }

#include <memory>

#include "chorus/device/runtime.hpp"
#include "coll/common/descriptor.hpp"
#include "coll/common/programs.hpp"

namespace chorus::bench {

/// main() of a *_perf program: parses the flags, starts or joins the ranks, prints the table.
/// Exit status 1 when any element was wrong (or a rank failed), else 0.
int perf_main(const Collective& collective, int argc, char** argv);

/// The CUDA runtime for --device cuda (cuda_runtime.cpp: the build's one nvcc-compiled instance);
/// where this build has no CUDA, throws unsupported saying so (no_cuda_runtime.cpp).
std::unique_ptr<device::Runtime> make_cuda_runtime();

}  // namespace chorus::bench
