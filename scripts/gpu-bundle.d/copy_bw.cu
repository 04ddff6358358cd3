// SPDX-License-Identifier: BSD-3-Clause
// copy_bw: the device's own copy bandwidth, the limit the *_perf busbw figures of the GPU bundle
// (scripts/gpu-bundle) are compared with. Plain CUDA, no chorus: built by scripts/gpu-bundle with
// nvcc, cudart linked statically.
//
//   copy_bw --probe           is there a usable GPU? prints the driver and runtime versions and the
//                             devices; exit 0 (yes), 77 (no GPU: no driver, the stub driver, no
//                             device, or 0 devices) or 1 (another CUDA error)
//   copy_bw [--bytes N] [--iters N] [--json FILE]
//                             on device 0: cudaMemcpyAsync device to device, and a copy kernel
//                             (16-byte loads and stores, grid-stride), each timed with CUDA events
//                             over --iters copies after one untimed one; the median is reported
//   copy_bw --host ...        the same two measures on host memory (memcpy and a copy loop), for
//                             run.sh --sim, whose simulated device copies are host memcpys
//
// Bandwidth is bytes copied per second (1 GB = 1e9 bytes): each copy reads and writes N bytes, so
// the memory traffic is twice the figure. Exit status: 0, 77 (no GPU), 1 (a CUDA error or a copy
// that came out wrong), 2 (usage).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

constexpr int kNoGpu = 77;

// cudaErrorInsufficientDriver (35), cudaErrorStubLibrary (34), cudaErrorNoDevice (100): no GPU
// here (docs: TOOLCHAIN facts, tests/cuda/gpu_test.hpp), not a failure of the program.
bool means_no_gpu(cudaError_t e) {
  return e == cudaErrorInsufficientDriver || e == cudaErrorStubLibrary || e == cudaErrorNoDevice;
}

[[noreturn]] void die(cudaError_t e, const char* call) {
  std::fprintf(stderr, "copy_bw: %s: %s (%d): %s\n", call, cudaGetErrorName(e), static_cast<int>(e),
               cudaGetErrorString(e));
  std::exit(means_no_gpu(e) ? kNoGpu : 1);
}

void check(cudaError_t e, const char* call) {
  if (e != cudaSuccess) die(e, call);
}

std::string version_text(int v) {
  if (v <= 0) return "none";
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

/// Prints the versions and devices; returns the exit status of --probe.
int probe() {
  int driver = 0, runtime = 0;
  const cudaError_t de = cudaDriverGetVersion(&driver);
  (void)cudaRuntimeGetVersion(&runtime);
  std::printf("cuda_driver_version: %s (%d)%s\n", version_text(driver).c_str(), driver,
              de != cudaSuccess ? " (cudaDriverGetVersion failed)" : "");
  std::printf("cuda_runtime_version: %s (%d, linked statically)\n", version_text(runtime).c_str(), runtime);
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    std::printf("devices: none: cudaGetDeviceCount: %s (%d)\n", cudaGetErrorName(e), static_cast<int>(e));
    return means_no_gpu(e) ? kNoGpu : 1;
  }
  std::printf("devices: %d\n", count);
  for (int d = 0; d < count; ++d) {
    cudaDeviceProp p{};
    check(cudaGetDeviceProperties(&p, d), "cudaGetDeviceProperties");
    std::printf("device %d: %s, sm_%d%d, %d SMs, %.1f GiB\n", d, p.name, p.major, p.minor, p.multiProcessorCount,
                static_cast<double>(p.totalGlobalMem) / (1024.0 * 1024 * 1024));
  }
  return count > 0 ? 0 : kNoGpu;
}

__global__ void copy_kernel(const uint4* __restrict__ src, uint4* __restrict__ dst, std::size_t n) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    dst[i] = src[i];
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Figures {
  std::string where;
  double memcpy_gbps = 0;
  double kernel_gbps = 0;
};

template <class Copy>
double time_device(Copy&& copy, std::size_t bytes, int iters, cudaStream_t s) {
  cudaEvent_t t0, t1;
  check(cudaEventCreate(&t0), "cudaEventCreate");
  check(cudaEventCreate(&t1), "cudaEventCreate");
  copy();  // untimed
  check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  std::vector<double> gbps;
  for (int i = 0; i < iters; ++i) {
    check(cudaEventRecord(t0, s), "cudaEventRecord");
    copy();
    check(cudaEventRecord(t1, s), "cudaEventRecord");
    check(cudaEventSynchronize(t1), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, t0, t1), "cudaEventElapsedTime");
    gbps.push_back(static_cast<double>(bytes) / (std::max(ms, 1e-6f) * 1e-3) / 1e9);
  }
  check(cudaEventDestroy(t0), "cudaEventDestroy");
  check(cudaEventDestroy(t1), "cudaEventDestroy");
  return median(gbps);
}

