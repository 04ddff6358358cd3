// SPDX-License-Identifier: BSD-3-Clause
// CallQueue: calls run one at a time, in the order they were submitted, exactly once, whether
// the worker runs them or a thread waiting for one runs it itself; errors reach the waiter.
#include "chorus/impl/call_queue.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

namespace unit_test_call_queue {

namespace {

using chorus::detail::RequestState;
using chorus::detail::CallQueue;

std::shared_ptr<RequestState> state() {
  return std::make_shared<RequestState>(chorus::ErrorContext{0, -1, "test call"}, std::chrono::seconds(30));
}

}  // namespace

TEST_CASE("serial executor: in order, once each, one at a time, whoever runs them") {
  constexpr int kJobs = 400;
  CallQueue ex;
  std::mutex mu;
  std::vector<int> log;
  std::atomic<int> running{0};
  std::atomic<int> overlaps{0};
  std::atomic<int> on_worker{0};
  const auto me = std::this_thread::get_id();
  std::vector<std::shared_ptr<RequestState>> states;
  std::mt19937 rng(7);
  for (int i = 0; i < kJobs; ++i) {
    auto s = state();
    states.push_back(s);
    ex.submit(
        [&, i] {
          if (running.fetch_add(1) != 0) overlaps.fetch_add(1);
          if (std::this_thread::get_id() != me) on_worker.fetch_add(1);
          if (i % 7 == 0) std::this_thread::sleep_for(std::chrono::microseconds(50));  // a slow one now and then
          {
            std::lock_guard lk(mu);
            log.push_back(i);
          }
          running.fetch_sub(1);
        },
        s);
    // Now and then wait for a call a few places back or just submitted: the waiter may run it
    // (and only it) itself, or find the worker at it.
    if (rng() % 3 == 0) states[static_cast<std::size_t>(i) - rng() % (std::min(i, 5) + 1)]->wait();
  }
  for (auto& s : states) s->wait();
  CHECK(overlaps.load() == 0);
  REQUIRE(log.size() == static_cast<std::size_t>(kJobs));
  for (int i = 0; i < kJobs; ++i) CHECK(log[static_cast<std::size_t>(i)] == i);
  // Both kinds of thread ran some (not a requirement of correctness; says the test covered both).
  MESSAGE("on the worker: " << on_worker.load() << " of " << kJobs);
}

TEST_CASE("serial executor: a call's error reaches its waiter; later calls still run") {
  CallQueue ex;
  auto bad = state(), good = state();
  std::atomic<bool> ran{false};
  ex.submit([] { throw chorus::Error(chorus::ErrorCode::mismatch, "differs"); }, bad);
  ex.submit([&] { ran = true; }, good);
  CHECK_THROWS_AS(bad->wait(), chorus::Error);
  good->wait();
  CHECK(ran.load());
}

TEST_CASE("serial executor: try_run runs inline only when nothing is queued or running") {
  CallQueue ex;
  int inline_runs = 0;
  auto task = [&] { ++inline_runs; };
  CHECK(ex.try_run(task));
  auto s = state();
  std::atomic<bool> release{false};
  ex.submit([&] {
    while (!release.load()) std::this_thread::yield();
  }, s);
  CHECK_FALSE(ex.try_run(task));
  release = true;
  s->wait();
  CHECK(ex.try_run(task));
  CHECK(inline_runs == 2);
}

// A call submitted while another runs inline (on its caller's thread) waits for it: never two at
// once. Checked with the inline call holding the executor until the queued call has been posted
// and the worker has had every chance to start it.
TEST_CASE("serial executor: a queued call never overlaps an inline one") {
  CallQueue ex;
  std::atomic<int> running{0};
  std::atomic<int> overlaps{0};
  auto body = [&] {
    if (running.fetch_add(1) != 0) overlaps.fetch_add(1);
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    running.fetch_sub(1);
  };
  for (int round = 0; round < 50; ++round) {
    REQUIRE(ex.try_begin_inline());
    auto s = state();
    ex.submit(body, s);  // queued while the inline call holds the executor
    CHECK(ex.pending() == 2);
    body();
    ex.end_inline();
    s->wait();
  }
  CHECK(overlaps.load() == 0);
  CHECK(ex.pending() == 0);
}

// cancel(): queued calls that have not started fail with the cancel error without running; the
// running one finishes; later submissions fail too.
TEST_CASE("serial executor: cancel fails the queued calls without running them") {
  CallQueue ex;
  std::atomic<bool> release{false};
  std::atomic<int> ran{0};
  auto first = state(), second = state(), third = state();
  std::atomic<bool> started{false};
  ex.submit([&] {
    started = true;
    while (!release.load()) std::this_thread::yield();
    ran.fetch_add(1);
  }, first);
  ex.submit([&] { ran.fetch_add(1); }, second);
  while (!started.load()) std::this_thread::yield();
  ex.cancel(chorus::Error(chorus::ErrorCode::aborted, "cancelled by the test"));
  release = true;
  first->wait();
  CHECK_THROWS_WITH_AS(second->wait(), doctest::Contains("cancelled by the test"), chorus::Error);
  ex.submit([&] { ran.fetch_add(1); }, third);
  CHECK_THROWS_AS(third->wait(), chorus::Error);
  CHECK(ran.load() == 1);
}

}  // namespace unit_test_call_queue
