// SPDX-License-Identifier: BSD-3-Clause
// The type-erased API rejects what its types cannot: a DataType or ReduceOp outside its
// enumeration, an op that does not apply to the dtype, a count whose buffers overflow, a null
// buffer that must hold elements. Each is invalid_argument naming the rank and the collective,
// raised on every rank before anything is sent: a correct call right after still works.
#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "chorus/communicator.hpp"
#include "support/communicators.hpp"
#include "support/spawn.hpp"

// This file's own names: the files of tests/collective/ are compiled together (unity build).
namespace collective_test_validation {

namespace {

using chorus::DataType;
using chorus::ErrorCode;
using chorus::ReduceOp;
using Comm = chorus::Communicator<chorus::inproc::Transport>;

/// `call` must throw invalid_argument naming this rank, `kind` and `part`.
template <class F>
void rejected(int rank, const char* kind, const std::string& part, F&& call) {
  const auto e = chorus::test::expect_error(ErrorCode::invalid_argument, call, std::string(kind) + ": " + part);
  const std::string text = e.what();
  chorus::test::expect(text.find("rank " + std::to_string(rank)) != std::string::npos, "names the rank: " + text);
  chorus::test::expect(text.find(kind) != std::string::npos, "names the collective: " + text);
  chorus::test::expect(text.find(part) != std::string::npos, "says '" + part + "': " + text);
}

}  // namespace

TEST_CASE("validation: the type-erased collectives reject bad arguments before sending, world 3") {
  chorus::test::run_threads(3, [](int rank, chorus::Options o) {
    Comm c = Comm::create(std::move(o));
    const int n = c.size();
    std::vector<float> a(8 * n, 1.0f), b(8 * n, 0.0f);
    const auto bad_dt = static_cast<DataType>(99);
    const auto bad_op = static_cast<ReduceOp>(42);
    const std::size_t huge = std::numeric_limits<std::size_t>::max() / 2;

    rejected(rank, "all_reduce", "not a chorus::DataType", [&] { c.all_reduce(a.data(), b.data(), 8, bad_dt, ReduceOp::sum); });
    rejected(rank, "broadcast", "not a chorus::DataType", [&] { c.broadcast(a.data(), 8, bad_dt, 0); });
    rejected(rank, "all_reduce", "not a chorus::ReduceOp", [&] { c.all_reduce(a.data(), b.data(), 8, DataType::float32, bad_op); });
    rejected(rank, "reduce_scatter", "not a chorus::ReduceOp",
             [&] { c.reduce_scatter(a.data(), b.data(), 8, DataType::float32, bad_op); });
    rejected(rank, "all_reduce", "does not apply", [&] { c.all_reduce(a.data(), b.data(), 8, DataType::float32, ReduceOp::bxor); });
    rejected(rank, "all_reduce", "larger than a call can move",
             [&] { c.all_reduce(a.data(), b.data(), huge, DataType::float32, ReduceOp::sum); });
    // all_gather's output holds count * n elements: this count overflows only once multiplied.
    rejected(rank, "all_gather", "larger than a call can move",
             [&] { c.all_gather(a.data(), b.data(), (std::size_t(1) << 46) / 4 / 2, DataType::float32); });
    rejected(rank, "all_reduce", "input buffer is null", [&] { c.all_reduce(nullptr, b.data(), 8, DataType::float32, ReduceOp::sum); });
    rejected(rank, "all_reduce", "output buffer is null", [&] { c.all_reduce(a.data(), nullptr, 8, DataType::float32, ReduceOp::sum); });
    rejected(rank, "broadcast", "null", [&] { c.broadcast(nullptr, 8, DataType::float32, 0); });
    // Null where this rank needs no buffer is fine: reduce's and gather's output off the root,
    // scatter's input off the root, and any buffer of an empty call.
    c.reduce(a.data(), rank == 0 ? b.data() : nullptr, 8, DataType::float32, ReduceOp::sum, 0);
    if (rank == 0) chorus::test::expect(b[0] == static_cast<float>(n), "reduce after the rejected calls");
    c.gather(a.data(), rank == 1 ? b.data() : nullptr, 2, DataType::float32, 1);
    c.scatter(rank == 2 ? a.data() : nullptr, b.data(), 2, DataType::float32, 2);
    c.all_reduce(nullptr, nullptr, 0, DataType::float32, ReduceOp::sum);
    // Nothing was sent by the rejected calls: the ranks still agree.
    c.all_reduce(a.data(), b.data(), 8, DataType::float32, ReduceOp::sum);
    chorus::test::expect(b[7] == static_cast<float>(n), "all_reduce after the rejected calls");
  });
}

}  // namespace collective_test_validation
