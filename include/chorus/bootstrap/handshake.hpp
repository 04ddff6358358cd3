#pragma once
/// The handshake that opens every chorus connection (store connections and transport links),
/// as Asio C++20 coroutines, plus two helpers for using coroutines with a bound:
/// run_with_deadline() (a blocking caller drives its own io_context up to a deadline) and
/// SocketWatchdog (a server closes a connection whose handshake or frame does not finish in time).
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
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "chorus/core/error.hpp"
#include "chorus/detail/asio.hpp"
#include "chorus/detail/crypto.hpp"
#include "chorus/detail/log.hpp"

namespace chorus {

/// The job's random nonce (also declared, identically, in bootstrap/rendezvous.hpp; a C++ alias
/// may be redeclared to the same type, so either header can come first).
using JobNonce = std::array<std::uint8_t, 16>;

/// Connection kinds carried in HELLO.
inline constexpr std::uint8_t kHandshakeStore = 1;
inline constexpr std::uint8_t kHandshakeLink = 2;

/// What the client says about itself in HELLO.
struct Hello {
  std::uint8_t kind = 0;
  JobNonce nonce{};
  std::int32_t rank = -1, peer = -1, world = -1;
  friend bool operator==(const Hello&, const Hello&) = default;
};

/// REPLY/FINAL status byte.
enum class HandshakeStatus : std::uint8_t {
  ok = 0,
  bad_protocol = 1,  ///< wrong magic or version
  wrong_kind = 2,    ///< e.g. a link connected to a store port
  rejected = 3,      ///< accept_hello said no: other job's nonce, unexpected rank or world size
  auth_failed = 4,   ///< job token mismatch (one side has none, or proofs differ)
};

/// Thrown by both sides when the handshake completed its exchange and one side refused.
/// Connecting again will not help (a caller that retries on peer_failure should stop here).
class HandshakeRefused : public Error {
 public:
  HandshakeRefused(ErrorCode code, const ErrorContext& ctx, const std::string& msg, HandshakeStatus s)
      : Error(code, ctx, msg), status_(s) {}
  HandshakeStatus status() const noexcept { return status_; }

