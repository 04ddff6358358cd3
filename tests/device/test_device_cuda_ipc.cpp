// SPDX-License-Identifier: BSD-3-Clause
// The cuda_ipc transport on the simulated CUDA runtime (testing/sim_runtime.hpp), ranks as real
// processes: IPC handles are memfds the processes map into each other's simulated device memory,
// so the whole direct path runs here: the windows' set-up (handles through the shm mailboxes,
// opened once), every collective by direct reads of the peers' windows with their reduction
// kernels under the grid emulator, the step protocol over two slots (slots of 4 KiB here, so
// most calls take many steps), a mismatch, a killed peer, and the fallback to the staged shm path
// for pairs that cannot map each other's memory.
#include <doctest/doctest.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "chorus/chorus.hpp"
#include "chorus/testing/sim_runtime.hpp"
#include "support/device_matrix.hpp"
#include "support/sanitized.hpp"
#include "support/spawn.hpp"

namespace device_test_device_cuda_ipc {

namespace {

using namespace std::chrono_literals;
using chorus::DataType;
using chorus::ErrorCode;
using chorus::ReduceOp;
using chorus::device::SimRuntime;
using chorus::device::Stream;
using chorus::test::expect;
using chorus::test::expect_error;
using chorus::test::device_matrix::Coll;
using IpcComm = chorus::Communicator<chorus::cuda_ipc::Transport>;
using AutoComm = chorus::Communicator<chorus::hybrid::Transport>;

constexpr std::size_t kSlot = 4096;

chorus::test::ProcessOptions options(std::set<int> killed = {}) {
  chorus::test::ProcessOptions p;
  p.timeout = 240s;
  p.comm_timeout = 60s;  // long: a failure must arrive well before it
  p.env = {{"CHORUS_CUDA_IPC_SLOT_BYTES", std::to_string(kSlot)}};
  p.expect_killed = std::move(killed);
  return p;
}

/// What the direct path leaves: this rank's window of two slots, where a direct call ran.
template <class Comm>
void expect_window(Comm& comm, bool made, const std::string& where) {
  const std::size_t got = comm.memory_stats().ipc_window_bytes;
  expect(got == (made ? 2 * kSlot + chorus::cuda_ipc::kFlagBytes : 0), where + ": ipc window of " + std::to_string(got) + " bytes, expected " +
                                            (made ? "two slots (the direct path ran)" : "none (the staged path)"));
}

/// What the collective kernel leaves: this rank's area (its window of one slot), where it ran.
template <class Comm>
void expect_kernel_area(Comm& comm, bool made, const std::string& where) {
  const std::size_t got = comm.memory_stats().kernel_area_bytes;
  expect(got == (made ? chorus::device::area::bytes(kSlot) : 0),
         where + ": kernel area of " + std::to_string(got) + " bytes, expected " + (made ? "one (the kernel ran)" : "none"));
}

/// The matrix of support/device_matrix.hpp over Comm, the default runtime set before the
/// communicator is made (the transport reads it).
template <class Comm>
void matrix(int world, const std::string& transport) {
  chorus::test::run_processes(
      world,
      [&](int, chorus::Options o) {
        SimRuntime rt;
        chorus::device::set_default_runtime(&rt);
        o.transport = transport;
        o.chunk_bytes = 512;
        Comm comm = Comm::create(o);
        std::ostringstream where;
        where << "(" << transport << ", world " << world << ", simulated runtime)";
        chorus::test::device_matrix::run_all(comm, rt, where.str());
        expect_window(comm, world > 1, where.str());
        chorus::device::set_default_runtime(nullptr);
      },
      options());
}

/// all_reduce alone, every dtype and op, in and out of place, with `algo` forced (the model picks
/// one_shot for everything the matrix sends).
void all_reduce_forced(int world, const std::string& algo) {
  chorus::test::run_processes(
      world,
      [&](int, chorus::Options o) {
        SimRuntime rt;
        chorus::device::set_default_runtime(&rt);
        IpcComm host = IpcComm::create(o);  // the host-path references: `algo` is for device buffers only
        o.algorithm = "all_reduce:" + algo;
        IpcComm comm = IpcComm::create(o);
        comm.set_device_runtime(&rt);
        const Stream s = rt.create_stream();
        chorus::test::device_matrix::Runner<IpcComm> run{comm, rt, s, "(cuda_ipc, " + algo + ")", 0, &host};
        for (DataType dt : chorus::test::matrix_dtypes())  // six of the twelve under ASan, four under TSan
          for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{1031}, std::size_t{5003}})
            for (ReduceOp op : {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max, ReduceOp::avg, ReduceOp::band,
                                ReduceOp::bor, ReduceOp::bxor})
              if (chorus::is_valid_op(dt, op))
                for (bool in_place : {false, true}) run.run(Coll::all_reduce, dt, count, op, -1, in_place);
        expect_window(comm, true, algo);
        rt.destroy_stream(s);
        chorus::device::set_default_runtime(nullptr);
      },
      options());
}

