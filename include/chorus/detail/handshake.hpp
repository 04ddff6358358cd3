// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// The handshake that opens every chorus connection (store connections and transport links),
/// as Asio C++20 coroutines: handshake_connect (client) and handshake_accept (server). It sits in
/// detail/ because both the bootstrap store and the transports' links open with it. The frames
/// and their checks are in detail/handshake/wire.hpp; the socket reads, writes and time bounds
/// (SocketWatchdog, run_with_deadline) in detail/handshake/io.hpp.
///
/// Wire protocol, version 1. Fixed-size binary frames, integers little-endian.
///
///   1. client -> server  HELLO, 52 bytes
///        off  size  field
///          0     4  magic "CHRS"
///          4     2  version (u16) = 1
///          6     1  kind (u8): 1 = store, 2 = link
///          7     1  flags (u8): bit0 = the client has a job token
///          8    16  client challenge cc (random)
///         24    16  job nonce (zeros for store connections)
///         40     4  rank (i32)      the client's rank, -1 when unknown
///         44     4  peer (i32)      the rank the client means to reach, -1 when unknown
///         48     4  world (i32)     the client's world size, -1 when unknown
///   2. server -> client  REPLY, 56 bytes
///          0     4  magic "CHRS"
///          4     2  version (u16) = 1
///          6     1  status (u8): 0 ok, else HandshakeStatus (refused; the server then closes)
///          7     1  flags (u8): bit0 = the server has a job token
///          8    16  server challenge sc (random; zeros when refused)
///         24    32  server proof = HMAC-SHA256(token, "chorus-srv" || cc || sc || HELLO)
///                   when the server has a token, zeros otherwise
///   3. client -> server  PROOF, 32 bytes
///          0    32  client proof = HMAC-SHA256(token, "chorus-cli" || sc || cc || HELLO)
///                   when the client has a token, zeros otherwise (also zeros when the client
///                   has already decided to refuse: bad server proof or token flags differ)
///   4. server -> client  FINAL, 1 byte: 0 ok, else HandshakeStatus
///
/// The token itself never crosses the wire. Each side proves knowledge of it over a challenge
/// the other side picked, with distinct labels per direction, so a proof can be neither replayed
/// nor reflected. A token on one side only is a mismatch: the server refuses in REPLY when the
/// flags differ, the client refuses when REPLY says ok but the server's flag differs from its
/// own or the server proof is wrong. The job nonce is checked by the server's accept_hello
/// callback (transport links: the nonce the rendezvous agreed on). Without a token the handshake
/// only guards against strays (wrong program, wrong job, wrong kind), not against an attacker.

#include <array>
#include <cstdint>
#include <cstring>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "chorus/core/error.hpp"
#include "chorus/detail/crypto.hpp"
#include "chorus/detail/handshake/io.hpp"
#include "chorus/detail/handshake/wire.hpp"

