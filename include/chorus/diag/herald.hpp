// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// How a mismatch found by one rank reaches every rank of the group: a fixed-size notice on the
/// group's error tag, which every rank keeps a receive posted for (Watch), told on by each rank
/// that learns of it before its transport aborts (Herald).

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "chorus/algo/group.hpp"
#include "chorus/core/concepts.hpp"
#include "chorus/core/error.hpp"
#include "chorus/core/request.hpp"
#include "chorus/detail/log.hpp"
#include "chorus/core/tag.hpp"

namespace chorus::mismatch {

using chorus::detail::RequestState;

/// How a rank that detects a collective mismatch tells the others: a fixed-size message on the
/// group's error tag (error_tag()), which every rank keeps a receive posted for.
struct ErrorNotice {
  static constexpr std::size_t kBytes = 1024;
  std::uint32_t code = 0;
  std::uint32_t length = 0;
  char text[kBytes - 8] = {};

  /// A notice of an error with this code and text (cut to fit).
  static ErrorNotice of(ErrorCode c, std::string_view what) {
    ErrorNotice n;
    n.code = static_cast<std::uint32_t>(c);
    n.length = static_cast<std::uint32_t>(std::min(what.size(), sizeof n.text));
    std::memcpy(n.text, what.data(), n.length);
    return n;
  }
  /// The text it carries (never read past the buffer, whatever `length` says).
  std::string message() const { return std::string(text, std::min<std::size_t>(length, sizeof text)); }
};
static_assert(sizeof(ErrorNotice) == ErrorNotice::kBytes);

/// The tag of a group's error notices (`context`: the group's high tag bits).
inline Tag error_tag(Tag context) { return context | chorus::detail::kInternalTagBit | algo::kTagClassError; }

/// Tells every other rank of a group about a mismatch, once per communicator, then aborts this
/// rank's transport with it. Started by the rank that finds the mismatch and, with the text it
/// received, by every rank that a notice reaches: each rank that learns tells everyone before its
/// transport aborts. Without the forwarding a notice could be lost: two ranks that find the
/// mismatch at once each abort the other through their first notices, and the abort fails the
/// notices still queued, so a third rank that talks to neither waits on, unaware.
/// Shared by the communicator and its notice receives' callbacks, which may run after the
/// communicator is gone, on a progress thread or (inproc) the sending rank's thread: never blocks
/// there; the transport is aborted by whichever thread completes the last notice.
template <Transport T>
class Herald : public std::enable_shared_from_this<Herald<T>> {
 public:
  Herald(std::weak_ptr<T> transport, std::vector<int> members, int rank, Tag tag)
      : transport_(std::move(transport)), members_(std::move(members)), rank_(rank), tag_(tag) {}

  /// Starts telling every peer about `e`; false (nothing done) when this rank already has.
  bool start(const Error& e) {
    if (started_.exchange(true)) return false;
    auto t = transport_.lock();
    if (!t) return true;
    const std::string text = e.what();
    notice_ = ErrorNotice::of(e.code(), text);
    // One count per notice plus one for this loop: the transport aborts once all have left.
    pending_.store(static_cast<int>(members_.size()));
    // The error travels as plain data and is made anew by the thread that aborts: no exception
    // object (its what() string is shared between copies) crosses threads.
    auto finish = [self = this->shared_from_this(), code = e.code(), text] {
      if (self->pending_.fetch_sub(1) != 1) return;
      if (auto tr = self->transport_.lock()) tr->abort(Error::from_text(code, text, self->rank_, -1));
    };
    for (int p = 0; p < static_cast<int>(members_.size()); ++p) {
      if (p == rank_) continue;
      Request s = t->link(members_[static_cast<std::size_t>(p)])
                      .isend(ConstBytes{reinterpret_cast<const std::byte*>(&notice_), sizeof notice_}, tag_);
      sends_.push_back(s);
      s.state()->then(finish);  // runs at once when the send is already done (or failed)
    }
    finish();
    return true;
  }

  /// After a start() that returned true: waits until every notice has left or failed, or until
  /// `deadline` (a failure path's own short bound: a peer that cannot be reached must not hold
  /// the others for the whole timeout). The last one's completion aborts the transport, possibly
  /// a moment after this returns (a request wakes its waiter before it runs its callback); the
  /// caller aborts it anyway.
  void wait(std::chrono::steady_clock::time_point deadline) {
    for (auto& s : sends_) {
      try {
        if (!s.state()->wait_before(deadline)) return;  // the caller's abort fails what is left
      } catch (...) {  // that peer is gone already
      }
    }
  }

 private:
  std::weak_ptr<T> transport_;
  std::vector<int> members_;  ///< group rank -> transport rank
  int rank_;
  Tag tag_;
  std::atomic<bool> started_{false};
  std::atomic<int> pending_{0};
  ErrorNotice notice_;          ///< sent from here to every peer
  std::vector<Request> sends_;  ///< written by start() only, read by wait() on the same thread
};

/// The receives, one per peer, that learn of a mismatch another rank detected: a notice that
/// arrives is told on to every rank (the Herald), which then aborts this rank's transport. One
/// receive buffer per peer, owned jointly with the pending receives' callbacks: a receive still
/// posted in a shared link when the communicator is gone keeps its buffer alive.
template <Transport T>
struct Watch {
  std::shared_ptr<std::vector<ErrorNotice>> notices;
  std::vector<Request> notice_recvs;
  std::shared_ptr<Herald<T>> herald;  ///< tells the others of a mismatch

  static Watch start(const std::shared_ptr<T>& transport, const algo::Group<T>& group) {
    Watch w;
    const int n = group.size();
    const Tag tag = error_tag(group.context);
    w.herald = std::make_shared<Herald<T>>(transport, group.members, group.rank, tag);
    w.notices = std::make_shared<std::vector<ErrorNotice>>(static_cast<std::size_t>(n));
    for (int p = 0; p < n; ++p) {
      if (p == group.rank) continue;
      auto* notice = &(*w.notices)[p];
      Request r = group.transport->link(group.members[p]).irecv(
          MutableBytes{reinterpret_cast<std::byte*>(notice), sizeof(ErrorNotice)}, tag);
      const int me = group.rank;
      r.state()->then([h = w.herald, notice, me, keep = w.notices, st = std::weak_ptr<RequestState>(r.state())] {
        auto s = st.lock();
        if (!s || s->failed()) return;  // the link closed: nothing was reported
        const std::string text = notice->message();
        chorus::detail::log(chorus::detail::LogLevel::info, chorus::detail::LogSubsys::diag, me, "a peer reported: ", text);
        h->start(Error::from_text(static_cast<ErrorCode>(notice->code), text, me, -1));
      });
      w.notice_recvs.push_back(std::move(r));
    }
    return w;
  }
};

}  // namespace chorus::mismatch
