// SPDX-License-Identifier: BSD-3-Clause
// broadcast_perf: nccl-tests' broadcast_perf for chorus. The root's `count` elements reach every
// rank; busbw = algbw. chorus's broadcast works on one buffer, so out of place the root sends
// from its input and copies it to its output while the broadcast runs.
#include "coll/common/driver.hpp"

namespace {
using namespace chorus::bench;

struct Broadcast {
  static constexpr std::string_view kName = "broadcast";
  static constexpr std::optional<chorus::algo::CollectiveKind> kKind =
      chorus::algo::CollectiveKind::broadcast;
  static constexpr bool kReduces = false, kRooted = true, kInPlaceChecked = true;

  static Layout layout(std::size_t count, int) { return {count, count, count, 0, 0}; }
  static double algbw_elements(const Layout& l, int) { return static_cast<double>(l.count); }
  static double bus_factor(int) { return 1.0; }
  static Expect expect(const Layout&, int, int, int root, std::size_t j) { return Expect::copy(root, j); }
  template <class C>
  static void run(C& comm, const Call& c, std::vector<chorus::Request>& pending) {
    if (c.rank == c.root && c.in != c.out) {
      // The root only reads its buffer.
      issue(
          c, pending, [&] { comm.broadcast(const_cast<std::byte*>(c.in), c.layout.count, c.dtype, c.root); },
          [&] {
            auto* buf = const_cast<std::byte*>(c.in);
            return c.stream ? comm.broadcast(buf, c.layout.count, c.dtype, c.root, *c.stream)
                            : comm.broadcast_async(buf, c.layout.count, c.dtype, c.root);
          });
      c.copy(c.out, c.in, c.bytes(c.layout.count));  // device buffers: through the runtime (a memcpy crashed there)
      return;
    }
    issue(
        c, pending, [&] { comm.broadcast(c.out, c.layout.count, c.dtype, c.root); },
        [&] {
          return c.stream ? comm.broadcast(c.out, c.layout.count, c.dtype, c.root, *c.stream)
                          : comm.broadcast_async(c.out, c.layout.count, c.dtype, c.root);
        });
  }
};
}  // namespace

/// The main() of broadcast_perf (bench/CMakeLists.txt generates the one-line main that calls it).
int chorus::bench::programs::broadcast_perf(int argc, char** argv) {
  return perf_main(describe<Broadcast>(), argc, argv);
}
