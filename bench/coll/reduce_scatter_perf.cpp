// SPDX-License-Identifier: BSD-3-Clause
// reduce_scatter_perf: nccl-tests' reduce_scatter_perf for chorus. size is every rank's input;
// each rank receives its reduced block of count = size / n / typesize elements;
// busbw = algbw x (n-1)/n.
#include "coll/common/driver.hpp"

namespace {
using namespace chorus::bench;

struct ReduceScatter {
  static constexpr std::string_view kName = "reduce_scatter";
  static constexpr std::optional<chorus::algo::CollectiveKind> kKind =
      chorus::algo::CollectiveKind::reduce_scatter;
  static constexpr bool kReduces = true, kRooted = false, kInPlaceChecked = true;

  static Layout layout(std::size_t count, int n) {
    const std::size_t c = count / static_cast<std::size_t>(n);
    return {c * static_cast<std::size_t>(n), c, c, 0, c};
  }
  static double algbw_elements(const Layout& l, int n) { return static_cast<double>(l.count) * n; }
  static double bus_factor(int n) { return static_cast<double>(n - 1) / n; }
  static Expect expect(const Layout& l, int rank, int, int, std::size_t j) {
    return Expect::reduce(static_cast<std::size_t>(rank) * l.count + j);
  }
  template <class C>
  static void run(C& comm, const Call& c, std::vector<chorus::Request>& pending) {
    issue(
        c, pending, [&] { comm.reduce_scatter(c.in, c.out, c.layout.count, c.dtype, c.op); },
        [&] { return c.stream ? comm.reduce_scatter(c.in, c.out, c.layout.count, c.dtype, c.op, *c.stream) : comm.reduce_scatter_async(c.in, c.out, c.layout.count, c.dtype, c.op); });
  }
};
}  // namespace

/// The main() of reduce_scatter_perf (bench/CMakeLists.txt generates the one-line main that calls it).
int chorus::bench::programs::reduce_scatter_perf(int argc, char** argv) {
  return perf_main(describe<ReduceScatter>(), argc, argv);
}
