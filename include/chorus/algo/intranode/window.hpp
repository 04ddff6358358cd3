// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// The IPC windows of one communicator: each rank's device buffer of two slots and a step flag,
/// exported once, and every peer's opened once (opening a handle is expensive: it is cached for
/// the communicator's life). algo/intranode/ipc.hpp sets them up in the first direct collective and runs
/// every later one through them.
///
/// Slots: the data of a collective's k-th step (counted over the communicator's life, the same
/// on every rank) is in slot k % 2 of the windows (algo/intranode/ipc.hpp says who writes it, and why no
/// read can meet a write).
///
/// Flag: the word `ready` after the slots holds k + 1 once its rank's stream has written the data
/// of step k (a device-synchronised step, algo/intranode/ipc.hpp); peers' streams wait on it through their
/// mapping. `abort` is a word of this process's pinned memory that ends those waits: the host
/// sets it when it gives up, and a wait that times out sets it to say which peer it waited for.
///
/// Release: close() unmaps the peers' windows (ipc_close, which waits for the work enqueued
/// before it); the communicator calls it when a direct collective fails (a peer died or the
/// communicator was aborted: it never runs another), at an abort() while no call runs, and at
/// destruction, which also frees this rank's window. A peer's reads of the last call may still
/// run when its owner is destroyed, so the communicator's destructor first exchanges a last
/// mailbox message with every peer (a peer posts it once its own reads are over, at its own
/// destruction); where that does not complete within kGoodbye, or after a failure or an abort,
/// the window is left allocated (it goes with the process) rather than freed under a reader.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "chorus/core/error.hpp"
#include "chorus/detail/env.hpp"
#include "chorus/device/runtime.hpp"

namespace chorus::cuda_ipc {

/// Bytes of each of the two slots of a window (CHORUS_CUDA_IPC_SLOT_BYTES, docs/environment.md).
inline constexpr std::size_t kDefaultSlotBytes = std::size_t(4) << 20;
inline constexpr std::size_t kMinSlotBytes = 1024;
/// Bytes after the two slots of a window: the step flag (a 64-bit word), padded.
inline constexpr std::size_t kFlagBytes = 256;
/// How long a communicator's destruction waits for its peers' last mailbox message.
inline constexpr std::chrono::milliseconds kGoodbye{5000};

/// CHORUS_CUDA_IPC_SLOT_BYTES ("4M", "65536"), else kDefaultSlotBytes; a value below
/// kMinSlotBytes, not a multiple of 256, or not a byte count is invalid_argument.
inline std::size_t slot_bytes_from_env(const ErrorContext& ctx) {
  auto v = chorus::detail::env_string("CHORUS_CUDA_IPC_SLOT_BYTES");
  if (!v) return kDefaultSlotBytes;
  const std::uint64_t n = chorus::detail::parse_bytes(*v, "CHORUS_CUDA_IPC_SLOT_BYTES");
  if (n < kMinSlotBytes || n % 256 != 0)
    throw Error(ErrorCode::invalid_argument, ctx,
                "CHORUS_CUDA_IPC_SLOT_BYTES='" + *v + "' is below " + std::to_string(kMinSlotBytes) +
                    " bytes or not a multiple of 256");
  return static_cast<std::size_t>(n);
}

class Windows {
 public:
  Windows(device::Runtime& rt, int rank, int size, std::size_t slot_bytes)
      : rt_(rt), rank_(rank), slot_(slot_bytes), base_(static_cast<std::size_t>(size), nullptr) {}
  ~Windows() {
    try {
      close();
      if (mine_ && quiet_) rt_.free_device(mine_);
      if (abort_ != nullptr) rt_.free_pinned(abort_);
    } catch (...) {  // destruction never throws
    }
  }
  Windows(const Windows&) = delete;
  Windows& operator=(const Windows&) = delete;

  /// Allocates this rank's window (its flag zeroed on `s`, which is synchronised: not the null
  /// stream, which would wait for a user's stream held by the call) and the abort word, and
  /// returns the window's handle.
  device::IpcHandle create(device::Stream s) {
    if (abort_ == nullptr) abort_ = static_cast<std::uint32_t*>(rt_.alloc_pinned(kFlagBytes));
    std::atomic_ref<std::uint32_t>(*abort_).store(0, std::memory_order_relaxed);
    mine_ = static_cast<std::byte*>(rt_.alloc_device(bytes()));
    rt_.fill(mine_ + 2 * slot_, 0, kFlagBytes, s);
    rt_.synchronize(s);  // zero before any peer can map it
    base_[static_cast<std::size_t>(rank_)] = mine_;
    return rt_.ipc_export(mine_);
  }
  /// Maps `peer`'s window.
  void open(int peer, const device::IpcHandle& h) {
    base_[static_cast<std::size_t>(peer)] = static_cast<std::byte*>(rt_.ipc_open(h));
  }
  /// Unmaps every peer's window (they are not used again).
  void close() {
    closed_ = true;
    for (std::size_t p = 0; p < base_.size(); ++p) {
      if (static_cast<int>(p) == rank_ || base_[p] == nullptr) continue;
      std::byte* b = base_[p];
      base_[p] = nullptr;
      rt_.ipc_close(b);
    }
  }
  /// No peer reads this rank's window any more: destruction frees it. Without this call the
  /// window is left allocated at destruction (a peer may still read it): it goes with the process.
  void set_quiet() { quiet_ = true; }
  bool ready() const { return mine_ != nullptr && !closed_; }
  bool closed() const { return closed_; }

  std::size_t slot_bytes() const { return slot_; }
  /// Bytes of one window: two slots and the flag.
  std::size_t bytes() const { return 2 * slot_ + kFlagBytes; }
  /// Rank q's step flag (its own, or a peer's as mapped here).
  std::uint64_t* ready(int q) const {
    return reinterpret_cast<std::uint64_t*>(base_[static_cast<std::size_t>(q)] + 2 * slot_);
  }
  /// This process's abort word (pinned memory): 0 while every device wait may go on.
  std::uint32_t* abort_word() const { return abort_; }
  /// Slot k % 2 of rank q's window (this rank's own, or a peer's as mapped here).
  std::byte* slot(int q, std::uint64_t k) const { return base_[static_cast<std::size_t>(q)] + (k % 2) * slot_; }

  /// Steps taken so far: the number of the next.
  std::uint64_t step = 0;

 private:
  device::Runtime& rt_;
  int rank_;
  std::size_t slot_;
  std::byte* mine_ = nullptr;
  std::uint32_t* abort_ = nullptr;
  std::vector<std::byte*> base_;  ///< by rank
  bool closed_ = false;
  bool quiet_ = false;
};

}  // namespace chorus::cuda_ipc
