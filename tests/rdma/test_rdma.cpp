// SPDX-License-Identifier: BSD-3-Clause
// The rdma transport (transport/rdma) over the in-repo fake provider (testing/fake_verbs.hpp),
// ranks as real processes sharing one fake fabric: every protocol (eager inline and from a slot,
// rts/cts with RDMA writes in chunks, credits), the size checks, the choice of transport=auto, and
// the collective matrix (support/device_matrix.hpp: every collective x the twelve dtypes x every op
// that applies x odd counts, worlds 1-4, host and simulated-device buffers), every result checked
// bit for bit against the reference and the host path.
#include <doctest/doctest.h>

#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "chorus/communicator.hpp"
#include "chorus/registered_memory.hpp"
#include "chorus/testing/sim_runtime.hpp"
#include "chorus/transport/hybrid/transport.hpp"
#include "chorus/transport/rdma/transport.hpp"
#include "rdma/fabric.hpp"
#include "support/communicators.hpp"
#include "support/device_matrix.hpp"
#include "support/sanitized.hpp"
#include "support/spawn.hpp"

namespace rdma_test_rdma {

namespace {

using namespace std::chrono_literals;
using chorus::test::expect;
using chorus::test::FakeFabric;
using Comm = chorus::Communicator<chorus::rdma::Transport>;

/// Byte i of message `m` from rank `from`.
std::uint8_t byte_of(int from, std::size_t m, std::size_t i) {
  return static_cast<std::uint8_t>((i * 131 + m * 31 + static_cast<std::size_t>(from) * 7 + (i >> 12)) & 0xff);
}
std::vector<std::uint8_t> message(int from, std::size_t m, std::size_t n) {
  std::vector<std::uint8_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = byte_of(from, m, i);
  return v;
}
void check_message(const std::vector<std::uint8_t>& got, int from, std::size_t m, const std::string& what) {
  for (std::size_t i = 0; i < got.size(); ++i)
    if (got[i] != byte_of(from, m, i))
      throw chorus::test::Failure(what + ": byte " + std::to_string(i) + " of message " + std::to_string(m) + " differs");
}

}  // namespace

TEST_CASE("rdma: messages of every protocol arrive intact both ways at once") {
  FakeFabric fabric;
  // 0 and small: inline; 8000: a send slot; the rest rts/cts and RDMA writes, of one chunk and of
  // several (1 MiB each) with a tail.
  const std::vector<std::size_t> sizes = {0, 1, 7, 100, 8000, 8152, 8153, 65537, std::size_t(1) << 20,
                                          (std::size_t(3) << 20) + 5};
  chorus::test::run_processes(
      2,
      [&](int rank, chorus::Options o) {
        Comm comm = Comm::create(o);
        const int peer = 1 - rank;
        std::vector<std::vector<std::uint8_t>> out, in;
        std::vector<chorus::Request> reqs;
        for (std::size_t m = 0; m < sizes.size(); ++m) {
          out.push_back(message(rank, m, sizes[m]));
          in.emplace_back(sizes[m], std::uint8_t{0xee});
        }
        for (std::size_t m = 0; m < sizes.size(); ++m) {
          reqs.push_back(comm.irecv(std::span<std::uint8_t>(in[m]), peer, static_cast<int>(m)));
          reqs.push_back(comm.isend(std::span<const std::uint8_t>(out[m]), peer, static_cast<int>(m)));
        }
        for (auto& r : reqs) r.wait();
        for (std::size_t m = 0; m < sizes.size(); ++m) check_message(in[m], peer, m, "rank " + std::to_string(rank));
      },
      fabric.options(120s, 30s));
}

TEST_CASE("rdma: large messages from and into registered memory, before and after its release, and one buffer sent twice") {
  FakeFabric fabric;
  constexpr std::size_t kMsg = (std::size_t(1) << 20) + 3, kCount = 6;
  chorus::test::run_processes(
      2,
      [&](int rank, chorus::Options o) {
        Comm comm = Comm::create(o);
        const int peer = 1 - rank;
        std::vector<std::uint8_t> out(kCount * kMsg), in(kCount * kMsg);
        chorus::RegisteredMemory reg_out(out), reg_in(in);
        for (int round = 0; round < 3; ++round) {
          if (round == 2) {  // released: every message registers its own buffer again
            reg_out.reset();
            reg_in.reset();
          }
          std::fill(in.begin(), in.end(), std::uint8_t{0xee});
          for (std::size_t m = 0; m < kCount; ++m) {
            const auto msg = message(rank, m + 10 * static_cast<std::size_t>(round), kMsg);
            std::copy(msg.begin(), msg.end(), out.begin() + static_cast<std::ptrdiff_t>(m * kMsg));
          }
          std::vector<chorus::Request> reqs;
          for (std::size_t m = 0; m < kCount; ++m) {  // slices of one registered range, all in flight
            reqs.push_back(comm.irecv(std::span<std::uint8_t>(in).subspan(m * kMsg, kMsg), peer, static_cast<int>(m)));
            reqs.push_back(comm.isend(std::span<const std::uint8_t>(out).subspan(m * kMsg, kMsg), peer, static_cast<int>(m)));
          }
          for (auto& r : reqs) r.wait();
          for (std::size_t m = 0; m < kCount; ++m)
            check_message(std::vector<std::uint8_t>(in.begin() + static_cast<std::ptrdiff_t>(m * kMsg),
                                                    in.begin() + static_cast<std::ptrdiff_t>((m + 1) * kMsg)),
                          peer, m + 10 * static_cast<std::size_t>(round), "rank " + std::to_string(rank) + " round " + std::to_string(round));
        }
        // One unregistered buffer sent twice at once: both sends share one registration.
        const auto same = message(rank, 99, kMsg);
        std::vector<std::uint8_t> got1(kMsg), got2(kMsg);
        std::vector<chorus::Request> reqs;
        reqs.push_back(comm.irecv(std::span<std::uint8_t>(got1), peer, 100));
        reqs.push_back(comm.irecv(std::span<std::uint8_t>(got2), peer, 101));
        reqs.push_back(comm.isend(std::span<const std::uint8_t>(same), peer, 100));
        reqs.push_back(comm.isend(std::span<const std::uint8_t>(same), peer, 101));
        for (auto& r : reqs) r.wait();
        check_message(got1, peer, 99, "rank " + std::to_string(rank) + " first of two sends of one buffer");
        check_message(got2, peer, 99, "rank " + std::to_string(rank) + " second of two sends of one buffer");
      },
      fabric.options(120s, 30s));
}

TEST_CASE("rdma: many more small messages than credits before their receives are posted") {
  FakeFabric fabric;
  constexpr std::size_t kCount = 1000;  // credits are 64 per link
  chorus::test::run_processes(
      2,
      [&](int rank, chorus::Options o) {
        Comm comm = Comm::create(o);
        if (rank == 0) {
          std::vector<std::vector<std::uint8_t>> out;
          std::vector<chorus::Request> reqs;
          for (std::size_t m = 0; m < kCount; ++m) out.push_back(message(0, m, 1 + m % 300));
          for (std::size_t m = 0; m < kCount; ++m)
            reqs.push_back(comm.isend(std::span<const std::uint8_t>(out[m]), 1, static_cast<int>(m % 4)));
          comm.send(std::span<const std::uint8_t>(out[0]), 1, 99);  // after all of them on the wire order
          for (auto& r : reqs) r.wait();
        } else {
          std::vector<std::uint8_t> first(1);
          comm.recv(std::span<std::uint8_t>(first), 0, 99);  // every other message came first
          // Per tag in order; the tags in reverse.
          for (int tag = 3; tag >= 0; --tag)
            for (std::size_t m = static_cast<std::size_t>(tag); m < kCount; m += 4) {
              std::vector<std::uint8_t> in(1 + m % 300);
              comm.recv(std::span<std::uint8_t>(in), 0, tag);
              check_message(in, 0, m, "message in tag " + std::to_string(tag));
            }
        }
      },
      fabric.options(120s, 30s));
}

TEST_CASE("rdma: large messages that arrive before their receives are matched in tag order") {
  FakeFabric fabric;
  chorus::test::run_processes(
      2,
      [&](int rank, chorus::Options o) {
        Comm comm = Comm::create(o);
        const std::size_t n = (std::size_t(1) << 18) + 3;
        if (rank == 0) {
          std::vector<std::vector<std::uint8_t>> out;
          std::vector<chorus::Request> reqs;
          for (std::size_t m = 0; m < 6; ++m) out.push_back(message(0, m, n + m));
          for (std::size_t m = 0; m < 6; ++m)
            reqs.push_back(comm.isend(std::span<const std::uint8_t>(out[m]), 1, static_cast<int>(m % 3)));
          for (auto& r : reqs) r.wait();
        } else {
          for (int tag = 2; tag >= 0; --tag)
            for (std::size_t m = static_cast<std::size_t>(tag); m < 6; m += 3) {
              std::vector<std::uint8_t> in(n + m);
              comm.recv(std::span<std::uint8_t>(in), 0, tag);
              check_message(in, 0, m, "large message in tag " + std::to_string(tag));
            }
        }
      },
      fabric.options(120s, 30s));
}

TEST_CASE("rdma: thousands of large messages outstanding, received in another order than sent") {
  // More large sends outstanding than the fake fabric has registrations (4096 for both ranks),
  // all announced before the first receive is posted: each side registers at most
  // Policy::kMaxRegistered per link at a time, the others wait their turn. The receiver takes the
  // tags in reverse, so sends cleared late must take the registrations of sends announced early
  // (whose receives are not posted yet).
  FakeFabric fabric;
  constexpr std::size_t kCount = 4200;
  constexpr int kTags = 3;
  chorus::test::run_processes(
      2,
      [&](int rank, chorus::Options o) {
        Comm comm = Comm::create(o);
        std::vector<std::vector<std::uint8_t>> bufs;
        std::vector<chorus::Request> reqs;
        for (std::size_t m = 0; m < kCount; ++m) {
          bufs.emplace_back(8153 + m % 5);
          if (rank == 0)
            for (std::size_t i = 0; i < bufs[m].size(); ++i) bufs[m][i] = byte_of(0, m, i);
        }
        std::uint8_t go = 1;
        if (rank == 0) {
          for (std::size_t m = 0; m < kCount; ++m)
            reqs.push_back(comm.isend(std::span<const std::uint8_t>(bufs[m]), 1, static_cast<int>(m % kTags)));
          comm.send(std::span<const std::uint8_t>(&go, 1), 1, 99);
        } else {
          comm.recv(std::span<std::uint8_t>(&go, 1), 0, 99);  // every rts is here before a receive is
          for (int tag = kTags - 1; tag >= 0; --tag)
            for (std::size_t m = static_cast<std::size_t>(tag); m < kCount; m += kTags)
              reqs.push_back(comm.irecv(std::span<std::uint8_t>(bufs[m]), 0, tag));
        }
        for (auto& r : reqs) r.wait();
        if (rank == 1)
          for (std::size_t m = 0; m < kCount; ++m) check_message(bufs[m], 0, m, "large message " + std::to_string(m));
      },
      fabric.options(120s, 30s));
}

TEST_CASE("rdma: a receive of another size fails with mismatch (eager: the receive; large: both sides)") {
  FakeFabric fabric;
  chorus::test::run_processes(
      2,
      [&](int rank, chorus::Options o) {
        Comm comm = Comm::create(o);
        const auto small = message(0, 1, 100);
        const auto large = message(0, 2, 100000);
        if (rank == 0) {
          comm.send(std::span<const std::uint8_t>(small), 1, 1);  // eager: sent, whatever the receive
          const auto e = chorus::test::expect_error(chorus::ErrorCode::mismatch, [&] {
            comm.send(std::span<const std::uint8_t>(large), 1, 2);
          }, "the large send");
          expect(std::string(e.what()).find("does not fit") != std::string::npos, std::string("says why: ") + e.what());
        } else {
          std::vector<std::uint8_t> in(50);
          chorus::test::expect_error(chorus::ErrorCode::mismatch, [&] { comm.recv(std::span<std::uint8_t>(in), 0, 1); },
                                     "the eager receive");
          std::vector<std::uint8_t> in2(100001);
          chorus::test::expect_error(chorus::ErrorCode::mismatch, [&] { comm.recv(std::span<std::uint8_t>(in2), 0, 2); },
                                     "the large receive");
        }
      },
      fabric.options(60s, 20s));
}

TEST_CASE("rdma: transport=auto uses rdma between hosts and shm within one") {
  FakeFabric fabric;
  auto p = fabric.options(90s, 30s);
  chorus::test::run_processes(
      3,
      [&](int rank, chorus::Options o) {
        ::setenv("CHORUS_HOST_ID", rank < 2 ? "host-a" : "host-b", 1);
        auto comm = chorus::Communicator<chorus::hybrid::Transport>::create(o);
        auto& t = comm.transport();
        const std::string want01 = "shm", want2 = "rdma";
        if (rank < 2) {
          expect(t.link_kind(1 - rank) == want01, "ranks of one host use shm");
          expect(t.link_kind(2) == want2, "ranks of two hosts use rdma, not " + std::string(t.link_kind(2)));
        } else {
          expect(t.link_kind(0) == want2 && t.link_kind(1) == want2, "rank 2 reaches both over rdma");
        }
        std::vector<float> v(300000, static_cast<float>(rank + 1));
        comm.all_reduce(std::span<float>(v), chorus::ReduceOp::sum);
        for (float x : v) expect(x == 6.0f, "the all_reduce over both transports");
      },
      p);
}

TEST_CASE("rdma: transport=rdma without a usable device says why") {
  chorus::test::run_processes(
      2,
      [&](int, chorus::Options o) {
        ::unsetenv("CHORUS_IB_FAKE");
        ::setenv("CHORUS_IB_HCA", "no_such_device", 1);
        o.transport = "rdma";
        const auto e = chorus::test::expect_error(chorus::ErrorCode::invalid_argument, [&] {
          (void)chorus::Communicator<chorus::hybrid::Transport>::create(o);
        }, "forcing rdma with no device");
        expect(std::string(e.what()).find("has no usable RDMA device") != std::string::npos,
               std::string("the error says there is no device: ") + e.what());
      },
      {});
}

namespace {

void matrix(int world) {
  FakeFabric fabric;
  // Slices of 16 KiB: the small counts are eager messages, the large ones RDMA writes.
  chorus::test::device_matrix::run_in_processes<Comm>(
      world, "fake verbs, simulated runtime", fabric.options(240s, 30s),
      [](int) { return std::make_unique<chorus::device::SimRuntime>(); }, 16 << 10);
}

}  // namespace

TEST_CASE("rdma: every collective dtype and op at world 1") { matrix(1); }
TEST_CASE("rdma: every collective dtype and op at world 2") { matrix(2); }
TEST_CASE("rdma: every collective dtype and op at world 3") { matrix(3); }
TEST_CASE("rdma: every collective dtype and op at world 4") { matrix(4); }

}  // namespace rdma_test_rdma
