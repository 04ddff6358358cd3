// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// Logging to stderr, controlled by CHORUS_DEBUG=WARN|INFO|TRACE (default: WARN).
/// Each line: "[chorus host:pid rank R] LEVEL message".

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <mutex>
#include <sstream>
#include <string>
#include <string_view>

#include "chorus/detail/env.hpp"

namespace chorus::detail {

enum class LogLevel { warn = 0, info = 1, trace = 2 };

inline LogLevel parse_log_level(std::string_view v) {
  if (v == "WARN" || v == "warn") return LogLevel::warn;
  if (v == "INFO" || v == "info") return LogLevel::info;
  if (v == "TRACE" || v == "trace") return LogLevel::trace;
  throw Error(ErrorCode::invalid_argument,
              "CHORUS_DEBUG='" + std::string(v) + "' is not one of WARN, INFO, TRACE");
}

/// The level in force, read once from CHORUS_DEBUG.
inline LogLevel log_level() {
  static const LogLevel level = [] {
    auto v = env_string("CHORUS_DEBUG");
    return v ? parse_log_level(*v) : LogLevel::warn;
  }();
  return level;
}

inline bool log_enabled(LogLevel l) { return static_cast<int>(l) <= static_cast<int>(log_level()); }

inline const std::string& log_host() {
  static const std::string host = [] {
    char buf[256] = {};
    if (::gethostname(buf, sizeof(buf) - 1) != 0) return std::string("?");
    return std::string(buf);
  }();
  return host;
}

/// Writes one line; the whole line goes out in one write so lines from threads do not interleave.
inline void log_line(LogLevel l, int rank, std::string_view msg) {
  if (!log_enabled(l)) return;
  static constexpr const char* kNames[] = {"WARN", "INFO", "TRACE"};
  std::ostringstream os;
  os << "[chorus " << log_host() << ':' << ::getpid();
  if (rank >= 0) os << " rank " << rank;
  os << "] " << kNames[static_cast<int>(l)] << ' ' << msg << '\n';
  const std::string s = os.str();
  std::fwrite(s.data(), 1, s.size(), stderr);
}

/// log(LogLevel::info, rank, "opened ", n, " links"): builds the message only when enabled.
template <class... Args>
void log(LogLevel l, int rank, const Args&... args) {
  if (!log_enabled(l)) return;
  std::ostringstream os;
  (os << ... << args);
  log_line(l, rank, os.str());
}

}  // namespace chorus::detail
