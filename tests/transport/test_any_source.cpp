// SPDX-License-Identifier: BSD-3-Clause
// Receives from any source (Communicator::irecv_any / recv_any, Request::source()) over inproc
// (ranks as threads), tcp (threads and processes), shm and the default transport (processes):
// several senders at once, eager and large messages on several tags over repeated rounds, with
// the receives posted before and after the messages arrive; a mix with ordinary receives on the
// same tag (each message taken once, in order per sender); a size mismatch naming the sender; a
// timeout; a peer's abort; the group rank of a split communicator; bad arguments.
#include "chorus/communicator.hpp"

#include "chorus/transport/hybrid/transport.hpp"
#include "chorus/transport/inproc/transport.hpp"
#include "chorus/transport/shm/transport.hpp"
#include "chorus/transport/tcp/transport.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "support/modes.hpp"
#include "support/spawn.hpp"

// This file's own names: the files of tests/transport/ are compiled together (unity build).
namespace transport_test_any_source {

namespace {

using namespace std::chrono_literals;
using chorus::ErrorCode;
using chorus::Request;
using chorus::test::expect;
using chorus::test::expect_eq;
using chorus::test::expect_error;
using chorus::test::run_world;

using chorus::test::AutoProcesses;
using chorus::test::InprocThreads;
using chorus::test::ShmProcesses;
using chorus::test::TcpProcesses;
using chorus::test::TcpThreads;

constexpr auto kTimeout = 30s;  // every chorus wait in these tests: a bug fails, never hangs

/// Every byte depends on (sender, tag, round, message, index), and the first 8 bytes carry
/// (sender, message) so the receiver can name what it got.
std::vector<std::byte> message(std::size_t n, int src, int tag, int round, int msg) {
  std::vector<std::byte> v(n);
  std::uint64_t x = (std::uint64_t(src) << 48) ^ (std::uint64_t(tag) << 32) ^ (std::uint64_t(round) << 16) ^ std::uint64_t(msg);
  for (std::size_t k = 0; k < n; ++k) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    v[k] = static_cast<std::byte>(x >> 56);
  }
  return v;
}

std::string str(int v) { return std::to_string(v); }
bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

/// The tags of the rounds and their sizes: eager, empty and large (rendezvous on every transport).
struct TagSize {
  int tag;
  std::size_t bytes;
};
constexpr TagSize kTags[] = {{1, 24}, {2, 0}, {3, 200003}};
constexpr int kPerSender = 2;  ///< messages of each sender per tag and round
constexpr int kRounds = 4;

}  // namespace

// Every rank but 0 sends kPerSender messages on each tag to rank 0 at once; rank 0 takes them
// all with receives from any source. In even rounds rank 0 posts its receives before the
// messages are sent (a barrier between), in odd ones after they were sent. Each receive must
// name a sender whose message it holds byte for byte, each sender's messages must come in the
// order they were sent, and every message must be taken exactly once.
TEST_CASE_TEMPLATE("recv_any: several senders at once, eager and large, several tags and rounds", M, InprocThreads,
                   TcpThreads, TcpProcesses, ShmProcesses, AutoProcesses) {
  for (int n : {2, 3, 4}) {
    CAPTURE(n);
    run_world<M>(n, [](auto& comm, chorus::Store&) {
      const int r = comm.rank(), n = comm.size();
      for (int round = 0; round < kRounds; ++round) {
        const bool post_first = round % 2 == 0;
        if (r == 0) {
          struct Posted {
            int tag;
            std::vector<std::byte> buf;
            Request req;
          };
          std::vector<Posted> posted;
          auto post = [&] {
            for (const auto& [tag, bytes] : kTags)
              for (int i = 0; i < (n - 1) * kPerSender; ++i) {
                posted.push_back({tag + 10 * round, std::vector<std::byte>(bytes), {}});
                posted.back().req = comm.irecv_any(posted.back().buf, posted.back().tag);
              }
          };
          if (post_first) post();
          comm.barrier();
          if (!post_first) post();
          std::map<std::pair<int, int>, int> next;  // (tag, sender) -> the message it must send next
          for (auto& p : posted) {
            p.req.wait();
            const int src = p.req.source();
            const std::string what = "round " + str(round) + " tag " + str(p.tag) + ": a receive from any source";
            expect(src >= 1 && src < n, what + " names sender " + str(src));
            expect_eq(p.req.bytes(), p.buf.size(), what + ": Request::bytes()");
            int& msg = next[{p.tag, src}];
            expect(msg < kPerSender, what + ": more than " + str(kPerSender) + " messages from rank " + str(src));
            expect(p.buf == message(p.buf.size(), src, p.tag, round, msg),
                   what + ": the data is not message " + str(msg) + " of rank " + str(src) + " (lost, reordered or mixed up)");
            ++msg;
          }
          for (const auto& [tag, bytes] : kTags)
            for (int s = 1; s < n; ++s)
              expect_eq(next[{tag + 10 * round, s}], kPerSender, "round " + str(round) + " tag " + str(tag) + ": messages from rank " + str(s));
        } else {
          std::vector<std::vector<std::byte>> out;
          std::vector<Request> sends;
          auto send = [&] {
            for (const auto& [tag, bytes] : kTags)
              for (int i = 0; i < kPerSender; ++i) {
                out.push_back(message(bytes, r, tag + 10 * round, round, i));
                sends.push_back(comm.isend(out.back(), 0, tag + 10 * round));
              }
          };
          out.reserve(std::size(kTags) * kPerSender);
          if (!post_first) send();
          comm.barrier();
          if (post_first) send();
          for (auto& s : sends) s.wait();
        }
      }
    });
  }
}

