// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// What a group (Communicator::group_start ... group_end, chorus/group.hpp) records and checks: the
// calls issued while it is open, the guard that stops its owner from waiting for them before
// group_end(), the signature the ranks compare (one group against another), and the fused
// buckets (small collectives of one kind, dtype, op and root packed into one call). Included by
// impl/state.hpp after communicator.hpp's declarations (Call); the bodies that run a group are in
// impl/group_calls.hpp.

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "chorus/algo/descriptor.hpp"
#include "chorus/core/error.hpp"
#include "chorus/core/request.hpp"
#include "chorus/core/types.hpp"
#include "chorus/detail/fnv.hpp"
#include "chorus/device/runtime.hpp"

namespace chorus::detail {

/// A call of collective `kind` joins a fused bucket when its largest buffer holds at most this
/// many bytes; a bucket is issued as one call of at most kGroupFuseBucketBytes (its largest
/// buffer), more buckets beyond.
inline constexpr std::size_t kGroupFuseCallBytes = std::size_t(256) << 10;
inline constexpr std::size_t kGroupFuseBucketBytes = std::size_t(8) << 20;

/// The descriptor of a call (its sequence number not yet taken).
inline algo::CollectiveDesc desc_of(const Call& c) {
  algo::CollectiveDesc d;
  d.kind = c.kind;
  d.count = c.count;
  d.dtype = c.dtype;
  d.op = c.op;
  d.root = c.root;
  return d;
}

/// One call recorded by an open group.
struct GroupItem {
  enum class Kind { collective, send, recv };
  Kind kind = Kind::collective;
  Call call;                             ///< a collective, as Communicator::start normalised it
  std::optional<device::Stream> stream;  ///< a call on device buffers ordered on a stream
  bool fusable = false;                  ///< host buffers of a kind a bucket takes (see group_calls.hpp)
  std::byte* data = nullptr;             ///< send (only read), recv
  std::size_t bytes = 0;                 ///< send, recv
  int peer = -1, tag = 0;                ///< send, recv
  std::shared_ptr<RequestState> req;     ///< what the caller holds; completed by group_end()
};

/// The driver of a recorded call's request while its group is open: the thread that opened the
/// group gets invalid_argument if it waits for one of them (its calls run at group_end(), so the
/// wait could only time out); another thread waits until group_end() has completed it.
class GroupGuard final : public Driver {
 public:
  explicit GroupGuard(std::thread::id owner) : owner_(owner) {}
  void close() { open_.store(false, std::memory_order_release); }
  /// After group_end() issued the call of `item`: a wait for `item` drives the engine of that
  /// call's request (a collective kernel's, whose requests complete when a waiter reaps them).
  void forward(const RequestState* item, std::weak_ptr<Driver> to) {
    std::lock_guard lk(mu_);
    forward_.emplace_back(item, std::move(to));
  }
  void drive(const RequestState& r, Clock::time_point deadline) override {
    if (open_.load(std::memory_order_acquire) && std::this_thread::get_id() == owner_)
      throw Error(ErrorCode::invalid_argument, r.context(),
                  "waited for inside the group that issued it: a group's calls run at group_end() (chorus/group.hpp); "
                  "wait after it");
    std::shared_ptr<Driver> to;
    {
      std::lock_guard lk(mu_);
      for (const auto& [item, d] : forward_)
        if (item == &r) to = d.lock();
    }
    if (to) to->drive(r, deadline);  // until r is done (its call's completion completes it) or the deadline
  }
  void drive_until(bool (*)(const void*), const void*, Clock::time_point) override {}
  void poll() override {
    std::vector<std::shared_ptr<Driver>> all;
    {
      std::lock_guard lk(mu_);
      for (const auto& f : forward_)
        if (auto d = f.second.lock()) all.push_back(std::move(d));
    }
    for (const auto& d : all) d->poll();
  }
  void on_timeout(const Error&) override {}

