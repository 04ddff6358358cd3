// SPDX-License-Identifier: BSD-3-Clause
// all_gather_perf: nccl-tests' all_gather_perf for chorus. size is the gathered buffer; every
// rank contributes count = size / n / typesize elements; busbw = algbw x (n-1)/n.
#include "coll/common/driver.hpp"

namespace {
using namespace chorus::bench;

struct AllGather {
  static constexpr std::string_view kName = "all_gather";
  static constexpr std::optional<chorus::algo::CollectiveKind> kKind =
      chorus::algo::CollectiveKind::all_gather;
  static constexpr bool kReduces = false, kRooted = false, kInPlaceChecked = true;

  static Layout layout(std::size_t count, int n) {
    const std::size_t c = count / static_cast<std::size_t>(n);
    return {c, c * static_cast<std::size_t>(n), c, c, 0};
  }
  static double algbw_elements(const Layout& l, int n) { return static_cast<double>(l.count) * n; }
  static double bus_factor(int n) { return static_cast<double>(n - 1) / n; }
  static Expect expect(const Layout& l, int, int, int, std::size_t j) {
    return Expect::copy(static_cast<int>(j / l.count), j % l.count);
  }
  template <class C>
  static void run(C& comm, const Call& c, std::vector<chorus::Request>& pending) {
    issue(
        c, pending, [&] { comm.all_gather(c.in, c.out, c.layout.count, c.dtype); },
        [&] { return c.stream ? comm.all_gather(c.in, c.out, c.layout.count, c.dtype, *c.stream) : comm.all_gather_async(c.in, c.out, c.layout.count, c.dtype); });
  }
};
}  // namespace

/// The main() of all_gather_perf (bench/CMakeLists.txt generates the one-line main that calls it).
int chorus::bench::programs::all_gather_perf(int argc, char** argv) {
  return perf_main(describe<AllGather>(), argc, argv);
}
