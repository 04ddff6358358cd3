// SPDX-License-Identifier: BSD-3-Clause
// chorus::Call (call.hpp): every kind through run() and start() gives what the typed method of its
// kind gives; a kind that is not a collective, and a bad root, are invalid_argument naming the
// rank and the operation, and the communicator stays usable. Request's public completion API:
// on_complete (several callbacks, at once when done already) and wait_for (false while pending).
#include "chorus/call.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <exception>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "support/communicators.hpp"
#include "support/spawn.hpp"

// This file's own names: the files of tests/collective/ are compiled together (unity build).
namespace collective_test_call {

namespace {

using chorus::Call;
using chorus::CallKind;
using chorus::DataType;
using chorus::ErrorCode;
using chorus::ReduceOp;
using Comm = chorus::Communicator<chorus::inproc::Transport>;

/// Rank-unique inputs: element i of rank r is r * 100 + i.
std::vector<float> input(int rank, std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>(rank * 100 + static_cast<int>(i));
  return v;
}

}  // namespace

TEST_CASE("call: every kind through run() and start() matches its typed method, world 3") {
  chorus::test::run_threads(3, [](int rank, chorus::Options o) {
    Comm c = Comm::create(std::move(o));
    const int n = c.size();
    const std::size_t k = 7;
    for (bool async : {false, true}) {
      auto issue = [&](const Call& call) {
        if (async)
          chorus::start(c, call).wait();
        else
          chorus::run(c, call);
      };
      struct Case {
        CallKind kind;
        std::size_t in, out, count;  // elements of in and out, count as the kind counts
        int root;
      };
      const std::vector<Case> cases = {
          {CallKind::all_reduce, k, k, k, -1},     {CallKind::broadcast, 0, k, k, 1},
          {CallKind::reduce, k, k, k, 2},          {CallKind::all_gather, k, k * n, k, -1},
          {CallKind::gather, k, k * n, k, 0},      {CallKind::scatter, k * n, k, k, 1},
          {CallKind::reduce_scatter, k * n, k, k, -1}, {CallKind::all_to_all, k * n, k * n, k, -1},
      };
      for (const Case& cs : cases) {
        const std::string what = std::string(chorus::algo::to_string(cs.kind)) + (async ? " start" : " run");
        std::vector<float> in = input(rank, cs.in), out(cs.out, -1.0f), want_in = in, want(cs.out, -1.0f);
        if (cs.kind == CallKind::broadcast) out = want = input(rank, cs.out);
        issue({.kind = cs.kind, .in = in.data(), .out = out.data(), .count = cs.count,
               .dtype = DataType::float32, .op = ReduceOp::max, .root = cs.root});
        switch (cs.kind) {
          case CallKind::all_reduce: c.all_reduce(want_in.data(), want.data(), k, DataType::float32, ReduceOp::max); break;
          case CallKind::broadcast: c.broadcast(want.data(), k, DataType::float32, 1); break;
          case CallKind::reduce: c.reduce(want_in.data(), want.data(), k, DataType::float32, ReduceOp::max, 2); break;
          case CallKind::all_gather: c.all_gather(want_in.data(), want.data(), k, DataType::float32); break;
          case CallKind::gather: c.gather(want_in.data(), want.data(), k, DataType::float32, 0); break;
          case CallKind::scatter: c.scatter(want_in.data(), want.data(), k, DataType::float32, 1); break;
          case CallKind::reduce_scatter: c.reduce_scatter(want_in.data(), want.data(), k, DataType::float32, ReduceOp::max); break;
          case CallKind::all_to_all: c.all_to_all(want_in.data(), want.data(), k, DataType::float32); break;
          default: break;
        }
        chorus::test::expect(out == want, what + ": the same result as the typed method");
      }
      issue({.kind = CallKind::barrier});
    }
  });
}

TEST_CASE("call: a kind that is not a collective, and a bad root, are invalid_argument; the communicator goes on") {
  chorus::test::run_threads(2, [](int rank, chorus::Options o) {
    Comm c = Comm::create(std::move(o));
    std::vector<float> a(4, 1.0f);
    const std::string me = "rank " + std::to_string(rank);
    for (auto kind : {CallKind::split, static_cast<CallKind>(99)}) {
      const Call bad{.kind = kind, .in = a.data(), .out = a.data(), .count = 4, .dtype = DataType::float32};
      auto e = chorus::test::expect_error(ErrorCode::invalid_argument, [&] { chorus::run(c, bad); }, "run, bad kind");
      chorus::test::expect(std::string(e.what()).find(me) != std::string::npos, e.what());
      chorus::test::expect(std::string(e.what()).find("run(Call)") != std::string::npos, e.what());
      e = chorus::test::expect_error(ErrorCode::invalid_argument, [&] { (void)chorus::start(c, bad); }, "start, bad kind");
      chorus::test::expect(std::string(e.what()).find("start(Call)") != std::string::npos, e.what());
    }
    const Call bad_root{.kind = CallKind::broadcast, .out = a.data(), .count = 4, .dtype = DataType::float32, .root = 5};
    auto e = chorus::test::expect_error(ErrorCode::invalid_argument, [&] { chorus::run(c, bad_root); }, "bad root");
    chorus::test::expect(std::string(e.what()).find(me) != std::string::npos, e.what());
    chorus::test::expect(std::string(e.what()).find("broadcast") != std::string::npos, e.what());
    chorus::run(c, {.kind = CallKind::all_reduce, .in = a.data(), .out = a.data(), .count = 4,
                    .dtype = DataType::float32, .op = ReduceOp::sum});
    chorus::test::expect(a == std::vector<float>(4, 2.0f), "a correct call after the bad ones");
  });
}

TEST_CASE("request: on_complete runs every callback once, at once when done; wait_for is false while pending") {
  chorus::test::run_threads(2, [](int rank, chorus::Options o) {
    Comm c = Comm::create(std::move(o));
    std::vector<int> buf(4, rank);
    if (rank == 0) {
      chorus::Request r = c.irecv(std::span(buf), 1, 5);
      std::atomic<int> calls{0};
      std::exception_ptr seen = std::make_exception_ptr(1);
      r.on_complete([&](std::exception_ptr e) { calls += 1; seen = e; });
      r.on_complete([&](std::exception_ptr) { calls += 10; });
      chorus::test::expect(!r.wait_for(std::chrono::milliseconds(20)), "pending: the peer sends after the barrier");
      c.barrier();
      chorus::test::expect(r.wait_for(std::chrono::seconds(30)), "done once the peer sent");
      chorus::test::expect(buf == std::vector<int>(4, 1), "received");
      chorus::test::expect(r.wait_for(std::chrono::milliseconds(0)), "done stays done");
      // The callbacks run on the completing thread, possibly just after the waiter woke.
      for (int i = 0; i < 3000 && calls.load() != 11; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      chorus::test::expect_eq(calls.load(), 11, "both callbacks, once each");
      chorus::test::expect(seen == nullptr, "success: no error");
      int now = 0;
      r.on_complete([&](std::exception_ptr e) { now = e ? -1 : 1; });
      chorus::test::expect_eq(now, 1, "a callback on a done request runs at once");
      chorus::Request empty;
      empty.on_complete([&](std::exception_ptr) { now = 2; });
      chorus::test::expect_eq(now, 2, "an empty request counts as done");
    } else {
      c.barrier();
      c.send(std::span(buf), 0, 5);
    }
  });
}

TEST_CASE("request: wait_for on a queued collective returns within its bound while a peer is late") {
  chorus::test::run_threads(2, [](int rank, chorus::Options o) {
    o.timeout = std::chrono::seconds(60);
    Comm c = Comm::create(std::move(o));
    std::vector<float> a(4, 1.0f);
    std::vector<int> token(1, 0);
    if (rank == 0) {
      chorus::Request r = chorus::start(c, {.kind = CallKind::all_reduce, .in = a.data(), .out = a.data(),
                                            .count = 4, .dtype = DataType::float32, .op = ReduceOp::sum});
      const auto t0 = std::chrono::steady_clock::now();
      chorus::test::expect(!r.wait_for(std::chrono::milliseconds(200)), "pending: rank 1 has not called yet");
      const auto waited = std::chrono::steady_clock::now() - t0;
      chorus::test::expect(waited < std::chrono::seconds(10), "wait_for did not hold the waiter for the call");
      c.send(std::span(token), 1, 9);  // now rank 1 joins
      chorus::test::expect(r.wait_for(std::chrono::seconds(60)), "done once rank 1 joined");
    } else {
      c.recv(std::span(token), 0, 9);
      c.all_reduce(a.data(), a.data(), 4, DataType::float32, ReduceOp::sum);
    }
    chorus::test::expect(a == std::vector<float>(4, 2.0f), "the all_reduce's result");
  });
}

}  // namespace collective_test_call
