// SPDX-License-Identifier: BSD-3-Clause
// The tcp transport's listening port meets strangers: garbage bytes, a handshake from another job
// (wrong nonce), a wrong job token. Each is refused, and the job's own ranks still connect. And
// the address the links listen on: IPv6 loopback, and the interface CHORUS_SOCKET_IFNAME picks.
#include "chorus/transport/tcp/transport.hpp"

#include <doctest/doctest.h>

#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "chorus/communicator.hpp"
#include "support/communicators.hpp"
#include "chorus/detail/asio.hpp"
#include "support/spawn.hpp"

// This file's own names: the files of tests/transport/ are compiled together (unity build).
namespace transport_test_tcp_handshake {

using namespace std::chrono_literals;
namespace asio = chorus::detail::asio;
using chorus::detail::asio_tcp;
using chorus::test::expect;

namespace {

/// Rank 0's published link address ("ip port"), from the store both ranks share.
asio_tcp::endpoint rank0_endpoint(chorus::Store& store) {
  const std::string where = store.get("chorus/g1/comm/tcp/addr/0", 20s);
  const auto space = where.rfind(' ');
  return {asio::ip::make_address(where.substr(0, space)), static_cast<unsigned short>(std::stoi(where.substr(space + 1)))};
}

/// Connects to `ep`, runs a client handshake with `hello`/`token`; returns the error it ends with,
/// or "" when the handshake was accepted.
std::string stranger_handshake(const asio_tcp::endpoint& ep, chorus::Hello hello, const std::string& token) {
  asio::io_context io;
  asio_tcp::socket s(io);
  s.connect(ep);
  std::string result;
  asio::co_spawn(
      io, [&]() -> asio::awaitable<void> { co_await chorus::handshake_connect(s, hello, token); },
      [&](std::exception_ptr e) {
        if (!e) return;
        try {
          std::rethrow_exception(e);
        } catch (const std::exception& x) {
          result = x.what();
        }
      });
  io.run_for(20s);
  return result.empty() && !io.stopped() ? "handshake did not finish" : result;
}

/// Sends bytes that are not a handshake; returns true when the rank closes the connection.
bool garbage_is_dropped(const asio_tcp::endpoint& ep) {
  asio::io_context io;
  asio_tcp::socket s(io);
  s.connect(ep);
  const std::string junk = "GET / HTTP/1.1\r\nHost: x\r\n\r\n" + std::string(200, '\xff');
  asio::write(s, asio::buffer(junk));
  // The rank may answer with a refusal before it closes: read until the connection ends.
  std::vector<char> buf(1 << 16);
  bool closed = false;
  asio::async_read(s, asio::buffer(buf), [&](const boost::system::error_code& ec, std::size_t) { closed = bool(ec); });
  io.run_for(20s);
  return closed;
}

}  // namespace

TEST_CASE("tcp links refuse garbage, other jobs and wrong tokens, and still connect their own ranks") {
  for (const std::string token : {"", "s3cret"}) {
    CAPTURE(token);
    chorus::test::ThreadOptions topt;
    chorus::test::run_threads(
        2,
        [&](int rank, chorus::Options o) {
          o.job_token = token;
          if (rank == 1) {
            // Before rank 1 joins, strangers knock on rank 0's link port.
            const auto ep = rank0_endpoint(*o.store);
            expect(garbage_is_dropped(ep), "garbage on the link port is dropped");
            chorus::Hello other_job;
            other_job.kind = chorus::kHandshakeLink;
            other_job.nonce.fill(0x5a);  // not this job's nonce
            other_job.rank = 1;
            other_job.peer = 0;
            other_job.world = 2;
            const std::string e1 = stranger_handshake(ep, other_job, token);
            expect(!e1.empty(), "a handshake with another job's nonce is refused");
            // This job's nonce (as if it had leaked) but a wrong token: the proof fails.
            chorus::Hello same_job = other_job;
            same_job.nonce = chorus::detail::nonce_from_hex(o.store->get("chorus/g1/nonce", 20s), {});
            const std::string e2 = stranger_handshake(ep, same_job, token.empty() ? "intruder" : token + "x");
            expect(e2.find("token") != std::string::npos, "a handshake with a wrong token is refused: " + e2);
          }
          auto comm = chorus::Communicator<chorus::tcp::Transport>::create(std::move(o));
          int v = rank == 0 ? 42 : 0;
          if (rank == 0) comm.send(std::span(&v, 1), 1, 3);
          if (rank == 1) comm.recv(std::span(&v, 1), 0, 3);
          expect(v == 42, "the job's own link works after the strangers were refused");
        },
        topt);
  }
}

TEST_CASE("tcp links over IPv6 loopback") {
  std::shared_ptr<chorus::TcpStore> store;
  try {
    store = std::make_shared<chorus::TcpStore>("::1", 0, true, 20s);
  } catch (const chorus::Error& e) {
    MESSAGE("IPv6 loopback not available here, skipped: " << e.what());
    return;
  }
  const std::string method = "tcp://[::1]:" + std::to_string(store->port());
  chorus::test::run_threads(
      3,
      [&](int rank, chorus::Options o) {
        // One store client per rank, as separate processes would have (a TcpStore client has one
        // connection, and a waiting get holds it).
        o.store = std::make_shared<chorus::TcpStore>("::1", store->port(), false, 20s);
        o.init_method = method;  // the links listen on the address that reaches the master: ::1
        auto comm = chorus::Communicator<chorus::tcp::Transport>::create(std::move(o));
        const std::string where = store->get("chorus/g1/comm/tcp/addr/" + std::to_string(rank), 20s);
        expect(where.rfind("::1 ", 0) == 0, "rank " + std::to_string(rank) + " listens on ::1, not '" + where + "'");
        std::vector<int> v(1000, rank), all(3000);
        comm.all_gather(v, all);
        for (int p = 0; p < 3; ++p) expect(all[p * 1000] == p && all[p * 1000 + 999] == p, "all_gather over IPv6");
      });
}

// CHORUS_SOCKET_IFNAME read by Options::apply_env: the prefix "lo" listens on loopback; "^lo" on
// another interface of this host where it has one (and the ranks still connect over it); a
// list that matches nothing fails the creation, naming the variable.
TEST_CASE("tcp links listen on the interface CHORUS_SOCKET_IFNAME picks") {
  const auto here = chorus::tcp::detail::interface_addresses();
  const bool other = std::any_of(here.begin(), here.end(), [](const auto& a) { return a.name != "lo"; });
  for (const std::string spec : {"lo", "^lo", "nosuch,alsonot"}) {
    CAPTURE(spec);
    if (spec == "^lo" && !other) {
      MESSAGE("no interface but lo here: '^lo' skipped");
      continue;
    }
    ::setenv("CHORUS_SOCKET_IFNAME", spec.c_str(), 1);
    std::string rank0_where;
    chorus::test::run_threads(2, [&](int rank, chorus::Options o) {
      o.apply_env();
      expect(o.socket_ifname == spec, "socket_ifname from the environment");
      if (spec == "nosuch,alsonot") {
        auto e = chorus::test::expect_error(
            chorus::ErrorCode::invalid_argument,
            [&] { (void)chorus::Communicator<chorus::tcp::Transport>::create(std::move(o)); }, "no interface matches");
        expect(std::string(e.what()).find("CHORUS_SOCKET_IFNAME='nosuch,alsonot': no interface") != std::string::npos &&
                   std::string(e.what()).find("'lo'") != std::string::npos,
               e.what());
        return;
      }
      auto store = o.store;
      auto comm = chorus::Communicator<chorus::tcp::Transport>::create(std::move(o));
      const std::string where = store->get("chorus/g1/comm/tcp/addr/" + std::to_string(rank), 20s);
      const auto address = asio::ip::make_address(where.substr(0, where.rfind(' ')));
      expect(address.is_loopback() == (spec == "lo"), "rank " + std::to_string(rank) + " listens on " + where);
      if (rank == 0) rank0_where = where;
      std::vector<int> v(1000, rank), all(2000);
      comm.all_gather(v, all);
      expect(all[0] == 0 && all[1999] == 1, "all_gather over the chosen interface");
    });
    ::unsetenv("CHORUS_SOCKET_IFNAME");
    if (!rank0_where.empty()) MESSAGE("CHORUS_SOCKET_IFNAME=" << spec << ": rank 0 listens on " << rank0_where);
  }
}

}  // namespace transport_test_tcp_handshake
