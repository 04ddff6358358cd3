// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// Tag matching shared by the transports: receives posted before their message arrives wait in
/// `posted`; messages that arrive before their receive wait in `unexpected`. Both are FIFO per tag,
/// which is what makes messages arrive in order per (peer, tag) while different tags stay
/// independent. Not thread-safe: each transport guards it (a mutex, or the one thread that drives its engine at a time).

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <boost/circular_buffer.hpp>

#include "chorus/core/concepts.hpp"
#include "chorus/core/tag.hpp"
#include "chorus/detail/env.hpp"

namespace chorus::detail {

/// Bytes of early messages (eager messages that arrived before their receives) that this process
/// holds, every link of every communicator together, and the cap on them
/// (CHORUS_MAX_BUFFERED_BYTES, default 1 GiB). Past the cap, inproc sends wait for their receives
/// instead of being copied; a tcp or shm link that receives one more early message fails with
/// `system` naming the variable (the peer sees its link close): memory never grows without
/// bound, and nothing hangs. Each link also stops reading past 64 MiB of its own early messages.
inline std::atomic<std::size_t>& buffered_total() {
  static std::atomic<std::size_t> total{0};
  return total;
}
inline std::size_t buffered_cap() {
  static const std::size_t cap = [] {
    const auto v = env_string("CHORUS_MAX_BUFFERED_BYTES");
    return v ? static_cast<std::size_t>(parse_bytes(*v, "CHORUS_MAX_BUFFERED_BYTES")) : std::size_t(1) << 30;
  }();
  return cap;
}
/// True when `more` bytes more would take the process past buffered_cap().
inline bool over_buffered_cap(std::size_t more) {
  return buffered_total().load(std::memory_order_relaxed) + more > buffered_cap();
}
inline std::string buffered_cap_error(std::size_t more) {
  return "an early message of " + std::to_string(more) + " bytes would take the messages that wait for their receives in this process past " +
         std::to_string(buffered_cap()) + " bytes (CHORUS_MAX_BUFFERED_BYTES)";
}

/// A link's bytes of early messages: one thread at a time changes it (under its link's lock or
/// drive token) and any thread may read it (Communicator::memory_stats()); each change is also
/// counted in buffered_total(), and what is left is taken off it when the link goes.
class ByteGauge {
 public:
  ByteGauge() = default;
  ByteGauge(const ByteGauge&) = delete;
  ByteGauge& operator=(const ByteGauge&) = delete;
  ~ByteGauge() { buffered_total().fetch_sub(v_.load(std::memory_order_relaxed), std::memory_order_relaxed); }

  ByteGauge& operator+=(std::size_t n) {
    v_.store(v_.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
    buffered_total().fetch_add(n, std::memory_order_relaxed);
    return *this;
  }
  ByteGauge& operator-=(std::size_t n) {
    v_.store(v_.load(std::memory_order_relaxed) - n, std::memory_order_relaxed);
    buffered_total().fetch_sub(n, std::memory_order_relaxed);
    return *this;
  }
  operator std::size_t() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<std::size_t> v_{0};
};

/// A posted receive of the tcp and shm links: where the bytes go, the request it completes, its tag.
struct RecvOp {
  MutableBytes dst;
  std::shared_ptr<RequestState> req;
  Tag tag;
  /// For a link's entry of a receive from any source: the rank the request names as its source
  /// when this link takes it (RequestState::claim_source); unused otherwise.
  int source = -1;
};
/// A small message that arrived before its receive: a copy of its bytes.
struct EagerArrival {
  std::vector<std::byte> data;
};

/// A small (eager) message of another size than its receive: the receive fails, but first the
/// bytes of the message that fit are written to its buffer, so that a header at its front can
/// still be read (the Link concept; the collectives read the peer's descriptor from there).
inline void write_prefix(MutableBytes dst, const std::byte* src, std::size_t n) {
  const std::size_t k = n < dst.size ? n : dst.size;
  if (k != 0) std::memcpy(dst.data, src, k);
}

/// The text of a failed receive whose message has another size (every transport says it alike).
inline std::string size_mismatch(std::uint64_t sent, std::size_t posted) {
  return "message of " + std::to_string(sent) + " bytes does not fit the posted receive of " +
         std::to_string(posted) + " bytes (sizes must match)";
}

/// Appends to a circular buffer, doubling it when full: a queue that never shrinks, so a link's
/// queues allocate nothing in steady state.
template <class T>
void push_back_growing(boost::circular_buffer<T>& q, T v) {
  if (q.full()) q.set_capacity(std::max<std::size_t>(16, 2 * q.capacity()));
  q.push_back(std::move(v));
}
/// Inserts before position `at` of a circular buffer, doubling it when full (a full
/// circular_buffer's insert would overwrite its first element instead).
template <class T>
void insert_growing(boost::circular_buffer<T>& q, std::size_t at, T v) {
  if (q.full()) q.set_capacity(std::max<std::size_t>(16, 2 * q.capacity()));
  q.insert(q.begin() + static_cast<std::ptrdiff_t>(at), std::move(v));
}

/// Both lists are circular buffers in arrival (posting) order, searched from the front, that grow
/// by doubling and never shrink: matching allocates nothing in steady state (a map of per-tag
/// queues made and freed a node and a queue per message). An entry is taken out with rerase, which
/// moves the entries ahead of it, not those behind: the match is nearly always the front, so a
/// link that holds many messages of one tag (a sender thousands of messages ahead of its receiver)
/// takes each in constant time, where erasing from a vector moved every later entry (quadratic in
/// the backlog).
template <class Recv, class Arrival>
class TagMatcher {
 public:
  /// Room for as many entries as a link usually holds, so that a new peak of them does not
  /// allocate mid-run.
  static constexpr std::size_t kReserve = 16;
  TagMatcher() : posted_(kReserve), unexpected_(kReserve) {}