/// One rank of the failure tests: a simulated runtime (the default while it lives), a
/// communicator over cuda_ipc, a stream and `n` zeroed floats of device memory, after one direct
/// all_reduce has set the direct path up (unless `set_up` is false): the collective kernel's, or
/// with `windows` the IPC windows' (all_reduce forced to one_shot, the path the collective kernel
/// does not take: scatter, gather, all_to_all and forced algorithms).
struct FailureRank {
  static constexpr std::size_t n = 5000;
  SimRuntime rt;
  IpcComm comm;
  Stream s;
  float* buf;
  explicit FailureRank(chorus::Options o, bool set_up = true, bool windows = false)
      : comm((chorus::device::set_default_runtime(&rt), o.algorithm = windows ? "all_reduce:one_shot" : o.algorithm,
              IpcComm::create(o))),
        s(rt.create_stream()), buf(static_cast<float*>(rt.alloc_device(n * sizeof(float)))) {
    rt.fill(buf, 0, n * sizeof(float), s);
    if (!set_up) return;
    all_reduce().wait();
    if (windows)
      expect_window(comm, true, "before the failure");
    else
      expect_kernel_area(comm, true, "before the failure");
  }
  ~FailureRank() {
    try {
      rt.synchronize(s);  // the stream was let go (its ticket says failed), not left waiting
    } catch (const chorus::Error&) {
    }
    rt.free_device(buf);
    chorus::device::set_default_runtime(nullptr);
  }
  chorus::Request all_reduce() { return comm.all_reduce(buf, buf, n, DataType::float32, ReduceOp::sum, s); }
};

}  // namespace

TEST_CASE("cuda_ipc: every collective dtype and op at world 1") { matrix<IpcComm>(1, "auto"); }
TEST_CASE("cuda_ipc: every collective dtype and op at world 2") { matrix<IpcComm>(2, "auto"); }
TEST_CASE("cuda_ipc: every collective dtype and op at world 3") { matrix<IpcComm>(3, "auto"); }
TEST_CASE("cuda_ipc: every collective dtype and op at world 4") { matrix<IpcComm>(4, "auto"); }
// (The default transport forced to cuda_ipc runs the direct path in the bench.*_cuda_ipc_sim tests.)

TEST_CASE("cuda_ipc: all_reduce two_shot forced, every dtype and op, worlds 2 and 3") {
  all_reduce_forced(2, "two_shot");
  all_reduce_forced(3, "two_shot");
}

// Rank 2 has no device runtime when the communicator is made: auto serves its pairs over shm
// (the staged path, for everyone: one peer without IPC is enough) and the others' pair over
// cuda_ipc; forcing cuda_ipc fails on every rank, naming why. Results stay right either way.
TEST_CASE("cuda_ipc: a rank without a device runtime falls back to shm; forced, it is an error") {
  chorus::test::run_processes(
      3,
      [](int rank, chorus::Options o) {
        SimRuntime rt;
        if (rank != 2) chorus::device::set_default_runtime(&rt);
        {
          chorus::Options forced = o;
          forced.transport = "cuda_ipc";
          auto e = expect_error(ErrorCode::invalid_argument, [&] { (void)AutoComm::create(forced); },
                                "transport=cuda_ipc with a rank that has no runtime");
          const std::string text = e.what();
          expect(text.find("cannot map device memory") != std::string::npos && text.find("no device runtime") != std::string::npos,
                 "the error says why: " + text);
        }
        o.store = std::make_shared<chorus::PrefixStore>("second/", o.store);
        AutoComm comm = AutoComm::create(o);
        for (int p = 0; p < 3; ++p) {
          if (p == rank) continue;
          const std::string want = rank == 2 || p == 2 ? "shm" : "cuda_ipc";
          expect(comm.transport().link_kind(p) == want,
                 "rank " + std::to_string(rank) + " <-> " + std::to_string(p) + " over " +
                     std::string(comm.transport().link_kind(p)) + ", expected " + want);
        }
        comm.set_device_runtime(&rt);
        const Stream s = rt.create_stream();
        chorus::test::device_matrix::Runner<AutoComm> run{comm, rt, s, "(fallback)"};
        for (std::size_t count : {std::size_t{1}, std::size_t{5003}}) {
          run.run(Coll::all_reduce, DataType::float32, count, ReduceOp::sum, -1, false);
          run.run(Coll::all_gather, DataType::int32, count, ReduceOp::sum, -1, false);
        }
        expect_window(comm, false, "fallback");
        rt.destroy_stream(s);
        chorus::device::set_default_runtime(nullptr);
      },
      options());
}

