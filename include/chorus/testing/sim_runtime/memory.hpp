// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// device::SimRuntime (testing/sim_runtime.hpp): its memory. Construction (the arena reserved) and
/// destruction, the one device, device memory from the arena (next fit, a guard page after each
/// allocation), pinned memory, and the checks every operation makes on the memory it touches.

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <random>
#include <string>

#include "chorus/testing/sim_runtime.hpp"

namespace chorus::device {

CHORUS_DETAIL_SIM_INLINE SimRuntime::SimRuntime(std::size_t arena_bytes) {
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

CHORUS_DETAIL_SIM_INLINE SimRuntime::~SimRuntime() {
  std::vector<std::shared_ptr<StreamState>> all;
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
    for (std::uint32_t* abort : running_aborts_) __atomic_store_n(abort, 1u, __ATOMIC_RELEASE);
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
  for (const Deferred& d : deferred_)
    if (d.fd >= 0) ::close(d.fd);
  ::munmap(arena_, arena_bytes_);
}

// --- devices -----------------------------------------------------------------------------------

CHORUS_DETAIL_SIM_INLINE void SimRuntime::set_device(int device) {
  if (device != 0)
    throw detail::cuda_error("cudaSetDevice", detail::kCudaInvalidDevice,
                             "device " + std::to_string(device) + " (the simulation has device 0 only)");
}

// --- memory ------------------------------------------------------------------------------------

CHORUS_DETAIL_SIM_INLINE bool SimRuntime::in_arena(const void* p) const noexcept {
  const auto a = reinterpret_cast<std::uintptr_t>(arena_);
  const auto q = reinterpret_cast<std::uintptr_t>(p);
  return q >= a && q - a < arena_bytes_;
}

CHORUS_DETAIL_SIM_INLINE const std::pair<const std::uintptr_t, SimRuntime::Allocation>* SimRuntime::device_allocation(
    const void* p) const {
  const auto q = reinterpret_cast<std::uintptr_t>(p);
  auto it = device_.upper_bound(q);
  if (it == device_.begin()) return nullptr;
  --it;
  return q - it->first < std::max<std::size_t>(it->second.bytes, 1) ? &*it : nullptr;
}

CHORUS_DETAIL_SIM_INLINE const std::pair<const std::uintptr_t, std::size_t>* SimRuntime::pinned_allocation(const void* p) const {
  const auto q = reinterpret_cast<std::uintptr_t>(p);
  auto it = pinned_.upper_bound(q);
  if (it == pinned_.begin()) return nullptr;
  --it;
  return q - it->first < std::max<std::size_t>(it->second, 1) ? &*it : nullptr;
}

CHORUS_DETAIL_SIM_INLINE MemoryKind SimRuntime::kind_of(const void* p) {
  std::lock_guard lk(mu_);
  return device_allocation(p) != nullptr ? MemoryKind::device : MemoryKind::host;
}

CHORUS_DETAIL_SIM_INLINE std::size_t SimRuntime::arena_take(std::size_t span) {
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

CHORUS_DETAIL_SIM_INLINE void SimRuntime::arena_give(std::size_t offset, std::size_t span) {
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

CHORUS_DETAIL_SIM_INLINE void* SimRuntime::alloc_device(std::size_t bytes) {
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

CHORUS_DETAIL_SIM_INLINE void SimRuntime::drain(std::unique_lock<std::mutex>& lk) {
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

CHORUS_DETAIL_SIM_INLINE void SimRuntime::free_device(void* p) {
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
  release_deferred(true);
}

CHORUS_DETAIL_SIM_INLINE void* SimRuntime::alloc_device_async(std::size_t bytes, Stream s) {
  {
    std::lock_guard lk(mu_);
    (void)stream_of(s, "cudaMallocAsync");  // an unknown stream is an error, as in CUDA
  }
  return alloc_device(bytes);  // usable at once, so by the stream's later work too
}

CHORUS_DETAIL_SIM_INLINE void SimRuntime::free_device_async(void* p, Stream s) {
  if (p == nullptr) return;
  {
    std::lock_guard lk(mu_);
    auto it = device_.find(reinterpret_cast<std::uintptr_t>(p));
    if (it == device_.end() || it->second.imported)
      throw detail::cuda_error(
          "cudaFreeAsync", detail::kCudaInvalidValue,
          detail::hex(p) + " is not the start of a live device allocation of this runtime");
  }
  Op op(OpKind::free_memory);
  op.dst = p;
  enqueue(s, "free_device_async", std::move(op));
}

/// The stream's worker at a free_device_async (mu_ held on entry and on return): the allocation
/// stops being device memory at once (a later use fails its check); its pages go back when no
/// operation holds memory_rw_ (now, or at a later free), since a collective kernel of another
/// stream may hold it shared while it waits for work queued behind this free (a deadlock if the
/// free waited for it).
CHORUS_DETAIL_SIM_INLINE void SimRuntime::free_in_stream(StreamState& st, void* p,
                                                         std::unique_lock<std::mutex>& lk) {
  auto it = device_.find(reinterpret_cast<std::uintptr_t>(p));
  if (it == device_.end()) {
    st.error = StreamError{
        detail::kCudaInvalidValue,
        detail::cuda_error_text("cudaFreeAsync", detail::kCudaInvalidValue,
                                detail::hex(p) + " was freed before the stream reached its free")};
    return;
  }
  const auto off = static_cast<std::size_t>(static_cast<std::byte*>(p) - arena_);
  const std::size_t span = it->second.span;
  const int fd = it->second.fd;
  device_.erase(it);
  deferred_.push_back({off, span, fd});
  lk.unlock();
  release_deferred(false);
  lk.lock();
}

/// Returns the pages of the in-stream frees not yet returned, waiting for memory_rw_ (`wait`), or
/// only if no operation holds it.
CHORUS_DETAIL_SIM_INLINE void SimRuntime::release_deferred(bool wait) {
  std::unique_lock wr(memory_rw_, std::defer_lock);
  if (wait) {
    wr.lock();
  } else if (!wr.try_lock()) {
    return;
  }
  std::lock_guard lk(mu_);
  for (const Deferred& d : deferred_) {
    unmap_pages(d.off, d.span, d.fd);
    if (d.fd >= 0) ::close(d.fd);
    arena_give(d.off, d.span);
  }
  deferred_.clear();
}

CHORUS_DETAIL_SIM_INLINE void SimRuntime::release_range(std::size_t off, std::size_t span, int fd) {
  {
    // No operation that passed its check on this range is still running.
    std::unique_lock wr(memory_rw_);
    unmap_pages(off, span, fd);
  }
  if (fd >= 0) ::close(fd);
  std::lock_guard lk(mu_);
  arena_give(off, span);
}

CHORUS_DETAIL_SIM_INLINE void SimRuntime::unmap_pages(std::size_t off, std::size_t span, int fd) {
  const std::size_t used = span - page_;
  if (fd >= 0) {
    // A memfd's mapping (exported or opened): the reservation's inaccessible anonymous mapping
    // goes back over it; the memfd's pages stay while another process maps them.
    ::mmap(arena_ + off, used, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
  } else {
    ::madvise(arena_ + off, used, MADV_DONTNEED);
    ::mprotect(arena_ + off, used, PROT_NONE);
  }
}

// --- pinned memory -------------------------------------------------------------------------------

CHORUS_DETAIL_SIM_INLINE void* SimRuntime::alloc_pinned(std::size_t bytes) {
  std::lock_guard lk(mu_);
  if (const int e = take_injection("alloc_pinned")) throw detail::cuda_error("cudaHostAlloc", e, "injected");
  const std::size_t rounded = (std::max<std::size_t>(bytes, 1) + page_ - 1) / page_ * page_;
  void* p = std::aligned_alloc(page_, rounded);
  if (p == nullptr)
    throw detail::cuda_error("cudaHostAlloc", detail::kCudaMemoryAllocation, std::to_string(bytes) + " bytes");
  pinned_.emplace(reinterpret_cast<std::uintptr_t>(p), bytes);
  return p;
}

CHORUS_DETAIL_SIM_INLINE void SimRuntime::free_pinned(void* p) {
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

// --- checks --------------------------------------------------------------------------------------

CHORUS_DETAIL_SIM_INLINE std::string SimRuntime::check_device_range(const void* p, std::size_t bytes, std::string_view what) const {
  const auto* a = device_allocation(p);
  const std::string range = std::string(what) + " [" + detail::hex(p) + ", +" + std::to_string(bytes) + ")";
  if (a == nullptr) return range + " is not in a live device allocation";
  if (reinterpret_cast<std::uintptr_t>(p) - a->first > a->second.bytes ||
      bytes > a->second.bytes - (reinterpret_cast<std::uintptr_t>(p) - a->first))
    return range + " runs past the end of its device allocation (" + std::to_string(a->second.bytes) + " bytes)";
  return {};
}

CHORUS_DETAIL_SIM_INLINE std::string SimRuntime::check_device_word(const void* p, std::size_t bytes, std::string_view what) const {
  if (reinterpret_cast<std::uintptr_t>(p) % bytes != 0)
    return std::string(what) + " " + detail::hex(p) + " is not aligned to " + std::to_string(bytes) + " bytes";
  return check_device_range(p, bytes, what);
}

CHORUS_DETAIL_SIM_INLINE std::string SimRuntime::check_any_range(const void* p, std::size_t bytes, std::string_view what) const {
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