 private:
  std::thread::id owner_;
  std::atomic<bool> open_{true};
  std::mutex mu_;
  std::vector<std::pair<const RequestState*, std::weak_ptr<Driver>>> forward_;  ///< under mu_
};

/// What the ranks of a group compare before running it: its collectives in order (kind, count,
/// dtype, op, root), hashed, and counted per kind. Sends and receives are not in it (they differ
/// between ranks by nature; each is checked on its link, as outside a group).
struct GroupSignature {
  static constexpr std::size_t kKinds = 10;  ///< CollectiveKind::all_reduce (1) ... split (10)
  static constexpr std::size_t kWords = 3 + kKinds;
  std::uint64_t hash = kFnvBasis;
  std::uint64_t collectives = 0;
  std::uint64_t bytes = 0;  ///< count x element size, summed: what this rank's calls name
  std::array<std::uint64_t, kKinds> per_kind{};

  void add(const Call& c) {
    const std::uint64_t fields[] = {static_cast<std::uint64_t>(c.kind), c.count, static_cast<std::uint64_t>(c.dtype),
                                    static_cast<std::uint64_t>(c.op), static_cast<std::uint64_t>(static_cast<std::int64_t>(c.root))};
    for (std::uint64_t f : fields) {
      char le[8];  // the field's bytes from the lowest, whatever the host's byte order
      for (int b = 0; b < 8; ++b) le[b] = static_cast<char>((f >> (8 * b)) & 0xffu);
      hash = fnv1a(hash, std::string_view(le, sizeof le));
    }
    ++collectives;
    bytes += c.kind == algo::CollectiveKind::barrier ? 0 : c.count * size_of(c.dtype);
    const auto k = static_cast<std::size_t>(c.kind);
    if (k >= 1 && k <= kKinds) ++per_kind[k - 1];
  }
  std::array<std::uint64_t, kWords> words() const {
    std::array<std::uint64_t, kWords> w{hash, collectives, bytes};
    for (std::size_t k = 0; k < kKinds; ++k) w[3 + k] = per_kind[k];
    return w;
  }
  static GroupSignature from(const std::uint64_t* w) {
    GroupSignature s;
    s.hash = w[0];
    s.collectives = w[1];
    s.bytes = w[2];
    for (std::size_t k = 0; k < kKinds; ++k) s.per_kind[k] = w[3 + k];
    return s;
  }
  bool operator==(const GroupSignature&) const = default;
  /// "3 collectives (2 all_reduce, 1 broadcast; 8200 bytes named, signature 0x1f...)"
  std::string describe() const {
    std::string s = std::to_string(collectives) + (collectives == 1 ? " collective (" : " collectives (");
    bool first = true;
    for (std::size_t k = 0; k < kKinds; ++k) {
      if (per_kind[k] == 0) continue;
      s += (first ? "" : ", ") + std::to_string(per_kind[k]) + " " +
           std::string(algo::to_string(static_cast<algo::CollectiveKind>(k + 1)));
      first = false;
    }
    char sig[32];
    std::snprintf(sig, sizeof sig, "%016llx", static_cast<unsigned long long>(hash));
    return s + (first ? "" : "; ") + std::to_string(bytes) + " bytes named, signature 0x" + sig + ")";
  }
};

/// What makes small collectives fusable into one call: same kind, dtype, op and root.
struct FuseKey {
  algo::CollectiveKind kind;
  DataType dtype;
  ReduceOp op;
  int root;
  bool operator==(const FuseKey&) const = default;
};

inline FuseKey fuse_key(const Call& c) { return {c.kind, c.dtype, c.op, c.root}; }

/// The kinds a bucket takes (each packs its members' buffers back to back; barriers collapse).
inline bool fusable_kind(algo::CollectiveKind k) {
  using K = algo::CollectiveKind;
  return k == K::all_reduce || k == K::reduce || k == K::broadcast || k == K::all_gather || k == K::reduce_scatter ||
         k == K::barrier;
}

/// The largest buffer of a call on a communicator of `n` ranks, in bytes.
inline std::size_t largest_buffer(const Call& c, int n) {
  const std::size_t b = c.count * size_of(c.dtype);
  return c.kind == algo::CollectiveKind::all_gather || c.kind == algo::CollectiveKind::reduce_scatter ? b * static_cast<std::size_t>(n) : b;
}

/// A bucket: members (indices into the recorded items) whose calls share a FuseKey, packed into
/// one call on this rank's scratch. `n` ranks, `me` this rank, `s` the element size; member j's
/// block is at element offset off[j] of the packed block of C = total elements.
class FusedBucket {
 public:
  FusedBucket(std::vector<const Call*> calls, int n, int me) : calls_(std::move(calls)), n_(n), me_(me) {
    const Call& c0 = *calls_.front();
    s_ = size_of(c0.dtype);
    for (const Call* c : calls_) {
      off_.push_back(total_);
      total_ += c->count;
    }
  }
  /// The call that moves the whole bucket, on buffers packed from the members' inputs.
  Call pack() {
    const Call& c0 = *calls_.front();
    using K = algo::CollectiveKind;
    Call f = c0;
    f.count = total_;
    const std::size_t n = static_cast<std::size_t>(n_), block = total_ * s_;
    switch (c0.kind) {
      case K::barrier: return f;
      case K::all_reduce:
      case K::broadcast:
        in_ = scratch(block);
        if (c0.kind == K::all_reduce || me_ == c0.root)
          for (std::size_t j = 0; j < calls_.size(); ++j) copy(in_.get() + off_[j] * s_, calls_[j]->in, calls_[j]->count * s_);
        f.in = in_.get();
        f.out = in_.get();
        return f;
      case K::reduce:
        in_ = scratch(block);
        for (std::size_t j = 0; j < calls_.size(); ++j) copy(in_.get() + off_[j] * s_, calls_[j]->in, calls_[j]->count * s_);
        if (me_ == c0.root) out_ = scratch(block);
        f.in = in_.get();
        f.out = me_ == c0.root ? out_.get() : nullptr;
        return f;
      case K::all_gather:
        in_ = scratch(block);
        out_ = scratch(block * n);
        for (std::size_t j = 0; j < calls_.size(); ++j) copy(in_.get() + off_[j] * s_, calls_[j]->in, calls_[j]->count * s_);
        f.in = in_.get();
        f.out = out_.get();
        return f;
      case K::reduce_scatter:  // block p of every member's in goes to block p of the packed in
        in_ = scratch(block * n);
        out_ = scratch(block);
        for (std::size_t p = 0; p < n; ++p)
          for (std::size_t j = 0; j < calls_.size(); ++j) {
            const std::size_t cj = calls_[j]->count * s_;
            copy(in_.get() + p * block + off_[j] * s_, static_cast<const std::byte*>(calls_[j]->in) + p * cj, cj);
          }
        f.in = in_.get();
        f.out = out_.get();
        return f;
      default: return f;  // not fusable_kind: never bucketed
    }
  }
  /// The members' outputs, from the fused call's.
  void unpack() const {
    using K = algo::CollectiveKind;
    const Call& c0 = *calls_.front();
    const std::size_t n = static_cast<std::size_t>(n_), block = total_ * s_;
    for (std::size_t j = 0; j < calls_.size(); ++j) {
      const std::size_t cj = calls_[j]->count * s_;
      auto* out = static_cast<std::byte*>(calls_[j]->out);
      switch (c0.kind) {
        case K::all_reduce:
        case K::broadcast: copy(out, in_.get() + off_[j] * s_, cj); break;
        case K::reduce:
          if (me_ == c0.root) copy(out, out_.get() + off_[j] * s_, cj);
          break;
        case K::all_gather:
          for (std::size_t p = 0; p < n; ++p) copy(out + p * cj, out_.get() + p * block + off_[j] * s_, cj);
          break;
        case K::reduce_scatter: copy(out, out_.get() + off_[j] * s_, cj); break;
        default: break;
      }
    }
  }

 private:
  static std::unique_ptr<std::byte[]> scratch(std::size_t bytes) { return std::make_unique_for_overwrite<std::byte[]>(bytes); }
  static void copy(std::byte* to, const void* from, std::size_t bytes) {
    if (bytes != 0) std::memcpy(to, from, bytes);
  }
  std::vector<const Call*> calls_;
  int n_, me_;
  std::size_t s_ = 1, total_ = 0;
  std::vector<std::size_t> off_;
  std::unique_ptr<std::byte[]> in_, out_;  ///< every byte is written before it is read: not zeroed
};

}  // namespace chorus::detail
