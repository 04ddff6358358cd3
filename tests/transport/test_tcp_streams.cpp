// SPDX-License-Identifier: BSD-3-Clause
// CHORUS_SOCKETS_PER_PEER: tcp links of K streams. Large messages are striped over the streams and
// still match in per-(peer, tag) order with the small ones that follow them on stream 0; sizes
// must still match; a broken stream breaks the link; invalid values, and ranks whose K differ,
// fail the creation naming the variable.
#include "chorus/transport/tcp/transport.hpp"

#include <doctest/doctest.h>

#include <stdlib.h>
#include <sys/socket.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "chorus/communicator.hpp"
#include "support/communicators.hpp"
#include "support/spawn.hpp"

// This file's own names: the files of tests/transport/ are compiled together (unity build).
namespace transport_test_tcp_streams {

using chorus::test::expect;
using chorus::test::expect_eq;
using Comm = chorus::Communicator<chorus::tcp::Transport>;

namespace {

/// Sets CHORUS_SOCKETS_PER_PEER for its lifetime (the transport reads it when it is created).
struct StreamsEnv {
  explicit StreamsEnv(const std::string& v) { ::setenv("CHORUS_SOCKETS_PER_PEER", v.c_str(), 1); }
  ~StreamsEnv() { ::unsetenv("CHORUS_SOCKETS_PER_PEER"); }
  StreamsEnv(const StreamsEnv&) = delete;
  StreamsEnv& operator=(const StreamsEnv&) = delete;
};

/// Bytes that differ between messages and positions, so a piece in the wrong place shows.
std::vector<std::uint8_t> pattern(std::size_t n, unsigned seed) {
  std::vector<std::uint8_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::uint8_t>((i * 2654435761u + seed * 97u) >> 7);
  return v;
}

}  // namespace

TEST_CASE("stripe_piece splits a size into contiguous pieces that cover it") {
  for (std::uint64_t size : {0ull, 1ull, 5ull, (1ull << 20) + 3, (64ull << 20) + 15})
    for (int n = 1; n <= 16; ++n) {
      std::uint64_t next = 0;
      for (int i = 0; i < n; ++i) {
        const auto [off, len] = chorus::tcp::detail::stripe_piece(size, i, n);
        CHECK(off == next);
        CHECK(len >= size / static_cast<std::uint64_t>(n));
        CHECK(len <= size / static_cast<std::uint64_t>(n) + 1);
        next = off + len;
      }
      CHECK(next == size);
    }
}

// A striped message (3 MiB + 5: pieces of unequal sizes) then a small one and another striped
// one, all of one tag: the receives match them in order, whether posted before the messages
// arrive (rank 1's first round) or after (second round: they are unexpected then).
TEST_CASE("tcp links of K streams: striped messages keep per-tag order with small ones, data intact") {
  const std::size_t big = (3u << 20) + 5, small = 100;
  for (const int k : {2, 4, 16}) {
    CAPTURE(k);
    StreamsEnv env(std::to_string(k));
    chorus::test::run_threads(2, [&](int rank, chorus::Options o) {
      auto comm = Comm::create(std::move(o));
      expect_eq(comm.transport().link(1 - rank).streams(), k, "streams per link");
      for (unsigned round = 0; round < 2; ++round) {
        const auto a = pattern(big, 1 + round), b = pattern(small, 2 + round), c = pattern(big + 8, 3 + round);
        // Round 0: rank 1 posts its receives, then tells rank 0 to send. Round 1: rank 0 sends, then
        // tells rank 1 (tag 98, behind the messages on stream 0) to post its receives.
        std::vector<int> token(1);
        if (rank == 0) {
          if (round == 0) comm.recv(token, 1, 99);
          auto r1 = comm.isend(a, 1, 7);
          auto r2 = comm.isend(b, 1, 7);
          auto r3 = comm.isend(c, 1, 7);
          if (round == 1) comm.send(token, 1, 98);
          r1.wait(), r2.wait(), r3.wait();
        } else {
          std::vector<std::uint8_t> ra(big), rb(small), rc(big + 8);
          if (round == 1) comm.recv(token, 0, 98);
          auto q1 = comm.irecv(ra, 0, 7);
          auto q2 = comm.irecv(rb, 0, 7);
          auto q3 = comm.irecv(rc, 0, 7);
          if (round == 0) comm.send(token, 0, 99);
          q1.wait(), q2.wait(), q3.wait();
          expect(ra == a, "the first striped message arrived whole");
          expect(rb == b, "the small message arrived whole, after it");
          expect(rc == c, "the second striped message arrived whole");
        }
        comm.barrier();
      }
    });
  }
}

TEST_CASE("tcp links of K streams: a size mismatch of a striped message fails both sides, the link goes on") {
  StreamsEnv env("4");
  chorus::test::run_threads(2, [&](int rank, chorus::Options o) {
    auto comm = Comm::create(std::move(o));
    std::vector<std::uint8_t> two(2u << 20, 1), three(3u << 20);
    if (rank == 0) {
      auto e = chorus::test::expect_error(chorus::ErrorCode::mismatch, [&] { comm.send(two, 1, 5); }, "send");
      const std::string w = e.what();
      expect(w.find(std::to_string(two.size())) != std::string::npos &&
                 w.find(std::to_string(three.size())) != std::string::npos,
             "the mismatch names both sizes: " + w);
      comm.send(three, 1, 6);
    } else {
      auto e = chorus::test::expect_error(chorus::ErrorCode::mismatch, [&] { comm.recv(three, 0, 5); }, "recv");
      const std::string w = e.what();
      expect(w.find(std::to_string(two.size())) != std::string::npos &&
                 w.find(std::to_string(three.size())) != std::string::npos,
             "the mismatch names both sizes: " + w);
      comm.recv(three, 0, 6);
      expect(three.front() == 0 && three.back() == 0, "the next striped message of a matching size arrives");
    }
  });
}

// A stream the peer closes between frames may be a peer that is leaving, its other streams' data
// still on the way (link.hpp): the link breaks when it next needs the stream. Here a striped
// message does, and both ends see peer_failure; a small message before it still goes through.
TEST_CASE("tcp links of K streams: a broken extra stream fails the whole link with peer_failure") {
  StreamsEnv env("3");
  chorus::test::run_threads(2, [&](int rank, chorus::Options o) {
    auto comm = Comm::create(std::move(o));
    std::vector<std::uint8_t> v(4u << 20);
    std::vector<int> small(10, rank);
    comm.barrier();
    // Rank 1 cuts stream 2 of its link to rank 0; both ends see it end.
    if (rank == 1) ::shutdown(comm.transport().link(0).socket(2).native_handle(), SHUT_RDWR);
    if (rank == 0) comm.send(small, 1, 2);
    if (rank == 1) comm.recv(small, 0, 2);
    expect(small[9] == 0, "a small message still goes on stream 0");
    auto e = chorus::test::expect_error(
        chorus::ErrorCode::peer_failure,
        [&] {
          if (rank == 0) comm.send(v, 1, 1);
          if (rank == 1) comm.recv(v, 0, 1);
        },
        "a striped message on the broken link");
    (void)e;
  });
}

TEST_CASE("CHORUS_SOCKETS_PER_PEER: invalid values fail the creation, naming the variable") {
  for (const std::string bad : {"0", "17", "abc", "-1"}) {
    CAPTURE(bad);
    StreamsEnv env(bad);
    chorus::test::run_threads(2, [&](int, chorus::Options o) {
      auto e = chorus::test::expect_error(chorus::ErrorCode::invalid_argument, [&] { (void)Comm::create(std::move(o)); },
                                          "create");
      expect(std::string(e.what()).find("CHORUS_SOCKETS_PER_PEER='" + bad + "'") != std::string::npos, e.what());
    });
  }
}

// Eager links: at creation. Lazy ones (the default): at the first call over the link, which fails
// on both ranks.
TEST_CASE("CHORUS_SOCKETS_PER_PEER: ranks with different values both fail, naming both") {
  chorus::test::ProcessOptions popt;
  popt.comm_timeout = std::chrono::seconds(20);
  std::string connect;
  SUBCASE("eager links") { connect = "eager"; }
  SUBCASE("lazy links") { connect = "lazy"; }
  CAPTURE(connect);
  chorus::test::run_processes(
      2,
      [&](int rank, chorus::Options o) {
        ::setenv("CHORUS_SOCKETS_PER_PEER", rank == 0 ? "2" : "4", 1);
        o.connect = connect;
        auto e = chorus::test::expect_error(
            chorus::ErrorCode::invalid_argument,
            [&] {
              auto comm = Comm::create(std::move(o));
              int v = 1;
              if (rank == 0) comm.send(std::span(&v, 1), 1, 0);
              if (rank == 1) comm.recv(std::span(&v, 1), 0, 0);
            },
            connect == "eager" ? "create" : "the first call over the link");
        const std::string w = e.what();
        expect(w.find("CHORUS_SOCKETS_PER_PEER differs") != std::string::npos && w.find('2') != std::string::npos &&
                   w.find('4') != std::string::npos,
               w);
      },
      popt);
}

}  // namespace transport_test_tcp_streams