 private:
  HandshakeStatus status_;
};

namespace detail {

inline constexpr std::array<std::uint8_t, 4> kHandshakeMagic = {'C', 'H', 'R', 'S'};
inline constexpr std::uint16_t kHandshakeVersion = 1;
inline constexpr std::size_t kHelloBytes = 52;
inline constexpr std::size_t kReplyBytes = 56;
inline constexpr std::size_t kProofBytes = 32;
inline constexpr std::uint8_t kFlagToken = 1;

inline void put_u16(std::uint8_t* p, std::uint16_t v) {
  p[0] = static_cast<std::uint8_t>(v);
  p[1] = static_cast<std::uint8_t>(v >> 8);
}
inline void put_u32(std::uint8_t* p, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::uint8_t>(v >> (8 * i));
}
inline void put_u64(std::uint8_t* p, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<std::uint8_t>(v >> (8 * i));
}
inline std::uint16_t get_u16(const std::uint8_t* p) {
  return static_cast<std::uint16_t>(p[0] | (static_cast<std::uint16_t>(p[1]) << 8));
}
inline std::uint32_t get_u32(const std::uint8_t* p) {
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<std::uint32_t>(p[i]) << (8 * i);
  return v;
}
inline std::uint64_t get_u64(const std::uint8_t* p) {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<std::uint64_t>(p[i]) << (8 * i);
  return v;
}

inline std::string_view to_string(HandshakeStatus s) {
  switch (s) {
    case HandshakeStatus::ok: return "ok";
    case HandshakeStatus::bad_protocol: return "not a chorus peer or another protocol version";
    case HandshakeStatus::wrong_kind: return "wrong connection kind (store vs link)";
    case HandshakeStatus::rejected: return "rejected (another job's nonce, or an unexpected rank or world size)";
    case HandshakeStatus::auth_failed:
      return "job token mismatch (CHORUS_JOB_TOKEN must be set, to the same value, on every rank)";
  }
  return "unknown status";
}

inline std::string kind_name(std::uint8_t kind) {
  if (kind == kHandshakeStore) return "store";
  if (kind == kHandshakeLink) return "link";
  return "kind " + std::to_string(kind);
}

inline std::array<std::uint8_t, kHelloBytes> encode_hello(const Hello& h, std::uint8_t flags,
                                                          const std::array<std::uint8_t, 16>& challenge) {
  std::array<std::uint8_t, kHelloBytes> b{};
  std::memcpy(b.data(), kHandshakeMagic.data(), 4);
  put_u16(b.data() + 4, kHandshakeVersion);
  b[6] = h.kind;
  b[7] = flags;
  std::memcpy(b.data() + 8, challenge.data(), 16);
  std::memcpy(b.data() + 24, h.nonce.data(), 16);
  put_u32(b.data() + 40, static_cast<std::uint32_t>(h.rank));
  put_u32(b.data() + 44, static_cast<std::uint32_t>(h.peer));
  put_u32(b.data() + 48, static_cast<std::uint32_t>(h.world));
  return b;
}

inline Hello decode_hello(const std::array<std::uint8_t, kHelloBytes>& b) {
  Hello h;
  h.kind = b[6];
  std::memcpy(h.nonce.data(), b.data() + 24, 16);
  h.rank = static_cast<std::int32_t>(get_u32(b.data() + 40));
  h.peer = static_cast<std::int32_t>(get_u32(b.data() + 44));
  h.world = static_cast<std::int32_t>(get_u32(b.data() + 48));
  return h;
}

inline ErrorCode refusal_code(HandshakeStatus s) {
  return (s == HandshakeStatus::auth_failed || s == HandshakeStatus::wrong_kind) ? ErrorCode::invalid_argument
                                                                                 : ErrorCode::peer_failure;
}

/// What a server makes of a client's HELLO, before its accept_hello callback is asked.
struct HelloVerdict {
  Hello hello;                                   ///< the fields, as decoded (also when refused)
  HandshakeStatus refusal = HandshakeStatus::ok;  ///< ok: go on with the handshake
  std::string why;                               ///< what is wrong, when refused
};

/// Checks a HELLO from the network (magic, version, kind, token flag), no callback involved.
inline HelloVerdict check_hello(const std::array<std::uint8_t, kHelloBytes>& b, std::uint8_t expected_kind,
                                bool have_token) {
  HelloVerdict v;
  if (std::memcmp(b.data(), kHandshakeMagic.data(), 4) != 0) {
    v.refusal = HandshakeStatus::bad_protocol;
    v.why = "bad magic (not a chorus client)";
    return v;
  }
  v.hello = decode_hello(b);
  const bool client_token = (b[7] & kFlagToken) != 0;
  if (get_u16(b.data() + 4) != kHandshakeVersion) {
    v.refusal = HandshakeStatus::bad_protocol;
    v.why = "protocol version " + std::to_string(get_u16(b.data() + 4)) + ", expected 1";
  } else if (v.hello.kind != expected_kind) {
    v.refusal = HandshakeStatus::wrong_kind;
    v.why = "a " + kind_name(v.hello.kind) + " connection on a " + kind_name(expected_kind) + " endpoint";
  } else if (client_token != have_token) {
    v.refusal = HandshakeStatus::auth_failed;
    v.why = have_token ? "the client has no job token but this endpoint requires one"
                       : "the client has a job token but this endpoint has none";
  }
  return v;
}

/// What a client takes from a REPLY that said ok.
struct ReplyInfo {
  bool server_token = false;
  std::array<std::uint8_t, 16> challenge{};  ///< the server's challenge sc
};

/// Checks a REPLY from the network: throws HandshakeRefused for another protocol or a refusal.
inline ReplyInfo check_reply(const std::array<std::uint8_t, kReplyBytes>& reply, const ErrorContext& ctx) {
  if (std::memcmp(reply.data(), kHandshakeMagic.data(), 4) != 0 || get_u16(reply.data() + 4) != kHandshakeVersion)
    throw HandshakeRefused(ErrorCode::peer_failure, ctx, "the server is not a chorus endpoint of protocol version 1",
                           HandshakeStatus::bad_protocol);
  const auto status = static_cast<HandshakeStatus>(reply[6]);
  if (status != HandshakeStatus::ok)
    throw HandshakeRefused(refusal_code(status), ctx, "refused by the server: " + std::string(to_string(status)),
                           status);
  ReplyInfo r;
  r.server_token = (reply[7] & kFlagToken) != 0;
  std::memcpy(r.challenge.data(), reply.data() + 8, 16);
  return r;
}

/// Checks the FINAL status byte: throws HandshakeRefused unless it is ok.
inline void check_final(std::uint8_t final_status, const ErrorContext& ctx) {
  const auto fs = static_cast<HandshakeStatus>(final_status);
  if (fs != HandshakeStatus::ok)
    throw HandshakeRefused(refusal_code(fs), ctx, "refused by the server: " + std::string(to_string(fs)), fs);
}

/// HMAC(token, label || first || second || hello).
inline Sha256Digest handshake_proof(std::string_view token, std::string_view label,
                                    const std::array<std::uint8_t, 16>& first,
                                    const std::array<std::uint8_t, 16>& second,
                                    const std::array<std::uint8_t, kHelloBytes>& hello) {
  std::vector<std::uint8_t> msg;
  msg.reserve(label.size() + 32 + kHelloBytes);
  msg.insert(msg.end(), label.begin(), label.end());
  msg.insert(msg.end(), first.begin(), first.end());
  msg.insert(msg.end(), second.begin(), second.end());
  msg.insert(msg.end(), hello.begin(), hello.end());
  return hmac_sha256(token, msg);
}

/// async_read of exactly buf.size() bytes; a short read or error is peer_failure naming `what`.
inline asio::awaitable<void> read_exact(asio_tcp::socket& s, std::span<std::uint8_t> buf, ErrorContext ctx,
                                        std::string what) {
  boost::system::error_code ec;
  co_await asio::async_read(s, asio::buffer(buf.data(), buf.size()), asio::redirect_error(asio::use_awaitable, ec));
  if (ec) throw Error(ErrorCode::peer_failure, ctx, what + ": " + ec.message());
}

inline asio::awaitable<void> write_all(asio_tcp::socket& s, std::span<const std::uint8_t> buf, ErrorContext ctx,
                                       std::string what) {
  boost::system::error_code ec;
  co_await asio::async_write(s, asio::buffer(buf.data(), buf.size()), asio::redirect_error(asio::use_awaitable, ec));
  if (ec) throw Error(ErrorCode::peer_failure, ctx, what + ": " + ec.message());
}

inline std::string endpoint_text(const asio_tcp::socket& s) {
  boost::system::error_code ec;
  auto ep = s.remote_endpoint(ec);
  if (ec) return "?";
  std::string a = ep.address().to_string();
  if (ep.address().is_v6()) a = "[" + a + "]";
  return a + ":" + std::to_string(ep.port());
}

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

namespace detail {

/// Closes a socket unless disarmed (destroyed) within `after`. For servers: arm one around each
/// per-connection handshake (and around reading each frame) so a silent client cannot hold a
/// slot forever. Runs on the socket's executor; the io_context must be run by one thread (or the
/// watchdog and the socket's users must share a strand).
class SocketWatchdog {
 public:
  SocketWatchdog(asio_tcp::socket& socket, std::chrono::milliseconds after)
      : timer_(socket.get_executor()), state_(std::make_shared<State>()) {
    timer_.expires_after(after);
    timer_.async_wait([&socket, st = state_](const boost::system::error_code& ec) {
      if (ec || !st->armed) return;  // disarmed: the socket may already be gone, do not touch it
      st->fired = true;
      boost::system::error_code ignored;
      socket.close(ignored);
    });
  }
  SocketWatchdog(const SocketWatchdog&) = delete;
  SocketWatchdog& operator=(const SocketWatchdog&) = delete;
  ~SocketWatchdog() { disarm(); }