  /// A message arrived: the oldest receive posted for its tag, or nullopt (then keep it with
  /// add_unexpected).
  /// An entry of a receive from any source is taken only by claiming it; one that another link
  /// took (or that was withdrawn) is dropped on the way.
  std::optional<Recv> take_posted(Tag tag) {
    for (auto it = posted_.begin(); it != posted_.end();) {
      if (it->tag != tag) {
        ++it;
        continue;
      }
      if (!it->req->claim_source(it->source)) {
        it = posted_.erase(it);
        continue;
      }
      std::optional<Recv> r(std::move(*it));
      posted_.rerase(it);
      return r;
    }
    return std::nullopt;
  }
  /// A receive is about to be posted (`broken`: the link is broken, so it would fail at once):
  /// false when it is a link's entry of a receive from any source that must be dropped (another
  /// link took it or it was withdrawn; or this link is broken and others may still take it).
  /// Such an entry that matches at once (a message of its tag waits here) claims its request
  /// first; one that would wait is posted unclaimed. Entries of earlier any-source receives that
  /// are settled go first, so a link whose peer never sends holds no more of them than there are
  /// open ones.
  bool admit(Recv& r, bool broken) {
    if (!r.req->any_source()) return true;
    remove_posted_entries([](const Recv& p) { return p.req->any_source() && !p.req->source_open(); });
    if (!r.req->source_open()) return false;
    if (has_unexpected(r.tag)) return r.req->claim_source(r.source);
    if (broken) return r.req->leave_source(r.source);
    return true;
  }
  bool has_unexpected(Tag tag) const {
    return std::any_of(unexpected_.begin(), unexpected_.end(), [tag](const Unexpected& u) { return u.tag == tag; });
  }
  /// A receive was posted: calls f(Arrival&) on the oldest unexpected message of its tag and removes
  /// it; false when there is none (then post the receive). (A callback rather than an optional:
  /// moving a variant through std::optional trips g++ 12's -Wmaybe-uninitialized.)
  template <class F>
  bool take_unexpected(Tag tag, F&& f) {
    for (auto it = unexpected_.begin(); it != unexpected_.end(); ++it) {
      if (it->tag != tag) continue;
      f(it->arrival);
      unexpected_.rerase(it);
      return true;
    }
    return false;
  }

  void add_posted(Tag tag, Recv r) {
    r.tag = tag;
    push_back_growing(posted_, std::move(r));
  }
  void add_unexpected(Tag tag, Arrival a) { push_back_growing(unexpected_, Unexpected{tag, std::move(a)}); }

