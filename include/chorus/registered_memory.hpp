// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// RegisteredMemory: a buffer of the caller's that transports may keep registered with their
/// device while the handle lives, like ncclCommRegister and ncclCommDeregister.
///
///   std::vector<float> grads(n);
///   chorus::RegisteredMemory reg(grads.data(), grads.size() * sizeof(float));
///   for (int step = 0; step < steps; ++step) comm.all_reduce(grads, chorus::ReduceOp::sum);
///
/// Without it, the rdma transport registers the user buffer of every large message for that
/// message alone (it cannot know when the memory is freed and its addresses handed out again,
/// and a kept registration would then let the device read and write the old pages). With it,
/// messages from or into the range use one registration of the whole range, made at its first
/// use and released once the handle is gone and no message uses it any more.
///
/// Contract: the memory stays allocated while the handle lives (free it after destroying the
/// handle; freeing it first is undefined, as with NCCL's registration). The registration is the
/// process's: every communicator of the process sees it. Transports that register nothing (tcp,
/// shm, inproc, cuda_ipc) ignore it. Device buffers are not registered this way: over rdma with
/// dma-buf they are registered per message, over cuda_ipc read through IPC windows, else staged.

#include <cstddef>
#include <cstdint>
#include <ranges>
#include <utility>

#include "chorus/detail/owned_memory.hpp"

namespace chorus {

class RegisteredMemory {
 public:
  RegisteredMemory() = default;
  /// Registers [p, p + bytes); nothing when bytes is 0.
  RegisteredMemory(const void* p, std::size_t bytes)
      : id_(p != nullptr && bytes != 0 ? detail::OwnedMemory::instance().announce(p, bytes, /*user=*/true) : 0) {}
  /// The storage of a contiguous range (std::vector, std::span, ...).
  template <std::ranges::contiguous_range R>
    requires std::ranges::sized_range<R>
  explicit RegisteredMemory(R& range)
      : RegisteredMemory(std::ranges::data(range), std::ranges::size(range) * sizeof(std::ranges::range_value_t<R>)) {}

  RegisteredMemory(RegisteredMemory&& o) noexcept : id_(std::exchange(o.id_, 0)) {}
  RegisteredMemory& operator=(RegisteredMemory&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = std::exchange(o.id_, 0);
    }
    return *this;
  }
  RegisteredMemory(const RegisteredMemory&) = delete;
  RegisteredMemory& operator=(const RegisteredMemory&) = delete;
  ~RegisteredMemory() { reset(); }

  /// Deregisters now (messages under way keep their registration until they end).
  void reset() { detail::OwnedMemory::instance().retire(std::exchange(id_, 0)); }
  explicit operator bool() const { return id_ != 0; }

 private:
  std::uint64_t id_ = 0;
};

}  // namespace chorus
