// SPDX-License-Identifier: BSD-3-Clause
// tcp links made on first use (CHORUS_CONNECT=lazy, the default; transport/tcp/detail/lazy_links.hpp):
// creation connects nothing; a send connects its pair, at both ends, and no other; two ranks that
// send to each other first settle on one connection (with K streams too); a ring or a tree
// all_reduce connects a rank to its neighbours only; a peer gone before any link to it was made
// fails the send with peer_failure naming it, not a timeout; CHORUS_CONNECT=eager connects every
// link at creation, and another value is refused.
#include <doctest/doctest.h>
#include <stdlib.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "chorus/communicator.hpp"
#include "chorus/transport/tcp/transport.hpp"
#include "support/communicators.hpp"
#include "support/spawn.hpp"

// This file's own names: the files of tests/transport/ are compiled together (unity build).
namespace transport_test_tcp_lazy {

using namespace std::chrono_literals;
using chorus::test::expect;
using chorus::test::expect_eq;
using chorus::test::store_barrier;
using Comm = chorus::Communicator<chorus::tcp::Transport>;

namespace {

/// The peers this rank's links are connected to.
std::vector<int> connected_peers(Comm& comm) {
  std::vector<int> v;
  for (int p = 0; p < comm.size(); ++p)
    if (p != comm.rank() && comm.transport().link(p).is_connected()) v.push_back(p);
  return v;
}

std::string list(const std::vector<int>& v) {
  std::string s;
  for (int p : v) s += (s.empty() ? "" : ",") + std::to_string(p);
  return "{" + s + "}";
}

/// Sets an environment variable for its lifetime.
struct Env {
  Env(const char* name, const std::string& v) : name_(name) { ::setenv(name, v.c_str(), 1); }
  ~Env() { ::unsetenv(name_); }
  Env(const Env&) = delete;
  Env& operator=(const Env&) = delete;
  const char* name_;
};

}  // namespace

TEST_CASE("tcp lazy links: creation connects nothing; a send connects its pair, at both ends, and no other") {
  chorus::test::run_threads(4, [](int rank, chorus::Options o) {
    auto store = o.store;
    auto comm = Comm::create(std::move(o));
    expect_eq(list(connected_peers(comm)), std::string("{}"), "links connected after creation");
    store->set("created/" + std::to_string(rank), "1");
    store->wait({"created/0", "created/1", "created/2", "created/3"}, 20s);  // nobody has sent yet
    int v = rank == 0 ? 42 : 0;
    if (rank == 0) comm.send(std::span(&v, 1), 1, 5);
    if (rank == 1) {
      comm.recv(std::span(&v, 1), 0, 5);
      expect_eq(v, 42, "the message over the link made on first use");
    }
    if (rank <= 1) store->set("sent/" + std::to_string(rank), "1");
    store->wait({"sent/0", "sent/1"}, 20s);
    const std::vector<int> want = rank == 0   ? std::vector<int>{1}
                                  : rank == 1 ? std::vector<int>{0}
                                              : std::vector<int>{};
    expect_eq(list(connected_peers(comm)), list(want), "links connected after rank 0 sent to rank 1");
  });
}

// Both ranks send before either receives: both dial, and the connection the lower rank dialed is
// kept at both ends. Many fresh pairs, so the dials cross in different orders; K streams too.
TEST_CASE("tcp lazy links: two ranks that both send first settle on one connection") {
  for (const int k : {1, 3}) {
    CAPTURE(k);
    Env env("CHORUS_SOCKETS_PER_PEER", std::to_string(k));
    for (int round = 0; round < 12; ++round) {
      CAPTURE(round);
      chorus::test::run_threads(2, [&](int rank, chorus::Options o) {
        auto comm = Comm::create(std::move(o));
        const int peer = 1 - rank;
        std::vector<int> out(3000, rank + 10 * round), in(3000, -1);   // 12 kB: eager
        std::vector<int> big_out(40000, rank + 7), big_in(40000, -1);  // 160 kB: rts, cts, data
        auto s1 = comm.isend(std::span<const int>(out), peer, 1);
        auto s2 = comm.isend(std::span<const int>(big_out), peer, 2);
        comm.recv(std::span(in), peer, 1);
        comm.recv(std::span(big_in), peer, 2);
        s1.wait();
        s2.wait();
        expect(in == std::vector<int>(3000, peer + 10 * round), "the small message");
        expect(big_in == std::vector<int>(40000, peer + 7), "the large message");
        expect_eq(list(connected_peers(comm)), list({peer}), "the link is connected");
        expect_eq(comm.transport().link(peer).streams(), k, "streams");
      });
    }
  }
}

TEST_CASE(
    "tcp lazy links: a ring all_reduce connects each rank to its two neighbours only, a tree to its few") {
  const int n = 8;
  for (const std::string algo : {"ring", "tree"}) {
    CAPTURE(algo);
    chorus::test::run_threads(n, [&](int rank, chorus::Options o) {
      o.algorithm = "all_reduce:" + algo;
      auto store = o.store;
      auto comm = Comm::create(std::move(o));
      for (const std::size_t count : {std::size_t(2), std::size_t(100003)}) {
        std::vector<float> in(count, float(rank + 1)), out(count, 0.0f);
        comm.all_reduce(std::span<const float>(in), std::span(out), chorus::ReduceOp::sum);
        expect(out == std::vector<float>(count, float(n * (n + 1) / 2)), "the sums");
      }
      // Every rank has finished its all_reduces (the store tells, not a call over the links).
      store_barrier(*store, algo + "/reduced", rank, n);
      const std::vector<int> peers = connected_peers(comm);
      if (algo == "ring") {
        for (int p : peers)
          expect(p == (rank + 1) % n || p == (rank + n - 1) % n,
                 "rank " + std::to_string(rank) + " connected to " + list(peers));
      } else {
        expect(peers.size() <= 6, "rank " + std::to_string(rank) + " connected to " + list(peers));
      }
      store_barrier(*store, algo + "/looked", rank, n);
      comm.barrier();  // (after every rank looked: its own algorithm may connect others)
    });
  }
}

TEST_CASE(
    "tcp lazy links: a send to a peer gone before any link to it was made fails with peer_failure naming "
    "it") {
  chorus::test::run_threads(2, [](int rank, chorus::Options o) {
    auto store = o.store;
    std::optional<Comm> comm(Comm::create(std::move(o)));
    if (rank == 1) {
      comm.reset();  // its listening socket closes with it
      store->set("gone", "1");
      return;
    }
    store->wait({"gone"}, 20s);
    int v = 1;
    const auto e = chorus::test::expect_error(
        chorus::ErrorCode::peer_failure, [&] { comm->send(std::span(&v, 1), 1, 0); },
        "send to a rank that is gone");
    const std::string what = e.what();
    expect(what.find("rank 1") != std::string::npos, "the error names the peer: " + what);
  });
}

TEST_CASE("tcp links: CHORUS_CONNECT=eager connects every link at creation; another value is refused") {
  chorus::test::run_threads(3, [](int rank, chorus::Options o) {
    o.connect = "eager";
    auto comm = Comm::create(std::move(o));
    expect_eq(list(connected_peers(comm)),
              list(rank == 0   ? std::vector<int>{1, 2}
                   : rank == 1 ? std::vector<int>{0, 2}
                               : std::vector<int>{0, 1}),
              "links connected after an eager creation");
    comm.barrier();
  });
  Env env("CHORUS_CONNECT", "sometimes");
  const auto e = chorus::test::expect_error(
      chorus::ErrorCode::invalid_argument, [] { (void)chorus::Options::from_env(); },
      "CHORUS_CONNECT=sometimes");
  expect(std::string(e.what()).find("CHORUS_CONNECT") != std::string::npos, "the error names the variable");
}

}  // namespace transport_test_tcp_lazy
