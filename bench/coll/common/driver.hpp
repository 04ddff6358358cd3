#pragma once
/// The one entry point of the shared driver (driver.cpp, nccl-tests' src/common.cu): a *_perf
/// program is a descriptor (descriptor.hpp) and one line,
///   int main(int argc, char** argv) { return perf_main(describe<D>(), argc, argv); }

#include "coll/common/descriptor.hpp"

namespace chorus::bench {

/// main() of a *_perf program: parses the flags, starts or joins the ranks, prints the table.
/// Exit status 1 when any element was wrong (or a rank failed), else 0.
int perf_main(const Collective& collective, int argc, char** argv);

}  // namespace chorus::bench
