// SPDX-License-Identifier: BSD-3-Clause
// all_to_all_v (all_to_all_v.hpp): all-to-all with a count per rank, ranks as threads over inproc
// and tcp, world sizes 1-4, counts including 0 and primes (up to 1031), three element sizes;
// every element encodes (sender, receiver, index), so a block in the wrong place or order shows.
// Counts that disagree fail the receive with mismatch.
#include "chorus/all_to_all_v.hpp"

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "chorus/communicator.hpp"
#include "chorus/transport/inproc/transport.hpp"
#include "chorus/transport/tcp/transport.hpp"
#include "support/spawn.hpp"

// This file's own names: the files of tests/collective/ are compiled together (unity build).
namespace collective_test_all_to_all_v {

namespace {

using chorus::DataType;
using chorus::test::expect;

constexpr std::size_t kCounts[] = {0, 1, 2, 3, 5, 7, 13, 31, 1031};

/// Elements rank `from` sends to rank `to` in round `round`: 0, primes, and one larger block.
std::size_t count(int from, int to, int round) {
  return kCounts[static_cast<std::size_t>(from * 5 + to * 3 + round) % std::size(kCounts)];
}

template <class T>
T value(int from, int to, std::size_t i) {
  return static_cast<T>(from * 1000003 + to * 10007 + static_cast<int>(i) + 1);
}

template <class T, class Comm>
void round_trip(Comm& c, int round) {
  const int n = c.size(), me = c.rank();
  std::vector<std::size_t> send(static_cast<std::size_t>(n)), recv(static_cast<std::size_t>(n));
  std::vector<T> in, out;
  for (int p = 0; p < n; ++p) {
    send[p] = count(me, p, round);
    recv[p] = count(p, me, round);
    for (std::size_t i = 0; i < send[p]; ++i) in.push_back(value<T>(me, p, i));
  }
  std::size_t total = 0;
  for (auto r : recv) total += r;
  out.assign(total, T{});
  chorus::all_to_all_v(c, in.data(), std::span<const std::size_t>(send), out.data(),
                       std::span<const std::size_t>(recv), chorus::data_type_of<T>);
  std::size_t at = 0;
  for (int p = 0; p < n; ++p) {
    for (std::size_t i = 0; i < recv[p]; ++i, ++at)
      expect(out[at] == value<T>(p, me, i), "rank " + std::to_string(me) + " round " + std::to_string(round) +
                                                 ": element " + std::to_string(i) + " from rank " + std::to_string(p));
  }
}

template <class Transport>
void run_world(int n) {
  chorus::test::run_threads(n, [](int, chorus::Options o) {
    auto c = chorus::Communicator<Transport>::create(std::move(o));
    for (int round = 0; round < 3; ++round) {
      round_trip<float>(c, round);
      round_trip<std::int8_t>(c, round);
      round_trip<std::uint64_t>(c, round);
    }
    c.barrier();  // the collectives are unaffected
  });
}

}  // namespace

TEST_CASE("all_to_all_v: inproc, world 1 to 4") {
  for (int n = 1; n <= 4; ++n) {
    CAPTURE(n);
    run_world<chorus::inproc::Transport>(n);
  }
}

TEST_CASE("all_to_all_v: tcp, world 2 and 3") {
  run_world<chorus::tcp::Transport>(2);
  run_world<chorus::tcp::Transport>(3);
}

TEST_CASE("all_to_all_v: bad arguments are invalid_argument; counts that disagree are mismatch") {
  chorus::test::run_threads(2, [](int rank, chorus::Options o) {
    auto c = chorus::Communicator<chorus::inproc::Transport>::create(std::move(o));
    std::vector<float> buf(16);
    const std::vector<std::size_t> ones = {1, 1, 1};
    chorus::test::expect_error(
        chorus::ErrorCode::invalid_argument,
        [&] { chorus::all_to_all_v(c, buf.data(), ones, buf.data(), ones, DataType::float32); },
        "three counts for two ranks");
    const std::vector<std::size_t> two = {2, 2}, three = {3, 3};  // to itself: 2 sent, 3 expected
    chorus::test::expect_error(
        chorus::ErrorCode::invalid_argument,
        [&] { chorus::all_to_all_v(c, buf.data(), two, buf.data(), three, DataType::float32); },
        "a block to itself of two sizes");
    // rank 0 sends 4 elements to rank 1, which expects 5
    const std::vector<std::size_t> send = rank == 0 ? std::vector<std::size_t>{1, 4} : std::vector<std::size_t>{1, 1};
    const std::vector<std::size_t> recv = rank == 0 ? std::vector<std::size_t>{1, 1} : std::vector<std::size_t>{5, 1};
    if (rank == 1) {
      chorus::test::expect_error(
          chorus::ErrorCode::mismatch,
          [&] { chorus::all_to_all_v(c, buf.data(), send, buf.data(), recv, DataType::float32); }, "4 sent, 5 expected");
    } else {
      try {
        chorus::all_to_all_v(c, buf.data(), send, buf.data(), recv, DataType::float32);
      } catch (const chorus::Error&) {  // the sender may learn of it too
      }
    }
  });
}

}  // namespace collective_test_all_to_all_v
