// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// The TcpStore's frames: encoding what the client sends and the server answers, and decoding,
/// with every field checked, what either side reads from the network. No sockets here:
/// fuzz/fuzz_store_request.cpp and fuzz/fuzz_store_response.cpp drive the decoders alone.
///
/// Requests (client -> server), integers little-endian:
///   header 21 bytes: op (u8: 1 set, 2 get, 3 wait, 4 add, 5 check), nkeys (u32),
///                    arg (u64: timeout in ms for get/wait, delta as i64 for add, else 0),
///                    vlen (u64: value bytes, set only)
///   then nkeys times: klen (u32), key bytes; then vlen value bytes.
///   Limits: key <= 4 KiB, value <= 64 MiB, nkeys 1 (set, get, add) or <= 65536 (wait, check).
/// Responses (server -> client): status (u8: 0 ok, 1 timeout, 2 bad request), len (u64), payload:
///   get: the value; add: the new value (i64); check: 1 byte (0/1); errors: a message.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "chorus/core/error.hpp"
#include "chorus/detail/handshake/wire.hpp"

namespace chorus::detail {

inline constexpr std::size_t kStoreMaxKeyBytes = 4096;
inline constexpr std::size_t kStoreMaxValueBytes = std::size_t(64) << 20;
inline constexpr std::size_t kStoreMaxKeys = std::size_t(1) << 16;
inline constexpr std::size_t kStoreRequestHeader = 21;
inline constexpr std::size_t kStoreResponseHeader = 9;
inline constexpr std::uint64_t kStoreMaxWaitMs = std::uint64_t(30) * 24 * 3600 * 1000;

enum class StoreOp : std::uint8_t { set = 1, get = 2, wait = 3, add = 4, check = 5 };
enum class StoreStatus : std::uint8_t { ok = 0, timeout = 1, bad_request = 2 };

inline const char* store_op_name(StoreOp op) {
  switch (op) {
    case StoreOp::set: return "set";
    case StoreOp::get: return "get";
    case StoreOp::wait: return "wait";
    case StoreOp::add: return "add";
    case StoreOp::check: return "check";
  }
  return "?";
}

/// Keys joined for messages: "a, b, c" (at most 10 named).
inline std::string join_keys(const std::vector<std::string>& keys) {
  std::string s;
  std::size_t n = 0;
  for (const auto& k : keys) {
    if (n == 10) return s + ", ... (" + std::to_string(keys.size()) + " keys)";
    if (n++) s += ", ";
    s += "'" + k + "'";
  }
  return s;
}

inline void check_store_key(const std::string& key, const ErrorContext& ctx) {
  if (key.size() > kStoreMaxKeyBytes)
    throw Error(ErrorCode::invalid_argument, ctx,
                "key of " + std::to_string(key.size()) + " bytes; the limit is " + std::to_string(kStoreMaxKeyBytes));
}

inline std::vector<std::uint8_t> encode_store_request(StoreOp op, const std::vector<std::string>& keys, std::uint64_t arg,
                                                      const std::string& value) {
  std::size_t total = kStoreRequestHeader + value.size();
  for (const auto& k : keys) total += 4 + k.size();
  std::vector<std::uint8_t> b(total);
  b[0] = static_cast<std::uint8_t>(op);
  put_u32(b.data() + 1, static_cast<std::uint32_t>(keys.size()));
  put_u64(b.data() + 5, arg);
  put_u64(b.data() + 13, value.size());
  std::size_t off = kStoreRequestHeader;
  for (const auto& k : keys) {
    put_u32(b.data() + off, static_cast<std::uint32_t>(k.size()));
    std::memcpy(b.data() + off + 4, k.data(), k.size());
    off += 4 + k.size();
  }
  if (!value.empty()) std::memcpy(b.data() + off, value.data(), value.size());
  return b;
}

// ---- Decoding what the network sends. Everything below checks every field before using it and
// reports a malformed frame as a chorus::Error (the connection is then dropped: after a bad length
// the stream cannot be resynchronised). The server and the client read frames piece by piece
// from their sockets with these functions; decode_store_request reads a whole frame from memory
// with the same ones (for tests and fuzz/fuzz_store_request.cpp).

/// The fixed part of a request: what follows it is nkeys times (klen, key), then vlen value bytes.
struct StoreRequestHeader {
  StoreOp op{};
  std::uint32_t nkeys = 0;
  std::uint64_t arg = 0;
  std::uint64_t vlen = 0;
};

/// A whole request, as the server executes it.
struct StoreRequest {
  StoreOp op{};
  std::uint64_t arg = 0;
  std::vector<std::string> keys;
  std::string value;
  friend bool operator==(const StoreRequest&, const StoreRequest&) = default;
};

/// Checks a request header from a client: a known op, the key count and value length it allows.
inline StoreRequestHeader decode_store_request_header(std::span<const std::uint8_t, kStoreRequestHeader> b) {
  const std::uint8_t op = b[0];
  if (op < 1 || op > 5) throw Error(ErrorCode::invalid_argument, "unknown request type " + std::to_string(op));
  StoreRequestHeader h;
  h.op = static_cast<StoreOp>(op);
  h.nkeys = get_u32(b.data() + 1);
  h.arg = get_u64(b.data() + 5);
  h.vlen = get_u64(b.data() + 13);
  const bool multi = h.op == StoreOp::wait || h.op == StoreOp::check;
  if (multi ? h.nkeys > kStoreMaxKeys : h.nkeys != 1)
    throw Error(ErrorCode::invalid_argument,
                "bad key count " + std::to_string(h.nkeys) + " for " + store_op_name(h.op));
  if (h.vlen > kStoreMaxValueBytes || (h.op != StoreOp::set && h.vlen != 0))
    throw Error(ErrorCode::invalid_argument, "bad value length " + std::to_string(h.vlen));
  return h;
}

/// Checks the length that precedes each key of a request.
inline std::uint32_t decode_store_key_length(std::span<const std::uint8_t, 4> b) {
  const std::uint32_t klen = get_u32(b.data());
  if (klen > kStoreMaxKeyBytes)
    throw Error(ErrorCode::invalid_argument, "key length " + std::to_string(klen) + " over the limit");
  return klen;
}

/// A whole request frame in memory; throws when it is malformed, cut short or followed by more.
inline StoreRequest decode_store_request(std::span<const std::uint8_t> frame) {
  std::size_t off = 0;
  auto take = [&](std::size_t n) {
    if (frame.size() - off < n) throw Error(ErrorCode::invalid_argument, "request cut short");
    const auto piece = frame.subspan(off, n);
    off += n;
    return piece;
  };
  const auto h = decode_store_request_header(take(kStoreRequestHeader).first<kStoreRequestHeader>());
  StoreRequest req{h.op, h.arg, {}, {}};
  for (std::uint32_t i = 0; i < h.nkeys; ++i) {
    const auto key = take(decode_store_key_length(take(4).first<4>()));
    req.keys.emplace_back(key.begin(), key.end());
  }
  const auto value = take(h.vlen);
  req.value.assign(value.begin(), value.end());
  if (off != frame.size()) throw Error(ErrorCode::invalid_argument, "bytes after the end of the request");
  return req;
}

/// A reply: status (u8), payload length (u64), payload.
inline std::vector<std::uint8_t> encode_store_response(StoreStatus status, const std::string& payload) {
  std::vector<std::uint8_t> out(kStoreResponseHeader + payload.size());
  out[0] = static_cast<std::uint8_t>(status);
  put_u64(out.data() + 1, payload.size());
  if (!payload.empty()) std::memcpy(out.data() + kStoreResponseHeader, payload.data(), payload.size());
  return out;
}

/// The fixed part of a reply.
struct StoreResponseHeader {
  StoreStatus status = StoreStatus::ok;
  std::uint64_t len = 0;  ///< payload bytes that follow
};

/// Checks a reply header from the server: a known status, a payload no longer than any reply.
inline StoreResponseHeader decode_store_response_header(std::span<const std::uint8_t, kStoreResponseHeader> b,
                                                        const ErrorContext& ctx) {
  if (b[0] > 2) throw Error(ErrorCode::peer_failure, ctx, "malformed response from the store");
  StoreResponseHeader h{static_cast<StoreStatus>(b[0]), get_u64(b.data() + 1)};
  if (h.len > kStoreMaxValueBytes + 65536) throw Error(ErrorCode::peer_failure, ctx, "oversized response from the store");
  return h;
}

/// The payload of an ok reply to add: the new value.
inline std::int64_t decode_store_add_reply(const std::string& payload, const ErrorContext& ctx) {
  if (payload.size() != 8) throw Error(ErrorCode::peer_failure, ctx, "malformed add response");
  return static_cast<std::int64_t>(get_u64(reinterpret_cast<const std::uint8_t*>(payload.data())));
}

/// The payload of an ok reply to check: whether every key is set.
inline bool decode_store_check_reply(const std::string& payload, const ErrorContext& ctx) {
  if (payload.size() != 1) throw Error(ErrorCode::peer_failure, ctx, "malformed check response");
  return payload[0] != 0;
}

}  // namespace chorus::detail
