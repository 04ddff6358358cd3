// SPDX-License-Identifier: BSD-3-Clause
// Buffers that grow give memory back: the algorithms' Scratch after a burst of large calls, the
// flight recorder keeps a fixed number of calls.
#include "chorus/exec/host.hpp"
#include "chorus/diag/flight_recorder.hpp"

#include <doctest/doctest.h>

#include <cstddef>

namespace unit_test_memory {

using chorus::exec::Scratch;

// One 64 MiB call, then small ones: the 64 MiB stay through the window that saw them, and go
// back (to kKeepBytes) in one step once a whole window of small calls has passed; steady calls at
// kKeepBytes never reallocate.
TEST_CASE("scratch: a burst of large calls is given back after a window of small ones") {
  Scratch s;
  s.work(std::size_t(64) << 20);
  s.get(std::size_t(16) << 20);
  s.end_call();
  const std::size_t peak = s.bytes();
  CHECK(peak >= (std::size_t(80) << 20));
  int small = 0;
  while (s.bytes() == peak && small < 3 * Scratch::kWindow) {
    s.work(1024);
    s.get(1024);
    s.end_call();
    ++small;
  }
  CHECK(small >= Scratch::kWindow - 1);  // kept while its window lasts
  CHECK(small <= 2 * Scratch::kWindow);  // given back after the next one
  CHECK(s.bytes() <= 2 * Scratch::kKeepBytes);
  std::byte* p = s.work(Scratch::kKeepBytes);
  for (int i = 0; i < 3 * Scratch::kWindow; ++i) {
    CHECK(s.work(Scratch::kKeepBytes) == p);
    s.end_call();
  }
}

// Large calls in every window keep their scratch (no reallocation per call).
TEST_CASE("scratch: steady large calls keep their buffer") {
  Scratch s;
  std::byte* p = s.work(std::size_t(32) << 20);
  s.end_call();
  for (int i = 0; i < 3 * Scratch::kWindow; ++i) {
    CHECK(s.work(std::size_t(32) << 20) == p);
    s.end_call();
  }
}

// The recorder keeps its last N calls, oldest first, with their states.
TEST_CASE("flight recorder: keeps the last N calls and their states") {
  chorus::algo::FlightRecorder r(16, 1, {0, 1, 2}, 0);
  chorus::algo::CollectiveDesc d;
  d.kind = chorus::algo::CollectiveKind::all_reduce;
  d.dtype = chorus::DataType::float32;
  for (std::uint64_t k = 0; k < 40; ++k) {
    d.seq = k;
    d.count = k;
    r.started(d, chorus::algo::Algorithm::ring);
    if (k != 39) r.finished(k, k % 5 != 0);
  }
  const auto recs = r.snapshot();
  REQUIRE(recs.size() == 16);
  CHECK(recs.front().desc.seq == 24);
  CHECK(recs.back().desc.seq == 39);
  CHECK(recs.back().state == chorus::algo::CallState::running);
  CHECK(recs[1].state == chorus::algo::CallState::failed);  // #25
  CHECK(recs[2].state == chorus::algo::CallState::completed);
  CHECK(r.entered() == 40);
  CHECK(r.completed() == 39);  // #38 completed: 39 calls up to it
  const std::string dump = r.dump("test");
  CHECK(dump.find("#39 all_reduce float32 sum count 39 algorithm ring: running") != std::string::npos);
  CHECK(dump.find("#23 ") == std::string::npos);
}

}  // namespace unit_test_memory
