// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// The registrations of the buffers large messages are written from and into (link.hpp).
///
/// A registration pins pages and hands the NIC their addresses, so a cached registration of a
/// buffer that was freed and whose addresses were handed out again would let the NIC read and
/// write the old pages. So only ranges announced to detail::OwnedMemory are cached: memory chorus
/// owns (the host executor's scratch, announced while allocated) and user memory the caller registered
/// (chorus::RegisteredMemory, like ncclCommRegister: the caller keeps it allocated while the
/// handle lives). The cache registers such a range whole on first use and keeps it until the
/// range is retired (its listener hears it before the memory is freed) or, for chorus's own
/// ranges, the cache is past its cap (CHORUS_IB_REG_CACHE_BYTES, default 256 MiB: the least
/// recently used of them go; the user's ranges are the user's to release and count against no
/// cap). Any other buffer of the user's is registered per message and deregistered when the
/// message completes or fails ("per-call registration for uncached ranges"). Messages in flight
/// over exactly the same range share that registration (a buffer sent to several peers, or sent
/// again before the last send of it ended): while one of them is in flight the range is the
/// caller's live buffer, so the registration names its pages; it goes with the last of them.
/// A range merely inside another message's range gets its own: the rest of that range may be
/// freed once the message that named it ends.
///
/// Device memory (get_device): registered per message through a dma-buf of the device runtime
/// (device::Runtime::export_dmabuf, then Verbs::reg_dmabuf_mr; the fd is closed at once, the
/// registration holds the memory), shared with no other message and never cached: it is made
/// after the message was posted, while the buffer is the caller's live memory, and deregistered
/// when the message completes or fails. So a device buffer that is freed and whose addresses are
/// handed out again is always registered anew, over the new allocation's dma-buf.

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "chorus/core/error.hpp"
#include "chorus/detail/env.hpp"
#include "chorus/device/runtime.hpp"
#include "chorus/detail/owned_memory.hpp"
#include "chorus/transport/rdma/detail/verbs.hpp"

namespace chorus::rdma {

struct Deregister {
  Verbs* v;
  void operator()(Mr* m) const {
    if (m) v->dereg_mr(m);
  }
};

/// The keys a message uses for its buffer, held as long as the message: a share of a cached
/// registration, or of one made for the messages in flight over its range (a registration
/// outlives a retirement, or the message that made it, until its last user ends).
class Registration {
 public:
  Registration() = default;
  Registration(std::shared_ptr<Mr> mr, bool cached) : mr_(std::move(mr)), cached_(cached) {}
  explicit operator bool() const { return mr_ != nullptr; }
  std::uint32_t lkey() const { return mr_->lkey; }
  std::uint32_t rkey() const { return mr_->rkey; }
  /// Cached (memory chorus owns, or the user registered), not made for messages in flight.
  bool cached() const { return cached_; }

 private:
  std::shared_ptr<Mr> mr_;
  bool cached_ = false;
};

class RegistrationCache {
 public:
  static constexpr std::size_t kDefaultCap = std::size_t(256) << 20;
  static constexpr int kAccess = kLocalWrite | kRemoteWrite;

  /// Registrations made on `v`, cached up to CHORUS_IB_REG_CACHE_BYTES (0: nothing is cached).
  explicit RegistrationCache(Verbs& v) : state_(std::make_shared<State>(v)) {
    if (auto s = chorus::detail::env_string("CHORUS_IB_REG_CACHE_BYTES"))
      state_->cap = static_cast<std::size_t>(chorus::detail::parse_bytes(*s, "CHORUS_IB_REG_CACHE_BYTES"));
    std::weak_ptr<State> weak = state_;
    listener_ = chorus::detail::OwnedMemory::instance().listen([weak](std::uint64_t id) {
      if (auto s = weak.lock()) s->forget(id);
    });
  }
  RegistrationCache(const RegistrationCache&) = delete;
  RegistrationCache& operator=(const RegistrationCache&) = delete;
  ~RegistrationCache() { chorus::detail::OwnedMemory::instance().unlisten(listener_); }

