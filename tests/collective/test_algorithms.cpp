// Each forced algorithm of broadcast and reduce (the matrix runs the selector's choices), over
// inproc ranks, with tiny slices so that pipelining is exercised on small buffers.
#include "chorus/communicator.hpp"
#include "support/communicators.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "chorus/transport/inproc/transport.hpp"
#include "support/spawn.hpp"

// This file's own names: the files of tests/collective/ are compiled together (unity build).
namespace collective_test_algorithms {

using chorus::test::expect;
using Comm = chorus::Communicator<chorus::inproc::Transport>;

namespace {
/// Rank r's input element i: small integers, so every sum is exact in float too.
float input(int rank, std::size_t i) { return static_cast<float>((rank * 7 + static_cast<int>(i % 13)) % 17 - 8); }
}  // namespace

TEST_CASE("broadcast and reduce with each algorithm, every root, uneven counts") {
  for (int n : {1, 2, 3, 5, 8}) {
    CAPTURE(n);
    for (const char* algo : {"chain", "binomial", "ring"}) {
      CAPTURE(algo);
      chorus::test::run_threads(n, [&](int rank, chorus::Options o) {
        o.algorithm = algo;
        o.chunk_bytes = 12;  // three floats per slice
        auto comm = Comm::create(std::move(o));
        for (std::size_t count : {std::size_t(0), std::size_t(1), std::size_t(7), std::size_t(1000), std::size_t(4099)}) {
          for (int root = 0; root < n; ++root) {
            const std::string what = std::string(algo) + " n=" + std::to_string(n) + " count=" + std::to_string(count) +
                                     " root=" + std::to_string(root) + " rank=" + std::to_string(rank);
            // broadcast: everyone ends with the root's input.
            std::vector<float> buf(count);
            for (std::size_t i = 0; i < count; ++i) buf[i] = rank == root ? input(root, i) : -99.0f;
            comm.broadcast(buf, root);
            for (std::size_t i = 0; i < count; ++i) expect(buf[i] == input(root, i), "broadcast " + what);
            // reduce (sum and avg): the root gets the exact sum; other ranks' out is untouched.
            std::vector<float> in(count), out(count, -1.0f);
            for (std::size_t i = 0; i < count; ++i) in[i] = input(rank, i);
            comm.reduce(in, out, chorus::ReduceOp::sum, root);
            for (std::size_t i = 0; i < count; ++i) {
              float want = 0;
              for (int p = 0; p < n; ++p) want += input(p, i);
              expect(out[i] == (rank == root ? want : -1.0f), "reduce sum " + what);
            }
            std::vector<std::int32_t> iin(count), iout(count, 0);
            for (std::size_t i = 0; i < count; ++i) iin[i] = static_cast<std::int32_t>(input(rank, i)) * n;
            comm.reduce(iin, iout, chorus::ReduceOp::avg, root);
            if (rank == root)
              for (std::size_t i = 0; i < count; ++i) {
                std::int32_t sum = 0;
                for (int p = 0; p < n; ++p) sum += static_cast<std::int32_t>(input(p, i)) * n;
                expect(iout[i] == sum / n, "reduce avg " + what);
              }
          }
        }
      });
    }
  }
}

}  // namespace collective_test_algorithms
