// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// device::SimRuntime (testing/sim_runtime.hpp): memory shared between processes. Peer access, IPC
/// handles (an allocation's pages moved into a memfd, which another process opens through
/// /proc/<pid>/fd and maps into its own arena) and dma-buf export (a dup of that memfd).

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>

#include "chorus/testing/sim_runtime.hpp"

namespace chorus::device {

namespace detail {
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
}  // namespace detail

// --- memory of other processes -------------------------------------------------------------------

CHORUS_DETAIL_SIM_INLINE bool SimRuntime::can_access_peer(int device, int peer_device) {
  if (device != 0 || peer_device != 0)
    throw detail::cuda_error("cudaDeviceCanAccessPeer", detail::kCudaInvalidDevice,
                             "devices " + std::to_string(device) + " and " + std::to_string(peer_device) +
                                 " (the simulation has device 0 only)");
  return true;
}

CHORUS_DETAIL_SIM_INLINE IpcHandle SimRuntime::ipc_export(void* base) {
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

CHORUS_DETAIL_SIM_INLINE int SimRuntime::memfd_of(void* base, Allocation& a, std::string_view call) {
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

CHORUS_DETAIL_SIM_INLINE void* SimRuntime::ipc_open(const IpcHandle& handle) {
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

CHORUS_DETAIL_SIM_INLINE void SimRuntime::ipc_close(void* p) {
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

// --- device memory for an RDMA NIC (dma-buf) -------------------------------------------------------

CHORUS_DETAIL_SIM_INLINE Runtime::DmabufExport SimRuntime::export_dmabuf(void* p, std::size_t bytes) {
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

}  // namespace chorus::device