Figures measure_device(std::size_t bytes, int iters) {
  Figures f;
  check(cudaSetDevice(0), "cudaSetDevice");
  cudaDeviceProp p{};
  check(cudaGetDeviceProperties(&p, 0), "cudaGetDeviceProperties");
  f.where = std::string("device 0: ") + p.name + ", sm_" + std::to_string(p.major) + std::to_string(p.minor);
  void *src = nullptr, *dst = nullptr;
  check(cudaMalloc(&src, bytes), "cudaMalloc");
  check(cudaMalloc(&dst, bytes), "cudaMalloc");
  cudaStream_t s;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  check(cudaMemsetAsync(src, 0x5a, bytes, s), "cudaMemsetAsync");
  check(cudaMemsetAsync(dst, 0, bytes, s), "cudaMemsetAsync");
  f.memcpy_gbps = time_device([&] { check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s), "cudaMemcpyAsync"); },
                              bytes, iters, s);
  // The kernel: 16-byte elements, a few blocks per SM.
  const std::size_t n = bytes / sizeof(uint4);
  const int threads = 512;
  const int blocks = std::max(1, p.multiProcessorCount * 4);
  check(cudaMemsetAsync(dst, 0, bytes, s), "cudaMemsetAsync");
  f.kernel_gbps = time_device(
      [&] {
        copy_kernel<<<blocks, threads, 0, s>>>(static_cast<const uint4*>(src), static_cast<uint4*>(dst), n);
        check(cudaGetLastError(), "copy_kernel launch");
      },
      n * sizeof(uint4), iters, s);
  // The kernel really copied: the last 4 KiB it wrote must be the source's pattern.
  std::vector<unsigned char> tail(4096);
  const std::size_t at = n * sizeof(uint4) - tail.size();
  check(cudaMemcpyAsync(tail.data(), static_cast<unsigned char*>(dst) + at, tail.size(), cudaMemcpyDeviceToHost, s),
        "cudaMemcpyAsync");
  check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  if (std::any_of(tail.begin(), tail.end(), [](unsigned char c) { return c != 0x5a; })) {
    std::fprintf(stderr, "copy_bw: the copy kernel's output is wrong\n");
    std::exit(1);
  }
  check(cudaStreamDestroy(s), "cudaStreamDestroy");
  check(cudaFree(src), "cudaFree");
  check(cudaFree(dst), "cudaFree");
  return f;
}

template <class Copy>
double time_host(Copy&& copy, std::size_t bytes, int iters) {
  copy();
  std::vector<double> gbps;
  for (int i = 0; i < iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    copy();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    gbps.push_back(static_cast<double>(bytes) / std::max(s, 1e-9) / 1e9);
  }
  return median(gbps);
}

Figures measure_host(std::size_t bytes, int iters) {
  Figures f;
  f.where = "host memory (memcpy; the simulated runtime's device copies are host memcpys)";
  std::vector<std::uint64_t> src(bytes / 8, 0x5a5a5a5a5a5a5a5aull), dst(bytes / 8, 0);
  f.memcpy_gbps = time_host([&] { std::memcpy(dst.data(), src.data(), src.size() * 8); }, bytes, iters);
  f.kernel_gbps = time_host(
      [&] {
        volatile std::uint64_t* d = dst.data();  // a loop the compiler must not turn into memcpy
        for (std::size_t i = 0; i < src.size(); ++i) d[i] = src[i];
      },
      src.size() * 8, iters);
  if (dst.back() != src.back()) {
    std::fprintf(stderr, "copy_bw: the host copy loop's output is wrong\n");
    std::exit(1);
  }
  return f;
}

[[noreturn]] void usage() {
  std::fprintf(stderr, "usage: copy_bw --probe | copy_bw [--host] [--bytes N] [--iters N] [--json FILE]\n");
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  bool host = false;
  std::size_t bytes = std::size_t{256} << 20;
  int iters = 20;
  std::string json;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage();
      return argv[++i];
    };
    if (a == "--probe") return probe();
    if (a == "--host") {
      host = true;
    } else if (a == "--bytes") {  // a number, optionally followed by K, M or G (powers of 1024)
      const std::string v = value();
      char* end = nullptr;
      unsigned long long n = std::strtoull(v.c_str(), &end, 10);
      const std::string unit = end;
      if (unit == "K") n <<= 10;
      else if (unit == "M") n <<= 20;
      else if (unit == "G") n <<= 30;
      else if (!unit.empty()) usage();
      if (end == v.c_str() || n < 4096) usage();
      bytes = static_cast<std::size_t>(n) / 4096 * 4096;
    } else if (a == "--iters") {
      iters = std::atoi(value().c_str());
      if (iters < 1) usage();
    } else if (a == "--json") {
      json = value();
    } else {
      usage();
    }
  }
  const Figures f = host ? measure_host(bytes, iters) : measure_device(bytes, iters);
  std::printf("copy_bw: %s; %zu bytes, median of %d\n", f.where.c_str(), bytes, iters);
  std::printf("memcpy_gbps: %.2f\n", f.memcpy_gbps);
  std::printf("kernel_gbps: %.2f\n", f.kernel_gbps);
  if (!json.empty()) {
    FILE* out = std::fopen(json.c_str(), "w");
    if (out == nullptr) {
      std::fprintf(stderr, "copy_bw: cannot write %s\n", json.c_str());
      return 1;
    }
    std::fprintf(out, "{\"where\": \"%s\", \"host\": %s, \"bytes\": %zu, \"iters\": %d, \"memcpy_gbps\": %.4f, "
                      "\"kernel_gbps\": %.4f}\n",
                 f.where.c_str(), host ? "true" : "false", bytes, iters, f.memcpy_gbps, f.kernel_gbps);
    std::fclose(out);
  }
  return 0;
}
