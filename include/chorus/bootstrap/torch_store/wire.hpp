// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// The requests and replies of torch.distributed's TCPStore as torch 1.13 speaks them, for
/// chorus's client of that store (bootstrap/torch_store.hpp). No sockets here.
///
/// Requests (client -> server): a query type (u8), then its arguments. A string or byte value is
/// its length (u64) and its bytes; integers are in the host's byte order (little-endian on every
/// host torch supports, and written as such here). Torch's client puts "/" before every key
/// (its TCPStore's key prefix), and so does this one, so that both see the same keys.
///
/// | query           | type | arguments                          | reply                               |
/// |-----------------|------|------------------------------------|-------------------------------------|
/// | set             | 0    | key, value                         | none                                |
/// | compare_set     | 1    | key, expected, desired             | value (u64 length, bytes)           |
/// | get             | 2    | key                                | value; a missing key closes the connection |
/// | add             | 3    | key, delta (i64)                   | the new value (i64)                 |
/// | check           | 4    | n (u64), n keys                    | u8: 0 every key set, 1 not          |
/// | wait            | 5    | n (u64), n keys                    | u8 0 once every key is set          |
///
/// The server parks a wait until its keys are set and has no way to cancel it (torch 1.13; later
/// versions added one): a client that stops waiting must drop the connection. compare_set on a
/// missing key sets it only when `expected` is empty, and otherwise answers `expected` without
/// setting anything (torch's behaviour). Values are stored as bytes; add keeps a decimal number.
/// torch 1.13 opens a connection with no greeting: its first bytes are the first request.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "chorus/core/error.hpp"
#include "chorus/detail/handshake/wire.hpp"  // put_u64, get_u64

namespace chorus::detail {

enum class TorchQuery : std::uint8_t { set = 0, compare_set = 1, get = 2, add = 3, check = 4, wait = 5 };

/// The reply a request waits for (set has none: see TorchStore::set_within).
enum class TorchReply { byte, int64, bytes };

/// Values chorus sends or accepts (its own store's limit): a longer reply length is a stream
/// that is not torch's store.
inline constexpr std::size_t kTorchStoreMaxValueBytes = std::size_t(64) << 20;
/// Keys of one check or wait.
inline constexpr std::size_t kTorchStoreMaxKeys = std::size_t(1) << 16;
/// torch's TCPStore client puts this before every key (TCPStore::keyPrefix_).
inline constexpr std::string_view kTorchKeyPrefix = "/";

/// One request being built: the query type, then arguments appended in the order of the table.
class TorchRequest {
 public:
  explicit TorchRequest(TorchQuery q) { bytes_.push_back(static_cast<std::uint8_t>(q)); }

  TorchRequest& key(std::string_view k) {
    value(std::string(kTorchKeyPrefix) + std::string(k));
    return *this;
  }
  TorchRequest& keys(std::span<const std::string> ks) {
    u64(ks.size());
    for (const auto& k : ks) key(k);
    return *this;
  }
  TorchRequest& value(std::string_view v) {
    u64(v.size());
    bytes_.insert(bytes_.end(), v.begin(), v.end());
    return *this;
  }
  TorchRequest& i64(std::int64_t v) { return u64(static_cast<std::uint64_t>(v)); }
  TorchRequest& u64(std::uint64_t v) {
    const std::size_t at = bytes_.size();
    bytes_.resize(at + 8);
    put_u64(bytes_.data() + at, v);
    return *this;
  }
  /// Another request sent in the same write (set, then the check that confirms it).
  TorchRequest& then(const TorchRequest& next) {
    bytes_.insert(bytes_.end(), next.bytes_.begin(), next.bytes_.end());
    return *this;
  }

  const std::vector<std::uint8_t>& bytes() const { return bytes_; }

 private:
  std::vector<std::uint8_t> bytes_;
};

/// The length prefix of a value reply, checked against the limit.
inline std::size_t decode_torch_value_length(std::span<const std::uint8_t, 8> b, const ErrorContext& ctx) {
  const std::uint64_t n = get_u64(b.data());
  if (n > kTorchStoreMaxValueBytes)
    throw Error(ErrorCode::peer_failure, ctx,
                "the store answered with a value of " + std::to_string(n) +
                    " bytes (more than 64 MiB): is MASTER_ADDR:MASTER_PORT a torch TCPStore?");
  return static_cast<std::size_t>(n);
}

/// check's and wait's one-byte answers.
inline bool decode_torch_check_reply(std::uint8_t b, const ErrorContext& ctx) {
  if (b > 1)
    throw Error(ErrorCode::peer_failure, ctx,
                "the store answered a check with " + std::to_string(b) + " (0 or 1 expected): not a torch TCPStore?");
  return b == 0;
}
inline void decode_torch_wait_reply(std::uint8_t b, const ErrorContext& ctx) {
  if (b != 0)
    throw Error(ErrorCode::peer_failure, ctx,
                "the store answered a wait with " + std::to_string(b) + " (0 expected): not a torch TCPStore?");
}

}  // namespace chorus::detail
