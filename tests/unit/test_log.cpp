// SPDX-License-Identifier: BSD-3-Clause
// Logging: CHORUS_DEBUG_SUBSYS (which subsystems' INFO/TRACE lines print; WARN always does) and
// CHORUS_DEBUG_FILE (lines into a file per process, %h the host, %p the pid; stderr with a
// warning when the file cannot be opened). The logger reads the variables once per process;
// these tests change them, call reload(), and put everything back (variables and logger) when
// they end, pass or fail. Every file is in a fresh mkdtemp folder.
#include "chorus/detail/log.hpp"

#include <doctest/doctest.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

// This file's own names: the files of tests/unit/ are compiled together (unity build).
namespace unit_test_log {

using chorus::Error;
using chorus::ErrorCode;
using chorus::detail::log;
using chorus::detail::Logger;
using chorus::detail::LogLevel;
using chorus::detail::LogSubsys;
using chorus::detail::parse_log_subsys;

namespace {

constexpr std::uint32_t bit(LogSubsys s) { return static_cast<std::uint32_t>(s); }

/// Sets the logging variables for one scope and reloads the logger; restores both after.
class ScopedLogEnv {
 public:
  explicit ScopedLogEnv(std::vector<std::pair<const char*, std::optional<std::string>>> vars) {
    (void)Logger::instance();  // made from the variables as they were, before they change
    for (const char* name : {"CHORUS_DEBUG", "CHORUS_DEBUG_SUBSYS", "CHORUS_DEBUG_FILE"}) {
      const char* old = std::getenv(name);
      saved_.emplace_back(name, old ? std::optional<std::string>(old) : std::nullopt);
      ::unsetenv(name);
    }
    for (const auto& [name, value] : vars)
      if (value) ::setenv(name, value->c_str(), 1);
  }
  ~ScopedLogEnv() {
    for (const auto& [name, value] : saved_) {
      if (value) ::setenv(name.c_str(), value->c_str(), 1);
      else ::unsetenv(name.c_str());
    }
    Logger::instance().reload();
  }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

/// A fresh folder, removed with everything in it at the end of the scope.
struct TempDir {
  std::string path;
  TempDir() : path((std::filesystem::temp_directory_path() / "chorus-log-XXXXXX").string()) {
    REQUIRE(::mkdtemp(path.data()) != nullptr);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

std::string read_all(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

/// The invalid_argument message parse_log_subsys throws for `v`.
std::string refusal(std::string_view v) {
  try {
    parse_log_subsys(v);
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::invalid_argument);
    return e.what();
  }
  FAIL("'" << v << "' was accepted");
  return {};
}

}  // namespace

TEST_CASE("CHORUS_DEBUG_SUBSYS: names, groups, aliases, '^' and bad values") {
  using chorus::detail::kLogAllSubsys;
  CHECK(parse_log_subsys("INIT") == bit(LogSubsys::init));
  CHECK(parse_log_subsys("init, Coll") == (bit(LogSubsys::init) | bit(LogSubsys::coll)));
  CHECK(parse_log_subsys("ALL") == kLogAllSubsys);
  CHECK(parse_log_subsys("TCP") == bit(LogSubsys::net));
  CHECK(parse_log_subsys("IB,P2P,MEM") == (bit(LogSubsys::rdma) | bit(LogSubsys::cuda_ipc) | bit(LogSubsys::alloc)));
  const std::uint32_t transports = parse_log_subsys("TRANSPORT");
  for (LogSubsys s : {LogSubsys::transport, LogSubsys::net, LogSubsys::shm, LogSubsys::rdma, LogSubsys::cuda_ipc})
    CHECK((transports & bit(s)) != 0);
  CHECK((transports & (bit(LogSubsys::coll) | bit(LogSubsys::misc))) == 0);
  CHECK(parse_log_subsys("^COLL") == (kLogAllSubsys & ~bit(LogSubsys::coll)));
  CHECK((parse_log_subsys("^COLL") & bit(LogSubsys::misc)) != 0);  // untagged lines still print
  CHECK(parse_log_subsys("^TRANSPORT,ALLOC") == (kLogAllSubsys & ~transports & ~bit(LogSubsys::alloc)));
  CHECK(parse_log_subsys("^ALL") == 0);

  const std::string bad = refusal("INIT,BOGUS");
  MESSAGE(bad);
  CHECK(contains(bad, "CHORUS_DEBUG_SUBSYS='INIT,BOGUS'"));
  CHECK(contains(bad, "'BOGUS' is not a subsystem"));
  CHECK(contains(bad, "COLL"));  // the message lists the names
  CHECK(contains(refusal("INIT,,COLL"), "an empty name"));
  CHECK(contains(refusal("^"), "an empty name"));
  CHECK(contains(refusal("COLL^"), "'COLL^'"));  // '^' only first
}

TEST_CASE("a bad CHORUS_DEBUG_SUBSYS fails reload() and leaves the logger as it was") {
  ScopedLogEnv env({{"CHORUS_DEBUG", "INFO"}, {"CHORUS_DEBUG_SUBSYS", "COLL,NETWORK"}});
  const bool before = Logger::instance().enabled(LogLevel::info, bit(LogSubsys::misc));
  try {
    Logger::instance().reload();
    FAIL("CHORUS_DEBUG_SUBSYS=COLL,NETWORK was accepted");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::invalid_argument);
    CHECK(contains(e.what(), "'NETWORK'"));
  }
  CHECK(Logger::instance().enabled(LogLevel::info, bit(LogSubsys::misc)) == before);
}

TEST_CASE("CHORUS_DEBUG_FILE: one file per process (%h, %p), filtered by CHORUS_DEBUG_SUBSYS") {
  TempDir dir;
  const std::string pattern = dir.path + "/chorus.%h.%p.log";
  const std::string want = dir.path + "/chorus." + chorus::detail::log_host() + "." + std::to_string(::getpid()) + ".log";
  CHECK(chorus::detail::expand_log_file(pattern) == want);
  CHECK(chorus::detail::expand_log_file("a%%p%x%") == "a%p%x%");
  {
    ScopedLogEnv env({{"CHORUS_DEBUG", "INFO"}, {"CHORUS_DEBUG_SUBSYS", "^COLL"}, {"CHORUS_DEBUG_FILE", pattern}});
    Logger::instance().reload();
    CHECK(Logger::instance().path() == want);
    log(LogLevel::info, LogSubsys::coll, 3, "all_reduce: ring (excluded)");
    log(LogLevel::info, LogSubsys::net, 3, "tcp: listening on 127.0.0.1 port 1");
    log(LogLevel::info, -1, "an untagged line");
    log(LogLevel::warn, LogSubsys::coll, 3, "a warning prints whatever the subsystems");
    log(LogLevel::trace, LogSubsys::net, 3, "trace is above INFO (not printed)");
  }
  const std::string text = read_all(want);
  MESSAGE(text);
  const std::string head = "[chorus " + chorus::detail::log_host() + ":" + std::to_string(::getpid());
  CHECK(contains(text, head + " rank 3] INFO NET tcp: listening on 127.0.0.1 port 1\n"));
  CHECK(contains(text, head + "] INFO an untagged line\n"));
  CHECK(contains(text, head + " rank 3] WARN COLL a warning prints whatever the subsystems\n"));
  CHECK_FALSE(contains(text, "excluded"));
  CHECK_FALSE(contains(text, "not printed"));

  // An inclusion list: only what it names (untagged lines are MISC); the file is appended to.
  {
    ScopedLogEnv env({{"CHORUS_DEBUG", "TRACE"}, {"CHORUS_DEBUG_SUBSYS", "init,bootstrap"}, {"CHORUS_DEBUG_FILE", pattern}});
    Logger::instance().reload();
    log(LogLevel::trace, LogSubsys::bootstrap, 0, "rendezvous: generation 1");
    log(LogLevel::info, LogSubsys::init, 0, "communicator ready");
    log(LogLevel::info, LogSubsys::net, 0, "tcp: not selected");
    log(LogLevel::info, -1, "untagged: not selected");
  }
  const std::string more = read_all(want);
  CHECK(more.rfind(text, 0) == 0);
  CHECK(contains(more, "] TRACE BOOTSTRAP rendezvous: generation 1\n"));
  CHECK(contains(more, "] INFO INIT communicator ready\n"));
  CHECK_FALSE(contains(more, "not selected"));
  CHECK(Logger::instance().path().empty());  // the scope's end put stderr back
}

TEST_CASE("CHORUS_DEBUG_FILE that cannot be opened: stderr, with a warning") {
  TempDir dir;
  const std::string captured = dir.path + "/stderr.txt";
  const std::string pattern = dir.path + "/no-such-folder/chorus.%p.log";
  // Catch what goes to stderr (fd 2) meanwhile in a file.
  const int saved = ::dup(STDERR_FILENO);
  REQUIRE(saved >= 0);
  const int fd = ::open(captured.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  REQUIRE(fd >= 0);
  ::dup2(fd, STDERR_FILENO);
  ::close(fd);
  {
    ScopedLogEnv env({{"CHORUS_DEBUG", "INFO"}, {"CHORUS_DEBUG_FILE", pattern}});
    Logger::instance().reload();
    CHECK(Logger::instance().path().empty());
    log(LogLevel::info, LogSubsys::init, 1, "still logged");
  }
  ::dup2(saved, STDERR_FILENO);
  ::close(saved);
  const std::string text = read_all(captured);
  MESSAGE(text);
  CHECK(contains(text, "WARN CHORUS_DEBUG_FILE='" + pattern + "': cannot open " + dir.path + "/no-such-folder/chorus." +
                           std::to_string(::getpid()) + ".log: No such file or directory; logging to stderr\n"));
  CHECK(contains(text, " rank 1] INFO INIT still logged\n"));
  CHECK_FALSE(std::filesystem::exists(dir.path + "/no-such-folder"));
}

}  // namespace unit_test_log
