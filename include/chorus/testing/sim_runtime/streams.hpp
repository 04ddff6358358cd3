#pragma once
/// Bodies of device::SimRuntime (declared in testing/sim_runtime.hpp).

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <random>
#include <string>
#include <utility>

#include "chorus/detail/env.hpp"
#include "chorus/testing/sim_runtime.hpp"

namespace chorus::device {

namespace detail {
inline constexpr std::string_view kSimCalls[] = {"alloc_device", "alloc_pinned", "create_stream", "create_event",
                                                 "copy",         "fill",         "reduce",        "reduce_many",
                                                 "finalize_avg", "wait_flag",     "write_value",   "wait_value"};
inline constexpr int kCudaInvalidValue = 1;
inline constexpr int kCudaMemoryAllocation = 2;
inline constexpr int kCudaInvalidDevice = 101;
inline constexpr int kCudaInvalidHandle = 400;
inline constexpr int kCudaNotReady = 600;
inline constexpr int kCudaIllegalAddress = 700;

/// The runtime call each simulated operation stands for (CudaRuntime's names).
constexpr std::string_view sim_call_name(std::string_view call) noexcept {
  if (call == "copy") return "cudaMemcpyAsync";
  if (call == "fill") return "cudaMemsetAsync";
  if (call == "reduce") return "reduce_async";
  if (call == "reduce_many") return "reduce_many_async";
  if (call == "finalize_avg") return "finalize_avg_async";
  if (call == "wait_flag" || call == "write_value" || call == "wait_value") return "cudaLaunchKernel";
  if (call == "alloc_device") return "cudaMalloc";
  if (call == "alloc_pinned") return "cudaHostAlloc";
  if (call == "create_stream") return "cudaStreamCreateWithFlags";
  if (call == "create_event") return "cudaEventCreateWithFlags";
  return call;
}

/// What an IpcHandle of the simulation holds.
struct SimIpcHandle {
  char magic[8];
  std::int32_t pid;
  std::int32_t fd;
  std::uint64_t nonce;   ///< the exporting runtime's
  std::uint64_t serial;  ///< the allocation's
  std::uint64_t bytes;
};
static_assert(sizeof(SimIpcHandle) <= sizeof(IpcHandle::bytes));
inline constexpr char kSimIpcMagic[8] = {'c', 'h', 's', 'i', 'm', 'i', 'p', 'c'};
inline std::string sim_memfd_name(std::uint64_t nonce, std::uint64_t serial) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "chorus-sim-%016llx-%llu", static_cast<unsigned long long>(nonce),
                static_cast<unsigned long long>(serial));
  return buf;
}

inline std::string hex(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", p);
  return buf;
}
}  // namespace detail

inline SimRuntime::SimRuntime(std::size_t arena_bytes) {
  const long page = ::sysconf(_SC_PAGESIZE);
  if (page > 0) page_ = static_cast<std::size_t>(page);
  arena_bytes_ = (std::max(arena_bytes, page_ * 4) + page_ - 1) / page_ * page_;
  void* base = ::mmap(nullptr, arena_bytes_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) throw chorus::detail::system_error({}, "SimRuntime: mmap of the device arena");
  arena_ = static_cast<std::byte*>(base);
  free_ranges_.emplace(0, arena_bytes_);
  std::random_device rd;
  nonce_ = (std::uint64_t(rd()) << 32) ^ rd() ^ (std::uint64_t(::getpid()) << 16);
  try {
    apply_env();
    std::lock_guard lk(mu_);
    default_stream_ = start_stream();
  } catch (...) {
    ::munmap(arena_, arena_bytes_);
    throw;
  }
}

inline SimRuntime::~SimRuntime() {
  std::vector<std::shared_ptr<StreamState>> all;
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
    all.push_back(default_stream_);
    for (auto& [k, st] : streams_) all.push_back(st);
    for (auto& st : retired_) all.push_back(st);
    for (auto& st : all) st->cv.notify_all();
    progress_.notify_all();
  }
  for (auto& st : all) {
    if (st->worker.joinable()) st->worker.join();
  }
  for (auto& [p, bytes] : pinned_) std::free(reinterpret_cast<void*>(p));
  for (auto& [p, a] : device_)
    if (a.fd >= 0) ::close(a.fd);
  ::munmap(arena_, arena_bytes_);
}

inline void SimRuntime::apply_env() {
  const auto v = chorus::detail::env_string("CHORUS_SIM_FAIL");
  if (!v) return;
  std::string_view rest = *v;
  const auto bad = [&](std::string_view why) {
    return Error(ErrorCode::invalid_argument,
                 "CHORUS_SIM_FAIL='" + *v + "': " + std::string(why) + " (expected call:n:cuda_error[,...])");
  };
  while (!rest.empty()) {
    const std::size_t comma = rest.find(',');
    std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    const std::size_t c1 = item.find(':');
    const std::size_t c2 = c1 == std::string_view::npos ? c1 : item.find(':', c1 + 1);
    if (c2 == std::string_view::npos) throw bad("an entry is not call:n:cuda_error");
    try {
      const auto n = chorus::detail::parse_int(item.substr(c1 + 1, c2 - c1 - 1), "n", 1, 1 << 30);
      const auto e = chorus::detail::parse_int(item.substr(c2 + 1), "cuda_error", 1, 100000);
      fail_after(item.substr(0, c1), static_cast<int>(n), static_cast<int>(e));
    } catch (const Error& e) {
      std::string_view why = e.what();
      const std::string prefix = Error::format(ErrorCode::invalid_argument, "");
      if (why.starts_with(prefix)) why.remove_prefix(prefix.size());
      throw bad(why);
    }
  }
}

