// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// Collectives on device buffers as one kernel per rank per call (device/collective.hpp), where
/// every peer's device memory is reachable: peers that are threads of this process (inproc
/// links, one device context: plain device pointers) or processes of this host over cuda_ipc
/// (each rank's collective area mapped by the others through CUDA IPC, once).
///
/// Set-up, once per communicator, at its first such call (every rank makes it): each rank
/// allocates its area (flags, LL lines, a window of CHORUS_CUDA_IPC_SLOT_BYTES), publishes it in
/// the communicator's store (the pointer, or its IPC handle) and maps its peers'. After that a
/// call is planned on the host (protocol, blocks, the barrier and LL numbers every rank counts
/// alike), launched on the caller's stream, and followed by an event: no host wait, no message,
/// no host round trip. The call's Request completes when the event has passed (this class is its
/// Driver: a waiter polls the events, spinning before it sleeps, and watches the links, so a peer
/// that dies or aborts makes this rank's kernel give up at once); its error, if any, is read from
/// the kernel's report: mismatch (the text of every other mismatch), timeout or peer_failure,
/// naming the peer.
///
/// Order: a communicator's kernels run one after another on every rank, as the barrier and LL
/// numbers require: a call on another stream than the last one waits for the last one's event
/// (cudaStreamWaitEvent, on the device).

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "chorus/algo/descriptor.hpp"
#include "chorus/algo/group.hpp"
#include "chorus/bootstrap/store.hpp"
#include "chorus/core/concepts.hpp"
#include "chorus/core/error.hpp"
#include "chorus/core/request.hpp"
#include "chorus/device/collective.hpp"
#include "chorus/device/runtime.hpp"

