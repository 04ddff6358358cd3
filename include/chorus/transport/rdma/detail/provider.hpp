// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// Which verbs provider the rdma transport of this process opens (verbs.hpp), and what it tells
/// the other ranks about it (the fact that hybrid::Transport exchanges, transport/peer_info.hpp):
/// - CHORUS_IB_FAKE=<file>: the in-repo fake on that fabric file, for tests: every process of the
///   job names the same file. The fake is a test double that users' programs never compile: a
///   program that wants it includes chorus/testing/fake_verbs.hpp, which registers it here
///   (fake_provider_opener); in any other program CHORUS_IB_FAKE makes the transport refuse to
///   start, saying the program was built without the test provider;
/// - else, when the program links chorus::rdma (CHORUS_WITH_RDMA): libibverbs (ibverbs.hpp), on
///   the port CHORUS_IB_HCA / CHORUS_IB_GID_INDEX choose, or the first active one;
/// - else none: "chorus was built without libibverbs".

#include <memory>
#include <mutex>
#include <string>

#include "chorus/config.hpp"
#include "chorus/detail/env.hpp"
#include "chorus/transport/rdma/detail/verbs.hpp"
#if CHORUS_HAS_RDMA
#include "chorus/transport/rdma/detail/ibverbs.hpp"
#endif

namespace chorus::rdma {
namespace detail {

/// Opens the fake fabric at `fabric` (nullptr with `why` when it cannot).
using FakeProviderOpener = std::unique_ptr<Verbs> (*)(const std::string& fabric, std::string& why);

/// The opener of the fake verbs provider: null unless the program includes
/// chorus/testing/fake_verbs.hpp, whose initializer sets it before main() runs.
inline FakeProviderOpener& fake_provider_opener() {
  static FakeProviderOpener opener = nullptr;
  return opener;
}

}  // namespace detail

// What the option changes (config.hpp: CHORUS_OPTIONS_NAMESPACE).
inline namespace CHORUS_OPTIONS_NAMESPACE {

/// Opens this process's provider; nullptr with `why` when none can be used.
inline std::unique_ptr<Verbs> open_provider(std::string& why) {
  if (auto fabric = chorus::detail::env_string("CHORUS_IB_FAKE")) {
    if (fabric->empty()) {
      why = "CHORUS_IB_FAKE is set but empty";
      return nullptr;
    }
    if (const auto open_fake = detail::fake_provider_opener()) return open_fake(*fabric, why);
    why = "CHORUS_IB_FAKE is set, but this program was built without the test verbs provider (it does "
          "not include chorus/testing/fake_verbs.hpp); unset CHORUS_IB_FAKE to use the RDMA device";
    return nullptr;
  }
#if CHORUS_HAS_RDMA
  return open_ibverbs(why);
#else
  why = "chorus was built without libibverbs (link the program with chorus::rdma)";
  return nullptr;
#endif
}

/// "ok:<fabric>" when this process can open a provider, "no:<why>" otherwise; probed once per
/// process (opening a device and closing it again). Ranks whose facts are the same "ok:" string
/// can reach each other: the fake's fabric file, or the link layer of the NIC (a job whose hosts
/// sit on different fabrics is not told apart: NCCL assumes one fabric too).
inline const std::string& local_fabric() {
  static const std::string fact = [] {
    std::string why;
    auto v = open_provider(why);
    if (!v) return "no:" + why;
    const PortInfo& p = v->port();
    if (auto fabric = chorus::detail::env_string("CHORUS_IB_FAKE")) return "ok:fake:" + *fabric;
    return "ok:" + p.link_layer;
  }();
  return fact;
}

}  // inline namespace CHORUS_OPTIONS_NAMESPACE
}  // namespace chorus::rdma
