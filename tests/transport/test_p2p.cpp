// SPDX-License-Identifier: BSD-3-Clause
// Point-to-point through the public API (Communicator::send/recv/isend/irecv, barrier, abort), over
// inproc (ranks as threads), tcp with ranks as threads, tcp and shm with ranks as processes, for world
// sizes 2, 3, 4 and 8. Data is checked byte by byte against a pattern that depends on sender,
// receiver, tag, message and byte index, so a shifted, swapped or truncated message fails.
#include "chorus/communicator.hpp"

#include "chorus/transport/inproc/transport.hpp"
#include "chorus/transport/shm/transport.hpp"
#include "chorus/transport/tcp/transport.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "support/modes.hpp"
#include "support/sanitized.hpp"
#include "support/spawn.hpp"

// This file's own names: the files of tests/transport/ are compiled together (unity build).
namespace transport_test_p2p {

namespace {

using namespace std::chrono_literals;
using chorus::ErrorCode;
using chorus::Request;
using chorus::test::expect;
using chorus::test::expect_eq;
using chorus::test::expect_error;
using chorus::test::run_world;

using chorus::test::InprocThreads;
using chorus::test::ShmProcesses;
using chorus::test::TcpProcesses;
using chorus::test::TcpThreads;

constexpr int kWorldSizes[] = {2, 3, 4, 8};
constexpr auto kTimeout = 30s;  // every chorus wait in these tests: a bug fails, never hangs

// ---- data pattern ----------------------------------------------------------------------------

std::uint64_t seed_of(int src, int dst, int tag, int msg) {
  return (std::uint64_t(src) << 48) ^ (std::uint64_t(dst) << 32) ^ (std::uint64_t(tag) << 16) ^ std::uint64_t(msg);
}

/// Byte k of the message with this seed: a multiplicative hash of (seed, k), so neighbouring
/// bytes differ and an offset or a message from another (src, dst, tag, msg) is caught.
inline std::byte pattern_byte(std::uint64_t seed, std::size_t k) {
  std::uint64_t x = (std::uint64_t(k) + 1) * 0x9E3779B97F4A7C15ull ^ (seed + 1) * 0xC2B2AE3D27D4EB4Full;
  x ^= x >> 29;
  return static_cast<std::byte>(x >> 56);
}

void fill(std::span<std::byte> b, std::uint64_t seed) {
  for (std::size_t k = 0; k < b.size(); ++k) b[k] = pattern_byte(seed, k);
}

/// Throws Failure naming the first wrong byte and how many are wrong.
void check(std::span<const std::byte> b, std::uint64_t seed, const std::string& what) {
  std::size_t bad = 0, first = 0;
  for (std::size_t k = 0; k < b.size(); ++k) {
    if (b[k] != pattern_byte(seed, k)) {
      if (bad++ == 0) first = k;
    }
  }
  if (bad != 0) {
    throw chorus::test::Failure(what + ": " + std::to_string(bad) + " of " + std::to_string(b.size()) +
                                " bytes wrong, the first at index " + std::to_string(first) + " (got " +
                                std::to_string(int(b[first])) + ", expected " +
                                std::to_string(int(pattern_byte(seed, first))) + ")");
  }
}

std::vector<std::byte> pattern(std::size_t n, std::uint64_t seed) {
  std::vector<std::byte> v(n);
  fill(v, seed);
  return v;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

// Every rank isends to every other rank and irecvs from every other rank at once, several
// messages per pair on one tag (so they must match in posting order), sizes 0, 1, 7, 1000003.
// Even ranks post their sends first, odd ranks their receives first.
TEST_CASE_TEMPLATE("p2p: all pairs exchange at once, sizes 0 1 7 1000003 in order", M, InprocThreads, TcpThreads,
                   TcpProcesses, ShmProcesses) {
  for (int n : kWorldSizes) {
    CAPTURE(n);
    run_world<M>(n, [](auto& comm, chorus::Store&) {
      const std::vector<std::size_t> sizes = {0, 1, 7, 1000003, 0, 13};
      const int r = comm.rank(), n = comm.size();
      const int tag = 5;
      std::vector<std::vector<std::byte>> out(std::size_t(n) * sizes.size()), in(out.size());
      std::vector<Request> sends, recvs;
      auto slot = [&](int peer, std::size_t i) { return std::size_t(peer) * sizes.size() + i; };
      auto post_sends = [&] {
        for (int p = 0; p < n; ++p) {
          if (p == r) continue;
          for (std::size_t i = 0; i < sizes.size(); ++i) {
            auto& b = out[slot(p, i)];
            b = pattern(sizes[i], seed_of(r, p, tag, int(i)));
            sends.push_back(comm.isend(b, p, tag));
          }
        }
      };
      auto post_recvs = [&] {
        for (int p = 0; p < n; ++p) {
          if (p == r) continue;
          for (std::size_t i = 0; i < sizes.size(); ++i) {
            auto& b = in[slot(p, i)];
            b.assign(sizes[i], std::byte{0});
            recvs.push_back(comm.irecv(b, p, tag));
          }
        }
      };
      if (r % 2 == 0) {
        post_sends();
        post_recvs();
      } else {
        post_recvs();
        post_sends();
      }
      for (auto& q : recvs) q.wait();
      for (auto& q : sends) q.wait();
      std::size_t k = 0;
      for (int p = 0; p < n; ++p) {
        if (p == r) continue;
        for (std::size_t i = 0; i < sizes.size(); ++i, ++k) {
          const std::string what = "rank " + std::to_string(r) + " from " + std::to_string(p) + " message " +
                                   std::to_string(i) + " (" + std::to_string(sizes[i]) + " bytes)";
          expect_eq(recvs[k].bytes(), sizes[i], what + ": Request::bytes()");
          check(in[slot(p, i)], seed_of(p, r, tag, int(i)), what);
        }
      }
    });
  }
}

// 10,000 (2,000 under the sanitizers) eight-byte messages to the right neighbour on one tag, each
// carrying its sequence number; the left neighbour receives them one by one and must see them in
// order.
TEST_CASE_TEMPLATE("p2p: thousands of small messages arrive in order", M, InprocThreads, TcpThreads, TcpProcesses,
                   ShmProcesses) {
  for (int n : kWorldSizes) {
    CAPTURE(n);
    run_world<M>(n, [](auto& comm, chorus::Store&) {
      constexpr int kCount = chorus::test::kSanitized ? 2000 : 10000;
      const int r = comm.rank(), n = comm.size();
      const int right = (r + 1) % n, left = (r + n - 1) % n;
      std::vector<std::uint64_t> seq(kCount);
      std::vector<Request> sends;
      sends.reserve(kCount);
      for (int i = 0; i < kCount; ++i) {
        seq[std::size_t(i)] = (std::uint64_t(r) << 32) | std::uint64_t(i);
        sends.push_back(comm.isend(std::span(&seq[std::size_t(i)], 1), right, 3));
      }
      for (int i = 0; i < kCount; ++i) {
        std::uint64_t got = ~std::uint64_t(0);
        comm.recv(std::span(&got, 1), left, 3);
        const std::uint64_t want = (std::uint64_t(left) << 32) | std::uint64_t(i);
        if (got != want) {
          throw chorus::test::Failure("rank " + std::to_string(r) + ": message " + std::to_string(i) + " from " +
                                      std::to_string(left) + " carries " + std::to_string(got & 0xffffffffu) +
                                      " (sender " + std::to_string(got >> 32) + ")");
        }
      }
      for (auto& s : sends) s.wait();
    });
  }
}

// Tags are matched independently: the sender sends tags 1, 2, 3; the receiver receives 3, 2, 1.
// Phase A: the messages may arrive before the receives (unexpected queue). Phase B: receives are
// posted (3, 2, 1) before the barrier, sends go out after it, and the receives are waited 1, 2, 3.
TEST_CASE_TEMPLATE("p2p: receives posted in reverse tag order", M, InprocThreads, TcpThreads, TcpProcesses, ShmProcesses) {
  for (int n : kWorldSizes) {
    CAPTURE(n);
    run_world<M>(n, [](auto& comm, chorus::Store&) {
      const int r = comm.rank(), n = comm.size();
      const int right = (r + 1) % n, left = (r + n - 1) % n;
      auto size_of = [](int phase, int tag) { return std::size_t(100 * tag + 17 * phase + 1); };
      for (int phase = 0; phase < 2; ++phase) {
        std::vector<std::vector<std::byte>> out(4), in(4);
        std::vector<Request> sends, recvs(4);
        auto send_all = [&] {
          for (int tag = 1; tag <= 3; ++tag) {
            out[std::size_t(tag)] = pattern(size_of(phase, tag), seed_of(r, right, tag, phase));
            sends.push_back(comm.isend(out[std::size_t(tag)], right, tag));
          }
        };
        for (int tag = 1; tag <= 3; ++tag) in[std::size_t(tag)].assign(size_of(phase, tag), std::byte{0});
        if (phase == 0) {
          send_all();
          for (int tag = 3; tag >= 1; --tag) comm.recv(in[std::size_t(tag)], left, tag);
        } else {
          for (int tag = 3; tag >= 1; --tag) recvs[std::size_t(tag)] = comm.irecv(in[std::size_t(tag)], left, tag);
          comm.barrier();
          send_all();
          for (int tag = 1; tag <= 3; ++tag) recvs[std::size_t(tag)].wait();
        }
        for (auto& s : sends) s.wait();
        for (int tag = 1; tag <= 3; ++tag) {
          check(in[std::size_t(tag)], seed_of(left, r, tag, phase),
                "rank " + std::to_string(r) + " phase " + std::to_string(phase) + " tag " + std::to_string(tag));
        }
      }
    });
  }
}

// A receive posted with a size other than the one sent fails on the receiver with mismatch, and
// the message names the rank, the peer and the operation. The sender's request must end (either
// way) within the timeout; what it reports is left to the transport.
TEST_CASE_TEMPLATE("p2p: size mismatch fails the receive with mismatch", M, InprocThreads, TcpThreads,
                   TcpProcesses, ShmProcesses) {
  for (std::size_t recv_size : {std::size_t(50), std::size_t(200)}) {
    CAPTURE(recv_size);
    for (int n : {2, 3}) {
      CAPTURE(n);
      run_world<M>(n, [recv_size](auto& comm, chorus::Store&) {
        if (comm.rank() == 0) {
          auto msg = pattern(100, 1);
          Request s = comm.isend(msg, 1, 9);
          try {
            s.wait();
          } catch (const chorus::Error& e) {
            expect(e.code() != ErrorCode::timeout, std::string("sender timed out: ") + e.what());
          }
        } else if (comm.rank() == 1) {
          std::vector<std::byte> buf(recv_size);
          auto e = expect_error(ErrorCode::mismatch, [&] { comm.recv(buf, 0, 9); }, "recv of the wrong size");
          const std::string m = e.what();
          expect(contains(m, "rank 1"), "the message names the rank: " + m);
          expect(contains(m, "peer 0"), "the message names the peer: " + m);
          expect(contains(m, "recv"), "the message names the operation: " + m);
          expect_eq(e.rank(), 1, "Error::rank()");
          expect_eq(e.peer(), 0, "Error::peer()");
        }
      });
    }
  }
}

// A small (eager) message of another size than its receive still writes its first bytes that fit
// into the receive's buffer before the receive fails (the Link concept: collectives read the
// peer's descriptor from there), and its send completes as any eager send does. Both orders: the
// message waiting when the receive is posted, and the receive posted first; a barrier on the same
// link orders them.
TEST_CASE_TEMPLATE("p2p: a small message of another size writes its first bytes, then fails", M, InprocThreads,
                   TcpThreads, TcpProcesses, ShmProcesses) {
  for (bool receive_first : {false, true}) {
    CAPTURE(receive_first);
    for (std::size_t recv_size : {std::size_t(40), std::size_t(100), std::size_t(3000)}) {
      CAPTURE(recv_size);
      run_world<M>(2, [receive_first, recv_size](auto& comm, chorus::Store&) {
        const auto msg = pattern(1000, 7);
        if (comm.rank() == 0) {
          if (receive_first) comm.barrier();
          Request s = comm.isend(msg, 1, 4);
          if (!receive_first) comm.barrier();
          try {
            s.wait();
          } catch (const chorus::Error& e) {
            expect(false, std::string("a small send whose receive has another size must complete: ") + e.what());
          }
        } else {
          std::vector<std::byte> buf(recv_size, std::byte{0});
          Request r;
          if (receive_first) r = comm.irecv(buf, 0, 4);
          comm.barrier();
          if (!receive_first) r = comm.irecv(buf, 0, 4);
          expect_error(ErrorCode::mismatch, [&] { r.wait(); }, "recv of the wrong size");
          const std::size_t k = std::min(recv_size, msg.size());
          for (std::size_t i = 0; i < k; ++i)
            expect(buf[i] == msg[i], "byte " + std::to_string(i) + " of the message's head was not written");
          for (std::size_t i = k; i < recv_size; ++i)
            expect(buf[i] == std::byte{0}, "byte " + std::to_string(i) + " past the message was written");
        }
      });
    }
  }
}

// Peers out of range and negative tags are invalid_argument, thrown before anything is sent; the
// communicator stays usable afterwards.
TEST_CASE_TEMPLATE("p2p: invalid peer or tag is invalid_argument", M, InprocThreads, TcpThreads, TcpProcesses, ShmProcesses) {
  for (int n : kWorldSizes) {
    CAPTURE(n);
    run_world<M>(n, [](auto& comm, chorus::Store&) {
      const int r = comm.rank(), n = comm.size();
      const int right = (r + 1) % n, left = (r + n - 1) % n;
      std::vector<std::byte> b(4);
      for (int bad_peer : {-1, n, n + 5, INT_MIN, INT_MAX}) {
        auto e = expect_error(ErrorCode::invalid_argument, [&] { comm.send(b, bad_peer, 0); },
                              "send to peer " + std::to_string(bad_peer));
        expect(contains(e.what(), "rank " + std::to_string(r)), std::string("the message names the rank: ") + e.what());
        expect_error(ErrorCode::invalid_argument, [&] { comm.recv(b, bad_peer, 0); },
                     "recv from peer " + std::to_string(bad_peer));
        expect_error(ErrorCode::invalid_argument, [&] { (void)comm.isend(b, bad_peer, 0); }, "isend to bad peer");
        expect_error(ErrorCode::invalid_argument, [&] { (void)comm.irecv(b, bad_peer, 0); }, "irecv from bad peer");
      }
      for (int bad_tag : {-1, -7, INT_MIN}) {
        expect_error(ErrorCode::invalid_argument, [&] { comm.send(b, right, bad_tag); },
                     "send with tag " + std::to_string(bad_tag));
        expect_error(ErrorCode::invalid_argument, [&] { comm.recv(b, left, bad_tag); },
                     "recv with tag " + std::to_string(bad_tag));
      }
      // Still usable: the largest tag, around the ring.
      auto msg = pattern(4, seed_of(r, right, INT_MAX, 0));
      Request s = comm.isend(msg, right, INT_MAX);
      comm.recv(b, left, INT_MAX);
      s.wait();
      check(b, seed_of(left, r, INT_MAX, 0), "after the invalid calls");
    });
  }
}

// No rank leaves a barrier before every rank entered it: each rank counts itself in the store
// before the barrier, and reads the count after it. In each round one rank enters late (the
// short pause only widens the window in which a broken barrier is caught; a correct barrier
// passes regardless of timing).
TEST_CASE_TEMPLATE("p2p: barrier waits for every rank", M, InprocThreads, TcpThreads, TcpProcesses, ShmProcesses) {
  for (int n : kWorldSizes) {
    CAPTURE(n);
    run_world<M>(n, [](auto& comm, chorus::Store& store) {
      const int r = comm.rank(), n = comm.size();
      for (int round = 0; round < 4; ++round) {
        const std::string key = "test/barrier/" + std::to_string(round);
        if (r == (round * 3 + 1) % n) std::this_thread::sleep_for(20ms);
        store.add(key, 1);
        comm.barrier();
        expect_eq(store.add(key, 0), std::int64_t(n),
                  "rank " + std::to_string(r) + " round " + std::to_string(round) + ": ranks that entered");
      }
    });
  }
}

// abort() on rank 0 fails every rank's pending receive from rank 0 with peer_failure (not by the
// timeout), and every later operation with rank 0 too; rank 0's own pending and later ones fail
// with `aborted`.
TEST_CASE_TEMPLATE("p2p: abort fails the peers' pending receives", M, InprocThreads, TcpThreads, TcpProcesses, ShmProcesses) {
  for (int n : kWorldSizes) {
    CAPTURE(n);
    run_world<M>(n, [](auto& comm, chorus::Store& store) {
      using Clock = std::chrono::steady_clock;
      const int r = comm.rank(), n = comm.size();
      std::vector<std::byte> b(64);
      if (r == 0) {
        Request mine = comm.irecv(b, 1, 11);
        std::vector<std::string> keys;
        for (int p = 1; p < n; ++p) keys.push_back("test/posted/" + std::to_string(p));
        store.wait(keys, kTimeout);
        comm.abort();
        comm.abort();  // idempotent
        expect_error(ErrorCode::aborted, [&] { mine.wait(); }, "rank 0's own pending receive");
        expect_error(ErrorCode::aborted, [&] { comm.send(b, 1, 12); }, "rank 0's send after abort");
        // Keep the communicator alive until every peer saw the failure, so that it is abort()
        // that fails them and not the destruction of rank 0's communicator.
        keys.clear();
        for (int p = 1; p < n; ++p) keys.push_back("test/failed/" + std::to_string(p));
        store.wait(keys, kTimeout);
      } else {
        Request pending = comm.irecv(b, 0, 11);
        store.set("test/posted/" + std::to_string(r), "1");
        const std::string done_key = "test/failed/" + std::to_string(r);
        try {
          const auto t0 = Clock::now();
          auto e = expect_error(ErrorCode::peer_failure, [&] { pending.wait(); },
                                "rank " + std::to_string(r) + ": pending receive from the aborted rank 0");
          const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0);
          expect(waited < 10s, "peer_failure took " + std::to_string(waited.count()) + " ms");
          expect(contains(e.what(), "peer 0"), std::string("the error names peer 0: ") + e.what());
          expect_error(ErrorCode::peer_failure, [&] { comm.send(b, 0, 12); },
                       "rank " + std::to_string(r) + ": send to the aborted rank 0");
        } catch (...) {
          store.set(done_key, "failed");  // let rank 0 finish at once
          throw;
        }
        store.set(done_key, "1");
      }
    });
  }
}

// 256 MiB (32 MiB under the sanitizers) each way at once between two processes over tcp, checked
// byte by byte.
TEST_CASE("p2p: hundreds of MiB each way between two tcp processes") {
  run_world<TcpProcesses>(2, [](auto& comm, chorus::Store&) {
    constexpr std::size_t kBytes = std::size_t(chorus::test::kSanitized ? 32 : 256) << 20;
    const int r = comm.rank(), peer = 1 - r;
    std::vector<std::byte> out(kBytes), in(kBytes);
    fill(out, seed_of(r, peer, 0, 256));
    Request rq = comm.irecv(in, peer, 0);
    Request sq = comm.isend(out, peer, 0);
    rq.wait();
    sq.wait();
    expect_eq(rq.bytes(), kBytes, "Request::bytes() of the large receive");
    check(in, seed_of(peer, r, 0, 256), "rank " + std::to_string(r) + ": the large message from " + std::to_string(peer));
  });
}

}  // namespace transport_test_p2p