inline void SimRuntime::fail_after(std::string_view call, int n, int cuda_error) {
  if (std::find(std::begin(detail::kSimCalls), std::end(detail::kSimCalls), call) == std::end(detail::kSimCalls)) {
    std::string known;
    for (auto c : detail::kSimCalls) known += (known.empty() ? "" : ", ") + std::string(c);
    throw Error(ErrorCode::invalid_argument,
                "SimRuntime::fail_after: unknown call '" + std::string(call) + "' (one of " + known + ")");
  }
  if (n < 1 || cuda_error == 0)
    throw Error(ErrorCode::invalid_argument, "SimRuntime::fail_after: n must be >= 1 and the error not 0");
  std::lock_guard lk(mu_);
  injections_.insert_or_assign(std::string(call), Injection{n, cuda_error});
}

inline void SimRuntime::stall_after(std::string_view call, int n, std::chrono::milliseconds how_long) {
  const auto first_stream_call = std::begin(detail::kSimCalls) + 4;  // after the allocations and creations
  if (std::find(first_stream_call, std::end(detail::kSimCalls), call) == std::end(detail::kSimCalls) || n < 1)
    throw Error(ErrorCode::invalid_argument, "SimRuntime::stall_after: '" + std::string(call) +
                                                 "' is not a stream operation of the simulation, or n < 1");
  std::lock_guard lk(mu_);
  stalls_.insert_or_assign(std::string(call), std::pair{n, how_long});
}

inline int SimRuntime::take_injection(std::string_view call) {
  auto it = injections_.find(call);
  if (it == injections_.end()) return 0;
  if (--it->second.remaining > 0) return 0;
  const int e = it->second.cuda_error;
  injections_.erase(it);
  return e;
}

// --- devices -----------------------------------------------------------------------------------

inline void SimRuntime::set_device(int device) {
  if (device != 0)
    throw detail::cuda_error("cudaSetDevice", detail::kCudaInvalidDevice,
                             "device " + std::to_string(device) + " (the simulation has device 0 only)");
}

// --- memory ------------------------------------------------------------------------------------

inline bool SimRuntime::in_arena(const void* p) const noexcept {
  const auto a = reinterpret_cast<std::uintptr_t>(arena_);
  const auto q = reinterpret_cast<std::uintptr_t>(p);
  return q >= a && q - a < arena_bytes_;
}

inline const std::pair<const std::uintptr_t, SimRuntime::Allocation>* SimRuntime::device_allocation(
    const void* p) const {
  const auto q = reinterpret_cast<std::uintptr_t>(p);
  auto it = device_.upper_bound(q);
  if (it == device_.begin()) return nullptr;
  --it;
  return q - it->first < std::max<std::size_t>(it->second.bytes, 1) ? &*it : nullptr;
}

inline const std::pair<const std::uintptr_t, std::size_t>* SimRuntime::pinned_allocation(const void* p) const {
  const auto q = reinterpret_cast<std::uintptr_t>(p);
  auto it = pinned_.upper_bound(q);
  if (it == pinned_.begin()) return nullptr;
  --it;
  return q - it->first < std::max<std::size_t>(it->second, 1) ? &*it : nullptr;
}

inline MemoryKind SimRuntime::kind_of(const void* p) {
  std::lock_guard lk(mu_);
  return device_allocation(p) != nullptr ? MemoryKind::device : MemoryKind::host;
}

inline std::size_t SimRuntime::arena_take(std::size_t span) {
  // Next fit: the first free range that has room at or after rover_, else the first from the
  // start. Freed ranges are thus reused only once the arena has wrapped around.
  auto it = free_ranges_.upper_bound(rover_);
  if (it != free_ranges_.begin() && std::prev(it)->first + std::prev(it)->second > rover_) --it;
  std::size_t off = SIZE_MAX;
  for (; it != free_ranges_.end(); ++it) {
    const std::size_t from = std::max(it->first, rover_);
    if (it->first + it->second - from >= span) {
      off = from;
      break;
    }
  }
  if (off == SIZE_MAX) {
    for (it = free_ranges_.begin(); it != free_ranges_.end() && it->second < span; ++it) {
    }
    if (it == free_ranges_.end()) return SIZE_MAX;
    off = it->first;
  }
  const std::size_t r_off = it->first, r_len = it->second;
  free_ranges_.erase(it);
  if (off > r_off) free_ranges_.emplace(r_off, off - r_off);
  if (r_off + r_len > off + span) free_ranges_.emplace(off + span, r_off + r_len - off - span);
  rover_ = off + span;
  return off;
}

inline void SimRuntime::arena_give(std::size_t offset, std::size_t span) {
  auto next = free_ranges_.lower_bound(offset);
  if (next != free_ranges_.end() && next->first == offset + span) {
    span += next->second;
    next = free_ranges_.erase(next);
  }
  if (next != free_ranges_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      prev->second += span;
      return;
    }
  }
  free_ranges_.emplace(offset, span);
}

inline void* SimRuntime::alloc_device(std::size_t bytes) {
  std::lock_guard lk(mu_);
  if (const int e = take_injection("alloc_device")) throw detail::cuda_error("cudaMalloc", e, "injected");
  const std::size_t used = (std::max<std::size_t>(bytes, 1) + page_ - 1) / page_ * page_;
  if (bytes > arena_bytes_ || used + page_ > arena_bytes_)
    throw detail::cuda_error("cudaMalloc", detail::kCudaMemoryAllocation, std::to_string(bytes) + " bytes");
  const std::size_t span = used + page_;  // a guard page after each allocation
  const std::size_t off = arena_take(span);
  if (off == SIZE_MAX)
    throw detail::cuda_error("cudaMalloc", detail::kCudaMemoryAllocation,
                             std::to_string(bytes) + " bytes (the simulated device's arena is full)");
  if (::mprotect(arena_ + off, used, PROT_READ | PROT_WRITE) != 0) {
    arena_give(off, span);
    throw detail::cuda_error("cudaMalloc", detail::kCudaMemoryAllocation, std::strerror(errno));
  }
  device_.emplace(reinterpret_cast<std::uintptr_t>(arena_ + off), Allocation{bytes, span});
  return arena_ + off;
}

