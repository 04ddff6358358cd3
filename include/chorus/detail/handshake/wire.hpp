// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// The handshake's frames (HELLO, REPLY, PROOF, FINAL; their layout is at the top of
/// detail/handshake.hpp): the types both sides share, encoding, the checks each side applies to
/// bytes from the network, the HMAC proofs, and the little-endian byte helpers that the TcpStore
/// codec uses too. No sockets here: fuzz/fuzz_handshake.cpp drives these checks alone.

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "chorus/core/error.hpp"
#include "chorus/detail/crypto.hpp"

namespace chorus {

/// The job's random nonce: agreed at rendezvous (bootstrap/rendezvous.hpp), carried in every
/// handshake.
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

}  // namespace detail
}  // namespace chorus
