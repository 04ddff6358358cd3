// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// rdma's engine: the provider, the memory registered once (Slab), the completion queue, the links
/// and the progress thread (transport/progress.hpp has the model; rdma/transport.hpp starts and
/// stops it). How it waits: the file comment of rdma/transport.hpp.

#include <poll.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "chorus/detail/log.hpp"
#include "chorus/transport/progress.hpp"
#include "chorus/transport/rdma/detail/registration.hpp"
#include "chorus/transport/rdma/detail/verbs.hpp"
#include "chorus/transport/rdma/link.hpp"
#include "chorus/transport/shell.hpp"

namespace chorus::rdma {
namespace detail {

using Clock = std::chrono::steady_clock;

/// Memory the transport registers once: per link two slot arrays and two credit blocks.
class Slab {
 public:
  Slab(Verbs& v, std::size_t links, const ErrorContext& ctx) : v_(v) {
    per_link_ = 2 * Policy::kSlots * Policy::kSlotBytes + 2 * sizeof(CreditBlock);
    bytes_ = std::max<std::size_t>(1, links) * per_link_;
    mem_ = static_cast<std::byte*>(std::aligned_alloc(4096, (bytes_ + 4095) / 4096 * 4096));
    if (!mem_) throw Error(ErrorCode::system, ctx, "out of memory for the rdma slots");
    std::memset(mem_, 0, bytes_);
    int err = 0;
    mr_ = v_.reg_mr(mem_, bytes_, kLocalWrite | kRemoteWrite, err);
    if (!mr_) {
      std::free(mem_);
      throw Error(ErrorCode::system, ctx,
                  "registering the transport's " + std::to_string(bytes_) + " bytes of slots failed (" + std::strerror(err) +
                      (err == ENOMEM ? "; raise the locked-memory limit, ulimit -l" : "") + ")");
    }
  }
  Slab(const Slab&) = delete;
  Slab& operator=(const Slab&) = delete;
  ~Slab() {
    v_.dereg_mr(mr_);
    std::free(mem_);
  }
  Memory memory(std::size_t i) const {
    std::byte* base = mem_ + i * per_link_;
    Memory m;
    m.recv_slots = base;
    m.send_slots = base + Policy::kSlots * Policy::kSlotBytes;
    m.credits_in = new (base + 2 * Policy::kSlots * Policy::kSlotBytes) CreditBlock;
    m.credits_out = new (base + 2 * Policy::kSlots * Policy::kSlotBytes + sizeof(CreditBlock)) CreditBlock;
    m.lkey = mr_->lkey;
    return m;
  }
  std::uint32_t rkey() const { return mr_->rkey; }

 private:
  Verbs& v_;
  std::size_t per_link_ = 0;
  std::size_t bytes_ = 0;
  std::byte* mem_ = nullptr;
  Mr* mr_ = nullptr;
};

/// The provider, the CQ, the links and the progress thread of one transport; shared by the
/// thread and by the requests (weakly, as their Driver).
struct Engine final : chorus::detail::DrivenEngine<Engine> {
  /// An exception out of a pass leaves the links in an unknown state: every link fails.
  static constexpr bool kRunAgainAfterError = false;
  static constexpr auto kSpin = std::chrono::microseconds(50);  ///< the background thread's spin
  static constexpr auto kPoll = std::chrono::milliseconds(100);  ///< the longest sleep (abort words)
  static constexpr auto kStarvedPoll = std::chrono::milliseconds(1);
  static constexpr int kBatch = 32;

  Hub hub;  ///< its mutex guards the links, the CQ and every verbs call
  std::unique_ptr<Verbs> verbs;
  std::unique_ptr<Slab> slab;
  std::unique_ptr<RegistrationCache> regs;
  Cq* cq = nullptr;
  std::vector<std::unique_ptr<Link>> links;  ///< by peer; null where there is none
  std::thread thread;
  int rank = -1;
  bool cq_broken = false;

  ~Engine() {
    links.clear();  // QPs first, then the CQ, the slots, the provider
    if (cq) verbs->destroy_cq(cq);
    slab.reset();
    regs.reset();
  }

  void kick() { hub.kick(); }

  /// Fails every link (from any thread); with tell, peers are told (their abort word).
  void fail_all(ErrorCode code, const std::string& why, bool tell = true) {
    {
      Completions done;
      std::lock_guard lk(hub.mu);
      for (auto& l : links)
        if (l) l->fail(code, why, tell, done);
    }
    kick();
  }

  // ---- what DrivenEngine needs (the token held, except for wake_background) ----

