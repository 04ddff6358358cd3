// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// The life of a communicator's IPC windows (window.hpp): made at its first direct collective,
/// closed (the peers' windows unmapped) by a failed one or an abort, released at destruction after
/// a last mailbox exchange that tells this rank its peers' reads of its window are over.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <memory>

#include "chorus/algo/descriptor.hpp"
#include "chorus/algo/group.hpp"
#include "chorus/algo/intranode/one_shot.hpp"
#include "chorus/algo/intranode/window.hpp"
#include "chorus/core/concepts.hpp"
#include "chorus/core/error.hpp"
#include "chorus/detail/log.hpp"
#include "chorus/device/runtime.hpp"

namespace chorus::algo {

template <Transport T>
class WindowOwner {
 public:
  /// The windows of group rank `rank` of `size`, made on first use with slots of `slot_bytes`.
  cuda_ipc::Windows& get(device::Runtime& rt, int rank, int size, std::size_t slot_bytes) {
    if (!windows_) {
      windows_ = std::make_unique<cuda_ipc::Windows>(rt, rank, size, slot_bytes);
      bytes_.store(windows_->bytes(), std::memory_order_relaxed);
    }
    return *windows_;
  }
  /// The windows once made (get() was called), else null.
  cuda_ipc::Windows* made() const { return windows_.get(); }
  /// Device memory of the windows (any thread; memory_stats()).
  std::size_t bytes() const { return bytes_.load(std::memory_order_relaxed); }

  /// Unmaps the peers' IPC windows, if any (they are not used again); a failure to is logged,
  /// never thrown: the caller is already failing or aborting.
  void close(int rank) {
    if (!windows_) return;
    try {
      windows_->close();
    } catch (const Error& e) {
      chorus::detail::log(chorus::detail::LogLevel::warn, chorus::detail::LogSubsys::cuda_ipc, rank, "closing the IPC windows: ", e.what());
    }
  }

  /// At destruction with no call in flight (`next_seq`: the number the next collective would
  /// take): the last mailbox exchange (the peers' reads of this rank's window are over once they
  /// post theirs), then the windows go; a window whose peers did not answer within kGoodbye is
  /// left to the process (window.hpp), as after a failure or an abort (`aborted`).
  void release(Group<T>& group, std::uint64_t next_seq, bool aborted, std::chrono::milliseconds timeout) {
    if (!windows_) return;
    bool quiet = false;
    if constexpr (LinkWithIpc<LinkOf<T>>) {
      if (windows_->ready() && !aborted) {
        try {
          CollectiveDesc bye;
          bye.seq = next_seq;
          mailbox_post(group, bye, 0, [](std::byte*) {});
          mailbox_wait(group, bye, 0, std::min(timeout, cuda_ipc::kGoodbye), [](const CollectiveDesc&) {});
          quiet = true;
        } catch (const Error& e) {
          chorus::detail::log(chorus::detail::LogLevel::info, chorus::detail::LogSubsys::cuda_ipc, group.rank, "the IPC window stays allocated (a peer may still read it): ",
                      e.what());
        }
      }
    }
    if (quiet) windows_->set_quiet();
    windows_.reset();
  }

 private:
  std::unique_ptr<cuda_ipc::Windows> windows_;
  std::atomic<std::size_t> bytes_{0};
};

}  // namespace chorus::algo
