// SPDX-License-Identifier: BSD-3-Clause
// Device memory over the rdma transport with dma-buf registration (transport/rdma/link.hpp), on
// the fake verbs (testing/fake_verbs.hpp) and the simulated device runtime
// (testing/sim_runtime.hpp), ranks as real processes: device collectives whose messages are past
// the eager size go zero-copy and equal the host path bit for bit; with the fake's
// dmabuf_unsupported fault the same collectives go through host staging; a receive into device
// memory that meets an eager message fails with mismatch and writes nothing.
#include <doctest/doctest.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "chorus/communicator.hpp"
#include "chorus/testing/sim_runtime.hpp"
#include "chorus/transport/rdma/transport.hpp"
#include "rdma/fabric.hpp"
#include "support/device_matrix.hpp"
#include "support/sanitized.hpp"
#include "support/spawn.hpp"

namespace rdma_test_dmabuf {

namespace {

using namespace std::chrono_literals;
using chorus::test::expect;
using chorus::test::FakeFabric;
using chorus::test::device_matrix::Coll;
using Comm = chorus::Communicator<chorus::rdma::Transport>;

/// Slices of 64 KiB: every message of the large counts below is past the eager size (8 KiB).
constexpr std::size_t kChunkBytes = std::size_t(64) << 10;

/// How a test's device buffers are meant to travel.
/// mixed: rank 0's runtime has no dma-buf, the others' has (each side decides for its own buffer).
enum class Path { zero_copy, staged_nic, staged_runtime, mixed };

/// Device collectives on `world` ranks, each checked bit for bit against the host path (and the
/// reference); then the transport's device-memory state must match `path`: zero-copy, or staged
/// because the NIC (CHORUS_IB_FAKE_FAULT=dmabuf_unsupported) or the runtime (refuse_dmabuf)
/// has no dma-buf.
void collectives(int world, Path path) {
  FakeFabric fabric;
  auto p = fabric.options(240s, 30s);
  if (path == Path::staged_nic) p.env.emplace_back("CHORUS_IB_FAKE_FAULT", "dmabuf_unsupported");
  chorus::test::run_processes(
      world,
      [&](int rank, chorus::Options o) {
        chorus::device::SimRuntime rt;  // outlives comm
        const bool zero_copy = path == Path::zero_copy || (path == Path::mixed && rank != 0);
        if (path == Path::staged_runtime || (path == Path::mixed && rank == 0)) rt.refuse_dmabuf();
        o.chunk_bytes = kChunkBytes;
        Comm comm = Comm::create(o);
        comm.set_device_runtime(&rt);
        const chorus::device::Stream stream = rt.create_stream();
        const std::string where = "(rdma dma-buf, world " + std::to_string(world) + (zero_copy ? ", zero-copy)" : ", staged)");
        chorus::test::device_matrix::Runner<Comm> run{comm, rt, stream, where};
        // Odd counts, all of them past the eager size per message; a few dtypes and ops.
        const std::size_t big = chorus::test::kSanitized ? 20011 : 100003;
        run.run(Coll::all_reduce, chorus::DataType::float32, big, chorus::ReduceOp::sum, -1, false);
        run.run(Coll::all_reduce, chorus::DataType::float32, big, chorus::ReduceOp::max, -1, true);
        run.run(Coll::all_reduce, chorus::DataType::bfloat16, 40009, chorus::ReduceOp::sum, -1, false);
        run.run(Coll::all_reduce, chorus::DataType::int64, 12347, chorus::ReduceOp::prod, -1, false);
        run.run(Coll::all_reduce, chorus::DataType::float64, 30011, chorus::ReduceOp::avg, -1, true);
        run.run(Coll::reduce_scatter, chorus::DataType::int32, 20011, chorus::ReduceOp::min, -1, false);
        run.run(Coll::reduce, chorus::DataType::uint8, 70001, chorus::ReduceOp::bxor, world - 1, false);
        run.run(Coll::broadcast, chorus::DataType::float16, 50021, chorus::ReduceOp::sum, world / 2, true);
        run.run(Coll::all_gather, chorus::DataType::uint64, 9001, chorus::ReduceOp::sum, -1, false);
        run.run(Coll::all_to_all, chorus::DataType::float32, 6007, chorus::ReduceOp::sum, -1, false);
        run.run(Coll::scatter, chorus::DataType::int8, 33331, chorus::ReduceOp::sum, 0, false);
        run.run(Coll::gather, chorus::DataType::int32, 8191, chorus::ReduceOp::sum, world - 1, false);
        // And small counts, whose messages are eager and staged either way.
        run.run(Coll::all_reduce, chorus::DataType::float32, 13, chorus::ReduceOp::sum, -1, false);
        run.run(Coll::all_reduce, chorus::DataType::int32, 1001, chorus::ReduceOp::max, -1, true);
        comm.barrier();
        rt.destroy_stream(stream);

        const auto st = comm.transport().device_memory_stats();
        const std::string who = "rank " + std::to_string(rank) + " " + where;
        expect(st.nic == (path != Path::staged_nic), who + ": the fake NIC says dma-buf " + (st.nic ? "supported" : "unsupported"));
        expect(st.zero_copy == zero_copy, who + ": device buffers " + (st.zero_copy ? "went" : "did not go") + " zero-copy");
        if (zero_copy)
          expect(st.registrations > 0, who + ": no dma-buf registration was made");
        else
          expect(st.registrations == 0, who + ": " + std::to_string(st.registrations) + " dma-buf registrations were made");
      },
      p);
}

}  // namespace

TEST_CASE("rdma dma-buf: device collectives past the eager size go zero-copy and equal the host path at world 2") {
  collectives(2, Path::zero_copy);
}
TEST_CASE("rdma dma-buf: device collectives past the eager size go zero-copy and equal the host path at world 3") {
  collectives(3, Path::zero_copy);
}
TEST_CASE("rdma dma-buf: with the NIC's dma-buf unsupported the same collectives go through staging at world 2") {
  collectives(2, Path::staged_nic);
}
TEST_CASE("rdma dma-buf: with the NIC's dma-buf unsupported the same collectives go through staging at world 3") {
  collectives(3, Path::staged_nic);
}
TEST_CASE("rdma dma-buf: with the runtime's dma-buf export unsupported the same collectives go through staging at world 3") {
  collectives(3, Path::staged_runtime);
}
TEST_CASE("rdma dma-buf: one rank staging and the others zero-copy give the host path's results at world 3") {
  collectives(3, Path::mixed);
}

TEST_CASE("rdma dma-buf: a receive into device memory that meets an eager message fails with mismatch and writes nothing") {
  FakeFabric fabric;
  chorus::test::run_processes(
      2,
      [&](int rank, chorus::Options o) {
        chorus::device::SimRuntime rt;
        Comm comm = Comm::create(o);
        const int peer = 1 - rank;
        auto& link = comm.transport().link(peer);
        constexpr chorus::Tag kTag = 77;
        constexpr std::size_t kBytes = 100000;
        if (rank == 0) {
          // The peer's receive is posted before this goes (the barrier): it meets it at arrival.
          comm.barrier();
          std::vector<std::byte> small(100, std::byte{0x5a});
          link.isend(chorus::ConstBytes{small.data(), small.size()}, kTag).wait();
          // And one that arrives before its receive is posted (an unexpected eager message).
          link.isend(chorus::ConstBytes{small.data(), small.size()}, kTag + 1).wait();
          comm.barrier();
        } else {
          std::byte* d = static_cast<std::byte*>(rt.alloc_device(kBytes));
          rt.fill(d, 0x11, kBytes, nullptr);
          rt.synchronize(chorus::device::Stream{});
          expect(link.device_memory(rt, d, kBytes), "the link takes device memory past the eager size");
          expect(!link.device_memory(rt, d, 100), "the link stages device messages of the eager size");
          auto r = link.irecv(chorus::MutableBytes{d, kBytes, chorus::MemoryKind::device}, kTag);
          comm.barrier();
          const auto e = chorus::test::expect_error(chorus::ErrorCode::mismatch, [&] { r.wait(); }, "the device receive");
          const std::string what = e.what();
          for (const char* part : {"rank 1", "peer 0", "recv", "device memory"})
            expect(what.find(part) != std::string::npos, std::string("the error names '") + part + "': " + what);
          comm.barrier();  // the second message is in by now
          auto r2 = link.irecv(chorus::MutableBytes{d, kBytes, chorus::MemoryKind::device}, kTag + 1);
          chorus::test::expect_error(chorus::ErrorCode::mismatch, [&] { r2.wait(); }, "the device receive of an unexpected eager message");
          std::vector<std::byte> back(kBytes);
          rt.copy(back.data(), d, kBytes, nullptr);
          rt.synchronize(chorus::device::Stream{});
          for (std::size_t i = 0; i < kBytes; ++i)
            if (back[i] != std::byte{0x11}) throw chorus::test::Failure("byte " + std::to_string(i) + " of the device buffer was written");
          rt.free_device(d);
        }
      },
      fabric.options(60s, 20s));
}

TEST_CASE("rdma dma-buf: device collectives of different sizes (one staged and eager and one zero-copy) fail with mismatch on both ranks") {
  FakeFabric fabric;
  chorus::test::run_processes(
      2,
      [&](int rank, chorus::Options o) {
        chorus::device::SimRuntime rt;
        o.chunk_bytes = kChunkBytes;
        Comm comm = Comm::create(o);
        comm.set_device_runtime(&rt);
        const chorus::device::Stream stream = rt.create_stream();
        // Rank 0's messages are past the eager size (zero-copy), rank 1's within it (eager).
        const std::size_t count = rank == 0 ? 50001 : 1001;
        void* d = rt.alloc_device(count * sizeof(float));
        rt.fill(d, 0, count * sizeof(float), stream);
        chorus::test::expect_error(chorus::ErrorCode::mismatch, [&] {
          comm.all_reduce(d, d, count, chorus::DataType::float32, chorus::ReduceOp::sum, stream).wait();
        }, "rank " + std::to_string(rank) + "'s all_reduce");
        rt.synchronize(stream);
        rt.free_device(d);
        rt.destroy_stream(stream);
      },
      fabric.options(60s, 20s));
}

}  // namespace rdma_test_dmabuf
