// SPDX-License-Identifier: BSD-3-Clause
// device::SimRuntime's IPC handles across real processes (ranks over shm): every rank exports a
// device allocation, the handles go round by all_gather, and each rank maps every other rank's
// memory, reads it and reduces into it with a kernel of its own; the owners see the results. A
// handle of an allocation that was freed fails to open, naming the call.
#include <doctest/doctest.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "chorus/communicator.hpp"
#include "chorus/testing/sim_runtime.hpp"
#include "support/communicators.hpp"
#include "support/spawn.hpp"

namespace device_test_device_ipc {

namespace {

using namespace std::chrono_literals;
using chorus::DataType;
using chorus::ReduceOp;
using chorus::device::IpcHandle;
using chorus::device::SimRuntime;
using chorus::device::Stream;
using chorus::test::expect;
using Comm = chorus::Communicator<chorus::shm::Transport>;

chorus::test::ProcessOptions options() {
  chorus::test::ProcessOptions p;
  p.timeout = 120s;
  p.comm_timeout = 30s;
  return p;
}

std::int32_t value(int rank, std::size_t i) { return static_cast<std::int32_t>(rank * 100000 + static_cast<int>(i)); }

}  // namespace

TEST_CASE("device ipc: ranks map each other's allocations and reduce into them") {
  for (int world : {2, 4}) {
    chorus::test::run_processes(
        world,
        [](int rank, chorus::Options o) {
          Comm comm = Comm::create(o);
          const int world = comm.size();
          SimRuntime rt;
          Stream s = rt.create_stream();
          constexpr std::size_t n = 4099;
          std::vector<std::int32_t> mine(n);
          for (std::size_t i = 0; i < n; ++i) mine[i] = value(rank, i);
          auto* d = static_cast<std::int32_t*>(rt.alloc_device(n * 4));
          rt.copy(d, mine.data(), n * 4, s);
          rt.synchronize(s);

          const IpcHandle h = rt.ipc_export(d);
          std::vector<IpcHandle> all(static_cast<std::size_t>(world));
          comm.all_gather(h.bytes.data(), all.data(), sizeof h.bytes, DataType::uint8);

          std::vector<std::int32_t*> peer(static_cast<std::size_t>(world), nullptr);
          for (int r = 0; r < world; ++r) {
            if (r == rank) continue;
            peer[static_cast<std::size_t>(r)] = static_cast<std::int32_t*>(rt.ipc_open(all[static_cast<std::size_t>(r)]));
            std::vector<std::int32_t> got(n);
            rt.copy(got.data(), peer[static_cast<std::size_t>(r)], n * 4, s);
            rt.synchronize(s);
            for (std::size_t i = 0; i < n; ++i)
              expect(got[i] == value(r, i), "rank " + std::to_string(rank) + " reads rank " + std::to_string(r) +
                                                 "'s element " + std::to_string(i));
          }
          comm.barrier();  // every rank has read the originals

          // Each rank adds its rank + 1 into its right neighbour's memory (a kernel on mapped memory).
          if (world > 1) {
            const int right = (rank + 1) % world;
            std::vector<std::int32_t> add(n, rank + 1);
            auto* tmp = static_cast<std::int32_t*>(rt.alloc_device(n * 4));
            rt.copy(tmp, add.data(), n * 4, s);
            auto* target = peer[static_cast<std::size_t>(right)];
            rt.reduce(ReduceOp::sum, DataType::int32, target, target, tmp, n, s);
            rt.synchronize(s);
            rt.free_device(tmp);
          }
          comm.barrier();  // every kernel has run

          std::vector<std::int32_t> now(n);
          rt.copy(now.data(), d, n * 4, s);
          rt.synchronize(s);
          const int left = (rank + world - 1) % world;
          for (std::size_t i = 0; i < n; ++i)
            expect(now[i] == value(rank, i) + (world > 1 ? left + 1 : 0),
                   "rank " + std::to_string(rank) + " element " + std::to_string(i) + " after its neighbour's kernel");

          for (auto* p : peer)
            if (p) rt.ipc_close(p);
          comm.barrier();
          rt.free_device(d);
          rt.destroy_stream(s);
        },
        options());
  }
}

TEST_CASE("device ipc: the handle of a freed allocation does not open") {
  chorus::test::run_processes(
      2,
      [](int rank, chorus::Options o) {
        Comm comm = Comm::create(o);
        SimRuntime rt;
        IpcHandle h;
        if (rank == 0) {
          void* d = rt.alloc_device(1000);
          h = rt.ipc_export(d);
          rt.free_device(d);
          comm.send(std::span<const std::byte>(h.bytes), 1, 0);
        } else {
          comm.recv(std::span<std::byte>(h.bytes), 0, 0);
          const auto e = chorus::test::expect_error(chorus::ErrorCode::system, [&] { rt.ipc_open(h); }, "opening a freed handle");
          expect(std::string(e.what()).find("cudaIpcOpenMemHandle: cudaErrorInvalidValue (1)") != std::string::npos,
                 std::string("the error names the call: ") + e.what());
        }
        comm.barrier();
      },
      options());
}

}  // namespace device_test_device_ipc
