// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// Byte ranges as links see them, with the kind of memory they live in. Host memory is all the
/// tcp, shm and cuda_ipc links take; rdma links also take device memory (dma-buf, above the eager
/// size; docs/transports.md). cuda_ipc's device path reads IPC windows, not links.

#include <cstddef>
#include <cstdint>
#include <span>

namespace chorus {

/// The largest message a link carries (2^46 bytes): the transports refuse larger ones, and a
/// collective whose buffers would be larger is rejected before it starts.
inline constexpr std::uint64_t kMaxMessageBytes = std::uint64_t(1) << 46;

enum class MemoryKind { host, device };

struct ConstBytes {
  const std::byte* data = nullptr;
  std::size_t size = 0;
  MemoryKind kind = MemoryKind::host;
};

struct MutableBytes {
  std::byte* data = nullptr;
  std::size_t size = 0;
  MemoryKind kind = MemoryKind::host;
};

template <class T>
ConstBytes as_bytes(std::span<const T> s, MemoryKind k = MemoryKind::host) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size_bytes(), k};
}
template <class T>
MutableBytes as_writable_bytes(std::span<T> s, MemoryKind k = MemoryKind::host) {
  return {reinterpret_cast<std::byte*>(s.data()), s.size_bytes(), k};
}

}  // namespace chorus
