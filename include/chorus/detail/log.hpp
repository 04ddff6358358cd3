// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// Logging, controlled by three variables, read once per process (docs/environment.md):
///   CHORUS_DEBUG=WARN|INFO|TRACE      the level (default WARN);
///   CHORUS_DEBUG_SUBSYS=INIT,COLL     which subsystems' INFO and TRACE lines print; `^` first
///                                     excludes the list instead (`^COLL`); default ALL. WARN
///                                     lines always print;
///   CHORUS_DEBUG_FILE=/tmp/c.%h.%p    lines go to this file (appended), %h the host name, %p the
///                                     pid, instead of stderr.
/// Each line: "[chorus host:pid rank R] LEVEL SUBSYS message" (no "rank R" before the rank is
/// known; no SUBSYS on lines logged without one, which count as MISC).
///
///   log(LogLevel::info, LogSubsys::coll, rank, "all_reduce: ring, slices of ", n, " bytes");

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>

#include "chorus/config.hpp"
#include "chorus/detail/env.hpp"

namespace chorus::detail {

enum class LogLevel { warn = 0, info = 1, trace = 2 };

/// What a line is about; CHORUS_DEBUG_SUBSYS selects by these names. One bit each.
enum class LogSubsys : std::uint32_t {
  init = 1u << 0,       ///< INIT: communicator creation and destruction
  bootstrap = 1u << 1,  ///< BOOTSTRAP: stores, rendezvous, launchers
  transport = 1u << 2,  ///< TRANSPORT: which transport each pair of ranks takes
  net = 1u << 3,        ///< NET: the tcp transport (alias TCP)
  shm = 1u << 4,        ///< SHM: the shm transport
  rdma = 1u << 5,       ///< RDMA: the rdma transport (alias IB)
  cuda_ipc = 1u << 6,   ///< CUDA_IPC: cuda_ipc and the IPC windows of the direct collectives (alias P2P)
  coll = 1u << 7,       ///< COLL: collective calls and the algorithm chosen
  alloc = 1u << 8,      ///< ALLOC: memory chorus holds (alias MEM)
  diag = 1u << 9,       ///< DIAG: flight recorder, hang diagnosis, failure notices
  misc = 1u << 10,      ///< MISC: lines logged without a subsystem
};

/// The names CHORUS_DEBUG_SUBSYS takes, one list: a name selects its mask. TRANSPORT is a group
/// (the choice of transport and every transport's own lines), ALL every subsystem; TCP, IB, P2P
/// and MEM are NCCL's names for NET, RDMA, CUDA_IPC and ALLOC.
struct LogSubsysName {
  std::string_view name;
  std::uint32_t mask;
};
inline constexpr std::uint32_t kLogAllSubsys = (static_cast<std::uint32_t>(LogSubsys::misc) << 1) - 1;
inline constexpr LogSubsysName kLogSubsysNames[] = {
    {"INIT", static_cast<std::uint32_t>(LogSubsys::init)},
    {"BOOTSTRAP", static_cast<std::uint32_t>(LogSubsys::bootstrap)},
    {"TRANSPORT", static_cast<std::uint32_t>(LogSubsys::transport) | static_cast<std::uint32_t>(LogSubsys::net) |
                      static_cast<std::uint32_t>(LogSubsys::shm) | static_cast<std::uint32_t>(LogSubsys::rdma) |
                      static_cast<std::uint32_t>(LogSubsys::cuda_ipc)},
    {"NET", static_cast<std::uint32_t>(LogSubsys::net)},
    {"SHM", static_cast<std::uint32_t>(LogSubsys::shm)},
    {"RDMA", static_cast<std::uint32_t>(LogSubsys::rdma)},
    {"CUDA_IPC", static_cast<std::uint32_t>(LogSubsys::cuda_ipc)},
    {"COLL", static_cast<std::uint32_t>(LogSubsys::coll)},
    {"ALLOC", static_cast<std::uint32_t>(LogSubsys::alloc)},
    {"DIAG", static_cast<std::uint32_t>(LogSubsys::diag)},
    {"MISC", static_cast<std::uint32_t>(LogSubsys::misc)},
    {"ALL", kLogAllSubsys},
    {"TCP", static_cast<std::uint32_t>(LogSubsys::net)},
    {"IB", static_cast<std::uint32_t>(LogSubsys::rdma)},
    {"P2P", static_cast<std::uint32_t>(LogSubsys::cuda_ipc)},
    {"MEM", static_cast<std::uint32_t>(LogSubsys::alloc)},
};

/// The name a line of subsystem `s` prints ("COLL").
constexpr std::string_view log_subsys_name(LogSubsys s) noexcept {
  switch (s) {
    case LogSubsys::init: return "INIT";
    case LogSubsys::bootstrap: return "BOOTSTRAP";
    case LogSubsys::transport: return "TRANSPORT";
    case LogSubsys::net: return "NET";
    case LogSubsys::shm: return "SHM";
    case LogSubsys::rdma: return "RDMA";
    case LogSubsys::cuda_ipc: return "CUDA_IPC";
    case LogSubsys::coll: return "COLL";
    case LogSubsys::alloc: return "ALLOC";
    case LogSubsys::diag: return "DIAG";
    case LogSubsys::misc: return "MISC";
  }
  return "MISC";
}

inline LogLevel parse_log_level(std::string_view v) {
  if (v == "WARN" || v == "warn") return LogLevel::warn;
  if (v == "INFO" || v == "info") return LogLevel::info;
  if (v == "TRACE" || v == "trace") return LogLevel::trace;
  throw Error(ErrorCode::invalid_argument,
              "CHORUS_DEBUG='" + std::string(v) + "' is not one of WARN, INFO, TRACE");
}

/// The mask a CHORUS_DEBUG_SUBSYS value selects: comma-separated names (any case, blanks around
/// them ignored); a leading '^' selects every subsystem but the listed ones. An unknown or empty
/// name is invalid_argument naming the variable and the name.
inline std::uint32_t parse_log_subsys(std::string_view v) {
  const std::string whole(v);
  bool exclude = false;
  if (!v.empty() && v.front() == '^') exclude = true, v.remove_prefix(1);
  std::uint32_t mask = 0;
  for (;;) {
    const std::size_t comma = v.find(',');
    std::string_view token = v.substr(0, comma);
    while (!token.empty() && (token.front() == ' ' || token.front() == '\t')) token.remove_prefix(1);
    while (!token.empty() && (token.back() == ' ' || token.back() == '\t')) token.remove_suffix(1);
    std::string upper(token);
    for (char& c : upper)
      if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
    bool known = false;
    for (const auto& n : kLogSubsysNames)
      if (n.name == upper) mask |= n.mask, known = true;
    if (!known) {
      std::string names;
      for (const auto& n : kLogSubsysNames) names += (names.empty() ? "" : ", ") + std::string(n.name);
      throw Error(ErrorCode::invalid_argument,
                  "CHORUS_DEBUG_SUBSYS='" + whole + "': " +
                      (token.empty() ? std::string("an empty name") : "'" + std::string(token) + "'") +
                      " is not a subsystem (" + names + "; '^' first excludes the list)");
    }
    if (comma == std::string_view::npos) break;
    v.remove_prefix(comma + 1);
  }
  return exclude ? kLogAllSubsys & ~mask : mask;
}

inline const std::string& log_host() {
  static const std::string host = [] {
    char buf[256] = {};
    if (::gethostname(buf, sizeof(buf) - 1) != 0) return std::string("?");
    return std::string(buf);
  }();
  return host;
}

/// A CHORUS_DEBUG_FILE pattern with %h replaced by the host name, %p by the pid and %% by '%';
/// any other '%' stays as it is.
inline std::string expand_log_file(std::string_view pattern) {
  std::string out;
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    const char next = i + 1 < pattern.size() ? pattern[i + 1] : '\0';
    if (pattern[i] == '%' && next == 'h') out += log_host(), ++i;
    else if (pattern[i] == '%' && next == 'p') out += std::to_string(::getpid()), ++i;
    else if (pattern[i] == '%' && next == '%') out += '%', ++i;
    else out += pattern[i];
  }
  return out;
}

