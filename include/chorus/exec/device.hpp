// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// DeviceExecutor: the executor of device memory, through the device::Runtime seam (the CUDA
/// runtime, or the simulated one in tests). Every operation is issued on one stream of its own:
/// copies are cudaMemcpyAsync, reductions the reduce/cuda kernels, scratch device buffers. Most
/// links cannot read device memory, so messages go through pinned host staging
/// (stage/download/upload): a send's slice is downloaded and waited for, then sent; a receive
/// lands in staging and is uploaded behind the work already issued, and the kernel that reduces it
/// follows on the stream. A link that takes device memory itself (rdma with dma-buf registration)
/// gets the call's memory after sync(); see algo/channel.hpp.
///
/// A call on a user's stream (StreamTicket): the executor's stream first waits for an event the
/// call recorded on the user's stream (the inputs are ready there), and the user's stream waits
/// on a flag in pinned memory that the call sets when its results are final (wait_flag), so
/// work the user enqueues after the call sees them.
///
/// Memory: device scratch grows on demand like the host's; staging is a pinned arena reset after
/// each call, as large as the bytes the call moved through it (a call sends and receives each slice
/// through it once), kept across calls up to kKeepStagingBytes or the recent calls' need. Nothing
/// is freed while a call is in flight (see collect()).

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "chorus/core/error.hpp"
#include "chorus/device/runtime.hpp"
#include "chorus/exec/executor.hpp"

namespace chorus::exec {

class DeviceExecutor final : public Executor {
 public:
  /// `timeout`: the bound of each wait for the stream (a device that stops answering is an error,
  /// not a hang).
  DeviceExecutor(device::Runtime& rt, std::chrono::milliseconds timeout)
      : Executor(MemoryKind::device), rt_(rt), timeout_(timeout) {
    stream_ = rt_.create_stream();
    done_ = rt_.create_event();
  }
  ~DeviceExecutor() override {
    try {
      wait_stream();
    } catch (...) {  // a failed stream: nothing more will run on it
    }
    try {
      collect();
      for (auto* b : {&slots_, &work_}) rt_.free_device(b->p);
      for (auto& blk : blocks_) rt_.free_pinned(blk.p);
      rt_.destroy_event(done_);
      rt_.destroy_stream(stream_);
      if (side_ != nullptr) {
        rt_.destroy_event(fork_);
        rt_.destroy_event(join_);
        rt_.destroy_stream(side_);
      }
    } catch (...) {  // destruction never throws
    }
  }

  /// Work issued from now on waits for `ready` (an event recorded on the caller's stream).
  void after(device::Event ready) { rt_.wait(stream_, ready); }

  /// A second stream, for work that may overlap the main stream's (algo/intranode/ipc.hpp: the copy of a
  /// call's next chunk into its window while this chunk is reduced). After fork(), side_copy work
  /// follows everything issued on the main stream so far; after join(), main-stream work follows
  /// everything issued on the side. wait_stream() joins first, so it covers both.
  void fork() {
    if (side_ == nullptr) {
      side_ = rt_.create_stream();
      fork_ = rt_.create_event();
      join_ = rt_.create_event();
    }
    rt_.record(fork_, stream_);
    rt_.wait(side_, fork_);
    side_open_ = true;
  }
  void side_copy(std::byte* dst, const std::byte* src, std::size_t n) {
    if (dst != src && n != 0) rt_.copy(dst, src, n, side_);
  }
  void join() {
    if (!side_open_) return;
    side_open_ = false;
    rt_.record(join_, side_);
    rt_.wait(stream_, join_);
    side_joined_ = true;
  }

  void copy(std::byte* dst, const std::byte* src, std::size_t n) override {
    if (dst != src && n != 0) rt_.copy(dst, src, n, stream_);
  }
  void reduce(ReduceOp op, DataType dt, std::byte* out, const std::byte* a, const std::byte* b,
              std::size_t count) override {
    if (count != 0) rt_.reduce(op, dt, out, a, b, count, stream_);
  }
  void reduce_many(ReduceOp op, DataType dt, std::byte* out, const std::byte* const* srcs, int n,
                   std::size_t count) override {
    check_reduce_many_inputs(srcs, n, "reduce_many");
    if (count == 0) return;
    const void* inputs[kMaxReduceInputs];
    for (int k = 0; k < n; ++k) inputs[k] = srcs[k];
    rt_.reduce_many(op, dt, out, inputs, n, count, stream_);
  }
  void finalize_avg(DataType dt, std::byte* data, std::size_t count, int ranks) override {
    if (count != 0) rt_.finalize_avg(dt, data, count, ranks, stream_);
  }
  /// The step flags of the direct collectives (algo/intranode/ipc.hpp), on this executor's stream.
  void write_value(std::uint64_t* word, std::uint64_t value) { rt_.write_value(stream_, word, value); }
  void wait_value(const std::uint64_t* word, std::uint64_t value, std::uint32_t* abort, std::uint32_t on_timeout,
                  std::chrono::milliseconds timeout) {
    rt_.wait_value(stream_, word, value, abort, on_timeout, static_cast<std::uint64_t>(timeout.count()) * 1000000u);
  }
  device::Stream stream() const { return stream_; }
  std::byte* slots(std::size_t n) override { return grow(slots_, n); }
  std::byte* work(std::size_t n) override { return grow(work_, n); }

