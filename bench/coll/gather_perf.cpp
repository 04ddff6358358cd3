// SPDX-License-Identifier: BSD-3-Clause
// gather_perf: nccl-tests' gather_perf for chorus. size is the root's buffer: every rank's
// count = size / n / typesize elements land in block r; busbw = algbw x (n-1)/n.
#include "coll/common/driver.hpp"

namespace {
using namespace chorus::bench;

struct Gather {
  static constexpr std::string_view kName = "gather";
  static constexpr std::optional<chorus::algo::CollectiveKind> kKind = chorus::algo::CollectiveKind::gather;
  static constexpr bool kReduces = false, kRooted = true, kInPlaceChecked = true;

  static Layout layout(std::size_t count, int n) {
    const std::size_t c = count / static_cast<std::size_t>(n);
    return {c, c * static_cast<std::size_t>(n), c, c, 0};
  }
  static double algbw_elements(const Layout& l, int n) { return static_cast<double>(l.count) * n; }
  static double bus_factor(int n) { return static_cast<double>(n - 1) / n; }
  static Expect expect(const Layout& l, int rank, int, int root, std::size_t j) {
    return rank == root ? Expect::copy(static_cast<int>(j / l.count), j % l.count) : Expect::none();
  }
  template <class C>
  static void run(C& comm, const Call& c, std::vector<chorus::Request>& pending) {
    issue(
        c, pending, [&] { comm.gather(c.in, c.out, c.layout.count, c.dtype, c.root); },
        [&] { return c.stream ? comm.gather(c.in, c.out, c.layout.count, c.dtype, c.root, *c.stream) : comm.gather_async(c.in, c.out, c.layout.count, c.dtype, c.root); });
  }
};
}  // namespace

/// The main() of gather_perf (bench/CMakeLists.txt generates the one-line main that calls it).
int chorus::bench::programs::gather_perf(int argc, char** argv) {
  return perf_main(describe<Gather>(), argc, argv);
}
