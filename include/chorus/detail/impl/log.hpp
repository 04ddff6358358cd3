// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// The bodies of detail/log.hpp (CHORUS_DECL, config.hpp): included by that header in a
/// header-only program, and by chorus/impl/bodies.hpp alone with CHORUS_SEPARATE_COMPILATION.

#include <unistd.h>

#include <sstream>
#include <string_view>

#include "chorus/detail/log.hpp"

namespace chorus::detail {

CHORUS_DECL Logger& Logger::instance() {
  static Logger* const logger = new Logger(log_config_from_env());
  return *logger;
}

CHORUS_DECL void log_line(LogLevel l, LogSubsys s, int rank, std::string_view msg, bool tagged) {
  if (!log_enabled(l, s)) return;
  static constexpr const char* kNames[] = {"WARN", "INFO", "TRACE"};
  std::ostringstream os;
  os << "[chorus " << log_host() << ':' << ::getpid();
  if (rank >= 0) os << " rank " << rank;
  os << "] " << kNames[static_cast<int>(l)] << ' ';
  if (tagged) os << log_subsys_name(s) << ' ';
  os << msg << '\n';
  Logger::instance().write(os.str());
}

}  // namespace chorus::detail