  /// Removes and returns every posted receive (to fail them when the link breaks); an entry of a
  /// receive from any source is returned only when no other link can take it any more
  /// (RequestState::leave_source), else dropped.
  template <class F>
  void drain_posted(F&& f) {
    for (auto& r : posted_)
      if (r.req->leave_source(r.source)) f(r);
    posted_.clear();
  }
  /// Removes the unexpected messages for which `pred` returns true, keeping the others in order.
  template <class Pred>
  void remove_unexpected_if(Pred&& pred) {
    remove_unexpected_entries([&](Unexpected& u) { return pred(u.arrival); });
  }
  /// Removes, per tag, the first unexpected message for which `pred` returns true and every later
  /// one of that tag (a link that breaks drops the large messages it can no longer fetch; the
  /// small ones behind them on their tag go too, or a receive would take them out of order).
  template <class Pred>
  void remove_unexpected_from(Pred&& pred) {
    std::vector<Tag> cut;
    remove_unexpected_entries([&](Unexpected& u) {
      if (std::find(cut.begin(), cut.end(), u.tag) != cut.end()) return true;
      if (!pred(u.arrival)) return false;
      cut.push_back(u.tag);
      return true;
    });
  }

 private:
  struct Unexpected {
    Tag tag;
    Arrival arrival;
  };
  template <class Pred>
  void remove_posted_entries(Pred&& pred) {
    posted_.erase(std::remove_if(posted_.begin(), posted_.end(), pred), posted_.end());
  }
  template <class Pred>
  void remove_unexpected_entries(Pred&& pred) {
    unexpected_.erase(std::remove_if(unexpected_.begin(), unexpected_.end(), pred), unexpected_.end());
  }
  boost::circular_buffer<Recv> posted_;
  boost::circular_buffer<Unexpected> unexpected_;
};

/// The buffers of unexpected eager messages, kept once their message was received for the next
/// one (at most kMax per link, none larger than kMaxBytes), so that messages arriving before
/// their receives cost no allocation in steady state. It starts with kMax buffers of kFirstBytes
/// (2 KiB per link): a small message that arrives early never allocates, even the first time
/// more of them wait at once than ever before.
class SpareBuffers {
 public:
  static constexpr std::size_t kMax = 8;
  static constexpr std::size_t kMaxBytes = std::size_t(64) << 10;
  static constexpr std::size_t kFirstBytes = 256;

  SpareBuffers() {
    spare_.resize(kMax);
    for (auto& v : spare_) v.reserve(kFirstBytes);
  }
  /// A buffer holding a copy of src[0, n).
  std::vector<std::byte> take(const std::byte* src, std::size_t n) {
    std::vector<std::byte> v = take_one();
    v.assign(src, src + n);
    return v;
  }
  /// A buffer of n bytes (to read into).
  std::vector<std::byte> take(std::size_t n) {
    std::vector<std::byte> v = take_one();
    v.resize(n);
    return v;
  }
  void give(std::vector<std::byte>&& v) {
    if (spare_.size() < kMax && v.capacity() <= kMaxBytes) spare_.push_back(std::move(v));
  }

 private:
  std::vector<std::byte> take_one() {
    if (spare_.empty()) return {};
    std::vector<std::byte> v = std::move(spare_.back());
    spare_.pop_back();
    return v;
  }
  std::vector<std::vector<std::byte>> spare_;
};

/// The messages of a link in flight by id (a send waiting for its clear-to-send, a receive being
/// filled): the subset of std::unordered_map's interface the links use, over a vector, since a
/// link holds a few at a time and a vector keeps its capacity (no node per message).
template <class V>
class IdMap {
 public:
  using value_type = std::pair<std::uint64_t, V>;
  using iterator = typename std::vector<value_type>::iterator;

  IdMap() { items_.reserve(8); }

  std::pair<iterator, bool> emplace(std::uint64_t id, V v) {
    if (auto it = find(id); it != end()) return {it, false};
    items_.emplace_back(id, std::move(v));
    return {std::prev(items_.end()), true};
  }
  iterator find(std::uint64_t id) {
    for (auto it = items_.begin(); it != items_.end(); ++it)
      if (it->first == id) return it;
    return end();
  }
  /// Order is not kept: the last entry takes the erased one's place.
  void erase(iterator it) {
    if (it != std::prev(items_.end())) *it = std::move(items_.back());
    items_.pop_back();
  }
  iterator begin() { return items_.begin(); }
  iterator end() { return items_.end(); }
  std::size_t size() const { return items_.size(); }
  void clear() { items_.clear(); }

 private:
  std::vector<value_type> items_;
};

}  // namespace chorus::detail