  void disarm() {
    state_->armed = false;
    timer_.cancel();
  }
  /// True when the watchdog closed the socket.
  bool fired() const { return state_->fired; }

 private:
  struct State {
    bool armed = true;
    bool fired = false;
  };
  asio::steady_timer timer_;
  std::shared_ptr<State> state_;
};

/// Runs `op` on `io` from a blocking caller until it completes or `deadline` passes, and returns
/// its result (or rethrows its exception). On expiry calls `on_expiry` (which must make the
/// operation finish: close the socket it uses), lets the operation unwind, then throws timeout
/// with `ctx` and `what`. The io_context must not be run by any other thread meanwhile.
template <class T>
T run_with_deadline(asio::io_context& io, asio::awaitable<T> op, std::chrono::steady_clock::time_point deadline,
                    const std::function<void()>& on_expiry, const ErrorContext& ctx, const std::string& what) {
  bool done = false;
  std::exception_ptr error;
  std::optional<std::conditional_t<std::is_void_v<T>, int, T>> result;
  io.restart();
  if constexpr (std::is_void_v<T>) {
    asio::co_spawn(io, std::move(op), [&](std::exception_ptr e) {
      error = e;
      done = true;
    });
  } else {
    asio::co_spawn(io, std::move(op), [&](std::exception_ptr e, T v) {
      error = e;
      if (!e) result.emplace(std::move(v));
      done = true;
    });
  }
  while (!done && std::chrono::steady_clock::now() < deadline) {
    io.run_one_until(deadline);
    if (io.stopped()) break;
  }
  bool expired = false;
  if (!done) {
    expired = true;
    if (on_expiry) on_expiry();
    // The operation must unwind before its frame's references go out of scope: closing its
    // socket makes every pending operation complete with operation_aborted at once.
    io.restart();
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!done && std::chrono::steady_clock::now() < give_up) {
      io.run_one_until(give_up);
      if (io.stopped()) break;
    }
    if (!done) {
      log(LogLevel::warn, ctx.rank, "run_with_deadline: ", what, ": operation did not unwind after expiry");
      io.stop();
    }
  }
  if (expired && (error || !done))
    throw Error(ErrorCode::timeout, ctx, what + ": did not complete in time");
  if (error) std::rethrow_exception(error);
  if constexpr (!std::is_void_v<T>) return std::move(*result);
}

}  // namespace detail
}  // namespace chorus
