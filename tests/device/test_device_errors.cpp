// SPDX-License-Identifier: BSD-3-Clause
// The device path's contract beyond the results (simulated CUDA runtime, ranks as processes over
// shm): calls on a stream return before the collective has run and the stream orders the user's
// work around it; buffers of two memory kinds in one call, host buffers on a stream and a stream
// without a device runtime are clear errors before anything is sent; a device failure on one
// rank (an injected cudaErrorLaunchFailure) fails the call there, on its Request, on the next
// call and in async_error(), and reaches every other rank as peer_failure (naming the peer whose
// link closed first: the failing rank, or one that failed through it), within seconds, not the
// timeout.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "chorus/communicator.hpp"
#include "chorus/testing/sim_runtime.hpp"
#include "support/communicators.hpp"
#include "support/spawn.hpp"

namespace device_test_device_errors {

namespace {

using namespace std::chrono_literals;
using chorus::DataType;
using chorus::ErrorCode;
using chorus::ReduceOp;
using chorus::device::SimRuntime;
using chorus::device::Stream;
using chorus::test::expect;
using chorus::test::expect_error;
using Comm = chorus::Communicator<chorus::shm::Transport>;

template <class Body>
void run_procs(int world, const Body& body, std::vector<std::pair<std::string, std::string>> env = {}) {
  chorus::test::ProcessOptions p;
  p.timeout = 120s;
  p.comm_timeout = 60s;  // long: a failure must arrive well before it
  p.env = std::move(env);
  chorus::test::run_processes(world, [&](int, chorus::Options o) { body(std::move(o)); }, p);
}

}  // namespace

TEST_CASE("device path: a call on a stream is ordered by the stream before and after") {
  run_procs(3, [](chorus::Options o) {
    SimRuntime rt;
    Comm comm = Comm::create(o);
    comm.set_device_runtime(&rt);
    const Stream s = rt.create_stream();
    constexpr std::size_t n = 1001;
    auto* in = static_cast<float*>(rt.alloc_device(n * sizeof(float)));
    auto* out = static_cast<float*>(rt.alloc_device(n * sizeof(float)));
    std::vector<float> ones(n, 1.0f), got(n, -1.0f);
    // The stream is held by a flag the host has not set: the fill below and the call are queued
    // behind it, so the call must not read `in` before the fill has run.
    auto* gate = static_cast<std::uint32_t*>(rt.alloc_pinned(64));
    *gate = 0;
    rt.wait_flag(s, gate, std::uint64_t(60) * 1000000000u);
    rt.copy(in, ones.data(), n * sizeof(float), s);
    chorus::Request req = comm.all_reduce(in, out, n, DataType::float32, ReduceOp::sum, s);
    rt.copy(got.data(), out, n * sizeof(float), s);  // enqueued after the call: sees its result
    expect(!req.test(), "the call waits for its stream to reach it");
    std::atomic_ref<std::uint32_t>(*gate).store(1, std::memory_order_release);
    req.wait();
    rt.synchronize(s);
    for (std::size_t i = 0; i < n; ++i)
      expect(got[i] == 3.0f, "element " + std::to_string(i) + " is " + std::to_string(got[i]) + ", expected 3");
    expect(!comm.async_error(), "no error recorded");
    rt.free_device(in);
    rt.free_device(out);
    rt.free_pinned(gate);
    rt.destroy_stream(s);
  });
}

TEST_CASE("device path: mixed memory kinds and host buffers on a stream and no runtime are invalid") {
  run_procs(2, [](chorus::Options o) {
    SimRuntime rt;
    Comm comm = Comm::create(o);
    std::vector<float> host(16, 1.0f);
    // Without a device runtime a stream cannot be used.
    auto e0 = expect_error(
        ErrorCode::unsupported, [&] { comm.all_reduce(host.data(), host.data(), 16, DataType::float32, ReduceOp::sum, nullptr); },
        "a stream without a runtime");
    expect(std::string(e0.what()).find("device runtime") != std::string::npos, e0.what());
    comm.set_device_runtime(&rt);
    auto* dev = static_cast<float*>(rt.alloc_device(16 * sizeof(float)));
    auto e1 = expect_error(
        ErrorCode::invalid_argument, [&] { comm.all_reduce(host.data(), dev, 16, DataType::float32, ReduceOp::sum); },
        "host in, device out");
    expect(std::string(e1.what()).find("input is in host memory and the output in device memory") != std::string::npos,
           e1.what());
    auto e2 = expect_error(
        ErrorCode::invalid_argument,
        [&] { comm.all_reduce(host.data(), host.data(), 16, DataType::float32, ReduceOp::sum, nullptr); },
        "host buffers on a stream");
    expect(std::string(e2.what()).find("takes device buffers") != std::string::npos, e2.what());
    // Nothing was sent: the communicator still works, on both kinds.
    comm.all_reduce(host.data(), host.data(), 16, DataType::float32, ReduceOp::sum);
    expect(host[3] == 2.0f, "host all_reduce after the errors");
    std::vector<float> back(16, 1.5f);
    rt.copy(dev, back.data(), sizeof(float) * 16, nullptr);
    rt.synchronize(Stream{});
    comm.all_reduce(dev, dev, 16, DataType::float32, ReduceOp::sum);  // device buffers, no stream: blocking
    rt.copy(back.data(), dev, sizeof(float) * 16, nullptr);
    rt.synchronize(Stream{});
    expect(back[5] == 3.0f, "device all_reduce without a stream: 1.5 + 1.5");
    rt.free_device(dev);
  });
}

TEST_CASE("device path: a device failure on one rank fails the call everywhere and promptly") {
  // Rank 1's third reduction kernel fails (SimRuntime::fail_after, on rank 1 only).
  run_procs(3, [](chorus::Options o) {
    const bool failing = o.rank == 1;
    SimRuntime rt;
    if (failing) rt.fail_after("reduce", 3, 719);
    Comm comm = Comm::create(o);
    comm.set_device_runtime(&rt);
    const Stream s = rt.create_stream();
    constexpr std::size_t n = 4096;
    auto* buf = static_cast<float*>(rt.alloc_device(n * sizeof(float)));
    const auto t0 = std::chrono::steady_clock::now();
    bool failed = false;
    std::string text;
    for (int i = 0; i < 20 && !failed; ++i) {
      try {
        comm.all_reduce(buf, buf, n, DataType::float32, ReduceOp::sum, s).wait();
      } catch (const chorus::Error& e) {
        failed = true;
        text = e.what();
        if (failing) {
          expect(e.code() == ErrorCode::system, "the failing rank reports the device error: " + text);
          expect(text.find("cudaErrorLaunchFailure") != std::string::npos || text.find("719") != std::string::npos,
                 "the CUDA error is named: " + text);
        } else {
          expect(e.code() == ErrorCode::peer_failure, "the others learn of it as a peer failure: " + text);
        }
      }
    }
    const auto took = std::chrono::steady_clock::now() - t0;
    expect(failed, "the injected failure surfaced");
    expect(took < 20s, "the failure arrived in " + std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(took).count()) +
                           " ms, before the 60 s timeout");
    expect(comm.async_error().has_value(), "async_error() reports it");
    // The next call fails too (the communicator is aborted), at once.
    auto again = [&] { comm.all_reduce(buf, buf, n, DataType::float32, ReduceOp::sum, s).wait(); };
    bool threw = false;
    try {
      again();
    } catch (const chorus::Error&) {
      threw = true;
    }
    expect(threw, "a call after the failure fails");
    try {
      rt.synchronize(s);  // the stream was let go (the flag says failed), not left waiting
    } catch (const chorus::Error&) {
    }
    rt.free_device(buf);
  });
}

}  // namespace device_test_device_errors