inline void SimRuntime::drain(std::unique_lock<std::mutex>& lk) {
  std::vector<std::pair<std::shared_ptr<StreamState>, std::uint64_t>> targets;
  targets.emplace_back(default_stream_, default_stream_->enqueued);
  for (auto& [k, st] : streams_) targets.emplace_back(st, st->enqueued);
  for (auto& st : retired_) targets.emplace_back(st, st->enqueued);
  progress_.wait(lk, [&] {
    return stopping_ || std::all_of(targets.begin(), targets.end(), [](const auto& t) {
             return t.first->completed >= t.second || t.first->exited;
           });
  });
}

inline void SimRuntime::free_device(void* p) {
  if (p == nullptr) return;
  std::size_t off = 0, span = 0;
  int fd = -1;
  {
    std::unique_lock lk(mu_);
    auto it = device_.find(reinterpret_cast<std::uintptr_t>(p));
    if (it == device_.end())
      throw detail::cuda_error("cudaFree", detail::kCudaInvalidValue,
                               detail::hex(p) + " is not the start of a live device allocation");
    drain(lk);  // cudaFree waits for the device
    it = device_.find(reinterpret_cast<std::uintptr_t>(p));
    if (it == device_.end())
      throw detail::cuda_error("cudaFree", detail::kCudaInvalidValue, detail::hex(p) + " was freed meanwhile");
    if (it->second.imported)
      throw detail::cuda_error("cudaFree", detail::kCudaInvalidValue,
                               detail::hex(p) + " was mapped by ipc_open: unmap it with ipc_close");
    off = static_cast<std::size_t>(static_cast<std::byte*>(p) - arena_);
    span = it->second.span;
    fd = it->second.fd;
    device_.erase(it);
  }
  release_range(off, span, fd);
}

