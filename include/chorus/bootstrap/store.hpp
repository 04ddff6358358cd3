// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// Store: the key-value service ranks use to find each other (like torch.distributed's Store).
/// Implementations: TcpStore (hosted by rank 0), FileStore (a shared file), MemoryStore (tests,
/// ranks as threads). Values are opaque bytes held in std::string.
///
/// | call              | contract                                                                |
/// |-------------------|-------------------------------------------------------------------------|
/// | set(k, v)         | stores v under k, replacing any value; visible to every later get/wait  |
/// | get(k, timeout)   | the value of k, waiting for it to be set; timeout error when it is not  |
/// | wait(keys, t)     | returns when every key is set; timeout error naming the missing keys    |
/// | add(k, delta)     | atomically adds delta to the integer under k (0 when unset), returns it |
/// | check(keys)       | true when every key is set, without waiting                             |
/// | set_within(k,v,t) | set, returning or throwing within about t (failure paths, see below)   |
/// | check_within(k,t) | check, likewise                                                         |
/// Every call is bounded in time; a store whose server is gone raises peer_failure. The plain
/// calls are bounded by the store's own timeout (the job's); the *_within ones, made on a failure
/// path (a stalled wait's cross-check), by a shorter one of the caller's, so that an unreachable
/// store cannot hold the caller past what the links would tell it. A store whose calls cannot
/// block on a remote host keeps the plain call there.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "chorus/core/error.hpp"

namespace chorus {

class Store {
 public:
  using Duration = std::chrono::milliseconds;
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::string& value) = 0;
  virtual std::string get(const std::string& key, Duration timeout) = 0;
  virtual void wait(const std::vector<std::string>& keys, Duration timeout) = 0;
  virtual std::int64_t add(const std::string& key, std::int64_t delta) = 0;
  virtual bool check(const std::vector<std::string>& keys) = 0;
  virtual void set_within(const std::string& key, const std::string& value, Duration) { set(key, value); }
  virtual bool check_within(const std::vector<std::string>& keys, Duration) { return check(keys); }
  /// Whether a wait that times out leaves the store as it was, so that a long wait may be made of
  /// short ones (bootstrap/creation_notice.hpp). Not so for a client whose late reply would stay
  /// in its stream: TorchStore drops its connection on a timeout, and torch's own TCPStore client
  /// (the python module's store) would read it as the reply to its next request.
  virtual bool timeouts_are_clean() const { return true; }
};

/// A view of another store with every key prefixed: sub-communicators and repeated rendezvous
/// in one job use distinct prefixes so their keys never collide.
class PrefixStore final : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> base) : prefix_(std::move(prefix)), base_(std::move(base)) {}
  void set(const std::string& k, const std::string& v) override { base_->set(prefix_ + k, v); }
  std::string get(const std::string& k, Duration t) override { return base_->get(prefix_ + k, t); }
  void wait(const std::vector<std::string>& keys, Duration t) override { base_->wait(prefixed(keys), t); }
  std::int64_t add(const std::string& k, std::int64_t d) override { return base_->add(prefix_ + k, d); }
  bool check(const std::vector<std::string>& keys) override { return base_->check(prefixed(keys)); }
  void set_within(const std::string& k, const std::string& v, Duration t) override {
    base_->set_within(prefix_ + k, v, t);
  }
  bool check_within(const std::vector<std::string>& keys, Duration t) override {
    return base_->check_within(prefixed(keys), t);
  }
  bool timeouts_are_clean() const override { return base_->timeouts_are_clean(); }
  /// The store this one prefixes.
  const std::shared_ptr<Store>& base() const { return base_; }

 private:
  std::vector<std::string> prefixed(const std::vector<std::string>& keys) const {
    std::vector<std::string> out;
    out.reserve(keys.size());
    for (const auto& k : keys) out.push_back(prefix_ + k);
    return out;
  }
  std::string prefix_;
  std::shared_ptr<Store> base_;
};

/// In-process store for ranks that are threads of one process (tests, inproc transport).
class MemoryStore final : public Store {
 public:
  void set(const std::string& k, const std::string& v) override {
    {
      std::lock_guard lk(mu_);
      map_[k] = v;
    }
    cv_.notify_all();
  }
  std::string get(const std::string& k, Duration t) override {
    wait({k}, t);
    std::lock_guard lk(mu_);
    return map_.at(k);
  }
  void wait(const std::vector<std::string>& keys, Duration t) override {
    std::unique_lock lk(mu_);
    if (!cv_.wait_for(lk, t, [&] { return all_set(keys); })) {
      std::string missing;
      for (const auto& k : keys)
        if (!map_.count(k)) missing += (missing.empty() ? "" : ", ") + k;
      throw Error(ErrorCode::timeout, "store wait: keys not set within " + std::to_string(t.count()) +
                                          " ms: " + missing);
    }
  }
  std::int64_t add(const std::string& k, std::int64_t d) override {
    std::int64_t v = 0;
    {
      std::lock_guard lk(mu_);
      auto it = map_.find(k);
      if (it != map_.end()) v = std::stoll(it->second);
      v += d;
      map_[k] = std::to_string(v);
    }
    cv_.notify_all();
    return v;
  }
  bool check(const std::vector<std::string>& keys) override {
    std::lock_guard lk(mu_);
    return all_set(keys);
  }

 private:
  bool all_set(const std::vector<std::string>& keys) const {
    for (const auto& k : keys)
      if (!map_.count(k)) return false;
    return true;
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> map_;
};

}  // namespace chorus