  std::byte* stage(std::size_t n) override {
    n = (n + 63) / 64 * 64;
    while (block_ < blocks_.size() && used_ + n > blocks_[block_].size) ++block_, used_ = 0;
    if (block_ == blocks_.size()) {
      const std::size_t size = std::max(n, kBlockBytes);
      blocks_.push_back({static_cast<std::byte*>(rt_.alloc_pinned(size)), size, /*pinned=*/true});
      used_ = 0;
    }
    std::byte* p = blocks_[block_].p + used_;
    used_ += n;
    staged_ += n;
    return p;
  }
  void download(std::byte* host, const std::byte* mine, std::size_t n) override {
    if (n == 0) return;
    rt_.copy(host, mine, n, stream_);
    wait_stream();
  }
  void upload(std::byte* mine, const std::byte* host, std::size_t n) override {
    if (n != 0) rt_.copy(mine, host, n, stream_);
  }

  // --- memory links take as it is (device memory over rdma with dma-buf) ---------------------
  device::Runtime* runtime() noexcept override { return &rt_; }
  void sync() override { wait_stream(); }
  // --- end of memory links take as it is -------------------------------------------------------

  /// Waits for everything issued; resets the staging arena, and gives back the pinned blocks a
  /// burst of large calls left (beyond kKeepStagingBytes, once kWindow calls needed less).
  void end_call() override {
    wait_stream();
    window_max_ = std::max(window_max_, staged_);
    staged_ = 0;
    block_ = 0;
    used_ = 0;
    if (++calls_ < kWindow) return;
    calls_ = 0;
    std::size_t kept = 0;
    std::size_t i = 0;
    for (; i < blocks_.size() && (kept < std::max(window_max_, kKeepStagingBytes)); ++i) kept += blocks_[i].size;
    retired_.insert(retired_.end(), blocks_.begin() + static_cast<std::ptrdiff_t>(i), blocks_.end());
    blocks_.resize(i);
    window_max_ = 0;
  }
  std::size_t bytes() const override {
    std::size_t b = slots_.size + work_.size;
    for (const auto& blk : blocks_) b += blk.size;
    for (const auto& r : retired_) b += r.size;
    return b;
  }

  /// Frees the memory retired by earlier calls. cudaFree and cudaFreeHost wait for the whole
  /// device, including a user's stream held by a call's flag (wait_flag), so memory is never
  /// freed while a call is in flight: the communicator calls this only when none is queued or
  /// running (every flag set).
  void collect() {
    for (const auto& r : retired_) {
      if (r.pinned)
        rt_.free_pinned(r.p);
      else
        rt_.free_device(r.p);
    }
    retired_.clear();
  }

  /// Blocks until the stream has done everything issued, polling (a spin of kSpin, then sleeps
  /// growing from 20 us to 1 ms) so that a wait is bounded by the timeout.
  void wait_stream() {
    wait_stream(timeout_, [] { return true; });
  }
  /// wait_stream bounded by `timeout`, calling watch() between polls: it may throw, or return
  /// false to stop the wait early (the stream not yet done; the caller decides what follows).
  /// True when the stream is done.
  template <class Watch>
  bool wait_stream(std::chrono::milliseconds timeout, const Watch& watch) {
    join();
    rt_.record(done_, stream_);
    if (rt_.query(done_)) return side_done();
    const auto begin = std::chrono::steady_clock::now();
    const auto deadline = begin + timeout;
    std::chrono::microseconds nap{0};
    for (;;) {
      if (rt_.query(done_)) return side_done();
      if (!watch()) return false;
      const auto now = std::chrono::steady_clock::now();
      if (now > deadline)
        throw Error(ErrorCode::timeout, ErrorContext{},
                    "the device stream did not finish its work within " + std::to_string(timeout.count()) +
                        " ms (CHORUS_TIMEOUT)");
      if (now - begin < kSpin) {  // a slice's copy takes microseconds: a nap would cost more than it
        std::this_thread::yield();
        continue;
      }
      nap = std::min<std::chrono::microseconds>(std::max<std::chrono::microseconds>(nap * 2, std::chrono::microseconds(20)),
                                                std::chrono::milliseconds(1));
      std::this_thread::sleep_for(nap);
    }
  }

  /// How long wait_stream spins (yielding the core) before it naps.
  static constexpr std::chrono::microseconds kSpin{200};
  static constexpr std::size_t kBlockBytes = std::size_t(1) << 20;
  static constexpr std::size_t kKeepStagingBytes = std::size_t(16) << 20;
  static constexpr int kWindow = 16;