// recv_any (blocking) returns the sender, and irecv_any's request names it; receives from any
// source and ordinary ones on the same tag: rank 1 sends three messages, the others one each;
// rank 0 posts an ordinary receive from rank 1, then receives from any source for the rest,
// before anything is sent (round 0) and after everything was (round 1). Every message is taken
// exactly once, and rank 1's in the order sent. Then, with rank 1 the only sender on a tag, a
// receive from any source posted before an ordinary one takes rank 1's first message.
TEST_CASE_TEMPLATE("recv_any: mixed with ordinary receives on the same tag", M, InprocThreads, TcpThreads, TcpProcesses,
                   ShmProcesses) {
  for (int n : {2, 3, 4}) {
    CAPTURE(n);
    run_world<M>(n, [](auto& comm, chorus::Store&) {
      const int r = comm.rank(), n = comm.size();
      constexpr int kTag = 7;
      constexpr std::size_t kBytes = 40;
      constexpr int kFromOne = 3;
      for (int round = 0; round < 2; ++round) {
        const int tag = kTag + 10 * round;  // a round's messages must not meet the other's receives
        if (r == 0) {
          struct Got {
            bool any;
            std::vector<std::byte> buf = std::vector<std::byte>(kBytes);
            Request req;
          };
          std::vector<Got> got;
          const int total = kFromOne + (n - 2);
          got.reserve(std::size_t(total));
          auto post = [&](bool any) {
            got.push_back({any, std::vector<std::byte>(kBytes), {}});
            got.back().req = any ? comm.irecv_any(got.back().buf, tag) : comm.irecv(got.back().buf, 1, tag);
          };
          if (round == 1) comm.barrier();  // the senders have posted everything
          post(false);
          for (int i = 1; i < total; ++i) post(true);
          if (round == 0) comm.barrier();
          std::map<int, int> next;  // sender -> its next message, in posting order
          for (std::size_t i = 0; i < got.size(); ++i) {
            auto& g = got[i];
            g.req.wait();
            const int src = g.req.source();
            const std::string what =
                "round " + str(round) + " receive " + std::to_string(i) + (g.any ? " (any source)" : " (from 1)");
            expect(src >= 1 && src < n, what + " names sender " + str(src));
            if (!g.any) expect_eq(src, 1, what + ": Request::source() of an ordinary receive");
            const int msg = next[src]++;
            expect(g.buf == message(kBytes, src, tag, round, msg), what + ": the data is not message " + str(msg) + " of rank " + str(src));
          }
          expect_eq(next[1], kFromOne, "round " + str(round) + ": messages taken from rank 1");
          for (int s = 2; s < n; ++s) expect_eq(next[s], 1, "round " + str(round) + ": messages taken from rank " + str(s));
        } else {
          std::vector<std::vector<std::byte>> out;
          std::vector<Request> sends;
          const int count = r == 1 ? kFromOne : 1;
          out.reserve(std::size_t(count));
          if (round == 0) comm.barrier();  // rank 0 has posted everything
          for (int i = 0; i < count; ++i) {
            out.push_back(message(kBytes, r, tag, round, i));
            sends.push_back(comm.isend(out.back(), 0, tag));
          }
          if (round == 1) comm.barrier();
          for (auto& s : sends) s.wait();
        }
      }
      // The blocking form returns the sender.
      if (r == 0) {
        std::set<int> seen;
        for (int s = 1; s < n; ++s) {
          std::vector<std::byte> b(kBytes);
          const int src = comm.recv_any(b, kTag + 31);
          expect(src >= 1 && src < n && seen.insert(src).second, "recv_any returned " + str(src) + " (again, or no rank)");
          expect(b == message(kBytes, src, kTag + 31, 0, 0), "recv_any's data is rank " + str(src) + "'s");
        }
      } else {
        comm.send(message(kBytes, r, kTag + 31, 0, 0), 0, kTag + 31);
      }
      // A receive from any source posted before an ordinary one takes the first message.
      if (r == 0) {
        std::vector<std::byte> a(kBytes), o(kBytes);
        Request any = comm.irecv_any(a, kTag + 32);
        Request one = comm.irecv(o, 1, kTag + 32);
        comm.barrier();
        any.wait();
        one.wait();
        expect_eq(any.source(), 1, "the receive from any source");
        expect(a == message(kBytes, 1, kTag + 32, 0, 0), "the receive from any source posted first takes message 0");
        expect(o == message(kBytes, 1, kTag + 32, 0, 1), "the ordinary receive posted second takes message 1");
      } else {
        comm.barrier();
        if (r == 1) {
          comm.send(message(kBytes, 1, kTag + 32, 0, 0), 0, kTag + 32);
          comm.send(message(kBytes, 1, kTag + 32, 0, 1), 0, kTag + 32);
        }
      }
    });
  }
}