namespace chorus::algo {

/// The collectives the kernel runs.
constexpr bool kernel_takes(CollectiveKind k) noexcept {
  return k == CollectiveKind::all_reduce || k == CollectiveKind::reduce_scatter || k == CollectiveKind::all_gather ||
         k == CollectiveKind::broadcast || k == CollectiveKind::reduce;
}

/// True when every peer of `g` is a thread of this process (inproc links).
template <Transport T>
bool peers_in_process(const Group<T>& g) {
  if constexpr (LinkInProcess<LinkOf<T>>) {
    for (int p = 0; p < g.size(); ++p)
      if (p != g.rank && !g.transport->link(g.members[static_cast<std::size_t>(p)]).same_process()) return false;
    return g.size() > 1;
  } else {
    return false;
  }
}

/// Whether the link to group rank p has failed, and with what (nothing where it has not, or where
/// the link cannot say).
template <Transport T>
std::optional<ErrorCode> link_failure(Group<T>& g, int p) {
  auto& l = g.transport->link(g.members[static_cast<std::size_t>(p)]);
  if constexpr (LinkInProcess<LinkOf<T>>) {
    if (l.broken()) return l.failure().first;
  } else if constexpr (LinkWithMailboxes<LinkOf<T>>) {
    if (l.shm_link() != nullptr && l.shm_link()->broken()) return l.shm_link()->failure().first;
  }
  return std::nullopt;
}

namespace kernel_detail {
inline std::string hex(const std::byte* p, std::size_t n) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s;
  for (std::size_t i = 0; i < n; ++i) {
    const auto b = static_cast<unsigned>(p[i]);
    s += kDigits[b >> 4];
    s += kDigits[b & 15u];
  }
  return s;
}
inline bool unhex(const std::string& s, std::byte* p, std::size_t n) {
  if (s.size() != 2 * n) return false;
  auto v = [](char c) -> int { return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1; };
  for (std::size_t i = 0; i < n; ++i) {
    const int hi = v(s[2 * i]), lo = v(s[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    p[i] = static_cast<std::byte>(hi * 16 + lo);
  }
  return true;
}
/// What a rank publishes: its area (a pointer, or an IPC handle) and its device context.
struct Published {
  device::IpcHandle handle;
  std::uint64_t area = 0;
  std::uint64_t context = 0;
  std::uint64_t window = 0;
};
}  // namespace kernel_detail

template <Transport T>
class KernelPath final : public chorus::detail::Driver, public std::enable_shared_from_this<KernelPath<T>> {
 public:
  /// What the communicator learns of each call as it ends: ok, or its error.
  using OnEnd = std::function<void(const CollectiveDesc&, const Error*)>;

  KernelPath(Group<T>& g, device::Runtime& rt, bool same_process, std::size_t window_bytes, std::chrono::milliseconds timeout,
             OnEnd on_end)
      : g_(g), rt_(rt), same_process_(same_process), window_(window_bytes), timeout_(timeout), on_end_(std::move(on_end)),
        areas_(static_cast<std::size_t>(g.size()), nullptr) {}
  ~KernelPath() override;
  KernelPath(const KernelPath&) = delete;
  KernelPath& operator=(const KernelPath&) = delete;

  bool ready() const { return mine_ != nullptr; }
  /// Device memory this rank's area takes (memory_stats()).
  std::size_t bytes() const { return mine_ != nullptr ? device::area::bytes(window_) : 0; }

  /// The set-up (see the top), through `store` under `key` (unique to the communicator).
  void set_up(Store& store, const std::string& key);

  /// The launch arguments of `desc` on `in` and `out` (device memory), its protocol and blocks,
  /// and this call's barrier and LL numbers taken.
  device::CollectiveLaunch prepare(const CollectiveDesc& desc, const std::byte* in, std::byte* out);
  /// Launches `a` on `s` (null: the default stream, see launch()) after the communicator's last
  /// kernel, and tracks it: `req` completes when it is over (or fails with its error).
  void launch(const device::CollectiveLaunch& a, device::Stream s, const CollectiveDesc& desc,
              std::shared_ptr<chorus::detail::RequestState> req);

  /// Every kernel running or to come gives up now (abort, a failure elsewhere): this rank's
  /// abort word, and the one in its area that its peers' kernels watch.
  /// `why`: the communicator's abort, which later calls fail with.
  void abort_kernels(const Error* why = nullptr);
  /// The first error a kernel reported (or an abort), once seen; later calls fail with it.
  std::optional<Error> failure() const {
    std::lock_guard lk(mu_);
    return failure_;
  }
  /// Kernels launched and not yet seen complete.
  std::size_t in_flight() const {
    std::lock_guard lk(mu_);
    return flight_.size();
  }
  /// Unmaps the peers' areas (processes; nothing for threads): after an abort with no kernel in
  /// flight, as the IPC windows are (they are not used again).
  void close_peers();
  /// Waits (bounded) until every launched kernel is over; true when they are.
  bool settle(std::chrono::milliseconds bound);
  /// At destruction without a failure: frees the area once every peer says its kernels are over
  /// (a last exchange through the store, within `bound`); otherwise the area stays (it goes with
  /// the process), as a peer may still read it.
  void release(Store* store, const std::string& key, bool failed, std::chrono::milliseconds bound);

  // --- Driver: a waiter polls the events -------------------------------------------------------
  void drive(const chorus::detail::RequestState& r, Clock::time_point deadline) override;
  void drive_until(bool (*ready)(const void*), const void* ctx, Clock::time_point deadline) override;
  void poll() override { reap(); }
  void on_timeout(const Error& e) override;

  /// Counters that every rank advances alike, call by call (tests read them).
  std::uint64_t barriers() const { return barriers_; }
  std::uint64_t ll_calls() const { return ll_calls_; }

 private:
  struct Flight {
    device::Event done;
    CollectiveDesc desc;
    std::shared_ptr<chorus::detail::RequestState> req;
    device::KernelResult* result;  ///< the call's entries of results_
    std::uint32_t blocks;
  };
  /// Completes the calls whose events have passed, in order; true when none is left.
  bool reap();
  /// How the call of `f` ended: null when it did, else its error (under mu_).
  std::optional<Error> outcome(const Flight& f);
  /// A peer whose link broke while kernels ran: abort them, and keep why.
  void watch_links();

  Group<T>& g_;
  device::Runtime& rt_;
  const bool same_process_;
  const std::size_t window_;
  const std::chrono::milliseconds timeout_;
  OnEnd on_end_;
  std::byte* mine_ = nullptr;          ///< this rank's area
  std::vector<std::byte*> areas_;      ///< every rank's, as addressed here
  std::vector<bool> opened_;           ///< mapped by ipc_open (closed at release)
  std::uint32_t* abort_ = nullptr;     ///< pinned
  std::uint32_t* one_ = nullptr;       ///< pinned, holds 1: copied into the area's abort word
  device::KernelReport* report_ = nullptr;  ///< pinned, kMaxKernelBlocks entries
  device::KernelResult* results_ = nullptr;  ///< pinned, kKernelResultSlots x kMaxKernelBlocks entries
  std::uint64_t calls_ = 0;                  ///< kernels launched (picks the call's slot of results_)
  /// The same pinned memory as kernels address it (Runtime::device_address).
  std::uint32_t* abort_dev_ = nullptr;
  device::KernelReport* report_dev_ = nullptr;
  device::KernelResult* results_dev_ = nullptr;
  device::Stream stream_ = nullptr;    ///< for blocking calls and the area's writes
  unsigned max_blocks_ = 1;
  std::uint64_t barriers_ = 0, ll_calls_ = 0;  ///< under the communicator's call lock
  device::Stream last_stream_ = nullptr;
  device::Event last_ = nullptr;       ///< the last kernel's end (the next one on another stream waits)
  device::Event default_ready_ = nullptr;  ///< the default stream's work before a call without a stream
  bool launched_ = false;
  mutable std::mutex mu_;              ///< flight_, failure_, spare_
  std::deque<Flight> flight_;
  std::vector<device::Event> spare_;
  std::optional<Error> failure_;
  std::atomic<int> broken_peer_{-1};  ///< a peer whose link broke while kernels ran (watch_links)
  std::atomic<Clock::rep> broken_seen_{0};   ///< when watch_links first saw a broken link (0: never)
  static constexpr std::chrono::milliseconds kLinkGrace{1000};
};

}  // namespace chorus::algo

#include "chorus/algo/intranode/impl/kernel_path.hpp"
