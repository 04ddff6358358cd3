// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// Memory for the handlers of one link's asynchronous operations. Asio allocates an operation
/// object for every read, write and post, through the completion handler's associated allocator;
/// by default it recycles memory only within one run()/poll() call, and the thread that waits
/// calls poll() many times, so each message would cost heap allocations. Handlers bound with
/// bind_memory() take their operation from the link's HandlerMemory instead: kBlocks blocks of
/// kBlockBytes, reused; a larger request, or one more while all are in use, goes to the heap.
/// Thread-safe: posts come from any thread, and completions free their memory on the thread that
/// runs the io_context.

#include <array>
#include <cstddef>
#include <mutex>
#include <new>
#include <utility>

#include "chorus/detail/asio.hpp"

namespace chorus::tcp::detail {

class HandlerMemory {
 public:
  static constexpr std::size_t kBlockBytes = 512;
  static constexpr std::size_t kBlocks = 8;

  HandlerMemory() {
    for (std::size_t i = 0; i < kBlocks; ++i) free_[i] = static_cast<unsigned char>(i);
  }
  HandlerMemory(const HandlerMemory&) = delete;
  HandlerMemory& operator=(const HandlerMemory&) = delete;

  void* allocate(std::size_t n) {
    if (n <= kBlockBytes) {
      std::lock_guard lk(mu_);
      if (free_count_ > 0) return storage_[free_[--free_count_]].bytes;
    }
    return ::operator new(n);
  }
  void deallocate(void* p) {
    auto* b = static_cast<std::byte*>(p);
    auto* first = storage_[0].bytes;
    if (b >= first && b < first + sizeof storage_) {
      std::lock_guard lk(mu_);
      free_[free_count_++] = static_cast<unsigned char>(static_cast<std::size_t>(b - first) / sizeof(Block));
      return;
    }
    ::operator delete(p);
  }

 private:
  struct alignas(std::max_align_t) Block {
    std::byte bytes[kBlockBytes];
  };
  std::array<Block, kBlocks> storage_;
  std::array<unsigned char, kBlocks> free_{};
  std::size_t free_count_ = kBlocks;
  std::mutex mu_;
};

/// An allocator over a HandlerMemory (Asio rebinds it to its operation types).
template <class T>
struct HandlerAllocator {
  using value_type = T;
  HandlerMemory* memory;

  explicit HandlerAllocator(HandlerMemory* m) noexcept : memory(m) {}
  template <class U>
  HandlerAllocator(const HandlerAllocator<U>& o) noexcept : memory(o.memory) {}
  T* allocate(std::size_t n) { return static_cast<T*>(memory->allocate(n * sizeof(T))); }
  void deallocate(T* p, std::size_t) noexcept { memory->deallocate(p); }
  template <class U>
  bool operator==(const HandlerAllocator<U>& o) const noexcept {
    return memory == o.memory;
  }
};

/// A completion handler whose associated allocator is a HandlerMemory's.
template <class F>
struct MemoryHandler {
  using allocator_type = HandlerAllocator<std::byte>;
  F f;
  HandlerMemory* memory;

  allocator_type get_allocator() const noexcept { return allocator_type(memory); }
  template <class... Args>
  void operator()(Args&&... args) {
    f(std::forward<Args>(args)...);
  }
};

/// A buffer sequence over buffers held elsewhere: Asio copies the sequence into each write
/// operation, and a std::vector would be copied (allocated) with it.
struct BufferRange {
  using value_type = boost::asio::const_buffer;
  using const_iterator = const boost::asio::const_buffer*;
  const_iterator first = nullptr;
  const_iterator last = nullptr;
  const_iterator begin() const { return first; }
  const_iterator end() const { return last; }
};

/// The completion condition of the links' payload transfers: all of it, as Asio's transfer_all,
/// but at most `max_per_call` bytes per system call instead of transfer_all's 64 KiB
/// (default_max_transfer_size), which makes a 64 MiB message a thousand calls and reactor rounds.
/// Writes take Policy::kWriteBytesPerCall at a time, reads what the socket buffer holds.
struct TransferAll {
  std::size_t max_per_call;
  std::size_t operator()(const boost::system::error_code& ec, std::size_t) const { return ec ? 0 : max_per_call; }
};

template <class F>
MemoryHandler<std::decay_t<F>> bind_memory(HandlerMemory& m, F&& f) {
  return {std::forward<F>(f), &m};
}

}  // namespace chorus::tcp::detail
