// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// Hang diagnosis of one communicator: what a rank whose call stalls or times out publishes and
/// reads through the store, so that a hang is explained instead of silent.
///
/// * A wait that stalls (kStallCheck without progress) calls stall(): now and then (200 ms after
///   the stall began, then at doubling gaps up to 5 s) the rank publishes its progress ("entered E
///   completed C at T") and its recent collectives, and cross-checks the stalled call against what
///   the others published for it (diag/cross_check.hpp): differing calls are a mismatch.
/// * A call that times out names the ranks that have not entered it (late_ranks()), from what
///   each published when its own waits stalled.
/// Every store call on these paths is bounded by failure_bound(); none throws past the caller's
/// own error except the cross-check's mismatch.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "chorus/algo/descriptor.hpp"
#include "chorus/bootstrap/store.hpp"
#include "chorus/core/tag.hpp"
#include "chorus/detail/log.hpp"
#include "chorus/diag/cross_check.hpp"
#include "chorus/diag/flight_recorder.hpp"

namespace chorus::diag {

class HangWatch {
 public:
  HangWatch() = default;
  /// For the group of `members` (group rank -> transport rank), this rank `rank`, its tag
  /// context; publishing through `store`, reading the calls from `recorder`.
  HangWatch(std::shared_ptr<Store> store, int rank, std::vector<int> members, Tag context,
            std::shared_ptr<algo::FlightRecorder> recorder, std::chrono::milliseconds timeout)
      : store_(std::move(store)), rank_(rank), members_(std::move(members)), context_(context),
        recorder_(std::move(recorder)), timeout_(timeout) {}

  /// The call `seq` stalled at least once (its progress was published).
  bool stalled(std::uint64_t seq) const { return stall_seq_ == seq; }

  /// A wait stalled (called every kStallCheck while it does): now and then, publish this rank's
  /// progress and cross-check the call (see stall_next_).
  void stall(const algo::CollectiveDesc& mine) {
    using namespace std::chrono_literals;
    const auto now = std::chrono::steady_clock::now();
    if (mine.seq != stall_seq_) {
      stall_seq_ = mine.seq;
      stall_gap_ = 200ms;
    } else if (now < stall_next_) {
      return;
    } else {
      stall_gap_ = std::min<std::chrono::milliseconds>(stall_gap_ * 2, 5s);
    }
    stall_next_ = now + stall_gap_;
    cross_check(mine);  // publishes this rank's progress too
  }

  /// The bound of each call on a failure path (store calls, notices): a few seconds, never more
  /// than the timeout.
  std::chrono::milliseconds failure_bound() const {
    return std::min<std::chrono::milliseconds>(timeout_, std::chrono::seconds(3));
  }

  /// A call that stalled has completed: its progress is published again, so that a rank that
  /// later times out waiting for this one learns where it is (never throws).
  void republish_progress() {
    try {
      publish_progress();
    } catch (const std::exception& e) {
      detail::log(detail::LogLevel::info, detail::LogSubsys::diag, rank_, "cannot publish progress: ", e.what());
    }
  }

  /// For a timed-out call `mine`: which ranks have not entered it, from what each published when
  /// its own waits stalled. Store errors are reported in the text, never thrown.
  std::string late_ranks(const algo::CollectiveDesc& mine) {
    const std::string call = std::string(algo::to_string(mine.kind)) + " #" + std::to_string(mine.seq);
    std::vector<int> inside;
    std::string late;
    try {
      publish_progress();
      const std::int64_t now_ms = epoch_ms();
      for (int p = 0; p < static_cast<int>(members_.size()); ++p) {
        if (p == rank_) continue;
        std::uint64_t entered = 0, completed = 0;
        std::int64_t at = 0;
        bool known = false;
        if (store_->check_within({progress_key(p)}, failure_bound())) {
          std::istringstream in(store_->get(progress_key(p), failure_bound()));
          std::string w1, w2, w3;
          known = static_cast<bool>(in >> w1 >> entered >> w2 >> completed >> w3 >> at) && w1 == "entered";
        }
        if (known && entered > mine.seq) {
          inside.push_back(p);
          continue;
        }
        late += "; rank " + std::to_string(p) + " has not entered " + call;
        if (!known)
          late += " (it published no progress: a rank publishes when one of its calls stalls)";
        else
          late += "; its last completed call is " + (completed == 0 ? std::string("none") : "#" + std::to_string(completed - 1)) +
                  " (as it published " + std::to_string((now_ms - at) / 1000) + " s ago" +
                  (entered > completed ? ", inside #" + std::to_string(entered - 1) : std::string()) + ")";
      }
    } catch (const std::exception& e) {
      late += std::string("; the store could not tell which ranks are late: ") + e.what();
    }
    std::string s = late.empty() ? "; every rank has entered " + call + " (a link may be stuck)" : late;
    if (!inside.empty()) {
      s += inside.size() > 1 ? "; in it: ranks" : "; in it: rank";
      for (std::size_t i = 0; i < inside.size(); ++i) {
        s += i ? ", " : " ";
        s += std::to_string(inside[i]);
      }
    }
    return s;
  }

 private:
  /// The store key where group rank `rank` publishes `what` (its history or its progress).
  std::string published_key(std::string_view what, int rank) const {
    return "chorus/" + std::string(what) + "/" + std::to_string(context_ >> detail::kContextShift) + "/" +
           std::to_string(members_[static_cast<std::size_t>(rank)]);
  }
  std::string history_key(int rank) const { return published_key("history", rank); }
  std::string progress_key(int rank) const { return published_key("progress", rank); }

  /// Wall-clock milliseconds since the epoch (the times published in the store).
  static std::int64_t epoch_ms() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
  }

  /// "entered E completed C at T": calls this rank has started and completed, and the wall time
  /// in milliseconds since the epoch; read by a rank that times out (late_ranks()).
  void publish_progress() {
    store_->set_within(progress_key(rank_), "entered " + std::to_string(recorder_->entered()) + " completed " +
                                                  std::to_string(recorder_->completed()) + " at " + std::to_string(epoch_ms()),
                           failure_bound());
  }

  /// A wait stalled: publish this rank's progress and recent collectives in the store and
  /// compare the current one with what the others published for it (mismatch::cross_check).
  void cross_check(const algo::CollectiveDesc& mine) {
    std::vector<algo::CollectiveDesc> recent;
    for (const auto& r : recorder_->snapshot()) recent.push_back(r.desc);
    mismatch::cross_check(*store_, recent, mine, rank_, static_cast<int>(members_.size()),
                          [this](int p) { return history_key(p); }, failure_bound(),
                          [this] { publish_progress(); });
  }

  /// The stall cross-check of the running call: its sequence number and when it may run next
  /// (200 ms after the stall began, then at doubling gaps up to 5 s: a long hang costs the store
  /// a write per rank every 5 s, not every 200 ms). Used by the thread that runs the call.
  std::uint64_t stall_seq_ = ~std::uint64_t(0);
  std::chrono::steady_clock::time_point stall_next_{};
  std::chrono::milliseconds stall_gap_{0};
  std::shared_ptr<Store> store_;
  int rank_ = -1;
  std::vector<int> members_;
  Tag context_ = 0;
  std::shared_ptr<algo::FlightRecorder> recorder_;
  std::chrono::milliseconds timeout_{0};
};

}  // namespace chorus::diag
