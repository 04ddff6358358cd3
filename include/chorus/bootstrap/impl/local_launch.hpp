// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// The bodies of bootstrap/local_launch.hpp (CHORUS_DECL, config.hpp): included by that header in a
/// header-only program, and by chorus/impl/bodies.hpp alone with CHORUS_SEPARATE_COMPILATION.

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <optional>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "chorus/bootstrap/launch_env.hpp"
#include "chorus/bootstrap/local_launch.hpp"
#include "chorus/bootstrap/tcp_store.hpp"
#include "chorus/core/error.hpp"
#include "chorus/detail/log.hpp"

extern char** environ;

namespace chorus {

CHORUS_DECL bool launched_by_launcher() { return detect_launch().has_value(); }

CHORUS_DECL int launch_local(int nranks, int argc, char** argv, std::chrono::milliseconds store_timeout) {
  if (nranks < 1) throw Error(ErrorCode::invalid_argument, "launch_local: nranks must be at least 1");
  TcpStore store("127.0.0.1", 0, /*is_server=*/true, store_timeout, detail::env_string("CHORUS_JOB_TOKEN").value_or(""));

  // The parent's environment, minus any launcher variables that would confuse the ranks.
  std::vector<std::string> base;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string_view v(*e);
    const auto name = v.substr(0, v.find('='));
    if (name == "RANK" || name == "WORLD_SIZE" || name == "LOCAL_RANK" || name == "LOCAL_WORLD_SIZE" ||
        name == "MASTER_ADDR" || name == "MASTER_PORT" || name == "CHORUS_AGENT_STORE" ||
        name.rfind("OMPI_COMM_WORLD_", 0) == 0 || name.rfind("PMI_", 0) == 0 || name.rfind("SLURM_", 0) == 0 ||
        name.rfind("TORCHELASTIC_", 0) == 0)
      continue;
    base.emplace_back(v);
  }

  // A rank inherits nothing but stdin, stdout and stderr: the launcher's store (its listening
  // socket and the connections of the ranks started before) stays the launcher's, as it would
  // under torchrun (64 ranks held 70 sockets each, most of them the launcher's).
  posix_spawn_file_actions_t actions;
  if (int rc = ::posix_spawn_file_actions_init(&actions); rc != 0)
    throw detail::system_error({}, "posix_spawn_file_actions_init", rc);
  struct Actions {
    posix_spawn_file_actions_t* a;
    ~Actions() { ::posix_spawn_file_actions_destroy(a); }
  } destroy_actions{&actions};
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 34))
  if (int rc = ::posix_spawn_file_actions_addclosefrom_np(&actions, 3); rc != 0)
    throw detail::system_error({}, "posix_spawn_file_actions_addclosefrom_np", rc);
#endif
  std::vector<pid_t> pids;
  for (int r = 0; r < nranks; ++r) {
    std::vector<std::string> env = base;
    env.push_back("RANK=" + std::to_string(r));
    env.push_back("WORLD_SIZE=" + std::to_string(nranks));
    env.push_back("LOCAL_RANK=" + std::to_string(r));
    env.push_back("LOCAL_WORLD_SIZE=" + std::to_string(nranks));
    env.push_back("MASTER_ADDR=127.0.0.1");
    env.push_back("MASTER_PORT=" + std::to_string(store.port()));
    env.push_back("CHORUS_AGENT_STORE=1");
    std::vector<char*> envp;
    for (auto& s : env) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::vector<char*> args(argv, argv + argc);
    args.push_back(nullptr);
    pid_t pid = 0;
    if (int rc = ::posix_spawn(&pid, "/proc/self/exe", &actions, nullptr, args.data(), envp.data());
        rc != 0) {
      for (pid_t p : pids) ::kill(p, SIGKILL);
      throw detail::system_error({}, "posix_spawn of rank " + std::to_string(r), rc);
    }
    pids.push_back(pid);
  }

  int result = 0;
  int alive = nranks;
  // Once a rank has failed, the others get SIGTERM and, after a grace period, SIGKILL. Only
  // children not yet reaped are signalled, so a pid is never reused under us.
  std::optional<std::chrono::steady_clock::time_point> kill_at;
  while (alive > 0) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, kill_at ? WNOHANG : 0);
    if (pid < 0 && errno == EINTR) continue;
    if (pid < 0) break;
    if (pid == 0) {  // stopping, nothing exited yet
      if (std::chrono::steady_clock::now() >= *kill_at) {
        for (pid_t p : pids)
          if (p > 0) ::kill(p, SIGKILL);
        kill_at = std::chrono::steady_clock::time_point::max();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    int rank = -1;
    for (int r = 0; r < nranks; ++r)
      if (pids[r] == pid) rank = r, pids[r] = -1;
    if (rank < 0) continue;
    --alive;
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (code == 0 || kill_at) continue;
    result = code;
    detail::log(detail::LogLevel::warn, detail::LogSubsys::bootstrap, -1, "launch_local: rank ", rank,
                WIFEXITED(status) ? " exited with status " : " was killed by signal ",
                WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status), "; stopping the other ranks");
    for (pid_t p : pids)
      if (p > 0) ::kill(p, SIGTERM);
    kill_at = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  }
  return result;
}

}  // namespace chorus
