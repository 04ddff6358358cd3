// SPDX-License-Identifier: BSD-3-Clause
// all_reduce_perf: nccl-tests' all_reduce_perf for chorus. Every rank's buffer of `count`
// elements is reduced into every rank's output; busbw = algbw x 2(n-1)/n.
#include "coll/common/driver.hpp"

namespace {
using namespace chorus::bench;

struct AllReduce {
  static constexpr std::string_view kName = "all_reduce";
  static constexpr std::optional<chorus::algo::CollectiveKind> kKind =
      chorus::algo::CollectiveKind::all_reduce;
  static constexpr bool kReduces = true, kRooted = false, kInPlaceChecked = true;

  static Layout layout(std::size_t count, int) { return {count, count, count, 0, 0}; }
  static double algbw_elements(const Layout& l, int) { return static_cast<double>(l.count); }
  static double bus_factor(int n) { return 2.0 * (n - 1) / n; }
  static Expect expect(const Layout&, int, int, int, std::size_t j) { return Expect::reduce(j); }
  template <class C>
  static void run(C& comm, const Call& c, std::vector<chorus::Request>& pending) {
    issue(
        c, pending, [&] { comm.all_reduce(c.in, c.out, c.layout.count, c.dtype, c.op); },
        [&] { return c.stream ? comm.all_reduce(c.in, c.out, c.layout.count, c.dtype, c.op, *c.stream) : comm.all_reduce_async(c.in, c.out, c.layout.count, c.dtype, c.op); });
  }
};
}  // namespace

/// The main() of all_reduce_perf (bench/CMakeLists.txt generates the one-line main that calls it).
int chorus::bench::programs::all_reduce_perf(int argc, char** argv) {
  return perf_main(describe<AllReduce>(), argc, argv);
}
