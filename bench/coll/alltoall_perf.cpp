// SPDX-License-Identifier: BSD-3-Clause
// alltoall_perf: nccl-tests' alltoall_perf for chorus. size is every rank's buffer: n blocks of
// count = size / n / typesize elements, block p going to rank p; busbw = algbw x (n-1)/n.
// chorus's all_to_all has no in-place form: the in-place half is timed, #wrong is N/A.
#include "coll/common/driver.hpp"

namespace {
using namespace chorus::bench;

struct AllToAll {
  static constexpr std::string_view kName = "alltoall";
  static constexpr std::optional<chorus::algo::CollectiveKind> kKind =
      chorus::algo::CollectiveKind::all_to_all;
  static constexpr bool kReduces = false, kRooted = false, kInPlaceChecked = false;

  static Layout layout(std::size_t count, int n) {
    const std::size_t c = count / static_cast<std::size_t>(n);
    return {c * static_cast<std::size_t>(n), c * static_cast<std::size_t>(n), c, 0, 0};
  }
  static double algbw_elements(const Layout& l, int n) { return static_cast<double>(l.count) * n; }
  static double bus_factor(int n) { return static_cast<double>(n - 1) / n; }
  static Expect expect(const Layout& l, int rank, int, int, std::size_t j) {
    return Expect::copy(static_cast<int>(j / l.count),
                        static_cast<std::size_t>(rank) * l.count + j % l.count);
  }
  template <class C>
  static void run(C& comm, const Call& c, std::vector<chorus::Request>& pending) {
    issue(
        c, pending, [&] { comm.all_to_all(c.in, c.out, c.layout.count, c.dtype); },
        [&] { return c.stream ? comm.all_to_all(c.in, c.out, c.layout.count, c.dtype, *c.stream) : comm.all_to_all_async(c.in, c.out, c.layout.count, c.dtype); });
  }
};
}  // namespace

/// The main() of alltoall_perf (bench/CMakeLists.txt generates the one-line main that calls it).
int chorus::bench::programs::alltoall_perf(int argc, char** argv) {
  return perf_main(describe<AllToAll>(), argc, argv);
}