 private:
  /// Device scratch, a pinned staging block, or either given up (`pinned` says which).
  struct Allocation {
    std::byte* p = nullptr;
    std::size_t size = 0;
    bool pinned = false;
  };
  /// Device scratch of at least n bytes, grown to twice the old size at least (so that retired
  /// buffers add up to less than the live one). The old buffer is retired, not freed: see collect().
  std::byte* grow(Allocation& b, std::size_t n) {
    if (b.p != nullptr && b.size >= n) return b.p;
    const std::size_t size = std::max({n, 2 * b.size, std::size_t{256}});
    std::byte* p = static_cast<std::byte*>(rt_.alloc_device(size));
    if (b.p) retired_.push_back(b);
    b.p = p;
    b.size = size;
    return p;
  }
  /// The main stream is done, and with it the side's work joined into it: an error there throws
  /// (the query of the side's last join event).
  bool side_done() {
    if (side_joined_) {
      side_joined_ = false;
      (void)rt_.query(join_);
    }
    return true;
  }

  device::Runtime& rt_;
  std::chrono::milliseconds timeout_;
  device::Stream stream_ = nullptr;
  device::Event done_ = nullptr;
  device::Stream side_ = nullptr;  ///< made at the first fork()
  device::Event fork_ = nullptr, join_ = nullptr;
  bool side_open_ = false;    ///< side work issued since the last join
  bool side_joined_ = false;  ///< joined, and its errors not yet looked for
  Allocation slots_, work_;
  std::vector<Allocation> blocks_;
  std::size_t block_ = 0, used_ = 0;
  std::size_t staged_ = 0, window_max_ = 0;
  int calls_ = 0;
  std::vector<Allocation> retired_;  ///< scratch and staging given up, freed by collect()
};

/// The handshake between a user's stream and a call that the communicator runs on the host: the
/// call starts after `ready` (recorded on the user's stream), and the user's stream waits until
/// the call sets `flag` (1: done, 2: failed; either way the stream goes on). A ticket is reused
/// once it is closed and the user's stream has passed `passed` (recorded after the wait); each
/// issue opens it under a new generation, and only a release of that generation closes it (a late
/// callback of an earlier call never touches a later one).
struct StreamTicket {
  device::Event ready = nullptr;
  device::Event passed = nullptr;
  std::uint32_t* flag = nullptr;
  std::atomic<std::uint64_t> open{0};  ///< the generation now open, 0 when closed
};

/// One issue of a ticket: what a call holds.
struct TicketRef {
  std::shared_ptr<StreamTicket> ticket;
  std::uint64_t generation = 0;

  explicit operator bool() const { return ticket != nullptr; }
  device::Event ready() const { return ticket->ready; }
  /// The call is over (done, failed, or cancelled before it ran): sets the flag, once per issue.
  void release(bool ok) const {
    if (!ticket) return;
    std::uint64_t expected = generation;
    if (!ticket->open.compare_exchange_strong(expected, 0, std::memory_order_acq_rel)) return;
    std::atomic_ref<std::uint32_t>(*ticket->flag).store(ok ? 1u : 2u, std::memory_order_release);
  }
};

/// Tickets of one communicator, allocated on demand and reused. issue() is called under the
/// communicator's call lock.
class TicketPool {
 public:
  explicit TicketPool(device::Runtime& rt) : rt_(rt) {}
  ~TicketPool() {
    try {
      for (auto& t : tickets_) {
        rt_.destroy_event(t->ready);
        rt_.destroy_event(t->passed);
        rt_.free_pinned(t->flag);
      }
    } catch (...) {
    }
  }
  TicketPool(const TicketPool&) = delete;
  TicketPool& operator=(const TicketPool&) = delete;

  /// Enqueues the handshake on `user` and returns the ticket's issue (released once by the call).
  /// `hold` false: only `ready`, for a call whose caller waits on the host until it is over (a
  /// blocking call without a stream), so nothing after it on `user` can run early and no kernel
  /// needs to hold the stream.
  TicketRef issue(device::Stream user, std::chrono::milliseconds timeout, bool hold = true) {
    std::shared_ptr<StreamTicket> t;
    for (auto& c : tickets_)
      if (c->open.load(std::memory_order_acquire) == 0 && rt_.query(c->passed)) {
        t = c;
        break;
      }
    if (!t) {
      t = std::make_shared<StreamTicket>();
      t->ready = rt_.create_event();
      t->passed = rt_.create_event();
      t->flag = static_cast<std::uint32_t*>(rt_.alloc_pinned(64));
      tickets_.push_back(t);
    }
    const std::uint64_t gen = ++generation_;
    std::atomic_ref<std::uint32_t>(*t->flag).store(0, std::memory_order_relaxed);
    t->open.store(gen, std::memory_order_release);
    rt_.record(t->ready, user);
    if (hold) rt_.wait_flag(user, t->flag, static_cast<std::uint64_t>(timeout.count()) * 1000000u);
    rt_.record(t->passed, user);
    return {t, gen};
  }

 private:
  device::Runtime& rt_;
  std::vector<std::shared_ptr<StreamTicket>> tickets_;
  std::uint64_t generation_ = 0;
};

}  // namespace chorus::exec