namespace chorus {
namespace detail {

/// REPLY with a non-zero status, best effort (the client may already be gone).
inline asio::awaitable<void> send_refusal(asio_tcp::socket& socket, HandshakeStatus s, bool have_token) {
  std::array<std::uint8_t, kReplyBytes> r{};
  std::memcpy(r.data(), kHandshakeMagic.data(), 4);
  put_u16(r.data() + 4, kHandshakeVersion);
  r[6] = static_cast<std::uint8_t>(s);
  r[7] = have_token ? kFlagToken : 0;
  boost::system::error_code ec;
  co_await asio::async_write(socket, asio::buffer(r), asio::redirect_error(asio::use_awaitable, ec));
}

/// Server's last step: reads the client's proof, checks it (when there is a token), sends FINAL.
/// Returns whether the proof was right; throws peer_failure when the connection breaks.
inline asio::awaitable<bool> check_client_proof(asio_tcp::socket& socket, std::string_view token,
                                                const std::array<std::uint8_t, 16>& sc,
                                                const std::array<std::uint8_t, 16>& cc,
                                                const std::array<std::uint8_t, kHelloBytes>& hello, ErrorContext ctx) {
  std::array<std::uint8_t, kProofBytes> proof{};
  co_await read_exact(socket, proof, ctx, "reading the client's proof");
  bool ok = true;
  if (!token.empty()) ok = constant_time_equal(handshake_proof(token, "chorus-cli", sc, cc, hello), proof);
  const std::array<std::uint8_t, 1> fs = {
      static_cast<std::uint8_t>(ok ? HandshakeStatus::ok : HandshakeStatus::auth_failed)};
  if (ok) {
    co_await write_all(socket, fs, ctx, "sending the final status");
  } else {
    boost::system::error_code ec;  // best effort: we refuse anyway
    co_await asio::async_write(socket, asio::buffer(fs), asio::redirect_error(asio::use_awaitable, ec));
  }
  co_return ok;
}

}  // namespace detail

/// Client side. Sends HELLO, checks the server's REPLY (and its proof when a token is set),
/// answers with its own proof and waits for FINAL. Throws HandshakeRefused (invalid_argument for
/// a token or kind mismatch, peer_failure otherwise) when either side refuses, Error(peer_failure)
/// when the connection breaks. `token` must stay valid until the awaitable completes. No time
/// bound of its own: run it under run_with_deadline or a SocketWatchdog.
inline detail::asio::awaitable<void> handshake_connect(detail::asio_tcp::socket& socket, Hello mine,
                                                       std::string_view token) {
  using namespace detail;
  const ErrorContext ctx{mine.rank, mine.peer, "handshake (" + kind_name(mine.kind) + ") with " + endpoint_text(socket)};
  const bool have_token = !token.empty();
  std::array<std::uint8_t, 16> cc{};
  random_bytes(cc);
  const auto hello = encode_hello(mine, have_token ? kFlagToken : 0, cc);
  co_await write_all(socket, hello, ctx, "sending hello");

  std::array<std::uint8_t, kReplyBytes> reply{};
  co_await read_exact(socket, reply, ctx, "reading the reply (the server closed the connection?)");
  const ReplyInfo info = check_reply(reply, ctx);
  const bool server_token = info.server_token;
  const std::array<std::uint8_t, 16>& sc = info.challenge;

  // Decide before proving anything: a client that refuses sends a zero proof, so a server that
  // lacks the token learns nothing it could reuse.
  std::string refusal;
  if (server_token != have_token) {
    refusal = have_token ? "the server has no job token but this process has one (CHORUS_JOB_TOKEN)"
                         : "the server requires a job token but this process has none (set CHORUS_JOB_TOKEN)";
  } else if (have_token) {
    const auto expected = handshake_proof(token, "chorus-srv", cc, sc, hello);
    if (!constant_time_equal(expected, std::span<const std::uint8_t>(reply.data() + 24, 32)))
      refusal = "the server's proof is wrong: job token mismatch (CHORUS_JOB_TOKEN must be equal on every rank)";
  }
  std::array<std::uint8_t, kProofBytes> proof{};
  if (refusal.empty() && have_token) proof = handshake_proof(token, "chorus-cli", sc, cc, hello);
  co_await write_all(socket, proof, ctx, "sending proof");
  if (!refusal.empty()) throw HandshakeRefused(ErrorCode::invalid_argument, ctx, refusal, HandshakeStatus::auth_failed);

  std::array<std::uint8_t, 1> final_status{};
  co_await read_exact(socket, final_status, ctx, "reading the final status");
  check_final(final_status[0], ctx);
}

/// Server side. Reads HELLO; refuses (sends a non-zero status, then throws HandshakeRefused) on
/// wrong magic/version/kind, a token flag that differs from ours, accept_hello returning false,
/// or a wrong client proof. Returns the client's Hello on success. `token` must stay valid until
/// the awaitable completes. Bound it with a SocketWatchdog: a silent client would wait forever.
inline detail::asio::awaitable<Hello> handshake_accept(detail::asio_tcp::socket& socket, std::uint8_t expected_kind,
                                                       std::string_view token,
                                                       std::function<bool(const Hello&)> accept_hello) {
  using namespace detail;
  ErrorContext ctx{-1, -1, "handshake (" + kind_name(expected_kind) + ") from " + endpoint_text(socket)};
  const bool have_token = !token.empty();

  std::array<std::uint8_t, kHelloBytes> hello{};
  Hello theirs;
  // Magic first, so a stray that sends a few bytes of something else is refused at once.
  HandshakeStatus refusal = HandshakeStatus::ok;
  std::string why;
  co_await read_exact(socket, std::span(hello.data(), 4), ctx, "reading hello");
  if (std::memcmp(hello.data(), kHandshakeMagic.data(), 4) != 0) {
    refusal = HandshakeStatus::bad_protocol;
    why = "bad magic (not a chorus client)";
  } else {
    co_await read_exact(socket, std::span(hello.data() + 4, kHelloBytes - 4), ctx, "reading hello");
    HelloVerdict v = check_hello(hello, expected_kind, have_token);
    theirs = v.hello;
    ctx.rank = theirs.peer;
    ctx.peer = theirs.rank;
    refusal = v.refusal;
    why = std::move(v.why);
    if (refusal == HandshakeStatus::ok && accept_hello && !accept_hello(theirs)) {
      refusal = HandshakeStatus::rejected;
      why = "hello not accepted (job nonce, rank " + std::to_string(theirs.rank) + ", world " +
            std::to_string(theirs.world) + ")";
    }
  }
  if (refusal != HandshakeStatus::ok) {
    co_await send_refusal(socket, refusal, have_token);
    throw HandshakeRefused(refusal_code(refusal), ctx, "refused: " + why, refusal);
  }

  std::array<std::uint8_t, 16> cc{};
  std::memcpy(cc.data(), hello.data() + 8, 16);
  std::array<std::uint8_t, 16> sc{};
  random_bytes(sc);
  std::array<std::uint8_t, kReplyBytes> reply{};
  std::memcpy(reply.data(), kHandshakeMagic.data(), 4);
  put_u16(reply.data() + 4, kHandshakeVersion);
  reply[6] = static_cast<std::uint8_t>(HandshakeStatus::ok);
  reply[7] = have_token ? kFlagToken : 0;
  std::memcpy(reply.data() + 8, sc.data(), 16);
  if (have_token) {
    const auto p = handshake_proof(token, "chorus-srv", cc, sc, hello);
    std::memcpy(reply.data() + 24, p.data(), p.size());
  }
  co_await write_all(socket, reply, ctx, "sending reply");

  if (!co_await check_client_proof(socket, token, sc, cc, hello, ctx))
    throw HandshakeRefused(ErrorCode::invalid_argument, ctx, "refused: the client's proof is wrong (job token mismatch)",
                           HandshakeStatus::auth_failed);
  co_return theirs;
}
}  // namespace chorus