// A message of another size fails the receive from any source with mismatch naming rank, sender
// and operation, and the communicator goes on (the next receive from any source works); a
// negative tag and a communicator of one rank are invalid_argument.
TEST_CASE_TEMPLATE("recv_any: a size mismatch names the sender; bad arguments", M, InprocThreads, TcpThreads, ShmProcesses) {
  run_world<M>(3, [](auto& comm, chorus::Store&) {
    const int r = comm.rank();
    std::vector<std::byte> b(16);
    if (r == 0) {
      auto e = expect_error(ErrorCode::mismatch, [&] { (void)comm.recv_any(b, 9); }, "recv_any of the wrong size");
      const std::string m = e.what();
      expect(contains(m, "rank 0"), "the message names the rank: " + m);
      expect(contains(m, "peer 2"), "the message names the sender: " + m);
      expect(contains(m, "recv from any source"), "the message names the operation: " + m);
      expect_eq(e.peer(), 2, "Error::peer()");
      expect_error(ErrorCode::invalid_argument, [&] { (void)comm.irecv_any(b, -1); }, "a negative tag");
      Request next = comm.irecv_any(b, 10);
      comm.barrier();  // rank 1 sends only now
      next.wait();
      expect_eq(next.source(), 1, "the next receive from any source");
      expect(b == message(16, 1, 10, 0, 0), "its data");
    } else {
      if (r == 2) comm.send(message(8, r, 9, 0, 0), 0, 9);
      comm.barrier();
      if (r == 1) comm.send(message(16, r, 10, 0, 0), 0, 10);
    }
  });
  run_world<M>(1, [](auto& comm, chorus::Store&) {
    std::vector<std::byte> b(4);
    auto e = expect_error(ErrorCode::invalid_argument, [&] { (void)comm.irecv_any(b, 0); }, "recv_any on one rank");
    expect(contains(e.what(), "no other rank"), std::string("says why: ") + e.what());
  });
}

