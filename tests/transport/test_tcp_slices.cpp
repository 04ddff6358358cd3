// SPDX-License-Identifier: BSD-3-Clause
// A tcp link's long message goes out in data frames of at most Policy::kDataFrameBytes, and a
// control frame queued meanwhile goes out between two of them: rank 0's clear-to-send for the
// peer's message must not wait behind the 64 MiB rank 0 is sending. The peer here is the test
// itself, speaking the wire protocol on a raw socket (handshake included), so it sees the frames
// in the order they left and controls when its own request-to-send arrives.
#include "chorus/transport/tcp/transport.hpp"

#include <doctest/doctest.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "chorus/bootstrap/rendezvous.hpp"
#include "chorus/bootstrap/store.hpp"
#include "chorus/detail/asio.hpp"
#include "chorus/detail/handshake.hpp"
#include "support/communicators.hpp"

// This file's own names: the files of tests/transport/ are compiled together (unity build).
namespace transport_test_tcp_slices {

using namespace std::chrono_literals;
namespace asio = chorus::detail::asio;
using chorus::detail::asio_tcp;
using chorus::tcp::Policy;
using chorus::tcp::detail::FrameHeader;
using chorus::tcp::detail::FrameType;

namespace {

constexpr std::uint64_t kBig = 64u << 20;   // rank 0 -> peer
constexpr std::uint64_t kBack = 3u << 20;   // peer -> rank 0, sent once rank 0's data flows
constexpr chorus::Tag kBigTag = 7, kBackTag = 8;

FrameHeader header(FrameType t, std::uint64_t tag, std::uint64_t size, std::uint64_t id) {
  return {static_cast<std::uint32_t>(t), 0, tag, size, id};
}

/// The peer's end: a blocking socket whose reads and writes give up after 20 s.
struct RawPeer {
  asio::io_context io;
  asio_tcp::socket s{io};

  void connect(const std::string& where) {
    const auto space = where.rfind(' ');
    s.connect({asio::ip::make_address(where.substr(0, space)), static_cast<unsigned short>(std::stoi(where.substr(space + 1)))});
    timeval tv{20, 0};
    ::setsockopt(s.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ::setsockopt(s.native_handle(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  }
  FrameHeader read_header() {
    FrameHeader h;
    asio::read(s, asio::buffer(&h, sizeof h));
    return h;
  }
  void write(const void* p, std::size_t n) { asio::write(s, asio::buffer(p, n)); }
};

}  // namespace

TEST_CASE("tcp link: a clear-to-send leaves between the slices of a long message going out") {
  auto store = std::make_shared<chorus::MemoryStore>();
  chorus::Bootstrap b;
  b.rank = 0;
  b.size = 2;
  b.store = store;
  b.options.timeout = 30s;
  b.options.connect = "eager";  // the peer below connects as an eager link's higher rank does
  b.nonce.fill(0x21);

  std::vector<std::byte> big(kBig), back(kBack);
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<std::byte>((i * 131u) >> 3);
  std::exception_ptr rank0_error;
  bool rank0_done = false;
  RawPeer peer;
  std::thread rank0([&] {
    try {
      chorus::tcp::Transport t(b);  // returns once the peer below has connected
      auto r = t.link(1).irecv({back.data(), back.size()}, kBackTag);
      auto s = t.link(1).isend({big.data(), big.size()}, kBigTag);
      s.wait();
      r.wait();
      rank0_done = true;
    } catch (...) {
      rank0_error = std::current_exception();
    }
  });
  // However this test ends, rank 0 is joined: a closed connection fails its link.
  struct Join {
    RawPeer& p;
    std::thread& t;
    ~Join() {
      boost::system::error_code ignored;
      p.s.close(ignored);
      if (t.joinable()) t.join();
    }
  } join{peer, rank0};

  peer.connect(store->get("tcp/addr/0", 20s));
  chorus::Hello mine;
  mine.kind = chorus::kHandshakeLink;
  mine.nonce = b.nonce;
  mine.rank = 1;
  mine.peer = 0;
  mine.world = 2;
  asio::co_spawn(peer.io, [&]() -> asio::awaitable<void> { co_await chorus::handshake_connect(peer.s, mine, ""); },
                 [](std::exception_ptr e) {
                   if (e) std::rethrow_exception(e);
                 });
  peer.io.run_for(20s);
  const std::uint32_t stream_hello[2] = {0, 1};
  peer.write(stream_hello, sizeof stream_hello);
  std::uint32_t k = 0;
  asio::read(peer.s, asio::buffer(&k, sizeof k));
  REQUIRE(k == 1);

  // Rank 0 announces its message; clear it, and read its data slice by slice.
  const FrameHeader rts = peer.read_header();
  REQUIRE(rts.type == static_cast<std::uint32_t>(FrameType::rts));
  REQUIRE(rts.size == kBig);
  const FrameHeader cts = header(FrameType::cts, 0, kBig, rts.id);
  peer.write(&cts, sizeof cts);

  std::vector<std::byte> got(kBig);
  std::uint64_t have = 0;
  std::uint64_t have_at_cts = kBig + 1;  // data read when rank 0's clear-to-send came
  std::uint64_t slices = 0;
  bool asked = false;
  while (have < kBig || have_at_cts > kBig) {
    // Once rank 0's data flows, ask to send: rank 0's receive is posted, so it clears at once.
    if (!asked && have >= 2 * Policy::kDataFrameBytes) {
      const FrameHeader mine_rts = header(FrameType::rts, kBackTag, kBack, 5);
      peer.write(&mine_rts, sizeof mine_rts);
      asked = true;
    }
    const FrameHeader h = peer.read_header();
    if (h.type == static_cast<std::uint32_t>(FrameType::cts)) {
      REQUIRE(h.id == 5);
      REQUIRE(h.size == kBack);
      REQUIRE(h.flags == 0);
      have_at_cts = have;
      std::vector<std::byte> mine_data(kBack);
      for (std::size_t i = 0; i < mine_data.size(); ++i) mine_data[i] = static_cast<std::byte>(i * 7u);
      for (std::uint64_t off = 0; off < kBack; off += Policy::kDataFrameBytes) {
        const std::uint64_t len = std::min<std::uint64_t>(Policy::kDataFrameBytes, kBack - off);
        const FrameHeader d = header(FrameType::data, 0, len, 5);
        peer.write(&d, sizeof d);
        peer.write(mine_data.data() + off, len);
      }
      continue;
    }
    REQUIRE(h.type == static_cast<std::uint32_t>(FrameType::data));
    REQUIRE(h.id == rts.id);
    REQUIRE(h.size == std::min<std::uint64_t>(Policy::kDataFrameBytes, kBig - have));
    asio::read(peer.s, asio::buffer(got.data() + have, h.size));
    have += h.size;
    ++slices;
  }
  rank0.join();
  if (rank0_error) std::rethrow_exception(rank0_error);
  CHECK(rank0_done);
  CHECK(slices == kBig / Policy::kDataFrameBytes);
  // Without slices the clear-to-send came after all 64 MiB; with them, within a few slices of
  // the request (what the socket buffers held, plus the slice being written).
  CHECK(have_at_cts < kBig);
  CHECK(got == big);
  bool back_ok = true;
  for (std::size_t i = 0; i < back.size(); ++i) back_ok = back_ok && back[i] == static_cast<std::byte>(i * 7u);
  CHECK(back_ok);
  MESSAGE("data read before the clear-to-send came: " << have_at_cts << " bytes of " << kBig);
}

}  // namespace transport_test_tcp_slices
