// SPDX-License-Identifier: BSD-3-Clause
// Options::apply_env on the switches NCCL users reach for: CHORUS_TRANSPORT_DISABLE (names, spaces,
// empty entries; a name that is no transport is invalid_argument naming the variable and it) and
// CHORUS_SOCKET_IFNAME (a value that names no interface fails at from_env, not at connection).
#include "chorus/options.hpp"

#include <doctest/doctest.h>

#include <stdlib.h>

#include <optional>
#include <string>
#include <vector>

// This file's own names: the files of tests/unit/ are compiled together (unity build).
namespace unit_test_options {

using chorus::Error;
using chorus::ErrorCode;
using chorus::Options;

namespace {

/// Sets one variable (or unsets it) for the scope, then puts back what was there.
class ScopedVar {
 public:
  ScopedVar(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* v = std::getenv(name)) old_ = v;
    if (value) ::setenv(name, value->c_str(), 1);
    else ::unsetenv(name);
  }
  ~ScopedVar() {
    if (old_) ::setenv(name_, old_->c_str(), 1);
    else ::unsetenv(name_);
  }
  ScopedVar(const ScopedVar&) = delete;
  ScopedVar& operator=(const ScopedVar&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

/// The invalid_argument message Options::from_env() throws with `name`=`value`.
std::string refusal(const char* name, const std::string& value) {
  ScopedVar v(name, value);
  try {
    (void)Options::from_env();
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::invalid_argument);
    return e.what();
  }
  FAIL(name << "='" << value << "' accepted");
  return {};
}

bool mentions(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

}  // namespace

TEST_CASE("options: CHORUS_TRANSPORT_DISABLE lists transports, and names a bad one") {
  {
    ScopedVar v("CHORUS_TRANSPORT_DISABLE", std::nullopt);
    CHECK(Options::from_env().transport_disable.empty());
  }
  {
    ScopedVar v("CHORUS_TRANSPORT_DISABLE", "rdma,shm");
    CHECK(Options::from_env().transport_disable == std::vector<std::string>{"rdma", "shm"});
  }
  {
    ScopedVar v("CHORUS_TRANSPORT_DISABLE", " tcp , cuda_ipc,, ");
    CHECK(Options::from_env().transport_disable == std::vector<std::string>{"tcp", "cuda_ipc"});
  }
  for (const std::string bad : {"ib", "rdma,SHM", "shm,auto", "inproc"}) {
    const std::string what = refusal("CHORUS_TRANSPORT_DISABLE", bad);
    MESSAGE(what);
    CHECK(mentions(what, "CHORUS_TRANSPORT_DISABLE='" + bad + "'"));
    const std::string token = bad == "rdma,SHM" ? "SHM" : bad == "shm,auto" ? "auto" : bad;
    CHECK(mentions(what, "'" + token + "' is not one of cuda_ipc, shm, rdma, tcp"));
  }
}

TEST_CASE("options: CHORUS_SOCKET_IFNAME that names no interface is refused at from_env") {
  {
    ScopedVar v("CHORUS_SOCKET_IFNAME", "^docker,lo");
    CHECK(Options::from_env().socket_ifname == "^docker,lo");
  }
  for (const std::string bad : {"^", "=", "^=", " , ", "^=,"}) {
    const std::string what = refusal("CHORUS_SOCKET_IFNAME", bad);
    MESSAGE(what);
    CHECK(mentions(what, "CHORUS_SOCKET_IFNAME='" + bad + "' names no interface"));
  }
}

}  // namespace unit_test_options
