// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// The little cryptography chorus needs, all from OpenSSL's libcrypto (link with -lcrypto):
/// random bytes for nonces and challenges, HMAC-SHA256 for the handshake's challenge-response,
/// and a constant-time comparison for MACs. Nothing here is hand-rolled.

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "chorus/core/error.hpp"

namespace chorus::detail {

using Sha256Digest = std::array<std::uint8_t, 32>;

/// The last OpenSSL error as text (empty when the queue is empty); clears the queue.
inline std::string openssl_error_text() {
  std::string out;
  while (unsigned long e = ERR_get_error()) {
    char buf[256] = {};
    ERR_error_string_n(e, buf, sizeof(buf));
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out.empty() ? std::string("unknown OpenSSL error") : out;
}

/// Initialises libcrypto in the calling thread, which registers OpenSSL's exit handler now. An
/// object with static storage made after this call (a kept TcpStore whose server thread draws
/// random bytes) is then destroyed before OpenSSL cleans up at exit, so its thread's random
/// generator is freed when that thread ends. (The flag must not be 0: OPENSSL_init_crypto(0, ...)
/// returns at once, and OpenSSL would register its handler later, from the server's thread, and
/// clean up first.)
inline void openssl_init() {
  if (OPENSSL_init_crypto(OPENSSL_INIT_LOAD_CRYPTO_STRINGS, nullptr) != 1)
    throw Error(ErrorCode::system, "OPENSSL_init_crypto failed: " + openssl_error_text());
}

/// Fills `out` from OpenSSL's CSPRNG. Throws system when the generator fails (never returns
/// predictable bytes).
inline void random_bytes(std::span<std::uint8_t> out) {
  std::size_t done = 0;
  while (done < out.size()) {
    const std::size_t n = std::min<std::size_t>(out.size() - done, INT_MAX);
    if (RAND_bytes(out.data() + done, static_cast<int>(n)) != 1)
      throw Error(ErrorCode::system, "RAND_bytes failed: " + openssl_error_text());
    done += n;
  }
}

/// HMAC-SHA256(key, data). The key may be empty (HMAC then uses an all-zero block) but chorus
/// only calls this with a non-empty job token.
inline Sha256Digest hmac_sha256(std::span<const std::uint8_t> key, std::span<const std::uint8_t> data) {
  if (key.size() > static_cast<std::size_t>(INT_MAX))
    throw Error(ErrorCode::invalid_argument, "hmac_sha256: key too long");
  Sha256Digest out{};
  unsigned int len = 0;
  static constexpr std::uint8_t kEmpty = 0;
  const std::uint8_t* d = data.empty() ? &kEmpty : data.data();
  const void* k = key.empty() ? static_cast<const void*>(&kEmpty) : key.data();
  if (HMAC(EVP_sha256(), k, static_cast<int>(key.size()), d, data.size(), out.data(), &len) == nullptr ||
      len != out.size())
    throw Error(ErrorCode::system, "HMAC-SHA256 failed: " + openssl_error_text());
  return out;
}

inline Sha256Digest hmac_sha256(std::string_view key, std::span<const std::uint8_t> data) {
  return hmac_sha256(std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(key.data()), key.size()),
                     data);
}

/// True when a and b hold the same bytes; the time taken depends only on the sizes, never on
/// where the contents differ (use it for MACs).
inline bool constant_time_equal(std::span<const std::uint8_t> a, std::span<const std::uint8_t> b) {
  if (a.size() != b.size()) return false;
  if (a.empty()) return true;
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace chorus::detail