/// What the three variables say.
struct LogConfig {
  LogLevel level = LogLevel::warn;
  std::uint32_t subsystems = kLogAllSubsys;
  std::optional<std::string> file;  ///< CHORUS_DEBUG_FILE as set (unexpanded); nullopt: stderr
};

/// Reads CHORUS_DEBUG, CHORUS_DEBUG_SUBSYS and CHORUS_DEBUG_FILE; a bad value throws.
inline LogConfig log_config_from_env() {
  LogConfig c;
  if (auto v = env_string("CHORUS_DEBUG")) c.level = parse_log_level(*v);
  if (auto v = env_string("CHORUS_DEBUG_SUBSYS")) c.subsystems = parse_log_subsys(*v);
  c.file = env_string("CHORUS_DEBUG_FILE");
  return c;
}

/// The logging state of the process: level and mask read on every log call (atomics, no lock),
/// and the descriptor lines go to.
class Logger {
 public:
  /// The process's logger, configured from the environment at its first use.
  /// Never destroyed, so threads that log while the process exits find it.
  CHORUS_DECL static Logger& instance();

  bool enabled(LogLevel l, std::uint32_t subsys) const noexcept {
    if (static_cast<int>(l) > level_.load(std::memory_order_relaxed)) return false;
    return l == LogLevel::warn || (subsys & mask_.load(std::memory_order_relaxed)) != 0;
  }