  /// Polls the CQ, hands each completion to its link, then lets every link read its credit
  /// block and post queued work. True when anything moved.
  bool pass() {
    Completions done;
    std::lock_guard lk(hub.mu);
    return pass_locked(done);
  }
  /// A short pause between two polls of the CQ (a poll is cheap: no system call); the core is
  /// given away only every 16th time, so a rank that shares it still runs.
  template <class Ready>
  void spin_wait(const Ready& ready) {
    for (int i = 0; i < 16; ++i) {
      if (ready()) return;
      chorus::detail::cpu_relax();
    }
    if (++spins_ % 16 == 0) ::sched_yield();
  }
  /// Arms the CQ, polls once more (a completion that came before the arming), then sleeps in
  /// poll() on the channel, the async fd and the eventfd.
  template <class Ready>
  void sleep_until(Clock::time_point until, const Ready& ready) {
    bool starved = false;
    {
      Completions done;
      std::lock_guard lk(hub.mu);
      hub.sleeping.store(true, std::memory_order_seq_cst);
      if (!cq_broken) (void)verbs->req_notify_cq(cq);
      const bool moved = pass_locked(done);
      for (auto& l : links)
        if (l && l->starved()) starved = true;
      if (moved || stop.load() || ready()) {
        hub.sleeping.store(false);
        return;
      }
    }
    auto left = std::chrono::ceil<std::chrono::milliseconds>(until - Clock::now());
    left = std::clamp(left, std::chrono::milliseconds(0), starved ? kStarvedPoll : kPoll);
    pollfd fds[3] = {{verbs->channel_fd(cq), POLLIN, 0}, {verbs->async_fd(), POLLIN, 0}, {hub.wake, POLLIN, 0}};
    const int k = ::poll(fds, 3, static_cast<int>(left.count()));
    hub.sleeping.store(false);
    if (k <= 0) return;
    std::lock_guard lk(hub.mu);
    if (fds[0].revents) verbs->drain_channel(cq);
    if (fds[2].revents) {
      std::uint64_t v;
      [[maybe_unused]] auto r = ::read(hub.wake, &v, sizeof v);
    }
    if (fds[1].revents) {
      Completions done;
      async_events(done);
    }
  }
  void wake_background() { kick(); }

  void run() { run_passes(kSpin, kPoll); }

 private:
  bool pass_locked(Completions& done) {
    bool moved = false;
    if (!cq_broken) {
      Wc wcs[kBatch];
      for (;;) {
        const int n = verbs->poll_cq(cq, kBatch, wcs);
        if (n < 0) {
          cq_broken = true;
          fail_locked(ErrorCode::peer_failure,
                      std::string("the completion queue failed (") + std::strerror(-n) + "; overrun?)", done);
          return true;
        }
        for (int i = 0; i < n; ++i) {
          const int peer = wr_peer(wcs[i].wr_id);
          if (peer >= 0 && static_cast<std::size_t>(peer) < links.size() && links[static_cast<std::size_t>(peer)])
            links[static_cast<std::size_t>(peer)]->on_completion(wcs[i], done);
        }
        if (n == 0) break;
        moved = true;
      }
    }
    for (auto& l : links)
      if (l) moved = l->progress(done) || moved;
    if (++passes_ % 256 == 0) async_events(done);
    return moved;
  }

  void fail_locked(ErrorCode code, const std::string& why, Completions& done) {
    for (auto& l : links)
      if (l) l->fail(code, why, true, done);
  }

  /// Asynchronous events: a fatal QP fails its link; a port or device going away fails them all.
  void async_events(Completions& done) {
    AsyncEvent ev;
    while (verbs->next_async_event(ev)) {
      chorus::detail::log(chorus::detail::LogLevel::warn, chorus::detail::LogSubsys::rdma, rank, "rdma: asynchronous event: ", ev.what);
      if (ev.kind == AsyncKind::qp_fatal) {
        for (auto& l : links)
          if (l && ((l->qp() && l->qp()->qp_num == ev.qp_num) || (l->control_qp() && l->control_qp()->qp_num == ev.qp_num)))
            l->fail(ErrorCode::peer_failure, "asynchronous event: " + ev.what, true, done);
      } else if (ev.kind == AsyncKind::port_down || ev.kind == AsyncKind::device_fatal) {
        fail_locked(ErrorCode::peer_failure, "asynchronous event: " + ev.what, done);
      }
    }
  }

  std::uint64_t passes_ = 0;
  std::uint64_t spins_ = 0;
};

}  // namespace detail
}  // namespace chorus::rdma
