// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// Where flight-recorder dumps go, and the SIGUSR1 trigger.
///
/// write_dump(): to CHORUS_DUMP_DIR/chorus-flight-<host>-<pid>.txt (appended) when that variable is
/// set, else to stderr; one write per dump, so dumps of several communicators do not interleave.
///
/// With CHORUS_DUMP_ON_SIGNAL=1, the first communicator created installs a SIGUSR1 handler. The
/// handler only writes a byte to a pipe (all it may do in a signal handler); a thread started
/// with it reads the pipe and dumps every live communicator's recorder. A SIGUSR1 handler that
/// the program installed before is left alone (chorus then says so at INFO and dumps nothing).

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "chorus/diag/flight_recorder.hpp"
#include "chorus/core/error.hpp"
#include "chorus/detail/env.hpp"
#include "chorus/detail/log.hpp"

namespace chorus::detail {

inline void write_dump(const std::string& text) {
  if (auto dir = env_string("CHORUS_DUMP_DIR"); dir && !dir->empty()) {
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    const std::string path = *dir + "/chorus-flight-" + host + "-" + std::to_string(::getpid()) + ".txt";
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd >= 0) {
      const ssize_t w = ::write(fd, text.data(), text.size());
      ::close(fd);
      if (w == static_cast<ssize_t>(text.size())) return;
    }
    log(LogLevel::warn, LogSubsys::diag, -1, "cannot write the flight recorder to ", path, ": ", std::strerror(errno), "; it follows on stderr");
  }
  std::fwrite(text.data(), 1, text.size(), stderr);
  std::fflush(stderr);
}

/// The recorders of the live communicators, for the signal thread.
class DumpRegistry {
 public:
  static DumpRegistry& instance() {
    static DumpRegistry r;
    return r;
  }

  /// Registers `rec` (kept weakly); installs the signal handler on first use when
  /// CHORUS_DUMP_ON_SIGNAL=1.
  void add(const std::shared_ptr<algo::FlightRecorder>& rec) {
    {
      std::lock_guard lk(mu_);
      std::erase_if(recorders_, [](const auto& w) { return w.expired(); });
      recorders_.push_back(rec);
    }
    std::call_once(install_, [this] { install(); });
  }

  /// Dumps every live recorder (the signal thread's job; callable directly, e.g. by tests).
  void dump_all(std::string_view reason) {
    std::vector<std::shared_ptr<algo::FlightRecorder>> live;
    {
      std::lock_guard lk(mu_);
      for (auto& w : recorders_)
        if (auto r = w.lock()) live.push_back(std::move(r));
    }
    for (auto& r : live) write_dump(r->dump(reason));
  }

 private:
  static int& pipe_write_end() {
    static int fd = -1;
    return fd;
  }
  static void on_signal(int) {
    const int saved = errno;
    const char c = 1;
    [[maybe_unused]] const ssize_t w = ::write(pipe_write_end(), &c, 1);
    errno = saved;
  }

  void install() {
    const auto v = env_string("CHORUS_DUMP_ON_SIGNAL");
    if (!v || *v == "0" || v->empty()) return;
    if (*v != "1") throw Error(ErrorCode::invalid_argument, "CHORUS_DUMP_ON_SIGNAL='" + *v + "' is not 0 or 1");
    struct sigaction old {};
    if (::sigaction(SIGUSR1, nullptr, &old) == 0 && old.sa_handler != SIG_DFL && old.sa_handler != SIG_IGN) {
      log(LogLevel::info, LogSubsys::diag, -1, "CHORUS_DUMP_ON_SIGNAL: SIGUSR1 already has a handler; flight recorders dump on timeouts and aborts only");
      return;
    }
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) throw system_error({}, "pipe2 (CHORUS_DUMP_ON_SIGNAL)");
    pipe_write_end() = fds[1];
    // Reads for the life of the process; a detached thread blocked in read() does not keep it
    // from exiting.
    std::thread([this, rd = fds[0]] {
      char c;
      for (;;) {
        const ssize_t n = ::read(rd, &c, 1);
        if (n == 1) dump_all("SIGUSR1 (CHORUS_DUMP_ON_SIGNAL)");
        else if (n < 0 && errno != EINTR) return;
      }
    }).detach();
    struct sigaction sa {};
    sa.sa_handler = &DumpRegistry::on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    ::sigaction(SIGUSR1, &sa, nullptr);
  }

  std::mutex mu_;
  std::vector<std::weak_ptr<algo::FlightRecorder>> recorders_;
  std::once_flag install_;
};

}  // namespace chorus::detail
