// SPDX-License-Identifier: BSD-3-Clause
// scatter_perf: nccl-tests' scatter_perf for chorus. size is the root's buffer: n blocks of
// count = size / n / typesize elements, block p going to rank p; busbw = algbw x (n-1)/n.
#include "coll/common/driver.hpp"

namespace {
using namespace chorus::bench;

struct Scatter {
  static constexpr std::string_view kName = "scatter";
  static constexpr std::optional<chorus::algo::CollectiveKind> kKind = chorus::algo::CollectiveKind::scatter;
  static constexpr bool kReduces = false, kRooted = true, kInPlaceChecked = true;

  static Layout layout(std::size_t count, int n) {
    const std::size_t c = count / static_cast<std::size_t>(n);
    return {c * static_cast<std::size_t>(n), c, c, 0, c};
  }
  static double algbw_elements(const Layout& l, int n) { return static_cast<double>(l.count) * n; }
  static double bus_factor(int n) { return static_cast<double>(n - 1) / n; }
  static Expect expect(const Layout& l, int rank, int, int root, std::size_t j) {
    return Expect::copy(root, static_cast<std::size_t>(rank) * l.count + j);
  }
  template <class C>
  static void run(C& comm, const Call& c, std::vector<chorus::Request>& pending) {
    issue(
        c, pending, [&] { comm.scatter(c.in, c.out, c.layout.count, c.dtype, c.root); },
        [&] { return c.stream ? comm.scatter(c.in, c.out, c.layout.count, c.dtype, c.root, *c.stream) : comm.scatter_async(c.in, c.out, c.layout.count, c.dtype, c.root); });
  }
};
}  // namespace

/// The main() of scatter_perf (bench/CMakeLists.txt generates the one-line main that calls it).
int chorus::bench::programs::scatter_perf(int argc, char** argv) {
  return perf_main(describe<Scatter>(), argc, argv);
}
