// SPDX-License-Identifier: BSD-3-Clause
// reduce_perf: nccl-tests' reduce_perf for chorus. Every rank's `count` elements are reduced
// into the root's output; busbw = algbw.
#include "coll/common/driver.hpp"

namespace {
using namespace chorus::bench;

struct Reduce {
  static constexpr std::string_view kName = "reduce";
  static constexpr std::optional<chorus::algo::CollectiveKind> kKind = chorus::algo::CollectiveKind::reduce;
  static constexpr bool kReduces = true, kRooted = true, kInPlaceChecked = true;

  static Layout layout(std::size_t count, int) { return {count, count, count, 0, 0}; }
  static double algbw_elements(const Layout& l, int) { return static_cast<double>(l.count); }
  static double bus_factor(int) { return 1.0; }
  static Expect expect(const Layout&, int rank, int, int root, std::size_t j) {
    return rank == root ? Expect::reduce(j) : Expect::none();
  }
  template <class C>
  static void run(C& comm, const Call& c, std::vector<chorus::Request>& pending) {
    issue(
        c, pending, [&] { comm.reduce(c.in, c.out, c.layout.count, c.dtype, c.op, c.root); },
        [&] { return c.stream ? comm.reduce(c.in, c.out, c.layout.count, c.dtype, c.op, c.root, *c.stream) : comm.reduce_async(c.in, c.out, c.layout.count, c.dtype, c.op, c.root); });
  }
};
}  // namespace

/// The main() of reduce_perf (bench/CMakeLists.txt generates the one-line main that calls it).
int chorus::bench::programs::reduce_perf(int argc, char** argv) {
  return perf_main(describe<Reduce>(), argc, argv);
}
