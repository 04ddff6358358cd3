// SPDX-License-Identifier: BSD-3-Clause
// pingpong: how long one hand-off of a flag in device memory takes between two kernels that spin
// on it, each waiting for the other's store before it stores, as the collective kernel's barriers
// and LL lines do. Plain CUDA, no chorus: built by scripts/gpu-bundle with nvcc, cudart static.
// It answers the time-slice question of docs/performance.md ("On a GPU"): two kernels of one
// process (two threads, two streams, one context) run side by side, so a hand-off should take
// about a microsecond; two processes on one GPU without MPS are time-sliced by the driver, so a
// kernel that spins on the other process's flag may keep the device for its whole slice.
//
//   pingpong --mode threads|processes [--iters N] [--json FILE]
//                     on device 0: two kernels of one block each, one per thread (two streams of
//                     one process) or one per process (the flag shared through CUDA IPC), hand a
//                     counter back and forth N times (default 10000); the time per hand-off is
//                     the wall time of the exchange over 2N, from the moment both kernels started
//   pingpong --host --mode threads|processes ...
//                     the same between host threads or processes on a word of shared memory
//                     (run.sh --sim: the steps and the summary's format, not a GPU's figure)
//
// Every spin gives up after 10 s (then exit 1: a hand-off that never came). Exit status: 0, 77 (no
// GPU), 1 (a CUDA error or a hand-off that never came), 2 (usage).
#include <cuda_runtime_api.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

namespace {

constexpr int kNoGpu = 77;
constexpr std::uint64_t kGiveUpNs = 10'000'000'000ull;

bool means_no_gpu(cudaError_t e) {
  return e == cudaErrorInsufficientDriver || e == cudaErrorStubLibrary || e == cudaErrorNoDevice;
}
void check(cudaError_t e, const char* call) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "pingpong: %s: %s (%d)\n", call, cudaGetErrorName(e), static_cast<int>(e));
  std::exit(means_no_gpu(e) ? kNoGpu : 1);
}

[[noreturn]] void usage() {
  std::fprintf(stderr, "usage: pingpong [--host] --mode threads|processes [--iters N] [--json FILE]\n");
  std::exit(2);
}

__device__ __forceinline__ std::uint64_t global_timer_ns() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

/// Side `side` (0 or 1) of the exchange: waits until *flag is 2i + side, stores 2i + side + 1,
/// for i < iters. *failed is set where a wait gives up.
__global__ void player(volatile std::uint64_t* flag, int side, int iters, volatile int* failed) {
  const std::uint64_t start = global_timer_ns();
  for (int i = 0; i < iters; ++i) {
    const std::uint64_t want = 2ull * static_cast<std::uint64_t>(i) + static_cast<std::uint64_t>(side);
    while (*flag != want) {
      if (global_timer_ns() - start > kGiveUpNs) {
        *failed = 1;
        return;
      }
    }
    __threadfence_system();
    *flag = want + 1;
  }
}

void host_player(std::uint64_t* flag, int side, int iters, int* failed) {
  std::atomic_ref<std::uint64_t> f(*flag);
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) {
    const std::uint64_t want = 2ull * static_cast<std::uint64_t>(i) + static_cast<std::uint64_t>(side);
    for (unsigned spins = 0; f.load(std::memory_order_acquire) != want; ++spins) {
      if ((spins & 255) == 255) {
        if (std::chrono::steady_clock::now() - start > std::chrono::nanoseconds(kGiveUpNs)) {
          *failed = 1;
          return;
        }
        std::this_thread::yield();
      }
    }
    f.store(want + 1, std::memory_order_release);
  }
}

using Clock = std::chrono::steady_clock;