  /// Writes one whole line with one write(2) (O_APPEND for a file), so lines from threads and
  /// from the processes sharing a file do not interleave.
  void write(std::string_view line) {
    std::lock_guard lk(mu_);
    while (!line.empty()) {
      const ssize_t w = ::write(fd_, line.data(), line.size());
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return;  // nowhere to report it
      line.remove_prefix(static_cast<std::size_t>(w));
    }
  }

  /// Re-reads the environment (tests: after changing the variables; the next lines follow the
  /// new values). A bad value throws and leaves the logger as it was.
  void reload() { configure(log_config_from_env()); }

  /// Takes `c`: closes the previous file, opens c.file, or falls back to stderr with a warning
  /// when it cannot be opened. Returns the path in use ("" for stderr).
  std::string configure(const LogConfig& c) {
    std::lock_guard lk(mu_);
    if (fd_ != STDERR_FILENO) ::close(fd_);
    fd_ = STDERR_FILENO;
    path_.clear();
    level_.store(static_cast<int>(c.level), std::memory_order_relaxed);
    mask_.store(c.subsystems, std::memory_order_relaxed);
    if (c.file) {
      const std::string path = expand_log_file(*c.file);
      const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
      if (fd >= 0) {
        fd_ = fd;
        path_ = path;
      } else {
        const int err = errno;
        const std::string warn = "[chorus " + log_host() + ':' + std::to_string(::getpid()) +
                                 "] WARN CHORUS_DEBUG_FILE='" + *c.file + "': cannot open " + path + ": " +
                                 std::strerror(err) + "; logging to stderr\n";
        [[maybe_unused]] const ssize_t w = ::write(STDERR_FILENO, warn.data(), warn.size());
      }
    }
    return path_;
  }

  /// The file lines go to, "" for stderr.
  std::string path() const {
    std::lock_guard lk(mu_);
    return path_;
  }

  Logger(const Logger&) = delete;
  Logger& operator=(const Logger&) = delete;

 private:
  explicit Logger(const LogConfig& c) { configure(c); }

  std::atomic<int> level_{0};
  std::atomic<std::uint32_t> mask_{kLogAllSubsys};
  mutable std::mutex mu_;  // guards fd_ and path_
  int fd_ = STDERR_FILENO;
  std::string path_;
};

/// The level in force.
inline LogLevel log_level() {
  const Logger& l = Logger::instance();
  for (LogLevel v : {LogLevel::trace, LogLevel::info})
    if (l.enabled(v, kLogAllSubsys)) return v;
  return LogLevel::warn;
}

inline bool log_enabled(LogLevel l, LogSubsys s) {
  return Logger::instance().enabled(l, static_cast<std::uint32_t>(s));
}
/// A line without a subsystem counts as MISC.
inline bool log_enabled(LogLevel l) { return log_enabled(l, LogSubsys::misc); }

/// Writes one line, when its level and subsystem are enabled. `tagged`: print the subsystem.
CHORUS_DECL void log_line(LogLevel l, LogSubsys s, int rank, std::string_view msg, bool tagged = true);
inline void log_line(LogLevel l, int rank, std::string_view msg) {
  log_line(l, LogSubsys::misc, rank, msg, /*tagged=*/false);
}

/// log(LogLevel::info, LogSubsys::net, rank, "opened ", n, " links"): builds the message only
/// when enabled. `rank` is -1 before the rank is known.
template <class... Args>
void log(LogLevel l, LogSubsys s, int rank, const Args&... args) {
  if (!log_enabled(l, s)) return;
  std::ostringstream os;
  (os << ... << args);
  log_line(l, s, rank, os.str());
}

/// The same without a subsystem: the line counts as MISC.
template <class... Args>
void log(LogLevel l, int rank, const Args&... args) {
  if (!log_enabled(l)) return;
  std::ostringstream os;
  (os << ... << args);
  log_line(l, rank, os.str());
}

}  // namespace chorus::detail

// The bodies (detail/impl/log.hpp): here in a header-only program; compiled once with
// CHORUS_SEPARATE_COMPILATION (config.hpp, CHORUS_DECL).
#if !defined(CHORUS_SEPARATE_COMPILATION)
#include "chorus/detail/impl/log.hpp"
#endif
