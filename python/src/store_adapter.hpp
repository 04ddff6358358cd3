// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// C10dStore: chorus's Store interface (bootstrap/store.hpp) over the c10d::Store that
/// torch.distributed hands a backend (already prefixed per process group by torch), so that
/// chorus's rendezvous runs through whatever init_method the program used: env://, tcp://,
/// file://, torchrun's store.
///
/// c10d stores raise c10::Error (or std::runtime_error) on a timeout or a lost server; they come
/// out of here as chorus::Error with code timeout (when the message says so) or peer_failure,
/// naming the key.

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "chorus/bootstrap/store.hpp"
#include "chorus/core/error.hpp"

namespace chorus_torch {

class C10dStore final : public chorus::Store {
 public:
  explicit C10dStore(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {}

  void set(const std::string& key, const std::string& value) override {
    guard("set", key, [&] { store_->set(key, std::vector<std::uint8_t>(value.begin(), value.end())); });
  }

  std::string get(const std::string& key, Duration timeout) override {
    std::string out;
    guard("get", key, [&] {
      store_->wait({key}, timeout);
      const std::vector<std::uint8_t> v = store_->get(key);
      out.assign(v.begin(), v.end());
    });
    return out;
  }

  void wait(const std::vector<std::string>& keys, Duration timeout) override {
    guard("wait", keys.empty() ? std::string() : keys.front(), [&] { store_->wait(keys, timeout); });
  }

  std::int64_t add(const std::string& key, std::int64_t delta) override {
    std::int64_t v = 0;
    guard("add", key, [&] { v = store_->add(key, delta); });
    return v;
  }

  // torch 1.13's TCPStore client leaves a timed-out wait's late reply in its stream.
  bool timeouts_are_clean() const override { return false; }

  bool check(const std::vector<std::string>& keys) override {
    bool ok = false;
    guard("check", keys.empty() ? std::string() : keys.front(), [&] { ok = store_->check(keys); });
    return ok;
  }

 private:
  template <class F>
  static void guard(const char* verb, const std::string& key, F&& f) {
    try {
      f();
    } catch (const chorus::Error&) {
      throw;
    } catch (const std::exception& e) {
      const std::string what = e.what();
      const bool timed_out = what.find("imeout") != std::string::npos || what.find("timed out") != std::string::npos;
      throw chorus::Error(timed_out ? chorus::ErrorCode::timeout : chorus::ErrorCode::peer_failure,
                          std::string("c10d store ") + verb + " '" + key + "': " + what);
    }
  }

  c10::intrusive_ptr<c10d::Store> store_;
};

}  // namespace chorus_torch
