// SPDX-License-Identifier: BSD-3-Clause
// sendrecv_perf: nccl-tests' sendrecv_perf for chorus. Every rank sends `count` elements to
// rank + 1 and receives as many from rank - 1, at once (isend + irecv); busbw = algbw.
// Sending and receiving in one buffer is not supported: the in-place half is timed, #wrong is N/A.
#include <cstring>

#include "coll/common/driver.hpp"

namespace {
using namespace chorus::bench;

struct SendRecv {
  static constexpr std::string_view kName = "sendrecv";
  static constexpr std::optional<chorus::algo::CollectiveKind> kKind = std::nullopt;  // point to point
  static constexpr bool kReduces = false, kRooted = false, kInPlaceChecked = false;

  static Layout layout(std::size_t count, int) { return {count, count, count, 0, 0}; }
  static double algbw_elements(const Layout& l, int) { return static_cast<double>(l.count); }
  static double bus_factor(int) { return 1.0; }
  static Expect expect(const Layout&, int rank, int n, int, std::size_t j) { return Expect::copy((rank + n - 1) % n, j); }
  template <class C>
  static void run(C& comm, const Call& c, std::vector<chorus::Request>& pending) {
    const std::size_t bytes = c.bytes(c.layout.count);
    if (c.size == 1) {  // no link to oneself
      if (c.out != c.in && bytes != 0) std::memmove(c.out, c.in, bytes);
      return;
    }
    pending.push_back(comm.irecv_bytes(chorus::MutableBytes{c.out, bytes}, (c.rank + c.size - 1) % c.size, 0));
    pending.push_back(comm.isend_bytes(chorus::ConstBytes{c.in, bytes}, (c.rank + 1) % c.size, 0));
  }
};
}  // namespace

/// The main() of sendrecv_perf (bench/CMakeLists.txt generates the one-line main that calls it).
int chorus::bench::programs::sendrecv_perf(int argc, char** argv) {
  return perf_main(describe<SendRecv>(), argc, argv);
}