// Rank 2 calls broadcast where the others call all_reduce, on device buffers: every rank gets
// mismatch from the step's mailbox exchange, naming both calls.
TEST_CASE("cuda_ipc: a differing call is a mismatch on every rank, world 3") {
  chorus::test::run_processes(
      3,
      [](int rank, chorus::Options o) {
        FailureRank r(o);
        auto e = expect_error(ErrorCode::mismatch,
                              [&] {
                                if (rank == 2)
                                  r.comm.broadcast(r.buf, FailureRank::n, DataType::float32, 0, r.s).wait();
                                else
                                  r.all_reduce().wait();
                              },
                              "differing calls");
        const std::string text = e.what();
        expect(text.find("all_reduce") != std::string::npos && text.find("broadcast") != std::string::npos,
               "the error names both calls: " + text);
      },
      options());
}

// Rank 2 dies (SIGKILL) with its window mapped by the others, who then wait for it in a direct
// all_reduce: both fail with peer_failure well before the timeout (60 s), and so does the call
// after; their mappings of the dead rank's window are released.
TEST_CASE("cuda_ipc: a rank killed while the others wait fails them with peer_failure, world 3") {
  chorus::test::run_processes(
      3,
      [](int rank, chorus::Options o) {
        auto store = o.store;
        FailureRank r(o);
        if (rank == 2) {
          store->wait({"test/waiting/0", "test/waiting/1"}, 30s);
          std::raise(SIGKILL);
        }
        chorus::Request req = r.all_reduce();
        store->set("test/waiting/" + std::to_string(rank), "1");
        const auto t0 = std::chrono::steady_clock::now();
        expect_error(ErrorCode::peer_failure, [&] { req.wait(); }, "all_reduce with a killed rank");
        expect(std::chrono::steady_clock::now() - t0 < 20s, "the death was noticed within 20 s");
        expect_error(ErrorCode::peer_failure, [&] { r.all_reduce().wait(); }, "the call after");
      },
      options({2}));
}

// Rank 0 forces two-shot and rank 1 one-shot: the same call takes 10 steps on one and 5 on the
// other (slots of 4 KiB), which the first step's mailbox exchange compares, so both get mismatch
// before any device wait could wait for a step the other never takes.
TEST_CASE("cuda_ipc: ranks that run different algorithms for a call get mismatch, world 2") {
  chorus::test::run_processes(
      2,
      [](int rank, chorus::Options o) {
        o.algorithm = rank == 0 ? "two_shot" : "one_shot";
        FailureRank r(o, /*set_up=*/false);
        auto e = expect_error(ErrorCode::mismatch, [&] { r.all_reduce().wait(); }, "differing algorithms");
        expect(std::string(e.what()).find("different algorithms") != std::string::npos, e.what());
      },
      options());
}

// Calls of 5000 floats take several steps (slots of 4 KiB): all but the first are synchronised on
// the device through the windows' step flags. Rank 2's stream fails in its first flag store of
// the next call: it gets the launch failure, aborts, and the others, whose devices wait on its
// flag, get peer_failure from the host's watch, well before the timeout (60 s), naming it (or the
// other survivor, where that one noticed first and aborted).
TEST_CASE("cuda_ipc: a rank whose stream fails in a device-synchronised step fails the others, world 3") {
  chorus::test::run_processes(
      3,
      [](int rank, chorus::Options o) {
        FailureRank r(o, true, /*windows=*/true);
        if (rank == 2) {
          r.rt.fail_after("write_value", 1, 719);
          auto e = expect_error(ErrorCode::system, [&] { r.all_reduce().wait(); }, "the rank whose stream failed");
          expect(std::string(e.what()).find("cudaErrorLaunchFailure") != std::string::npos, e.what());
          return;
        }
        const auto t0 = std::chrono::steady_clock::now();
        auto e = expect_error(ErrorCode::peer_failure, [&] { r.all_reduce().wait(); }, "all_reduce with a failed rank");
        // It names rank 2, or the other survivor if that one noticed first and aborted.
        const std::string text = e.what(), other = "rank " + std::to_string(1 - rank) + " failed";
        expect(text.find("rank 2 failed") != std::string::npos || text.find(other) != std::string::npos,
               "the error names the failed rank: " + text);
        expect(std::chrono::steady_clock::now() - t0 < 20s, "the failure was noticed within 20 s");
      },
      options());
}

