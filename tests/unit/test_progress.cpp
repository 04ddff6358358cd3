// SPDX-License-Identifier: BSD-3-Clause
// The progress model's hand-over (transport/progress.hpp): an engine's background thread that
// parked for kBusyPark while a caller drove is woken by the last caller to leave where the engine
// asked for it (set_hand_over_on_leave: tcp beside shm in the hybrid transport, whose ranks go on
// to wait on the other engine), and sleeps its park out where it did not.
#include "chorus/transport/progress.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <optional>
#include <thread>

// This file's own names: the files of tests/unit/ are compiled together (unity build).
namespace unit_test_progress {

using chorus::detail::DriveToken;

/// Parks a background thread while a caller drives, lets the caller leave once the park has
/// begun, and returns what park() said: true when it ended early.
bool park_then_leave(bool hand_over) {
  DriveToken t;
  t.set_hand_over_on_leave(hand_over);
  std::optional<DriveToken::Caller> caller;
  caller.emplace(t);
  std::atomic<int> early{-1};
  std::thread background([&] { early = t.park() ? 1 : 0; });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!t.busy_parked() && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  const bool parked = t.busy_parked();
  caller.reset();  // the last caller leaves
  background.join();
  REQUIRE(parked);  // the background thread was in its busy park when the caller left
  return early == 1;
}

TEST_CASE("DriveToken: the last caller out ends a busy park where the engine hands over on leave") {
  CHECK(park_then_leave(true));
}

TEST_CASE("DriveToken: without hand-over a busy park runs its time") {
  CHECK_FALSE(park_then_leave(false));
}

TEST_CASE("DriveToken: unpark ends a park, and every park after it") {
  DriveToken t;
  t.unpark();
  CHECK(t.park());
  DriveToken::Caller c(t);
  CHECK(t.park());
}

}  // namespace unit_test_progress
