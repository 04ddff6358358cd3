// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// PMI-1's wire protocol, the client half: what a rank started by MPICH's Hydra (mpiexec) says to
/// its PMI server over the connected socket whose number PMI_FD holds. One request is one line of
/// "cmd=<name> <key>=<value> ...", answered by one line of the same form:
///
///   cmd=init pmi_version=1 pmi_subversion=1   ->  cmd=response_to_init ... rc=0
///   cmd=get_my_kvsname                         ->  cmd=my_kvsname kvsname=<name>
///   cmd=put kvsname=<n> key=<k> value=<v>      ->  cmd=put_result rc=0 ...
///   cmd=barrier_in                             ->  cmd=barrier_out          (every rank of the job)
///   cmd=get kvsname=<n> key=<k>                ->  cmd=get_result rc=0 value=<v> ...
///   cmd=finalize                               ->  cmd=finalize_ack
///
/// Hydra takes a rank that exits after init without finalize for a failed one and ends the job,
/// so every use ends with finalize. Keys and values hold no spaces nor '='.

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace chorus::detail {

/// One PMI-1 conversation over `fd` (not owned: the launcher's socket), every answer awaited
/// until `deadline`.
class Pmi1Connection {
 public:
  Pmi1Connection(int fd, std::chrono::steady_clock::time_point deadline) : fd_(fd), deadline_(deadline) {}

  /// Sends `request` (one line, ending in '\n') and returns the answer's line; nullopt when the
  /// socket fails or closes, or no answer is complete by the deadline.
  std::optional<std::string> ask(std::string_view request) const {
    while (!request.empty()) {
      const ssize_t w = ::write(fd_, request.data(), request.size());
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return std::nullopt;
      request.remove_prefix(static_cast<std::size_t>(w));
    }
    std::string line;
    while (line.empty() || line.back() != '\n') {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ - std::chrono::steady_clock::now());
      pollfd p{fd_, POLLIN, 0};
      const int ready = ::poll(&p, 1, static_cast<int>(std::max<std::int64_t>(left.count(), 0)));
      if (ready < 0 && errno == EINTR) continue;
      if (ready <= 0) return std::nullopt;
      char c = 0;  // a byte at a time: nothing past the answer's newline is taken from the socket
      const ssize_t r = ::read(fd_, &c, 1);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return std::nullopt;
      line += c;
    }
    return line;
  }

  /// The value of `key` in an answer's line ("rc" in "cmd=put_result rc=0 msg=success" is "0");
  /// nullopt when the line has no such field.
  static std::optional<std::string> field(std::string_view line, std::string_view key) {
    std::size_t at = 0;
    while (at < line.size()) {
      const std::size_t end = std::min(line.find_first_of(" \n", at), line.size());
      const std::string_view item = line.substr(at, end - at);
      if (item.size() > key.size() && item.starts_with(key) && item[key.size()] == '=')
        return std::string(item.substr(key.size() + 1));
      at = end + 1;
    }
    return std::nullopt;
  }

  /// The session's start: init, then get_my_kvsname. The job's KVS name; nullopt when either
  /// step fails (no answer by the deadline, a non-zero rc, no name).
  std::optional<std::string> start() const {
    if (!ask_ok("cmd=init pmi_version=1 pmi_subversion=1\n", "response_to_init")) return std::nullopt;
    const auto answer = ask("cmd=get_my_kvsname\n");
    auto name = answer ? field(*answer, "kvsname") : std::nullopt;
    if (!name || name->empty()) return std::nullopt;
    return name;
  }

  /// ask(request), true when the answer's first field is `cmd=<expected>` and its rc, where it
  /// has one, is 0.
  bool ask_ok(std::string_view request, std::string_view expected) const {
    const auto answer = ask(request);
    if (!answer || field(*answer, "cmd") != expected) return false;
    const auto rc = field(*answer, "rc");
    return !rc || *rc == "0";
  }

 private:
  int fd_;
  std::chrono::steady_clock::time_point deadline_;
};

}  // namespace chorus::detail
