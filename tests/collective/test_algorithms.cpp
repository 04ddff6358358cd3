// SPDX-License-Identifier: BSD-3-Clause
// Each forced algorithm of broadcast and reduce (the matrix runs the selector's choices), over
// inproc ranks, with tiny slices so that pipelining is exercised on small buffers; and a forced
// algorithm that a collective lacks, refused by name.
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
      const bool broadcast = std::string(algo) != "ring", reduce = std::string(algo) != "chain";
      chorus::test::run_threads(n, [&](int rank, chorus::Options o) {
        o.algorithm = algo;
        o.chunk_bytes = 12;  // three floats per slice
        auto comm = Comm::create(std::move(o));
        for (std::size_t count : {std::size_t(0), std::size_t(1), std::size_t(7), std::size_t(1000), std::size_t(4099)}) {
          for (int root = 0; root < n; ++root) {
            const std::string what = std::string(algo) + " n=" + std::to_string(n) + " count=" + std::to_string(count) +
                                     " root=" + std::to_string(root) + " rank=" + std::to_string(rank);
            // broadcast: everyone ends with the root's input.
            if (broadcast) {
              std::vector<float> buf(count);
              for (std::size_t i = 0; i < count; ++i) buf[i] = rank == root ? input(root, i) : -99.0f;
              comm.broadcast(buf, root);
              for (std::size_t i = 0; i < count; ++i) expect(buf[i] == input(root, i), "broadcast " + what);
            }
            if (!reduce) continue;
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

TEST_CASE("a forced algorithm the collective lacks is refused by name; pairs force one collective; split runs") {
  using chorus::ErrorCode;
  using chorus::test::expect_error;
  const auto refused = [](const chorus::Error& e, const std::string& what) {
    const std::string m = e.what();
    for (const char* part : {"broadcast has no ring algorithm", "binomial, chain, hierarchical, tree", "CHORUS_ALGO"})
      if (what == "broadcast" && m.find(part) == std::string::npos) throw chorus::test::Failure("message: " + m);
    for (const char* part : {"reduce has no chain algorithm", "binomial, ring, hierarchical, tree"})
      if (what == "reduce" && m.find(part) == std::string::npos) throw chorus::test::Failure("message: " + m);
  };
  for (int n : {1, 3}) {
    CAPTURE(n);
    chorus::test::run_threads(n, [&](int rank, chorus::Options o) {
      std::vector<float> buf(5, 1.0f), out(5 * static_cast<std::size_t>(n));
      {
        o.algorithm = "ring";
        auto comm = Comm::create(o);
        refused(expect_error(ErrorCode::invalid_argument, [&] { comm.broadcast(std::span(buf), 0); }, "broadcast ring"),
                "broadcast");
        // ring is all_reduce's, reduce's and all_gather's; gather and barrier have one algorithm
        // each, not ring: refused too. split (the library's own calls) takes no override.
        comm.all_reduce(std::span(buf), chorus::ReduceOp::sum);
        comm.reduce(std::span<const float>(buf), std::span(out).first(5), chorus::ReduceOp::sum, 0);
        comm.all_gather(std::span<const float>(buf), std::span(out));
        const auto one = [](const chorus::Error& e, const char* part) {
          if (std::string(e.what()).find(part) == std::string::npos) throw chorus::test::Failure(std::string("message: ") + e.what());
        };
        one(expect_error(ErrorCode::invalid_argument, [&] { comm.gather(std::span<const float>(buf), std::span(out), 0); },
                         "gather ring"),
            "gather has no ring algorithm; it has direct");
        one(expect_error(ErrorCode::invalid_argument, [&] { comm.barrier(); }, "barrier ring"),
            "barrier has no ring algorithm; it has dissemination");
        auto sub = comm.split(rank % 2, rank);
        expect_error(ErrorCode::invalid_argument, [&] { sub.barrier(); }, "sub barrier ring");
        expect(buf[0] == static_cast<float>(n), "all_reduce ring after the refusal");
      }
      {
        o.algorithm = "all_reduce:ring;reduce:binomial";  // pairs: the others keep the model's choice
        auto comm = Comm::create(o);
        comm.all_reduce(std::span(buf), chorus::ReduceOp::sum);
        comm.broadcast(std::span(buf), 0);
        comm.gather(std::span<const float>(buf), std::span(out), 0);
        comm.barrier();
        expect(buf[0] == static_cast<float>(n) * n, "all_reduce ring (pairs)");
      }
      {
        o.algorithm = "chain";
        auto comm = Comm::create(o);
        refused(expect_error(ErrorCode::invalid_argument,
                             [&] { comm.reduce(std::span<const float>(buf), std::span(out).first(5), chorus::ReduceOp::sum, 0); },
                             "reduce chain"),
                "reduce");
        expect_error(ErrorCode::invalid_argument, [&] { comm.all_reduce(std::span(buf), chorus::ReduceOp::sum); },
                     "all_reduce chain");
        comm.broadcast(std::span(buf), 0);
        auto sub = comm.split(0, rank);
      }
      {
        o.algorithm = "one_shot";  // all_reduce's alone
        auto comm = Comm::create(o);
        expect_error(ErrorCode::invalid_argument, [&] { comm.broadcast(std::span(buf), 0); }, "broadcast one_shot");
        expect_error(ErrorCode::invalid_argument, [&] { comm.barrier(); }, "barrier one_shot");
      }
    });
  }
}

}  // namespace collective_test_algorithms
