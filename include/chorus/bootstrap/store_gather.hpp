// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// store_all_gather: every rank's value, in rank order, through the store, in about 3n requests in
/// all where each rank reading every other's key would make n^2. Each rank sets "<key>/<rank>";
/// rank 0 reads the others' and sets "<key>/all", the list of all n (encode_strings); every other
/// rank reads that one key. Values are opaque bytes. A creation-time exchange (the host layout,
/// the standby addresses, the transports' host facts) is one call of it on every rank.
///
/// The store then serves O(n) requests for the exchange, and rank 0 makes n - 1 of them one after
/// another (a round trip each; 64 ranks over a TcpStore on this machine: a few milliseconds).

#include <chrono>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "chorus/bootstrap/store.hpp"
#include "chorus/core/error.hpp"

namespace chorus {
namespace detail {

/// A list of strings as one: each as its decimal length, a newline, then its bytes.
inline std::string encode_strings(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& s : items) {
    out += std::to_string(s.size());
    out += '\n';
    out += s;
  }
  return out;
}

/// encode_strings' inverse; mismatch naming `what` when `text` is not such a list of `count`.
inline std::vector<std::string> decode_strings(std::string_view text, std::size_t count,
                                               const std::string& what) {
  std::vector<std::string> out;
  out.reserve(count);
  std::size_t at = 0;
  while (at < text.size()) {
    const auto nl = text.find('\n', at);
    std::size_t len = 0;
    bool ok = nl != std::string_view::npos && nl > at && nl - at <= 12;
    for (std::size_t i = at; ok && i < nl; ++i) {
      ok = text[i] >= '0' && text[i] <= '9';
      len = len * 10 + static_cast<std::size_t>(text[i] - '0');
    }
    if (!ok || len > text.size() - nl - 1)
      throw Error(ErrorCode::mismatch,
                  what + ": a malformed list in the store (at byte " + std::to_string(at) + ")");
    out.emplace_back(text.substr(nl + 1, len));
    at = nl + 1 + len;
  }
  if (out.size() != count)
    throw Error(ErrorCode::mismatch, what + ": " + std::to_string(out.size()) +
                                         " values in the store where " + std::to_string(count) +
                                         " ranks take part (ranks disagree on the world size?)");
  return out;
}

}  // namespace detail

/// Every rank's `mine` by rank (see the top of this file); every rank of `size` must call it with
/// the same `key`. Waits at most `timeout` in all (a rank that never sets its value: the store's
/// timeout error, which names its key).
inline std::vector<std::string> store_all_gather(Store& store, const std::string& key, int rank, int size,
                                                 const std::string& mine, std::chrono::milliseconds timeout) {
  using Clock = std::chrono::steady_clock;
  const auto n = static_cast<std::size_t>(size);
  if (size <= 1) return {mine};
  const auto deadline = Clock::now() + timeout;
  auto left = [&] {
    return std::max(std::chrono::milliseconds(1),
                    std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
  };
  if (rank != 0) {
    store.set(key + "/" + std::to_string(rank), mine);
    return detail::decode_strings(store.get(key + "/all", left()), n, "store_all_gather '" + key + "'");
  }
  std::vector<std::string> all(n);
  all[0] = mine;
  for (int r = 1; r < size; ++r)
    all[static_cast<std::size_t>(r)] = store.get(key + "/" + std::to_string(r), left());
  store.set(key + "/all", detail::encode_strings(all));
  return all;
}

}  // namespace chorus
