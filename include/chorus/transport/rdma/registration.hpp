#pragma once
/// The registrations of the buffers large messages are written from and into (link.hpp).
///
/// A registration pins pages and hands the NIC their addresses, so a cached registration of a
/// buffer that was freed and whose addresses were handed out again would let the NIC read and
/// write the old pages. So only memory chorus owns is cached: the executors' scratch, announced to
/// detail::OwnedMemory while allocated. The cache registers such a range whole on first use and
/// keeps it until the range is retired (its listener hears it before the memory is freed) or the
/// cache is past its cap (CHORUS_IB_REG_CACHE_BYTES, default 256 MiB: the least recently used
/// ranges go). Any other buffer, a user's, is registered per message and deregistered when the
/// message completes or fails ("per-call registration for uncached ranges").

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <utility>

#include "chorus/detail/env.hpp"
#include "chorus/detail/owned_memory.hpp"
#include "chorus/transport/rdma/verbs.hpp"

namespace chorus::rdma {

struct Deregister {
  Verbs* v;
  void operator()(Mr* m) const {
    if (m) v->dereg_mr(m);
  }
};
using MrPtr = std::unique_ptr<Mr, Deregister>;

/// The keys a message uses for its buffer, held as long as the message: its own registration, or
/// a share of a cached one (the registration outlives a retirement until its last user ends).
class Registration {
 public:
  Registration() = default;
  explicit Registration(MrPtr own) : own_(std::move(own)) {}
  explicit Registration(std::shared_ptr<Mr> shared) : shared_(std::move(shared)) {}
  explicit operator bool() const { return own_ || shared_; }
  std::uint32_t lkey() const { return own_ ? own_->lkey : shared_->lkey; }
  std::uint32_t rkey() const { return own_ ? own_->rkey : shared_->rkey; }
  bool cached() const { return shared_ != nullptr; }

 private:
  MrPtr own_;
  std::shared_ptr<Mr> shared_;
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
    if (range.id != 0 && range.length <= state_->cap) {
      if (auto mr = state_->lookup(range.id)) return Registration(std::move(mr));
      Mr* m = state_->v.reg_mr(const_cast<std::byte*>(range.begin), range.length, kAccess, err);
      if (!m) return {};
      std::shared_ptr<Mr> shared(m, Deregister{&state_->v});
      // Retired meanwhile (its listener found nothing to forget yet): use it for this message
      // only; the memory is still there, since the caller is about to use it.
      if (owned.live(range.id)) state_->insert(range.id, range.length, shared);
      if (!owned.live(range.id)) state_->forget(range.id);
      return Registration(std::move(shared));
    }
    Mr* m = state_->v.reg_mr(p, n, kAccess, err);
    if (!m) return {};
    return Registration(MrPtr(m, Deregister{&state_->v}));
  }

  /// Bytes of the ranges cached now.
  std::size_t bytes() const {
    std::lock_guard lk(state_->mu);
    return state_->bytes;
  }

 private:
  struct Entry {
    std::uint64_t id;
    std::size_t length;
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
    void insert(std::uint64_t id, std::size_t length, std::shared_ptr<Mr> mr) {
      std::list<Entry> gone;  // deregistered after the lock
      std::lock_guard lk(mu);
      while (!lru.empty() && bytes + length > cap) {
        bytes -= lru.back().length;
        gone.splice(gone.begin(), lru, std::prev(lru.end()));
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

  std::shared_ptr<State> state_;
  std::uint64_t listener_ = 0;
};

}  // namespace chorus::rdma
