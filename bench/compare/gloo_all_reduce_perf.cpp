// SPDX-License-Identifier: BSD-3-Clause
// gloo_all_reduce_perf: nccl-tests' all_reduce_perf table for Gloo's gloo::allreduce (the
// collective PyTorch's gloo backend calls for CPU tensors), over Gloo's tcp transport on
// loopback. Like chorus's *_perf programs it launches itself: run plainly, it starts --nranks
// local processes of itself, which meet in a gloo::rendezvous::FileStore in a fresh temporary
// directory (removed at the end), and returns the first failure's exit status.
//
//   gloo_all_reduce_perf --nranks 4 -b 8 -e 64M -f 4
//
// Flags: -b -e -i -f -n -w -c -a -d -o as in nccl-tests. Layout and loop:
// bench/compare/common/perf.hpp. Gloo's allreduce picks its ring algorithm (segments of at most
// 1 MiB, two in flight) at every size; reductions are Gloo's own functors (gloo/math.h).
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/config.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

#include "compare/common/perf.hpp"

extern char** environ;

namespace {

using compare::Op;
using compare::Type;

constexpr const char* kRankVar = "GLOO_PERF_RANK";
constexpr const char* kSizeVar = "GLOO_PERF_SIZE";
constexpr const char* kDirVar = "GLOO_PERF_STORE";

class Gloo {
 public:
  Gloo(int rank, int size, const std::string& store_dir) {
    gloo::transport::tcp::attr attr;
    attr.hostname = "127.0.0.1";
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    context->setTimeout(std::chrono::seconds(300));
    gloo::rendezvous::FileStore store(store_dir);
    context->connectFullMesh(store, device);
    context_ = std::move(context);
  }
  int rank() const { return context_->rank; }
  int size() const { return context_->size; }
  void barrier() {
    gloo::BarrierOptions opts(context_);
    gloo::barrier(opts);
  }
  void all_reduce(const void* in, void* out, std::size_t count, Type t, Op op) {
    if (count == 0) return;
    compare::dispatch(t, [&]<class T>(std::type_identity<T>) {
      gloo::AllreduceOptions opts(context_);
      if (in != nullptr) opts.setInput(const_cast<T*>(static_cast<const T*>(in)), count);
      opts.setOutput(static_cast<T*>(out), count);
      using Fn = void (*)(void*, const void*, const void*, std::size_t);
      Fn fn = op == Op::sum    ? Fn(&gloo::sum<T>)
              : op == Op::prod ? Fn(&gloo::product<T>)
              : op == Op::max  ? Fn(&gloo::max<T>)
                               : Fn(&gloo::min<T>);
      opts.setReduceFunction(fn);
      gloo::allreduce(opts);
    });
  }

 private:
  std::shared_ptr<gloo::Context> context_;
};

/// The launcher: starts n ranks of this program, waits for them; the first failure's status.
int launch(int n, char** argv) {
  char tmpl[] = "/tmp/gloo-perf-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) {
    std::perror("gloo_all_reduce_perf: mkdtemp");
    return 1;
  }
  const std::string dir = tmpl;
  std::vector<pid_t> pids;
  int rc = 0;
  for (int r = 0; r < n && rc == 0; ++r) {
    std::vector<std::string> env_strings;
    for (char** e = environ; *e != nullptr; ++e) env_strings.emplace_back(*e);
    env_strings.push_back(std::string(kRankVar) + "=" + std::to_string(r));
    env_strings.push_back(std::string(kSizeVar) + "=" + std::to_string(n));
    env_strings.push_back(std::string(kDirVar) + "=" + dir);
    std::vector<char*> env;
    for (auto& s : env_strings) env.push_back(s.data());
    env.push_back(nullptr);
    pid_t pid = 0;
    if (::posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv, env.data()) != 0) {
      std::perror("gloo_all_reduce_perf: posix_spawn");
      rc = 1;
      break;
    }
    pids.push_back(pid);
  }
  // Wait for all; once one fails, stop the others (they would wait for it until Gloo's timeout).
  for (std::size_t left = pids.size(); left > 0; --left) {
    int status = 0;
    const pid_t done = ::wait(&status);
    if (done < 0) break;
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (code != 0 && rc == 0) {
      rc = code;
      for (pid_t p : pids)
        if (p != done) ::kill(p, SIGTERM);
    }
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  ::setvbuf(stdout, nullptr, _IOLBF, 0);
  compare::Settings s = compare::parse_settings(
      argc, argv, "gloo_all_reduce_perf: nccl-tests' all_reduce_perf table for gloo::allreduce over tcp",
      /*self_launching=*/true);
  if (s.transport == "default") s.transport = "tcp";
  const char* rank = std::getenv(kRankVar);
  const char* size = std::getenv(kSizeVar);
  const char* dir = std::getenv(kDirVar);
  if (rank == nullptr || size == nullptr || dir == nullptr) return launch(s.nranks, argv);
  try {
    Gloo g(std::atoi(rank), std::atoi(size), dir);
    const std::string version = std::to_string(GLOO_VERSION_MAJOR) + "." + std::to_string(GLOO_VERSION_MINOR) + "." +
                                std::to_string(GLOO_VERSION_PATCH);
    return compare::Driver<Gloo>(g, s, "gloo=" + version, "Gloo " + version + " (tcp transport, ring allreduce)").run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gloo_all_reduce_perf: rank %s: %s\n", rank, e.what());
    return 1;
  }
}