/// Device, two threads of this process: a stream each, one context.
double device_threads(int iters, bool& ok) {
  std::uint64_t* flag = nullptr;
  int* failed = nullptr;
  check(cudaMalloc(&flag, sizeof *flag), "cudaMalloc");
  check(cudaMemset(flag, 0, sizeof *flag), "cudaMemset");
  check(cudaHostAlloc(&failed, sizeof *failed, cudaHostAllocMapped), "cudaHostAlloc");
  *failed = 0;
  cudaStream_t s[2];
  for (auto& x : s) check(cudaStreamCreateWithFlags(&x, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  // Every kernel loaded before the clock starts (lazy loading would put the load in the figure).
  cudaFuncAttributes attr;
  check(cudaFuncGetAttributes(&attr, player), "cudaFuncGetAttributes");
  const auto t0 = Clock::now();
  std::thread other([&] {
    player<<<1, 1, 0, s[1]>>>(flag, 1, iters, failed);
    check(cudaGetLastError(), "cudaLaunchKernel");
    check(cudaStreamSynchronize(s[1]), "cudaStreamSynchronize");
  });
  player<<<1, 1, 0, s[0]>>>(flag, 0, iters, failed);
  check(cudaGetLastError(), "cudaLaunchKernel");
  check(cudaStreamSynchronize(s[0]), "cudaStreamSynchronize");
  other.join();
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  ok = *failed == 0;
  for (auto& x : s) check(cudaStreamDestroy(x), "cudaStreamDestroy");
  check(cudaFree(flag), "cudaFree");
  check(cudaFreeHost(failed), "cudaFreeHost");
  return secs;
}

/// Device, two processes: the parent's flag opened by the child through CUDA IPC. The fork comes
/// before any CUDA call (a CUDA context does not survive a fork).
double device_processes(int iters, bool& ok) {
  int to_child[2], to_parent[2];
  if (::pipe(to_child) != 0 || ::pipe(to_parent) != 0) std::exit(1);
  const pid_t pid = ::fork();
  if (pid == 0) {  // the child: reads the handle, opens it, says so, plays side 1
    cudaIpcMemHandle_t h;
    if (::read(to_child[0], &h, sizeof h) != static_cast<ssize_t>(sizeof h)) std::_Exit(1);
    std::uint64_t* peer = nullptr;
    check(cudaIpcOpenMemHandle(reinterpret_cast<void**>(&peer), h, cudaIpcMemLazyEnablePeerAccess), "cudaIpcOpenMemHandle");
    int* failed = nullptr;
    check(cudaHostAlloc(&failed, sizeof *failed, cudaHostAllocMapped), "cudaHostAlloc");
    *failed = 0;
    cudaFuncAttributes a;
    check(cudaFuncGetAttributes(&a, player), "cudaFuncGetAttributes");
    const char ready = 1;
    if (::write(to_parent[1], &ready, 1) != 1) std::_Exit(1);
    player<<<1, 1>>>(peer, 1, iters, failed);
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    std::_Exit(*failed == 0 ? 0 : 1);
  }
  std::uint64_t* flag = nullptr;
  check(cudaMalloc(&flag, sizeof *flag), "cudaMalloc");
  check(cudaMemset(flag, 0, sizeof *flag), "cudaMemset");
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  cudaIpcMemHandle_t h;
  check(cudaIpcGetMemHandle(&h, flag), "cudaIpcGetMemHandle");
  cudaFuncAttributes attr;
  check(cudaFuncGetAttributes(&attr, player), "cudaFuncGetAttributes");
  int* failed = nullptr;
  check(cudaHostAlloc(&failed, sizeof *failed, cudaHostAllocMapped), "cudaHostAlloc");
  *failed = 0;
  char ready = 0;
  if (::write(to_child[1], &h, sizeof h) != static_cast<ssize_t>(sizeof h) || ::read(to_parent[0], &ready, 1) != 1) {
    std::fprintf(stderr, "pingpong: the child process did not open the flag\n");
    std::exit(1);
  }
  const auto t0 = Clock::now();
  player<<<1, 1>>>(flag, 0, iters, failed);
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  int status = 0;
  ::waitpid(pid, &status, 0);
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  ok = *failed == 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  check(cudaFree(flag), "cudaFree");
  return secs;
}

/// Host, two threads or two processes, on a word of shared memory.
double host_pingpong(bool processes, int iters, bool& ok) {
  void* mem = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) std::exit(1);
  auto* flag = static_cast<std::uint64_t*>(mem);
  int* failed = reinterpret_cast<int*>(static_cast<char*>(mem) + 64);
  *flag = 0;
  *failed = 0;
  const auto t0 = Clock::now();
  if (processes) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      host_player(flag, 1, iters, failed);
      std::_Exit(0);
    }
    host_player(flag, 0, iters, failed);
    int status = 0;
    ::waitpid(pid, &status, 0);
  } else {
    std::thread other([&] { host_player(flag, 1, iters, failed); });
    host_player(flag, 0, iters, failed);
    other.join();
  }
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  ok = *failed == 0;
  ::munmap(mem, 4096);
  return secs;
}

}  // namespace

int main(int argc, char** argv) {
  bool host = false;
  std::string mode, json;
  int iters = 10000;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage();
      return argv[++i];
    };
    if (a == "--host") host = true;
    else if (a == "--mode") mode = value();
    else if (a == "--iters") iters = std::atoi(value().c_str());
    else if (a == "--json") json = value();
    else usage();
  }
  if ((mode != "threads" && mode != "processes") || iters < 1) usage();
  if (!host && mode == "threads") {  // (processes: the fork comes first; the parent's first call says)
    int count = 0;
    check(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
    if (count == 0) return kNoGpu;
  }
  bool ok = false;
  const bool processes = mode == "processes";
  const double secs = host ? host_pingpong(processes, iters, ok)
                           : processes ? device_processes(iters, ok) : device_threads(iters, ok);
  const double us = secs * 1e6 / (2.0 * iters);
  std::printf("pingpong: %s, %s, %d round trips: %.3f us per hand-off%s\n", host ? "host" : "device 0", mode.c_str(), iters,
              us, ok ? "" : " (a hand-off never came: FAILED)");
  if (!json.empty()) {
    FILE* out = std::fopen(json.c_str(), "w");
    if (out == nullptr) return 1;
    std::fprintf(out, "{\"where\": \"%s\", \"mode\": \"%s\", \"iters\": %d, \"us_per_handoff\": %.4f, \"ok\": %s}\n",
                 host ? "host" : "device 0", mode.c_str(), iters, us, ok ? "true" : "false");
    std::fclose(out);
  }
  return ok ? 0 : 1;
}
