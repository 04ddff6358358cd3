// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// Creation's failure notice. A rank whose communicator creation fails after it reached the
/// job's store (a world size other than rank 0's, a transport that cannot start, a variable
/// that differs) sets "chorus/g<g>/failed" to its rank, error code and message before it throws
/// (publish_creation_failure). The other ranks' creation waits on the store go through a
/// WatchedStore: a wait that has lasted a while (100 ms, then doubling up to 1 s) looks at that
/// key, and a rank finds it fails at once with the failing rank's words (mismatch where that
/// rank's error was a mismatch, peer_failure otherwise) instead of waiting out the setup timeout
/// (300 s by default) for a rank that is gone.
///
/// Only waits through the store are watched, and only on a store whose timed-out waits leave it
/// as it was (Store::timeouts_are_clean: not torch's stores, which torchrun's agent and the python
/// module hand chorus; torchrun and torch.multiprocessing.spawn stop the other ranks when one
/// fails). A rank that dies without a word still costs the others the setup timeout, which then
/// names it.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "chorus/bootstrap/store.hpp"
#include "chorus/core/error.hpp"

namespace chorus {
namespace detail {

/// The notice's value: "<rank>\n<code>\n<what()>".
inline std::string encode_creation_failure(int rank, ErrorCode code, const std::string& what) {
  return std::to_string(rank) + "\n" + std::to_string(static_cast<int>(code)) + "\n" + what;
}

/// The error a rank raises on finding the notice `value` of another rank. `here` names this rank
/// and its operation; a value that is not a notice still fails the wait (peer_failure), with the
/// value shown.
inline Error creation_failure_error(const std::string& value, ErrorContext here) {
  const auto nl1 = value.find('\n');
  const auto nl2 = nl1 == std::string::npos ? std::string::npos : value.find('\n', nl1 + 1);
  int rank = -1;
  int code = -1;
  auto number = [&](std::size_t from, std::size_t to, int& out) {
    if (to <= from || to - from > 9) return false;
    int v = 0;
    for (std::size_t i = from; i < to; ++i) {
      if (value[i] < '0' || value[i] > '9') return false;
      v = v * 10 + (value[i] - '0');
    }
    out = v;
    return true;
  };
  if (nl2 == std::string::npos || !number(0, nl1, rank) || !number(nl1 + 1, nl2, code))
    return Error(ErrorCode::peer_failure, here, "a rank could not create its communicator: '" + value + "'");
  here.peer = rank;
  const ErrorCode theirs =
      code == static_cast<int>(ErrorCode::mismatch) ? ErrorCode::mismatch : ErrorCode::peer_failure;
  return Error(
      theirs, here,
      "rank " + std::to_string(rank) + " could not create its communicator: " + value.substr(nl2 + 1));
}

/// Sets `key` of `root` to this rank's notice of `e`, unless a notice is there already (the failure
/// it reports may be this rank's reason). Best effort: a store that does not answer within a
/// second is left; never throws.
inline void publish_creation_failure(Store& root, const std::string& key, int rank,
                                     const std::exception& e) noexcept {
  try {
    if (root.check_within({key}, std::chrono::seconds(1))) return;
    const auto* err = dynamic_cast<const Error*>(&e);
    root.set_within(key, encode_creation_failure(rank, err ? err->code() : ErrorCode::system, e.what()),
                    std::chrono::seconds(1));
  } catch (...) {  // the store is gone too: the others find this rank missing at their timeout
  }
}

}  // namespace detail

/// A view of `base` whose waits (get, wait) also watch `failed_key` of `root`: see the top of this
/// file. Everything else goes to `base` as it is.
class WatchedStore final : public Store {
 public:
  WatchedStore(std::shared_ptr<Store> base, std::shared_ptr<Store> root, std::string failed_key, int rank)
      : base_(std::move(base)), root_(std::move(root)), failed_key_(std::move(failed_key)), rank_(rank) {}

  void set(const std::string& k, const std::string& v) override { base_->set(k, v); }
  std::string get(const std::string& k, Duration t) override {
    return watched(t, [&](Duration slice) { return base_->get(k, slice); });
  }
  void wait(const std::vector<std::string>& keys, Duration t) override {
    watched(t, [&](Duration slice) {
      base_->wait(keys, slice);
      return std::string();
    });
  }
  std::int64_t add(const std::string& k, std::int64_t d) override { return base_->add(k, d); }
  bool check(const std::vector<std::string>& keys) override { return base_->check(keys); }
  void set_within(const std::string& k, const std::string& v, Duration t) override {
    base_->set_within(k, v, t);
  }
  bool check_within(const std::vector<std::string>& keys, Duration t) override {
    return base_->check_within(keys, t);
  }
  bool timeouts_are_clean() const override { return base_->timeouts_are_clean(); }

  /// The store this one watches over.
  const std::shared_ptr<Store>& base() const { return base_; }

  /// Tells the other ranks that this rank's creation failed with `e` (detail::publish_creation_failure).
  void publish_failure(const std::exception& e) noexcept {
    detail::publish_creation_failure(*root_, failed_key_, rank_, e);
  }

 private:
  template <class F>
  std::string watched(Duration total, F&& attempt) {
    using Clock = std::chrono::steady_clock;
    if (!root_->timeouts_are_clean()) return attempt(total);  // one wait, unwatched
    const auto deadline = Clock::now() + total;
    Duration slice = std::chrono::milliseconds(100);
    for (;;) {
      const auto left = std::chrono::duration_cast<Duration>(deadline - Clock::now());
      const bool last = left <= slice;
      try {
        return attempt(last ? std::max(left, Duration(0)) : slice);
      } catch (const Error& e) {
        if (e.code() != ErrorCode::timeout) throw;
        check_failed();
        if (last)
          throw Error::from_text(
              ErrorCode::timeout,
              std::string(e.what()) + " (waited " + std::to_string(total.count()) + " ms in all)", e.rank(),
              e.peer());
      }
      slice = std::min<Duration>(slice * 2, std::chrono::seconds(1));
    }
  }
  void check_failed() {
    if (!root_->check({failed_key_})) return;
    throw detail::creation_failure_error(root_->get(failed_key_, std::chrono::seconds(1)),
                                         ErrorContext{rank_, -1, "creation"});
  }

  std::shared_ptr<Store> base_;
  std::shared_ptr<Store> root_;
  std::string failed_key_;
  int rank_;
};

/// Publishes `e` as this rank's creation failure where `store` is a WatchedStore (the store of a
/// Bootstrap from rendezvous()); does nothing otherwise. Never throws.
inline void publish_creation_failure(Store* store, const std::exception& e) noexcept {
  if (auto* w = dynamic_cast<WatchedStore*>(store)) w->publish_failure(e);
}

}  // namespace chorus
