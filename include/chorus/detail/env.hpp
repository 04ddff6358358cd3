// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// Environment parsing. A variable that is set but does not parse is an invalid_argument error
/// naming the variable and the value; it is never silently ignored.

#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "chorus/core/error.hpp"

namespace chorus::detail {

/// The variable's value, or nullopt when unset. An empty value counts as unset.
inline std::optional<std::string> env_string(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

/// Parses a whole decimal integer in [lo, hi]; throws invalid_argument naming `what` otherwise.
inline std::int64_t parse_int(std::string_view text, std::string_view what, std::int64_t lo, std::int64_t hi) {
  std::int64_t v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || p != text.data() + text.size() || v < lo || v > hi) {
    throw Error(ErrorCode::invalid_argument, std::string(what) + "='" + std::string(text) +
                                                 "' is not an integer in [" + std::to_string(lo) + ", " +
                                                 std::to_string(hi) + "]");
  }
  return v;
}

inline std::optional<std::int64_t> env_int(const char* name, std::int64_t lo, std::int64_t hi) {
  auto s = env_string(name);
  if (!s) return std::nullopt;
  return parse_int(*s, name, lo, hi);
}

/// Byte counts accept K, M, G suffixes (powers of 1024): "64K", "4M".
inline std::uint64_t parse_bytes(std::string_view text, std::string_view what) {
  std::uint64_t mult = 1;
  std::string_view num = text;
  if (!num.empty()) {
    switch (num.back()) {
      case 'K': case 'k': mult = 1ull << 10; break;
      case 'M': case 'm': mult = 1ull << 20; break;
      case 'G': case 'g': mult = 1ull << 30; break;
      default: break;
    }
    if (mult != 1) num.remove_suffix(1);
  }
  auto v = parse_int(num, what, 0, std::int64_t(1) << 50);
  return static_cast<std::uint64_t>(v) * mult;
}

/// The entries of a comma-separated list ("rdma, shm" gives rdma and shm): spaces around an entry
/// are dropped, and so are empty entries.
inline std::vector<std::string> split_list(std::string_view text) {
  std::vector<std::string> out;
  while (true) {
    const auto comma = text.find(',');
    std::string_view e = text.substr(0, comma);
    while (!e.empty() && e.front() == ' ') e.remove_prefix(1);
    while (!e.empty() && e.back() == ' ') e.remove_suffix(1);
    if (!e.empty()) out.emplace_back(e);
    if (comma == std::string_view::npos) return out;
    text.remove_prefix(comma + 1);
  }
}

/// Seconds as a decimal number ("300", "0.5"), strictly positive.
inline std::chrono::milliseconds parse_seconds(std::string_view text, std::string_view what) {
  std::string s(text);
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size() || errno != 0 || !(v > 0) || v > 1e9) {
    throw Error(ErrorCode::invalid_argument,
                std::string(what) + "='" + s + "' is not a positive number of seconds");
  }
  return std::chrono::milliseconds(static_cast<std::int64_t>(v * 1000.0 + 0.5));
}

}  // namespace chorus::detail
