#pragma once
/// Tag matching shared by the transports: receives posted before their message arrives wait in
/// `posted`; messages that arrive before their receive wait in `unexpected`. Both are FIFO per tag,
/// which is what makes messages arrive in order per (peer, tag) while different tags stay
/// independent. Not thread-safe: each transport guards it (a mutex, or its one progress thread).

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <deque>
#include <optional>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "chorus/core/concepts.hpp"

namespace chorus::detail {

/// A posted receive of the tcp and shm links: where the bytes go, the request it completes, its tag.
struct RecvOp {
  MutableBytes dst;
  std::shared_ptr<RequestState> req;
  Tag tag;
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

template <class Recv, class Arrival>
class TagMatcher {
 public:
  /// A message arrived: the oldest receive posted for its tag, or nullopt (then keep it with
  /// add_unexpected).
  std::optional<Recv> take_posted(Tag tag) { return take(posted_, tag); }
  /// A receive was posted: calls f(Arrival&) on the oldest unexpected message of its tag and removes
  /// it; false when there is none (then post the receive). (A callback rather than an optional:
  /// moving a variant through std::optional trips g++ 12's -Wmaybe-uninitialized.)
  template <class F>
  bool take_unexpected(Tag tag, F&& f) {
    auto it = unexpected_.find(tag);
    if (it == unexpected_.end()) return false;
    f(it->second.front());
    it->second.pop_front();
    if (it->second.empty()) unexpected_.erase(it);
    return true;
  }

  void add_posted(Tag tag, Recv r) { posted_[tag].push_back(std::move(r)); }
  void add_unexpected(Tag tag, Arrival a) { unexpected_[tag].push_back(std::move(a)); }

  /// Removes and returns every posted receive (to fail them when the link breaks).
  template <class F>
  void drain_posted(F&& f) {
    for (auto& [tag, q] : posted_)
      for (auto& r : q) f(r);
    posted_.clear();
  }
  /// Removes the unexpected messages for which `pred` returns true, keeping the others in order.
  template <class Pred>
  void remove_unexpected_if(Pred&& pred) {
    for (auto it = unexpected_.begin(); it != unexpected_.end();) {
      auto& q = it->second;
      for (auto a = q.begin(); a != q.end();) a = pred(*a) ? q.erase(a) : std::next(a);
      it = q.empty() ? unexpected_.erase(it) : std::next(it);
    }
  }

 private:
  template <class T>
  static std::optional<T> take(std::unordered_map<Tag, std::deque<T>>& m, Tag tag) {
    auto it = m.find(tag);
    if (it == m.end()) return std::nullopt;
    T v = std::move(it->second.front());
    it->second.pop_front();
    if (it->second.empty()) m.erase(it);
    return v;
  }
  std::unordered_map<Tag, std::deque<Recv>> posted_;
  std::unordered_map<Tag, std::deque<Arrival>> unexpected_;
};

/// Tag layout on links (see communicator.hpp): bits 63..48 communicator context, bit 47 set for
/// internal traffic (collectives, barrier), low 47 bits the user's tag or the internal sequence.
inline constexpr Tag kInternalTagBit = Tag(1) << 47;
inline constexpr int kContextShift = 48;

inline std::string describe_tag(Tag t) {
  std::ostringstream os;
  const Tag low = t & (kInternalTagBit - 1);
  if (t & kInternalTagBit)
    os << "internal tag 0x" << std::hex << low;
  else
    os << "tag " << low;
  if (const Tag ctx = t >> kContextShift; ctx != 0) os << " (context " << std::dec << ctx << ")";
  return os.str();
}

/// "send tag 5 (1024 bytes)": the operation part of an error message.
inline std::string describe_op(const char* verb, Tag tag, std::size_t bytes) {
  std::ostringstream os;
  os << verb << ' ' << describe_tag(tag) << " (" << bytes << " bytes)";
  return os.str();
}

}  // namespace chorus::detail