// Rank 2's stream is held 12 s in its first flag store of the next call (a slow kernel), with a
// timeout of 4 s: the others' device waits on its flag give up after the timeout and their calls
// fail with timeout naming rank 2 (a survivor whose wait was slower may hear of the other's abort
// first: peer_failure naming it); rank 2 fails too (its peers aborted). Nothing waits forever.
TEST_CASE("cuda_ipc: a device wait on a late rank's step flag times out naming it, world 3" *
          doctest::test_suite("waits")) {
  auto opts = options();
  opts.comm_timeout = 4s;
  chorus::test::run_processes(
      3,
      [](int rank, chorus::Options o) {
        FailureRank r(o, true, /*windows=*/true);
        if (rank == 2) {
          r.rt.stall_after("write_value", 1, 12s);
          try {
            r.all_reduce().wait();
            expect(false, "the late rank's call succeeded after its peers gave up");
          } catch (const chorus::Error&) {
          }
          return;
        }
        const auto t0 = std::chrono::steady_clock::now();
        bool timed_out = false;
        try {
          r.all_reduce().wait();
          expect(false, "all_reduce with a late rank succeeded");
        } catch (const chorus::Error& e) {
          // A timeout naming rank 2; or, where the other survivor timed out first and aborted,
          // peer_failure naming that one. The first to give up cannot have heard of the other.
          const std::string text = e.what(), other = "rank " + std::to_string(1 - rank) + " failed";
          timed_out = e.code() == ErrorCode::timeout && text.find("rank 2") != std::string::npos &&
                      text.find("step flag") != std::string::npos;
          expect(timed_out || (e.code() == ErrorCode::peer_failure && text.find(other) != std::string::npos),
                 "a timeout naming rank 2 and the step flag, or the other survivor's failure: " + text);
        }
        expect(std::chrono::steady_clock::now() - t0 < 12s, "the failure came before the late rank's store");
        o.store->set("test/timed_out/" + std::to_string(rank), timed_out ? "1" : "0");
        const bool any = o.store->get("test/timed_out/0", 30s) == "1" || o.store->get("test/timed_out/1", 30s) == "1";
        expect(any, "at least one survivor's device wait timed out naming rank 2");
      },
      opts);
}

/// How many simulated IPC memfds this process maps: its own exported window and the peers' it
/// opened (/proc/self/maps names each mapping's memfd).
int sim_ipc_mappings() {
  std::ifstream maps("/proc/self/maps");
  int n = 0;
  for (std::string line; std::getline(maps, line);)
    if (line.find("/memfd:chorus-sim-") != std::string::npos) ++n;
  return n;
}

TEST_CASE("cuda_ipc: abort while no call runs unmaps the peers' windows, world 3") {
  chorus::test::run_processes(
      3,
      [](int rank, chorus::Options o) {
        auto store = o.store;
        FailureRank r(o);  // one direct all_reduce: every window mapped
        expect(sim_ipc_mappings() == 3, "own window and two peers' mapped: " + std::to_string(sim_ipc_mappings()));
        store->set("test/set_up/" + std::to_string(rank), "1");
        store->wait({"test/set_up/0", "test/set_up/1", "test/set_up/2"}, 30s);  // every rank's reads over
        r.comm.abort();
        expect(sim_ipc_mappings() == 1,
               "after an abort with no call running only the own window stays: " + std::to_string(sim_ipc_mappings()));
        expect_error(ErrorCode::aborted, [&] { r.all_reduce().wait(); }, "a call after the abort");
      },
      options());
}

// One rank of three is killed after a direct all_reduce; the survivors' next call fails, they
// shrink, and the new communicator's direct all_reduce on device buffers (new windows) is right.
TEST_CASE("cuda_ipc: the survivors of a kill shrink and go on (simulated runtime)") {
  chorus::test::run_processes(
      3,
      [](int rank, chorus::Options o) {
        FailureRank r(o);
        if (rank == 1) std::raise(SIGKILL);
        expect_error(ErrorCode::peer_failure, [&] { r.all_reduce().wait(); }, "the all_reduce after the kill");
        IpcComm c = r.comm.shrink();
        expect(c.size() == 2 && c.rank() == (rank == 0 ? 0 : 1), "the shrunk communicator's size and rank");
        std::vector<float> host(FailureRank::n);
        for (std::size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>(rank + 1 + i % 5);
        r.rt.copy(r.buf, host.data(), host.size() * sizeof(float), r.s);
        c.all_reduce(r.buf, r.buf, FailureRank::n, DataType::float32, ReduceOp::sum, r.s).wait();
        r.rt.copy(host.data(), r.buf, host.size() * sizeof(float), r.s);
        r.rt.synchronize(r.s);
        for (std::size_t i = 0; i < host.size(); ++i)
          expect(host[i] == static_cast<float>(1 + 3 + 2 * (i % 5)), "all_reduce on the shrunk communicator at " + std::to_string(i));
        expect_kernel_area(c, true, "after the shrink");
      },
      options({1}));
}

}  // namespace device_test_device_cuda_ipc