// Nobody sends: the receive from any source times out after the communicator's timeout (not
// before, not much later) with timeout naming the operation. The other ranks stay until then,
// so that it is the timeout and not their leaving that ends it.
TEST_CASE_TEMPLATE("recv_any: times out" * doctest::test_suite("waits"), M, InprocThreads, TcpThreads,
                   ShmProcesses) {
  constexpr auto kShort = 1500ms;
  run_world<M>(
      3,
      [kShort](auto& comm, chorus::Store& store) {
        using Clock = std::chrono::steady_clock;
        if (comm.rank() == 0) {
          std::vector<std::byte> b(8);
          Request q = comm.irecv_any(b, 4);
          const auto t0 = Clock::now();
          try {
            auto e = expect_error(ErrorCode::timeout, [&] { q.wait(); }, "recv_any nobody sends to");
            const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0);
            expect(waited >= kShort - 100ms && waited < kShort + 20s, "timed out after " + std::to_string(waited.count()) + " ms");
            expect(contains(e.what(), "recv from any source"), std::string("names the operation: ") + e.what());
          } catch (...) {
            store.set("test/any/timed_out", "failed");
            throw;
          }
          store.set("test/any/timed_out", "1");
        } else {
          store.wait({"test/any/timed_out"}, 60s);
        }
      },
      kShort);
}

// One peer's abort does not fail a pending receive from any source (another rank may still
// send it): rank 2 aborts, rank 0 sees its link to rank 2 break (an ordinary receive from it
// fails), the receive from any source is still pending and then takes rank 1's message. When
// rank 1 aborts as well, no rank is left to send: the next one fails with peer_failure, promptly.
TEST_CASE_TEMPLATE("recv_any: fails with peer_failure once every peer is gone, not before", M, InprocThreads,
                   TcpThreads, TcpProcesses, ShmProcesses) {
  run_world<M>(3, [](auto& comm, chorus::Store& store) {
    using Clock = std::chrono::steady_clock;
    std::vector<std::byte> b(8), probe(8);
    const int r = comm.rank();
    if (r == 0) {
      try {
        Request q = comm.irecv_any(b, 6);
        Request from2 = comm.irecv(probe, 2, 99);
        store.set("test/any/posted", "1");
        expect_error(ErrorCode::peer_failure, [&] { from2.wait(); }, "an ordinary receive from the aborted rank 2");
        expect(!q.test(), "the receive from any source is still pending after rank 2 aborted");
        store.set("test/any/send", "1");
        q.wait();
        expect_eq(q.source(), 1, "the receive from any source after rank 2 aborted");
        expect(b == message(8, 1, 6, 0, 0), "its data");
        Request q2 = comm.irecv_any(b, 7);
        store.set("test/any/posted2", "1");
        const auto t0 = Clock::now();
        expect_error(ErrorCode::peer_failure, [&] { q2.wait(); }, "recv_any once ranks 1 and 2 aborted");
        expect(Clock::now() - t0 < 10s, "peer_failure came late");
      } catch (...) {
        store.set("test/any/done", "failed");
        throw;
      }
      store.set("test/any/done", "1");
    } else {
      if (r == 2) {
        store.wait({"test/any/posted"}, kTimeout);
        comm.abort();
      } else {
        store.wait({"test/any/send"}, kTimeout);
        comm.send(message(8, 1, 6, 0, 0), 0, 6);
        store.wait({"test/any/posted2"}, kTimeout);
        comm.abort();
      }
      store.wait({"test/any/done"}, kTimeout);
    }
  });
}

// In a communicator split from the world, the source is the rank in that communicator, and only
// its own messages match: world rank 2 sends on the same tag in the world first, and the
// group's receive from any source must not take it.
TEST_CASE_TEMPLATE("recv_any: a split communicator names group ranks", M, InprocThreads, TcpThreads) {
  run_world<M>(4, [](auto& comm, chorus::Store&) {
    const int r = comm.rank();
    auto half = comm.split(r % 2, r);  // {0, 2} and {1, 3}
    if (r == 0) {
      std::vector<std::byte> g(8), w(8);
      expect_eq(half.recv_any(g, 5), 1, "the source in the group (world rank 2)");
      expect(g == message(8, 2, 5, 1, 0), "the group's message from world rank 2");
      comm.recv(w, 2, 5);
      expect(w == message(8, 2, 5, 0, 0), "the world's message from rank 2");
      comm.recv(w, 1, 5);
      expect(w == message(8, 1, 5, 0, 0), "the world's message from rank 1");
    } else if (r == 1) {
      comm.send(message(8, 1, 5, 0, 0), 0, 5);
    } else if (r == 2) {
      comm.send(message(8, 2, 5, 0, 0), 0, 5);
      half.send(message(8, 2, 5, 1, 0), 0, 5);
    }
    comm.barrier();
  });
}

}  // namespace transport_test_any_source
