// SPDX-License-Identifier: BSD-3-Clause
// The collective kernel (device/collective.hpp, algo/intranode/kernel_path.hpp) on the simulated
// CUDA runtime, whose blocks run on host threads of their own: ranks as threads of one process
// (one runtime, plain device pointers: the direct protocol and LL) and as processes over cuda_ipc
// (areas mapped through IPC: the windowed protocol and LL). The whole device matrix bit for bit
// against the host path; the budgets of a warm call counted by device::CountingRuntime (launches,
// copies, host waits, host round trips, cross-process spins, device-memory traffic); a mismatch,
// an abort and a late rank in the middle of a kernel, each ending within its bound with the usual
// error.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "chorus/chorus.hpp"
#include "chorus/device/counting.hpp"
#include "chorus/testing/sim_runtime.hpp"
#include "support/device_matrix.hpp"
#include "support/spawn.hpp"

namespace device_test_device_kernel {

namespace {

using namespace std::chrono_literals;
using chorus::DataType;
using chorus::ErrorCode;
using chorus::ReduceOp;
using chorus::device::CountingRuntime;
using chorus::device::RuntimeCounts;
using chorus::device::SimRuntime;
using chorus::device::Stream;
using chorus::test::expect;
using chorus::test::expect_error;
using InprocComm = chorus::Communicator<chorus::inproc::Transport>;
using IpcComm = chorus::Communicator<chorus::cuda_ipc::Transport>;

constexpr std::size_t kSlot = 64 << 10;  ///< the processes' windows (CHORUS_CUDA_IPC_SLOT_BYTES)

chorus::test::ProcessOptions process_options() {
  chorus::test::ProcessOptions p;
  p.timeout = 240s;
  p.comm_timeout = 60s;
  p.env = {{"CHORUS_CUDA_IPC_SLOT_BYTES", std::to_string(kSlot)}};
  return p;
}

chorus::test::ThreadOptions thread_options(std::chrono::milliseconds timeout = 60s) {
  chorus::test::ThreadOptions t;
  t.timeout = timeout;
  return t;
}

/// The matrix of support/device_matrix.hpp with `world` ranks as threads on one simulated device.
void threads_matrix(int world) {
  SimRuntime rt;
  chorus::test::run_threads(
      world,
      [&](int, chorus::Options o) {
        o.chunk_bytes = 512;
        InprocComm comm = InprocComm::create(o);
        const std::string where = "(inproc, ranks as threads, world " + std::to_string(world) + ")";
        chorus::test::device_matrix::run_all(comm, rt, where, /*threads=*/true);
        expect((comm.memory_stats().kernel_area_bytes != 0) == (world > 1), where + ": the kernel's area exists where it ran");
      },
      thread_options());
}

/// Device memory of `n` floats, rank-unique.
struct Buffers {
  chorus::device::Runtime& rt;
  std::size_t n;
  float* in;
  float* out;
  Buffers(chorus::device::Runtime& r, std::size_t count, int rank, Stream s)
      : rt(r), n(count), in(static_cast<float*>(r.alloc_device(count * sizeof(float)))),
        out(static_cast<float*>(r.alloc_device(count * sizeof(float)))) {
    std::vector<float> h(n);
    for (std::size_t i = 0; i < n; ++i) h[i] = static_cast<float>(rank + 1) * static_cast<float>(i % 13);
    rt.copy(in, h.data(), n * sizeof(float), s);
    rt.synchronize(s);
  }
  ~Buffers() {
    rt.free_device(in);
    rt.free_device(out);
  }
  /// out after an all_reduce sum of `world` ranks.
  void check(int world, Stream s, const std::string& what) const {
    std::vector<float> h(n);
    rt.copy(h.data(), out, n * sizeof(float), s);
    rt.synchronize(s);
    const float ranks = static_cast<float>(world * (world + 1) / 2);
    for (std::size_t i = 0; i < n; ++i)
      if (h[i] != ranks * static_cast<float>(i % 13)) {
        expect(false, what + ": wrong result at element " + std::to_string(i));
        return;
      }
  }
};

/// A warm all_reduce of `count` floats: what issuing it counts, and the whole call with its wait.
struct CallCounts {
  RuntimeCounts issued, whole;
};
template <class Comm>
CallCounts warm_all_reduce(Comm& comm, CountingRuntime& rt, Stream s, const Buffers& b) {
  comm.all_reduce(b.in, b.out, b.n, DataType::float32, ReduceOp::sum, s).wait();  // set-up
  const RuntimeCounts before = rt.counts();
  chorus::Request req = comm.all_reduce(b.in, b.out, b.n, DataType::float32, ReduceOp::sum, s);
  const RuntimeCounts issued = rt.counts() - before;
  req.wait();
  return {issued, rt.counts() - before};
}

/// The budgets every warm call on the kernel path keeps (see the top).
void expect_kernel_budget(const CallCounts& c, std::size_t bytes, bool threads, int world, const std::string& what) {
  const std::string got = what + ": issued " + c.issued.to_string() + "; whole call " + c.whole.to_string();
  expect(c.whole.launches == 1, got + ": one launch");
  expect(c.whole.copies == 0 && c.whole.fills == 0, got + ": no copy");
  expect(c.issued.host_waits == 0, got + ": no host wait inside a stream call");
  expect(c.whole.round_trips == 0, got + ": no host round trip after the set-up");
  if (threads) expect(c.whole.cross_process_spins == 0, got + ": no cross-process spin for ranks as threads");
  if (threads && bytes >= (std::size_t(1) << 20))
    expect(static_cast<double>(c.whole.traffic_bytes) <= 2.2 * static_cast<double>(bytes), got + ": traffic at most 2.2 N");
  (void)world;
}

}  // namespace

TEST_CASE("kernel: every collective, dtype and op, ranks as threads, world 1") { threads_matrix(1); }
TEST_CASE("kernel: every collective, dtype and op, ranks as threads, world 2") { threads_matrix(2); }
TEST_CASE("kernel: every collective, dtype and op, ranks as threads, world 3") { threads_matrix(3); }
TEST_CASE("kernel: every collective, dtype and op, ranks as threads, world 4") { threads_matrix(4); }

TEST_CASE("kernel budget: a warm all_reduce, ranks as threads, k = 2, 3, 4, 8 B and 1 MiB") {
  for (int world : {2, 3, 4}) {
    SimRuntime sim;
    chorus::test::run_threads(
        world,
        [&](int rank, chorus::Options o) {
          CountingRuntime rt(sim);
          InprocComm comm = InprocComm::create(o);
          comm.set_device_runtime(&rt);
          const Stream s = rt.create_stream();
          {
            // Both sizes' buffers first: no rank frees while a peer's kernel may wait for it (a free
            // waits for the whole device, as cudaFree does).
            Buffers small(rt, 2, rank, s), large(rt, (std::size_t(1) << 20) / sizeof(float), rank, s);
            for (const Buffers* b : {&small, &large}) {
              const std::size_t bytes = b->n * sizeof(float);
              const std::string what = "threads, k = " + std::to_string(world) + ", " + std::to_string(bytes) + " B, rank " +
                                       std::to_string(rank);
              const CallCounts c = warm_all_reduce(comm, rt, s, *b);
              expect_kernel_budget(c, bytes, true, world, what);
              b->check(world, s, what);
            }
            comm.barrier();
          }
          rt.destroy_stream(s);
        },
        thread_options());
  }
}

TEST_CASE("kernel budget: a warm all_reduce, ranks as processes over cuda_ipc, k = 2, 3, 4, 8 B and 1 MiB") {
  for (int world : {2, 3, 4}) {
    chorus::test::run_processes(
        world,
        [&](int rank, chorus::Options o) {
          SimRuntime sim;
          CountingRuntime rt(sim);
          chorus::device::set_default_runtime(&rt);
          {
            IpcComm comm = IpcComm::create(o);
            const Stream s = rt.create_stream();
            for (std::size_t bytes : {std::size_t{8}, std::size_t{1} << 20}) {
              const std::string what = "processes, k = " + std::to_string(world) + ", " + std::to_string(bytes) +
                                       " B, rank " + std::to_string(rank);
              Buffers b(rt, bytes / sizeof(float), rank, s);
              const CallCounts c = warm_all_reduce(comm, rt, s, b);
              expect_kernel_budget(c, bytes, false, world, what);
              // The peers' flags and lines are in their processes: one wait on each per barrier
              // (windowed: two per chunk of the window) or per LL exchange.
              const std::uint64_t chunks = bytes <= chorus::device::kLLMaxBytes ? 0 : (bytes + kSlot - 1) / kSlot;
              const std::uint64_t per_peer = chunks == 0 ? 1 : 2 * chunks;
              expect(c.whole.cross_process_spins == per_peer * static_cast<std::uint64_t>(world - 1),
                     what + ": cross-process spins " + std::to_string(c.whole.cross_process_spins));
              b.check(world, s, what);
            }
            rt.destroy_stream(s);
          }
          chorus::device::set_default_runtime(nullptr);
        },
        process_options());
  }
}

// A communicator split from ranks as threads takes the kernel too: 4 ranks in two groups of 2 (even
// and odd), each group's all_reduce on device buffers through its own areas, while the parent's
// runs alongside them in the same order on every rank.
TEST_CASE("kernel: split communicators of ranks as threads take the kernel") {
  SimRuntime rt;
  chorus::test::run_threads(
      4,
      [&](int rank, chorus::Options o) {
        InprocComm comm = InprocComm::create(o);
        comm.set_device_runtime(&rt);
        InprocComm half = comm.split(rank % 2, rank);
        const Stream s = rt.create_stream();
        {
          Buffers b(rt, 3001, rank / 2, s), w(rt, 3001, rank, s);
          for (int i = 0; i < 3; ++i) {
            half.all_reduce(b.in, b.out, b.n, DataType::float32, ReduceOp::sum, s).wait();
            b.check(2, s, "the split communicator's all_reduce, call " + std::to_string(i));
            comm.all_reduce(w.in, w.out, w.n, DataType::float32, ReduceOp::sum, s).wait();
            w.check(4, s, "the parent's all_reduce, call " + std::to_string(i));
          }
          expect(half.memory_stats().kernel_area_bytes != 0, "the split communicator ran the kernel");
          comm.barrier();
        }
        rt.destroy_stream(s);
      },
      thread_options());
}

// Rank `odd` calls with one element more than the others: every rank's kernel finds the other
// descriptor at its first barrier (direct) or in the LL lines' descriptor (LL) and fails with
// mismatch naming both calls; the communicator is aborted after it.
TEST_CASE("kernel: a mismatch in the middle of a kernel, ranks as threads, LL and direct, worlds 2 and 3") {
  for (int world : {2, 3})
    for (std::size_t count : {std::size_t{3}, std::size_t{70000}}) {
      SimRuntime rt;
      chorus::test::run_threads(
          world,
          [&](int rank, chorus::Options o) {
            InprocComm comm = InprocComm::create(o);
            comm.set_device_runtime(&rt);
            const Stream s = rt.create_stream();
            const int odd = world - 1;
            Buffers b(rt, count + 1, rank, s);
            comm.all_reduce(b.in, b.out, count, DataType::float32, ReduceOp::sum, s).wait();  // set-up, in step
            const std::size_t mine = rank == odd ? count + 1 : count;
            const auto t0 = std::chrono::steady_clock::now();
            auto e = expect_error(ErrorCode::mismatch,
                                  [&] { comm.all_reduce(b.in, b.out, mine, DataType::float32, ReduceOp::sum, s).wait(); },
                                  "differing counts");
            const std::string text = e.what();
            expect(text.find("collectives differ") != std::string::npos &&
                       text.find("count " + std::to_string(count) + " ") != std::string::npos &&
                       text.find("count " + std::to_string(count + 1) + " ") != std::string::npos,
                   "the error names both calls: " + text);
            expect(std::chrono::steady_clock::now() - t0 < 20s, "found well within the timeout");
            expect_error(ErrorCode::mismatch, [&] { comm.all_reduce(b.in, b.out, count, DataType::float32, ReduceOp::sum, s).wait(); },
                         "the call after");
            rt.synchronize(s);
          },
          thread_options());
    }
}

// Rank 0's kernel waits for rank 1, which has not called yet, when rank 0's communicator is
// aborted from another thread: the call fails with aborted at once. Rank 1's call then fails with
// peer_failure naming rank 0 (its kernel sees rank 0's abort word, and its links are broken).
TEST_CASE("kernel: an abort in the middle of a kernel ends it, and the peer's, ranks as threads") {
  SimRuntime rt;
  std::atomic<bool> aborted{false};
  chorus::test::run_threads(
      2,
      [&](int rank, chorus::Options o) {
        InprocComm comm = InprocComm::create(o);
        comm.set_device_runtime(&rt);
        const Stream s = rt.create_stream();
        Buffers b(rt, 50000, rank, s);
        comm.all_reduce(b.in, b.out, b.n, DataType::float32, ReduceOp::sum, s).wait();  // set-up
        comm.barrier();
        if (rank == 0) {
          chorus::Request req = comm.all_reduce(b.in, b.out, b.n, DataType::float32, ReduceOp::sum, s);
          std::thread aborter([&] {
            std::this_thread::sleep_for(100ms);
            comm.abort();
          });
          const auto t0 = std::chrono::steady_clock::now();
          expect_error(ErrorCode::aborted, [&] { req.wait(); }, "the aborted rank's call");
          aborter.join();
          expect(std::chrono::steady_clock::now() - t0 < 10s, "the abort ended the kernel at once");
          aborted = true;
        } else {
          while (!aborted) std::this_thread::sleep_for(1ms);
          const auto t0 = std::chrono::steady_clock::now();
          auto e = expect_error(ErrorCode::peer_failure,
                                [&] { comm.all_reduce(b.in, b.out, b.n, DataType::float32, ReduceOp::sum, s).wait(); },
                                "the peer of the aborted rank");
          expect(std::string(e.what()).find("rank 0") != std::string::npos, "names rank 0: " + std::string(e.what()));
          expect(std::chrono::steady_clock::now() - t0 < 10s, "ended at once");
        }
        rt.synchronize(s);
      },
      thread_options());
}

// Rank 1 calls nothing until rank 0's call is over: rank 0's kernel gives up after the timeout
// (1 s) with timeout naming rank 1, and rank 1's late call fails at once with peer_failure
// naming rank 0 (whose kernel set its abort word as it gave up).
TEST_CASE("kernel: a late rank, ranks as threads: a timeout naming it, LL and direct") {
  for (std::size_t count : {std::size_t{2}, std::size_t{50000}}) {
    SimRuntime rt;
    std::atomic<bool> over{false};
    chorus::test::run_threads(
        2,
        [&](int rank, chorus::Options o) {
          InprocComm comm = InprocComm::create(o);
          comm.set_device_runtime(&rt);
          const Stream s = rt.create_stream();
          Buffers b(rt, count, rank, s);
          comm.all_reduce(b.in, b.out, b.n, DataType::float32, ReduceOp::sum, s).wait();  // set-up, in step
          comm.barrier();
          if (rank == 0) {
            const auto t0 = std::chrono::steady_clock::now();
            auto e = expect_error(ErrorCode::timeout,
                                  [&] { comm.all_reduce(b.in, b.out, b.n, DataType::float32, ReduceOp::sum, s).wait(); },
                                  "the call that waits for a late rank");
            expect(std::string(e.what()).find("rank 1") != std::string::npos, "names rank 1: " + std::string(e.what()));
            const auto took = std::chrono::steady_clock::now() - t0;
            expect(took >= 900ms && took < 10s, "within its bound: " + std::to_string(took / 1ms) + " ms");
            over = true;
          } else {
            while (!over) std::this_thread::sleep_for(1ms);
            const auto t0 = std::chrono::steady_clock::now();
            try {
              comm.all_reduce(b.in, b.out, b.n, DataType::float32, ReduceOp::sum, s).wait();
              expect(false, "the late rank's call succeeded alone");
            } catch (const chorus::Error& e) {
              expect(e.code() == ErrorCode::peer_failure || e.code() == ErrorCode::aborted,
                     "the late rank fails as its peer is gone: " + std::string(e.what()));
            }
            expect(std::chrono::steady_clock::now() - t0 < 10s, "at once");
          }
          rt.synchronize(s);
        },
        thread_options(1s));
  }
}

// Processes: rank 2's kernel is held 12 s before it starts (a slow stream), with a timeout of
// 4 s: the others' kernels give up at their first barrier with timeout naming rank 2 (or, where
// the other survivor gave up first, peer_failure naming it).
TEST_CASE("kernel: a late rank, ranks as processes over cuda_ipc: a timeout naming it, world 3" *
          doctest::test_suite("waits")) {
  auto opts = process_options();
  opts.comm_timeout = 4s;
  chorus::test::run_processes(
      3,
      [](int rank, chorus::Options o) {
        SimRuntime rt;
        chorus::device::set_default_runtime(&rt);
        {
          IpcComm comm = IpcComm::create(o);
          const Stream s = rt.create_stream();
          Buffers b(rt, 50000, rank, s);
          comm.all_reduce(b.in, b.out, b.n, DataType::float32, ReduceOp::sum, s).wait();  // set-up
          if (rank == 2) rt.stall_after("collective", 1, 12s);
          const auto t0 = std::chrono::steady_clock::now();
          try {
            comm.all_reduce(b.in, b.out, b.n, DataType::float32, ReduceOp::sum, s).wait();
            expect(false, "a call with a late rank succeeded");
          } catch (const chorus::Error& e) {
            if (rank != 2) {
              const std::string text = e.what(), other = "rank " + std::to_string(1 - rank);
              expect((e.code() == ErrorCode::timeout && text.find("rank 2") != std::string::npos) ||
                         (e.code() == ErrorCode::peer_failure && text.find(other) != std::string::npos),
                     "a timeout naming rank 2, or the other survivor's failure: " + text);
              expect(std::chrono::steady_clock::now() - t0 < 12s, "before the late rank started");
            }
          }
          try {
            rt.synchronize(s);
          } catch (const chorus::Error&) {
          }
        }
        chorus::device::set_default_runtime(nullptr);
      },
      opts);
}

}  // namespace device_test_device_kernel