inline void SimRuntime::release_range(std::size_t off, std::size_t span, int fd) {
  const std::size_t used = span - page_;
  {
    // No operation that passed its check on this range is still running.
    std::unique_lock wr(memory_rw_);
    if (fd >= 0) {
      // A memfd's mapping (exported or opened): the reservation's inaccessible anonymous mapping
      // goes back over it; the memfd's pages stay while another process maps them.
      ::mmap(arena_ + off, used, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    } else {
      ::madvise(arena_ + off, used, MADV_DONTNEED);
      ::mprotect(arena_ + off, used, PROT_NONE);
    }
  }
  if (fd >= 0) ::close(fd);
  std::lock_guard lk(mu_);
  arena_give(off, span);
}

// --- memory of other processes -------------------------------------------------------------------

inline bool SimRuntime::can_access_peer(int device, int peer_device) {
  if (device != 0 || peer_device != 0)
    throw detail::cuda_error("cudaDeviceCanAccessPeer", detail::kCudaInvalidDevice,
                             "devices " + std::to_string(device) + " and " + std::to_string(peer_device) +
                                 " (the simulation has device 0 only)");
  return true;
}

inline IpcHandle SimRuntime::ipc_export(void* base) {
  constexpr std::string_view call = "cudaIpcGetMemHandle";
  // Unique on memory_rw_: no operation touches the pages while they move into the memfd.
  std::unique_lock wr(memory_rw_);
  std::lock_guard lk(mu_);
  auto it = device_.find(reinterpret_cast<std::uintptr_t>(base));
  if (it == device_.end())
    throw detail::cuda_error(call, detail::kCudaInvalidValue,
                             detail::hex(base) + " is not the start of a live device allocation");
  Allocation& a = it->second;
  if (a.imported)
    throw detail::cuda_error(call, detail::kCudaInvalidValue,
                             detail::hex(base) + " was mapped from another process's handle (export it there)");
  memfd_of(base, a, call);
  detail::SimIpcHandle h{};
  std::memcpy(h.magic, detail::kSimIpcMagic, sizeof h.magic);
  h.pid = static_cast<std::int32_t>(::getpid());
  h.fd = a.fd;
  h.nonce = nonce_;
  h.serial = a.serial;
  h.bytes = a.bytes;
  IpcHandle out;
  std::memcpy(out.bytes.data(), &h, sizeof h);
  return out;
}

inline int SimRuntime::memfd_of(void* base, Allocation& a, std::string_view call) {
  if (a.fd >= 0) return a.fd;
  const std::size_t used = a.span - page_;
  const std::uint64_t serial = next_serial_++;
  const int fd = ::memfd_create(detail::sim_memfd_name(nonce_, serial).c_str(), MFD_CLOEXEC);
  if (fd < 0) throw detail::cuda_error(call, detail::kCudaMemoryAllocation, std::string("memfd_create: ") + std::strerror(errno));
  const auto fail = [&](const char* what) {
    const int e = errno;
    ::close(fd);
    return detail::cuda_error(call, detail::kCudaMemoryAllocation, std::string(what) + ": " + std::strerror(e));
  };
  if (::ftruncate(fd, static_cast<off_t>(used)) != 0) throw fail("ftruncate");
  for (std::size_t done = 0; done < used;) {
    const ssize_t n = ::pwrite(fd, static_cast<std::byte*>(base) + done, used - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw fail("pwrite");
    done += static_cast<std::size_t>(n);
  }
  if (::mmap(base, used, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) throw fail("mmap");
  a.fd = fd;
  a.serial = serial;
  return fd;
}

// --- device memory for an RDMA NIC (dma-buf) -------------------------------------------------------

inline Runtime::DmabufExport SimRuntime::export_dmabuf(void* p, std::size_t bytes) {
  constexpr std::string_view call = "cuMemGetHandleForAddressRange";
  if (refuse_dmabuf_.load(std::memory_order_relaxed))
    throw Error(ErrorCode::unsupported, "export_dmabuf: the simulated device refuses dma-buf export (refuse_dmabuf)");
  // Unique on memory_rw_: no operation touches the pages while they move into the memfd (the
  // first export of an allocation). Every registration of the allocation is made after that
  // move, so no RDMA write into it races with it.
  std::unique_lock wr(memory_rw_);
  std::lock_guard lk(mu_);
  const std::string why = check_device_range(p, bytes, "export_dmabuf");
  if (!why.empty()) throw detail::cuda_error(call, detail::kCudaInvalidValue, why);
  auto it = device_.find(device_allocation(p)->first);
  void* base = reinterpret_cast<void*>(it->first);
  const int fd = ::fcntl(memfd_of(base, it->second, call), F_DUPFD_CLOEXEC, 0);
  if (fd < 0) throw detail::cuda_error(call, detail::kCudaMemoryAllocation, std::string("dup: ") + std::strerror(errno));
  return {fd, static_cast<std::uint64_t>(static_cast<std::byte*>(p) - static_cast<std::byte*>(base))};
}

// --- end of device memory for an RDMA NIC (dma-buf) ------------------------------------------------

inline void* SimRuntime::ipc_open(const IpcHandle& handle) {
  constexpr std::string_view call = "cudaIpcOpenMemHandle";
  detail::SimIpcHandle h;
  std::memcpy(&h, handle.bytes.data(), sizeof h);
  if (std::memcmp(h.magic, detail::kSimIpcMagic, sizeof h.magic) != 0)
    throw detail::cuda_error(call, detail::kCudaInvalidValue, "not a handle of the simulated runtime");
  if (h.nonce == nonce_)
    throw detail::cuda_error(call, detail::kCudaInvalidValue,
                             "a handle of this runtime's own allocation (handles open in other processes only)");
  const std::string name = detail::sim_memfd_name(h.nonce, h.serial);
  const std::string path = "/proc/" + std::to_string(h.pid) + "/fd/" + std::to_string(h.fd);
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0)
    throw detail::cuda_error(call, detail::kCudaInvalidValue,
                             "the allocation of process " + std::to_string(h.pid) + " is gone (it was freed or the process exited: " +
                                 std::strerror(errno) + ")");
  const auto refuse = [&](const std::string& why) {
    ::close(fd);
    return detail::cuda_error(call, detail::kCudaInvalidValue, why);
  };
  // The descriptor's number may have been reused since: it must still name the exported memfd.
  char link[256] = {};
  const std::string self = "/proc/self/fd/" + std::to_string(fd);
  const ssize_t n = ::readlink(self.c_str(), link, sizeof link - 1);
  const std::string expect = "/memfd:" + name;
  if (n <= 0 || std::string_view(link, static_cast<std::size_t>(n)).substr(0, expect.size()) != expect)
    throw refuse("the allocation of process " + std::to_string(h.pid) + " is gone (it was freed)");
  const std::size_t used = (std::max<std::size_t>(h.bytes, 1) + page_ - 1) / page_ * page_;
  struct stat st {};
  if (::fstat(fd, &st) != 0 || static_cast<std::size_t>(st.st_size) < used)
    throw refuse("the exported memory is smaller than its handle says");
  std::lock_guard lk(mu_);
  const std::size_t span = used + page_;
  const std::size_t off = used + page_ > arena_bytes_ ? SIZE_MAX : arena_take(span);
  if (off == SIZE_MAX) {
    ::close(fd);
    throw detail::cuda_error(call, detail::kCudaMemoryAllocation, "the simulated device's arena is full");
  }
  if (::mmap(arena_ + off, used, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) {
    const int e = errno;
    arena_give(off, span);
    ::close(fd);
    throw detail::cuda_error(call, detail::kCudaMemoryAllocation, std::string("mmap: ") + std::strerror(e));
  }
  device_.emplace(reinterpret_cast<std::uintptr_t>(arena_ + off), Allocation{h.bytes, span, fd, true, h.serial});
  return arena_ + off;
}

inline void SimRuntime::ipc_close(void* p) {
  constexpr std::string_view call = "cudaIpcCloseMemHandle";
  std::size_t off = 0, span = 0;
  int fd = -1;
  {
    std::unique_lock lk(mu_);
    auto it = device_.find(reinterpret_cast<std::uintptr_t>(p));
    if (it == device_.end() || !it->second.imported)
      throw detail::cuda_error(call, detail::kCudaInvalidValue, detail::hex(p) + " was not mapped by ipc_open");
    drain(lk);
    it = device_.find(reinterpret_cast<std::uintptr_t>(p));
    if (it == device_.end())
      throw detail::cuda_error(call, detail::kCudaInvalidValue, detail::hex(p) + " was closed meanwhile");
    off = static_cast<std::size_t>(static_cast<std::byte*>(p) - arena_);
    span = it->second.span;
    fd = it->second.fd;
    device_.erase(it);
  }
  release_range(off, span, fd);
}

inline void* SimRuntime::alloc_pinned(std::size_t bytes) {
  std::lock_guard lk(mu_);
  if (const int e = take_injection("alloc_pinned")) throw detail::cuda_error("cudaHostAlloc", e, "injected");
  const std::size_t rounded = (std::max<std::size_t>(bytes, 1) + page_ - 1) / page_ * page_;
  void* p = std::aligned_alloc(page_, rounded);
  if (p == nullptr)
    throw detail::cuda_error("cudaHostAlloc", detail::kCudaMemoryAllocation, std::to_string(bytes) + " bytes");
  pinned_.emplace(reinterpret_cast<std::uintptr_t>(p), bytes);
  return p;
}

inline void SimRuntime::free_pinned(void* p) {
  if (p == nullptr) return;
  {
    std::unique_lock lk(mu_);
    auto it = pinned_.find(reinterpret_cast<std::uintptr_t>(p));
    if (it == pinned_.end())
      throw detail::cuda_error("cudaFreeHost", detail::kCudaInvalidValue,
                               detail::hex(p) + " is not the start of a live pinned allocation");
    drain(lk);
    it = pinned_.find(reinterpret_cast<std::uintptr_t>(p));
    if (it == pinned_.end())
      throw detail::cuda_error("cudaFreeHost", detail::kCudaInvalidValue, detail::hex(p) + " was freed meanwhile");
    pinned_.erase(it);
  }
  std::unique_lock wr(memory_rw_);
  std::free(p);
}

// --- streams and events --------------------------------------------------------------------------

inline std::shared_ptr<SimRuntime::StreamState> SimRuntime::start_stream() {
  auto st = std::make_shared<StreamState>();
  st->worker = std::thread([this, st] { run(st); });
  return st;
}

inline std::shared_ptr<SimRuntime::StreamState> SimRuntime::stream_of(Stream s, std::string_view call) {
  if (s == nullptr) return default_stream_;
  auto it = streams_.find(reinterpret_cast<const StreamState*>(s));
  if (it == streams_.end())
    throw detail::cuda_error(call, detail::kCudaInvalidHandle, "stream " + detail::hex(s) + " is not a live stream");
  return it->second;
}

inline std::shared_ptr<SimRuntime::EventState> SimRuntime::event_of(Event e, std::string_view call) {
  auto it = events_.find(reinterpret_cast<const EventState*>(e));
  if (it == events_.end())
    throw detail::cuda_error(call, detail::kCudaInvalidHandle, "event " + detail::hex(e) + " is not a live event");
  return it->second;
}

inline void SimRuntime::throw_if_failed(const StreamState& st) {
  if (st.error)
    throw Error(means_no_gpu(st.error->cuda_error) ? ErrorCode::unsupported : ErrorCode::system, st.error->text);
}

inline void SimRuntime::reap_retired() {
  for (auto it = retired_.begin(); it != retired_.end();) {
    if ((*it)->exited && (*it)->worker.joinable()) {
      (*it)->worker.join();  // it has exited: returns at once
      it = retired_.erase(it);
    } else {
      ++it;
    }
  }
}

inline Stream SimRuntime::create_stream() {
  std::lock_guard lk(mu_);
  if (const int e = take_injection("create_stream"))
    throw detail::cuda_error("cudaStreamCreateWithFlags", e, "injected");
  reap_retired();
  auto st = start_stream();
  const StreamState* key = st.get();
  streams_.emplace(key, std::move(st));
  return reinterpret_cast<Stream>(const_cast<StreamState*>(key));
}

inline void SimRuntime::destroy_stream(Stream s) {
  std::lock_guard lk(mu_);
  if (s == nullptr)
    throw detail::cuda_error("cudaStreamDestroy", detail::kCudaInvalidHandle, "the null stream is not destroyed");
  auto st = stream_of(s, "cudaStreamDestroy");
  streams_.erase(st.get());
  // Like CUDA: returns at once; what is queued still runs, then the worker ends.
  st->closing = true;
  st->cv.notify_all();
  retired_.push_back(std::move(st));
  reap_retired();
}

inline Event SimRuntime::create_event(bool timing) {
  std::lock_guard lk(mu_);
  if (const int e = take_injection("create_event")) throw detail::cuda_error("cudaEventCreateWithFlags", e, "injected");
  auto ev = std::make_shared<EventState>();
  ev->timing = timing;
  const EventState* key = ev.get();
  events_.emplace(key, std::move(ev));
  return reinterpret_cast<Event>(const_cast<EventState*>(key));
}

inline void SimRuntime::destroy_event(Event e) {
  std::lock_guard lk(mu_);
  auto ev = event_of(e, "cudaEventDestroy");
  events_.erase(ev.get());  // a record still queued keeps its state alive
}

inline void SimRuntime::record(Event e, Stream s) {
  std::lock_guard lk(mu_);
  auto ev = event_of(e, "cudaEventRecord");
  auto st = stream_of(s, "cudaEventRecord");
  throw_if_failed(*st);
  Op op(OpKind::record);
  op.event = ev;
  op.generation = ++ev->generation;
  ev->stream = st;
  ev->stamped = false;
  st->queue.push_back(std::move(op));
  ev->position = ++st->enqueued;
  st->cv.notify_one();
}

inline bool SimRuntime::query(Event e) {
  std::lock_guard lk(mu_);
  auto ev = event_of(e, "cudaEventQuery");
  if (!ev->stream) return true;  // never recorded: complete, as in CUDA
  throw_if_failed(*ev->stream);
  return ev->stream->completed >= ev->position;
}

inline void SimRuntime::synchronize(Event e) {
  std::unique_lock lk(mu_);
  auto ev = event_of(e, "cudaEventSynchronize");
  if (!ev->stream) return;
  auto st = ev->stream;
  const std::uint64_t target = ev->position;
  progress_.wait(lk, [&] { return stopping_ || st->completed >= target || st->exited; });
  throw_if_failed(*st);
}

inline void SimRuntime::synchronize(Stream s) {
  std::unique_lock lk(mu_);
  auto st = stream_of(s, "cudaStreamSynchronize");
  const std::uint64_t target = st->enqueued;
  progress_.wait(lk, [&] { return stopping_ || st->completed >= target || st->exited; });
  throw_if_failed(*st);
}

inline void SimRuntime::wait(Stream s, Event e) {
  std::lock_guard lk(mu_);
  auto ev = event_of(e, "cudaStreamWaitEvent");
  auto st = stream_of(s, "cudaStreamWaitEvent");
  throw_if_failed(*st);
  if (!ev->stream) return;  // never recorded: nothing to wait for
  Op op(OpKind::wait_event);
  op.target = ev->stream;
  op.position = ev->position;
  st->queue.push_back(std::move(op));
  ++st->enqueued;
  st->cv.notify_one();
}

inline float SimRuntime::elapsed_ms(Event start, Event end) {
  std::lock_guard lk(mu_);
  auto a = event_of(start, "cudaEventElapsedTime");
  auto b = event_of(end, "cudaEventElapsedTime");
  if (!a->timing || !b->timing || !a->stream || !b->stream)
    throw detail::cuda_error("cudaEventElapsedTime", detail::kCudaInvalidHandle,
                             "both events must be timing events that have been recorded");
  throw_if_failed(*a->stream);
  throw_if_failed(*b->stream);
  if (!a->stamped || !b->stamped) throw detail::cuda_error("cudaEventElapsedTime", detail::kCudaNotReady);
  return std::chrono::duration<float, std::milli>(b->when - a->when).count();
}

// --- work enqueued on a stream -------------------------------------------------------------------

inline void SimRuntime::enqueue(Stream s, std::string_view call, Op op) {
  std::lock_guard lk(mu_);
  auto st = stream_of(s, detail::sim_call_name(call));
  throw_if_failed(*st);
  op.inject = take_injection(call);
  if (auto it = stalls_.find(call); it != stalls_.end() && --it->second.first == 0) {
    op.stall = it->second.second;
    stalls_.erase(it);
  }
  st->queue.push_back(std::move(op));
  ++st->enqueued;
  st->cv.notify_one();
}

inline void SimRuntime::copy(void* dst, const void* src, std::size_t bytes, Stream s) {
  if (bytes == 0) return;
  Op op(OpKind::copy);
  op.dst = dst;
  op.a = src;
  op.bytes = bytes;
  enqueue(s, "copy", std::move(op));
}

inline void SimRuntime::fill(void* dst, int byte, std::size_t bytes, Stream s) {
  if (bytes == 0) return;
  Op op(OpKind::fill);
  op.dst = dst;
  op.value = byte;
  op.bytes = bytes;
  enqueue(s, "fill", std::move(op));
}

inline void SimRuntime::reduce(ReduceOp rop, DataType dt, void* out, const void* a, const void* b,
                               std::size_t count, Stream s) {
  const std::size_t size = size_of(dt);
  if (size == 0 || !is_valid_op(dt, rop) || count > SIZE_MAX / size)
    throw detail::cuda_error("reduce_async", detail::kCudaInvalidValue,
                             "op " + std::to_string(static_cast<int>(rop)) + " on DataType " +
                                 std::to_string(static_cast<int>(dt)) + ", count " + std::to_string(count));
  if (count == 0) return;
  Op op(OpKind::reduce);
  op.dst = out;
  op.a = a;
  op.b = b;
  op.bytes = count;
  op.op = rop;
  op.dt = dt;
  enqueue(s, "reduce", std::move(op));
}

inline void SimRuntime::reduce_many(ReduceOp rop, DataType dt, void* out, const void* const* srcs, int n,
                                    std::size_t count, Stream s) {
  check_reduce_many_inputs(srcs, n, "reduce_many");
  const std::size_t size = size_of(dt);
  if (size == 0 || !is_valid_op(dt, rop) || count > SIZE_MAX / size)
    throw detail::cuda_error("reduce_many_async", detail::kCudaInvalidValue,
                             "op " + std::to_string(static_cast<int>(rop)) + " on DataType " +
                                 std::to_string(static_cast<int>(dt)) + ", count " + std::to_string(count));
  if (count == 0) return;
  Op op(OpKind::reduce_many);
  op.dst = out;
  for (int k = 0; k < n; ++k) op.srcs[static_cast<std::size_t>(k)] = srcs[k];  // read now: the caller's array may go
  op.value = n;
  op.bytes = count;
  op.op = rop;
  op.dt = dt;
  enqueue(s, "reduce_many", std::move(op));
}

inline void SimRuntime::finalize_avg(DataType dt, void* data, std::size_t count, int world_size, Stream s) {
  const std::size_t size = size_of(dt);
  if (size == 0 || world_size <= 0 || count > SIZE_MAX / size)
    throw detail::cuda_error("finalize_avg_async", detail::kCudaInvalidValue,
                             "DataType " + std::to_string(static_cast<int>(dt)) + ", world size " +
                                 std::to_string(world_size) + ", count " + std::to_string(count));
  if (count == 0) return;
  Op op(OpKind::finalize_avg);
  op.dst = data;
  op.bytes = count;
  op.dt = dt;
  op.value = world_size;
  enqueue(s, "finalize_avg", std::move(op));
}

inline void SimRuntime::wait_flag(Stream s, const std::uint32_t* flag, std::uint64_t timeout_ns) {
  {
    std::lock_guard lk(mu_);
    const auto* pin = pinned_allocation(flag);
    if (flag == nullptr || reinterpret_cast<std::uintptr_t>(flag) % alignof(std::uint32_t) != 0 || pin == nullptr ||
        reinterpret_cast<std::uintptr_t>(flag) + sizeof(std::uint32_t) > pin->first + pin->second)
      throw detail::cuda_error("cudaHostGetDevicePointer", detail::kCudaInvalidValue,
                               "the flag " + detail::hex(flag) + " is not an aligned word of pinned memory");
  }
  Op op(OpKind::wait_flag);
  op.a = flag;
  op.timeout_ns = timeout_ns;
  enqueue(s, "wait_flag", std::move(op));
}

inline void SimRuntime::write_value(Stream s, std::uint64_t* word, std::uint64_t value) {
  {
    std::lock_guard lk(mu_);
    const std::string why = check_device_word(word, sizeof *word, "write_value: the word");
    if (!why.empty()) throw detail::cuda_error("cudaLaunchKernel", detail::kCudaInvalidValue, why);
  }
  Op op(OpKind::write_value);
  op.dst = word;
  op.word_value = value;
  enqueue(s, "write_value", std::move(op));
}

inline void SimRuntime::wait_value(Stream s, const std::uint64_t* word, std::uint64_t value, std::uint32_t* abort,
                                   std::uint32_t on_timeout, std::uint64_t timeout_ns) {
  {
    std::lock_guard lk(mu_);
    std::string why = check_device_word(word, sizeof *word, "wait_value: the word");
    const auto* pin = pinned_allocation(abort);
    if (why.empty() && (abort == nullptr || reinterpret_cast<std::uintptr_t>(abort) % alignof(std::uint32_t) != 0 ||
                        pin == nullptr ||
                        reinterpret_cast<std::uintptr_t>(abort) + sizeof(std::uint32_t) > pin->first + pin->second))
      why = "wait_value: the abort word " + detail::hex(abort) + " is not an aligned word of pinned memory";
    if (why.empty() && on_timeout == 0) why = "wait_value: on_timeout is 0";
    if (!why.empty()) throw detail::cuda_error("cudaLaunchKernel", detail::kCudaInvalidValue, why);
  }
  Op op(OpKind::wait_value);
  op.a = word;
  op.b = abort;
  op.word_value = value;
  op.value = static_cast<int>(on_timeout);
  op.timeout_ns = timeout_ns;
  enqueue(s, "wait_value", std::move(op));
}

// --- the workers ---------------------------------------------------------------------------------

inline void SimRuntime::run(const std::shared_ptr<StreamState>& st) {
  std::unique_lock lk(mu_);
  for (;;) {
    st->cv.wait(lk, [&] { return stopping_ || !st->queue.empty() || st->closing; });
    if (stopping_) break;  // destruction drops what is queued
    if (st->queue.empty()) break;  // closing, and nothing left
    Op op = std::move(st->queue.front());
    st->queue.pop_front();
    if (op.stall.count() > 0) st->cv.wait_for(lk, op.stall, [&] { return stopping_; });
    if (!st->error && !stopping_) execute(*st, op, lk);
    ++st->completed;
    progress_.notify_all();
  }
  st->exited = true;
  progress_.notify_all();
}

inline void SimRuntime::execute(StreamState& st, Op& op, std::unique_lock<std::mutex>& lk) {
  switch (op.kind) {
    case OpKind::record:
      if (op.event->generation == op.generation) {
        op.event->when = std::chrono::steady_clock::now();
        op.event->stamped = true;
      }
      return;
    case OpKind::wait_event: {
      auto& t = *op.target;
      progress_.wait(lk, [&] { return stopping_ || t.completed >= op.position || t.exited; });
      return;
    }
    case OpKind::wait_flag:
      if (op.inject != 0) {
        st.error = StreamError{op.inject, detail::cuda_error_text("cudaLaunchKernel", op.inject, "injected")};
        return;
      }
      wait_for_flag(st, op, lk);
      return;
    case OpKind::write_value:
    case OpKind::wait_value:
      if (op.inject != 0) {
        st.error = StreamError{op.inject, detail::cuda_error_text("cudaLaunchKernel", op.inject, "injected")};
        return;
      }
      if (op.kind == OpKind::write_value)
        store_word(st, op, lk);
      else
        wait_for_value(st, op, lk);
      return;
    default: execute_memory(st, op, lk); return;
  }
}

inline void SimRuntime::execute_memory(StreamState& st, Op& op, std::unique_lock<std::mutex>& lk) {
  std::string_view call;
  switch (op.kind) {
    case OpKind::copy: call = "cudaMemcpyAsync"; break;
    case OpKind::fill: call = "cudaMemsetAsync"; break;
    case OpKind::reduce: call = "reduce_async"; break;
    case OpKind::reduce_many: call = "reduce_many_async"; break;
    default: call = "finalize_avg_async"; break;
  }
  if (op.inject != 0) {
    st.error = StreamError{op.inject, detail::cuda_error_text(call, op.inject, "injected")};
    return;
  }
  // Lock order: memory_rw_ before mu_. Held shared while the bytes move, so that no free
  // returns the memory under this operation.
  lk.unlock();
  std::shared_lock rd(memory_rw_);
  lk.lock();
  std::string why;
  int code = detail::kCudaInvalidValue;
  if (op.kind == OpKind::copy) {
    why = check_any_range(op.dst, op.bytes, "destination");
    if (why.empty()) why = check_any_range(op.a, op.bytes, "source");
  } else if (op.kind == OpKind::fill) {
    why = check_any_range(op.dst, op.bytes, "destination");
  } else {
    code = detail::kCudaIllegalAddress;
    const std::size_t bytes = op.bytes * size_of(op.dt);
    why = check_device_range(op.dst, bytes, op.kind == OpKind::finalize_avg ? "data" : "out");
    if (why.empty() && op.kind == OpKind::reduce) why = check_device_range(op.a, bytes, "a");
    if (why.empty() && op.kind == OpKind::reduce) why = check_device_range(op.b, bytes, "b");
    for (int k = 0; why.empty() && op.kind == OpKind::reduce_many && k < op.value; ++k)
      why = check_device_range(op.srcs[static_cast<std::size_t>(k)], bytes, "srcs[" + std::to_string(k) + "]");
  }
  if (!why.empty()) {
    st.error = StreamError{code, detail::cuda_error_text(call, code, why)};
    return;
  }
  lk.unlock();
  std::optional<std::string> failed;
  try {
    switch (op.kind) {
      case OpKind::copy: std::memmove(op.dst, op.a, op.bytes); break;
      case OpKind::fill: std::memset(op.dst, op.value, op.bytes); break;
      case OpKind::reduce: detail::sim_kernels::emulate_reduce(op.op, op.dt, op.dst, op.a, op.b, op.bytes); break;
      case OpKind::reduce_many:
        detail::sim_kernels::emulate_reduce_many(op.op, op.dt, op.dst, op.srcs.data(), op.value, op.bytes);
        break;
      default: detail::sim_kernels::emulate_finalize_avg(op.dt, op.dst, op.bytes, op.value); break;
    }
  } catch (const std::exception& e) {
    failed = e.what();
  }
  rd.unlock();
  lk.lock();
  if (failed) st.error = StreamError{detail::kCudaInvalidValue, detail::cuda_error_text(call, 1, *failed)};
}

inline void SimRuntime::wait_for_flag(StreamState& st, const Op& op, std::unique_lock<std::mutex>& lk) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::nanoseconds(op.timeout_ns);
  auto pause = std::chrono::duration_cast<std::chrono::nanoseconds>(kFlagPollMin);
  auto* word = const_cast<std::uint32_t*>(static_cast<const std::uint32_t*>(op.a));
  for (;;) {
    if (stopping_) return;
    // Under mu_: the flag's pinned buffer cannot be freed between this check and the load.
    if (pinned_allocation(word) == nullptr) {
      st.error = StreamError{detail::kCudaIllegalAddress,
                             detail::cuda_error_text("cudaLaunchKernel", detail::kCudaIllegalAddress,
                                                     "wait_flag: the flag's pinned memory was freed")};
      return;
    }
    if (std::atomic_ref<std::uint32_t>(*word).load(std::memory_order_acquire) != 0) return;
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return;  // gives up; the caller reports the failure its own way
    const auto step = std::min<std::chrono::nanoseconds>(pause, deadline - now);
    st.cv.wait_for(lk, step, [&] { return stopping_; });
    pause = std::min<std::chrono::nanoseconds>(pause * 2, kFlagPollMax);
  }
}

inline void SimRuntime::store_word(StreamState& st, const Op& op, std::unique_lock<std::mutex>& lk) {
  // Under mu_: the allocation cannot be unmapped between the check and the store. The work
  // before it on this stream is done (one worker runs the stream in order): the release store
  // publishes its writes to the processes that map the word.
  const std::string why = check_device_word(op.dst, sizeof(std::uint64_t), "write_value: the word");
  if (!why.empty()) {
    st.error = StreamError{detail::kCudaIllegalAddress,
                           detail::cuda_error_text("cudaLaunchKernel", detail::kCudaIllegalAddress, why)};
    return;
  }
  (void)lk;
  std::atomic_ref<std::uint64_t>(*static_cast<std::uint64_t*>(op.dst)).store(op.word_value, std::memory_order_release);
}

inline void SimRuntime::wait_for_value(StreamState& st, const Op& op, std::unique_lock<std::mutex>& lk) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::nanoseconds(op.timeout_ns);
  auto pause = std::chrono::duration_cast<std::chrono::nanoseconds>(kFlagPollMin);
  auto* word = const_cast<std::uint64_t*>(static_cast<const std::uint64_t*>(op.a));
  auto* abort = const_cast<std::uint32_t*>(static_cast<const std::uint32_t*>(op.b));
  for (;;) {
    if (stopping_) return;
    // Under mu_: neither the word's mapping nor the abort word can go between these checks and
    // the loads.
    std::string why = check_device_word(word, sizeof *word, "wait_value: the word");
    if (why.empty() && pinned_allocation(abort) == nullptr) why = "wait_value: the abort word's pinned memory was freed";
    if (!why.empty()) {
      st.error = StreamError{detail::kCudaIllegalAddress,
                             detail::cuda_error_text("cudaLaunchKernel", detail::kCudaIllegalAddress, why)};
      return;
    }
    if (std::atomic_ref<std::uint64_t>(*word).load(std::memory_order_acquire) >= op.word_value) return;
    std::atomic_ref<std::uint32_t> gave_up(*abort);
    if (gave_up.load(std::memory_order_acquire) != 0) return;
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      gave_up.store(static_cast<std::uint32_t>(op.value), std::memory_order_release);
      return;
    }
    const auto step = std::min<std::chrono::nanoseconds>(pause, deadline - now);
    st.cv.wait_for(lk, step, [&] { return stopping_; });
    pause = std::min<std::chrono::nanoseconds>(pause * 2, kValuePollMax);
  }
}