  /// The registration for [p, p + n) (local and remote write allowed); empty, with `err` set to
  /// the errno, when the device refuses it.
  Registration get(void* p, std::size_t n, int& err) {
    auto& owned = chorus::detail::OwnedMemory::instance();
    const auto range = owned.find(p, n);
    if (range.id != 0 && (range.user || range.length <= state_->cap)) {
      if (auto mr = state_->lookup(range.id)) return Registration(std::move(mr), true);
      Mr* m = state_->v.reg_mr(const_cast<std::byte*>(range.begin), range.length, kAccess, err);
      if (!m) return {};
      std::shared_ptr<Mr> shared(m, Deregister{&state_->v});
      // Retired meanwhile (its listener found nothing to forget yet): use it for this message
      // only; the memory is still there, since the caller is about to use it.
      if (owned.live(range.id)) state_->insert(range.id, range.user ? 0 : range.length, shared);
      if (!owned.live(range.id)) state_->forget(range.id);
      return Registration(std::move(shared), true);
    }
    std::lock_guard lk(flight_mu_);
    std::erase_if(in_flight_, [](const InFlight& f) { return f.mr.expired(); });
    for (const InFlight& f : in_flight_)
      if (f.begin == p && f.length == n)
        if (auto mr = f.mr.lock()) return Registration(std::move(mr), false);
    Mr* m = state_->v.reg_mr(p, n, kAccess, err);
    if (!m) return {};
    std::shared_ptr<Mr> mr(m, Deregister{&state_->v});
    in_flight_.push_back({p, n, mr});
    return Registration(std::move(mr), false);
  }

  // --- device memory (dma-buf) -----------------------------------------------------------------
  /// A registration of device memory [p, p + n) of `rt` for one message (see the top of the
  /// file); empty, with `why` set, when the runtime cannot export it or the device refuses it.
  Registration get_device(device::Runtime& rt, void* p, std::size_t n, std::string& why) {
    device::Runtime::DmabufExport x;
    try {
      x = rt.export_dmabuf(p, n);
    } catch (const Error& e) {
      why = e.what();
      return {};
    }
    int err = 0;
    Mr* m = state_->v.reg_dmabuf_mr(x.offset, n, reinterpret_cast<std::uintptr_t>(p), x.fd, kAccess, err);
    ::close(x.fd);
    if (!m) {
      why = std::string("ibv_reg_dmabuf_mr failed (") + std::strerror(err) + ")";
      return {};
    }
    return Registration(std::shared_ptr<Mr>(m, Deregister{&state_->v}), false);
  }
  // --- end of device memory (dma-buf) ----------------------------------------------------------

  /// Bytes of chorus's own ranges cached now (the user's registered ranges count 0).
  std::size_t bytes() const {
    std::lock_guard lk(state_->mu);
    return state_->bytes;
  }

 private:
  struct Entry {
    std::uint64_t id;
    std::size_t length;  ///< counted against the cap (0 for the user's ranges)
    std::shared_ptr<Mr> mr;
  };
  struct State {
    explicit State(Verbs& verbs) : v(verbs) {}
    Verbs& v;
    std::size_t cap = kDefaultCap;
    mutable std::mutex mu;
    std::list<Entry> lru;  ///< most recently used first
    std::size_t bytes = 0;

    std::shared_ptr<Mr> lookup(std::uint64_t id) {
      std::lock_guard lk(mu);
      for (auto it = lru.begin(); it != lru.end(); ++it)
        if (it->id == id) {
          lru.splice(lru.begin(), lru, it);
          return it->mr;
        }
      return nullptr;
    }
    /// Caches `mr`; `length` 0 (a user's range) is never dropped for the cap.
    void insert(std::uint64_t id, std::size_t length, std::shared_ptr<Mr> mr) {
      std::list<Entry> gone;  // deregistered after the lock
      std::lock_guard lk(mu);
      for (auto it = lru.end(); length != 0 && bytes + length > cap && it != lru.begin();) {
        --it;  // from the least recently used on
        if (it->length == 0) continue;
        bytes -= it->length;
        gone.splice(gone.begin(), lru, it++);
      }
      lru.push_front({id, length, std::move(mr)});
      bytes += length;
    }
    void forget(std::uint64_t id) {
      std::list<Entry> gone;
      std::lock_guard lk(mu);
      for (auto it = lru.begin(); it != lru.end(); ++it)
        if (it->id == id) {
          bytes -= it->length;
          gone.splice(gone.begin(), lru, it);
          break;
        }
    }
  };

  /// A registration made for messages in flight over exactly [begin, begin + length).
  struct InFlight {
    const void* begin;
    std::size_t length;
    std::weak_ptr<Mr> mr;
  };

  std::shared_ptr<State> state_;
  std::uint64_t listener_ = 0;
  std::mutex flight_mu_;
  std::vector<InFlight> in_flight_;  ///< expired entries are dropped at the next get
};

}  // namespace chorus::rdma
