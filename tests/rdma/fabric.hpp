// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// The fake RDMA fabric of one test case (testing/fake_verbs.hpp): a file in a directory of its
/// own, named to the ranks through CHORUS_IB_FAKE. The parent makes it and removes it; the
/// children (run_processes re-runs the test case) inherit its path and make nothing.
/// With CHORUS_TEST_RDMA_REAL=1 (the Soft-RoCE guest, scripts/rdma-guest) there is no fake: the
/// ranks open the real device (libibverbs).

#include <stdlib.h>

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "chorus/detail/env.hpp"
#include "chorus/testing/fake_verbs.hpp"  // what CHORUS_IB_FAKE opens
#include "support/spawn.hpp"

namespace chorus::test {

class FakeFabric {
 public:
  FakeFabric() {
    if (real()) return;
    if (auto inherited = chorus::detail::env_string("CHORUS_IB_FAKE")) {
      path_ = *inherited;
      return;
    }
    std::string tmpl = (std::filesystem::temp_directory_path() / "chorus-rdma-fabric-XXXXXX").string();
    expect(::mkdtemp(tmpl.data()) != nullptr, "mkdtemp");
    dir_ = tmpl;
    path_ = dir_ + "/fabric";
  }
  FakeFabric(const FakeFabric&) = delete;
  FakeFabric& operator=(const FakeFabric&) = delete;
  ~FakeFabric() {
    if (dir_.empty()) return;
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  const std::string& path() const { return path_; }
  /// True when the tests run on a real device (CHORUS_TEST_RDMA_REAL=1).
  static bool real() { return chorus::detail::env_string("CHORUS_TEST_RDMA_REAL").value_or("0") == "1"; }
  /// Process options whose children use this fabric.
  ProcessOptions options(std::chrono::milliseconds timeout, std::chrono::milliseconds comm_timeout) const {
    ProcessOptions p;
    p.timeout = timeout;
    p.comm_timeout = comm_timeout;
    if (!path_.empty()) p.env.emplace_back("CHORUS_IB_FAKE", path_);
    return p;
  }

 private:
  std::string dir_;  ///< made here (the parent); empty in a child
  std::string path_;
};

}  // namespace chorus::test