// --- checks --------------------------------------------------------------------------------------

inline std::string SimRuntime::check_device_range(const void* p, std::size_t bytes, std::string_view what) const {
  const auto* a = device_allocation(p);
  const std::string range = std::string(what) + " [" + detail::hex(p) + ", +" + std::to_string(bytes) + ")";
  if (a == nullptr) return range + " is not in a live device allocation";
  if (reinterpret_cast<std::uintptr_t>(p) - a->first > a->second.bytes ||
      bytes > a->second.bytes - (reinterpret_cast<std::uintptr_t>(p) - a->first))
    return range + " runs past the end of its device allocation (" + std::to_string(a->second.bytes) + " bytes)";
  return {};
}

inline std::string SimRuntime::check_device_word(const void* p, std::size_t bytes, std::string_view what) const {
  if (reinterpret_cast<std::uintptr_t>(p) % bytes != 0)
    return std::string(what) + " " + detail::hex(p) + " is not aligned to " + std::to_string(bytes) + " bytes";
  return check_device_range(p, bytes, what);
}

inline std::string SimRuntime::check_any_range(const void* p, std::size_t bytes, std::string_view what) const {
  if (in_arena(p)) return check_device_range(p, bytes, what);
  if (p == nullptr) return std::string(what) + " is null";
  if (const auto* pin = pinned_allocation(p)) {
    const std::size_t at = reinterpret_cast<std::uintptr_t>(p) - pin->first;
    if (at > pin->second || bytes > pin->second - at)
      return std::string(what) + " [" + detail::hex(p) + ", +" + std::to_string(bytes) +
             ") runs past the end of its pinned allocation (" + std::to_string(pin->second) + " bytes)";
  }
  return {};
}

}  // namespace chorus::device
