// SPDX-License-Identifier: BSD-3-Clause
// Bitwise reductions (band, bor, bxor) through all_reduce, reduce and reduce_scatter, with ranks as
// threads over inproc: world sizes 1-4, every integer dtype, each all_reduce algorithm (reduce
// with those it has too), counts including 0 and primes; each element checked against the
// operator folded over the ranks' inputs.
// Floating-point dtypes with a bitwise op are invalid_argument on every rank before anything is
// sent (so nothing waits on a peer).
#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "chorus/communicator.hpp"
#include "chorus/transport/inproc/transport.hpp"
#include "support/forced.hpp"
#include "support/spawn.hpp"

// This file's own names: the files of tests/collective/ are compiled together (unity build).
namespace collective_test_bitwise {

namespace {

using chorus::DataType;
using chorus::ReduceOp;
using chorus::test::expect;
using Comm = chorus::Communicator<chorus::inproc::Transport>;

constexpr std::size_t kCounts[] = {0, 1, 2, 7, 13, 1031};

/// Rank r's element i: varied bits in every byte, different per rank, op and dtype.
template <class T>
T input(int rank, std::size_t i, ReduceOp op) {
  std::uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ (static_cast<std::uint64_t>(rank) + 3) * 0xD1B54A32D192ED03ull ^
                    static_cast<std::uint64_t>(op) * 0x2545F4914F6CDD1Dull;
  x ^= x >> 29;
  return static_cast<T>(x);
}

template <class T>
T expected(int n, std::size_t i, ReduceOp op) {
  T acc = input<T>(0, i, op);
  for (int r = 1; r < n; ++r) {
    const T v = input<T>(r, i, op);
    acc = op == ReduceOp::band ? static_cast<T>(acc & v) : op == ReduceOp::bor ? static_cast<T>(acc | v)
                                                                               : static_cast<T>(acc ^ v);
  }
  return acc;
}

template <class T>
void check(const std::vector<T>& got, std::size_t offset, int n, ReduceOp op, const std::string& what, int rank) {
  for (std::size_t i = 0; i < got.size(); ++i)
    expect(got[i] == expected<T>(n, offset + i, op),
           what + " " + std::string(chorus::to_string(op)) + " " + std::string(chorus::to_string(chorus::data_type_of<T>)) +
               " rank " + std::to_string(rank) + " element " + std::to_string(offset + i));
}

/// `reduce`: whether the forced algorithm is one reduce has (recursive_doubling is all_reduce's
/// alone; forced on reduce it is invalid_argument).
template <class T>
void run_type(Comm& c, bool reduce) {
  const int n = c.size(), me = c.rank();
  for (ReduceOp op : chorus::kBitwiseReduceOps) {
    for (std::size_t count : kCounts) {
      std::vector<T> in(count);
      for (std::size_t i = 0; i < count; ++i) in[i] = input<T>(me, i, op);
      // all_reduce, in place and out of place
      std::vector<T> inout = in, out(count);
      c.all_reduce(std::span<T>(inout), op);
      check(inout, 0, n, op, "all_reduce in place", me);
      c.all_reduce_async(std::span<const T>(in), std::span<T>(out), op).wait();
      check(out, 0, n, op, "all_reduce_async", me);
      // reduce to the last rank
      if (reduce) {
        std::vector<T> red(me == n - 1 ? count : 0);
        c.reduce(std::span<const T>(in), std::span<T>(red), op, n - 1);
        if (me == n - 1) check(red, 0, n, op, "reduce", me);
      }
      // reduce_scatter: block r of size `count` (in has n blocks)
      std::vector<T> big(count * static_cast<std::size_t>(n)), block(count);
      for (std::size_t i = 0; i < big.size(); ++i) big[i] = input<T>(me, i, op);
      c.reduce_scatter(std::span<const T>(big), std::span<T>(block), op);
      check(block, count * static_cast<std::size_t>(me), n, op, "reduce_scatter", me);
    }
  }
}

void run_world(int n, const std::string& algorithm) {
  chorus::test::run_threads(n, [&](int, chorus::Options o) {
    o.algorithm = chorus::test::forced_where_it_applies(algorithm);
    o.chunk_bytes = 64;  // several slices for the larger counts
    auto c = Comm::create(std::move(o));
    const bool reduce = algorithm != "recursive_doubling";
    run_type<std::int8_t>(c, reduce);
    run_type<std::uint8_t>(c, reduce);
    run_type<std::int32_t>(c, reduce);
    run_type<std::uint32_t>(c, reduce);
    run_type<std::int64_t>(c, reduce);
    run_type<std::uint64_t>(c, reduce);
    // floating-point dtypes: refused at the call, on every rank, nothing sent
    for (DataType dt : {DataType::float16, DataType::bfloat16, DataType::float32, DataType::float64}) {
      for (ReduceOp op : chorus::kBitwiseReduceOps) {
        double buf[4] = {1, 2, 3, 4};
        chorus::test::expect_error(
            chorus::ErrorCode::invalid_argument, [&] { c.all_reduce(buf, buf, 4, dt, op); },
            "bitwise all_reduce of a floating-point type");
        chorus::test::expect_error(
            chorus::ErrorCode::invalid_argument, [&] { c.all_reduce_async(buf, buf, 4, dt, op).wait(); },
            "bitwise all_reduce_async of a floating-point type");
      }
    }
    c.barrier();  // still usable: the refused calls sent nothing
  });
}

}  // namespace

TEST_CASE("bitwise: world 1") { run_world(1, ""); }
TEST_CASE("bitwise: world 2 ring") { run_world(2, "ring"); }
TEST_CASE("bitwise: world 3 tree") { run_world(3, "tree"); }
TEST_CASE("bitwise: world 3 recursive_doubling") { run_world(3, "recursive_doubling"); }
TEST_CASE("bitwise: world 4 auto") { run_world(4, ""); }
TEST_CASE("bitwise: world 4 ring") { run_world(4, "ring"); }

}  // namespace collective_test_bitwise
