// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// Memory that chorus allocates and frees itself (the host executor's scratch), and user memory
/// the caller registered (chorus::RegisteredMemory, registered_memory.hpp): a transport that
/// registers memory with a device may keep a registration of such a range until the range is
/// retired (rdma: its registration cache), which it cannot safely do for any other buffer of the
/// user's: that can be freed and its addresses handed out again behind the transport's back, and
/// a cached registration would then name the old pages.
///
/// OwnedMemory is one registry per process: ranges are announced when allocated and retired
/// before they are freed; listeners (the registration caches) hear of every retirement, after the
/// registry's lock is released, before the memory goes.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace chorus::detail {

class OwnedMemory {
 public:
  struct Range {
    std::uint64_t id = 0;  ///< 0: none
    const std::byte* begin = nullptr;
    std::size_t length = 0;
    bool user = false;  ///< registered by the user: kept registered whatever a cache's cap
  };
  using Listener = std::function<void(std::uint64_t id)>;

  static OwnedMemory& instance() {
    static OwnedMemory m;
    return m;
  }

  /// A new range; its id (never 0, never reused). `user`: the user's (RegisteredMemory).
  std::uint64_t announce(const void* p, std::size_t n, bool user = false) {
    std::lock_guard lk(mu_);
    const std::uint64_t id = ++next_;
    ranges_.push_back({id, static_cast<const std::byte*>(p), n, user});
    return id;
  }
  /// The range is about to be freed: every listener hears it first.
  void retire(std::uint64_t id) {
    if (id == 0) return;
    std::vector<std::shared_ptr<Listener>> ls;
    {
      std::lock_guard lk(mu_);
      std::erase_if(ranges_, [&](const Range& r) { return r.id == id; });
      for (auto& [k, l] : listeners_) ls.push_back(l);
    }
    for (auto& l : ls) (*l)(id);
  }
  /// The live range that holds [p, p + n), or a Range with id 0.
  Range find(const void* p, std::size_t n) const {
    const auto* b = static_cast<const std::byte*>(p);
    std::lock_guard lk(mu_);
    for (const Range& r : ranges_)
      if (b >= r.begin && b + n <= r.begin + r.length) return r;
    return {};
  }
  bool live(std::uint64_t id) const {
    std::lock_guard lk(mu_);
    return std::any_of(ranges_.begin(), ranges_.end(), [&](const Range& r) { return r.id == id; });
  }

  std::uint64_t listen(Listener l) {
    std::lock_guard lk(mu_);
    listeners_.emplace_back(++next_listener_, std::make_shared<Listener>(std::move(l)));
    return next_listener_;
  }
  /// After it returns, the listener is not called again (one already running may finish).
  void unlisten(std::uint64_t key) {
    std::lock_guard lk(mu_);
    std::erase_if(listeners_, [&](const auto& e) { return e.first == key; });
  }

 private:
  mutable std::mutex mu_;
  std::vector<Range> ranges_;
  std::vector<std::pair<std::uint64_t, std::shared_ptr<Listener>>> listeners_;
  std::uint64_t next_ = 0;
  std::uint64_t next_listener_ = 0;
};

/// A heap buffer of bytes announced to OwnedMemory while it has storage (what std::vector<byte>
/// was to the scratch, with the registry told of every reallocation).
class OwnedBuffer {
 public:
  OwnedBuffer() = default;
  explicit OwnedBuffer(std::size_t n) { resize(n); }
  OwnedBuffer(const OwnedBuffer&) = delete;
  OwnedBuffer& operator=(const OwnedBuffer&) = delete;
  ~OwnedBuffer() { release(); }

  std::byte* data() { return p_.get(); }
  std::size_t size() const { return n_; }
  /// Grows or shrinks to n bytes; the contents are kept up to min(old, n).
  void resize(std::size_t n) {
    if (n == n_) return;
    std::unique_ptr<std::byte[]> q;
    std::uint64_t id = 0;
    if (n != 0) {
      q.reset(new std::byte[n]);
      if (n_ != 0) std::memcpy(q.get(), p_.get(), std::min(n, n_));
      id = OwnedMemory::instance().announce(q.get(), n);
    }
    release();
    p_ = std::move(q);
    n_ = n;
    id_ = id;
  }

 private:
  void release() {
    OwnedMemory::instance().retire(id_);
    p_.reset();
    n_ = 0;
    id_ = 0;
  }
  std::unique_ptr<std::byte[]> p_;
  std::size_t n_ = 0;
  std::uint64_t id_ = 0;
};

}  // namespace chorus::detail
