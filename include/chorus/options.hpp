// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// Options for creating a communicator. Options::from_env() fills them the way chorus::init()
/// does: from CHORUS_* variables and the launcher's variables (see docs/environment.md).

#include <algorithm>
#include <array>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "chorus/core/error.hpp"
#include "chorus/detail/env.hpp"
#include "chorus/detail/ifname.hpp"

namespace chorus {

class Store;  // bootstrap/store.hpp

struct Options {
  /// This process's rank and the world size; -1 means "from the environment".
  int rank = -1;
  int world_size = -1;
  /// "env://" (MASTER_ADDR/MASTER_PORT), "tcp://host:port", "file:///path"; empty means env://.
  std::string init_method;
  /// An existing store to rendezvous through (ranks as threads, tests); overrides init_method.
  std::shared_ptr<Store> store;
  /// "auto", "tcp", "shm", "rdma", "cuda_ipc" (CHORUS_TRANSPORT). A rank that forces one takes
  /// it to every peer, and a peer left on "auto" takes it for their pair too; two ranks that force
  /// different ones both fail with mismatch, naming each other.
  std::string transport = "auto";
  /// Transports that transport "auto" leaves out of its choice per pair (CHORUS_TRANSPORT_DISABLE,
  /// like NCCL_IB_DISABLE, NCCL_SHM_DISABLE, NCCL_P2P_DISABLE): names of kTransportCandidates. A
  /// pair goes over the first candidate that can connect it and that neither of its two ranks
  /// disables, so ranks may differ (a host whose NIC is broken can leave rdma out on its own); a
  /// pair that nothing left can connect is invalid_argument, and so is forcing (`transport`) a
  /// disabled one. Transports other than "auto" (hybrid) ignore it.
  std::vector<std::string> transport_disable;
  /// When tcp's links are made (CHORUS_CONNECT): "lazy", a link when a call first sends over it
  /// (a ring or tree job holds links to the ranks it exchanges with only), or "eager", every link
  /// at creation (a peer that cannot be reached then fails the creation, not a later call).
  /// shm, rdma and cuda_ipc connect their links at creation either way.
  std::string connect = "lazy";
  /// Bound on every wait (CHORUS_TIMEOUT, seconds). Default 300 s.
  std::chrono::milliseconds timeout = std::chrono::seconds(300);
  /// Interfaces whose address links listen on (CHORUS_SOCKET_IFNAME), as NCCL_SOCKET_IFNAME
  /// reads them: "eth,ib" (name prefixes), "^docker,lo" (all but these), "=eth0" (exact names);
  /// detail/ifname.hpp. Empty: the interface that routes to MASTER_ADDR.
  std::string socket_ifname;
  /// Shared secret for the connection handshake (CHORUS_JOB_TOKEN); empty: no authentication.
  std::string job_token;
  /// Forces the collectives' algorithm (CHORUS_ALGO): a name for every collective ("ring"), or
  /// collective:name pairs ("all_reduce:hierarchical,broadcast:chain"); empty: the cost model
  /// picks per call. A collective forced to an algorithm it lacks, or one its layout cannot run,
  /// fails with invalid_argument (algo/select.hpp).
  std::string algorithm;
  /// This rank's host, for the host layout the hierarchical algorithms read (topology/hosts.hpp):
  /// ranks with equal values count as one host. Empty: the host identity the transports compare
  /// (CHORUS_HOST_ID where set, else boot id and host name: the machine, whatever the namespaces).
  /// For tests that run ranks as threads of one process and want a layout of several hosts.
  std::string host_id;
  /// Forces the pipeline slice size in bytes (CHORUS_CHUNK_BYTES); 0: the cost model's.
  std::size_t chunk_bytes = 0;
  /// How long Communicator::shrink()'s agreement waits for a rank that is alive and reachable
  /// (or, with a store every rank shares, not known to be gone) but has not called shrink yet
  /// (CHORUS_SHRINK_WAIT, seconds); 0: the timeout. A rank that has not joined by then is left out.
  std::chrono::milliseconds shrink_wait{0};
  /// Bound on the waits of a communicator's creation (rendezvous, the transports' connections,
  /// the layout exchange); 0: the timeout. shrink() sets it, so that a member that dies while the
  /// shrunk communicator is made sends the others into another round soon, not at the timeout.
  std::chrono::milliseconds setup_timeout{0};
  /// setup_timeout where set, else the timeout.
  std::chrono::milliseconds setup_bound() const { return setup_timeout.count() > 0 ? setup_timeout : timeout; }

  /// The transports `transport` may name besides "auto", and transport_disable may list: the
  /// candidates of transport/registry.hpp (hybrid/transport.hpp checks that the two agree).
  static constexpr std::array<std::string_view, 4> kTransportCandidates{"cuda_ipc", "shm", "rdma", "tcp"};

  /// The names of a comma-separated transport list ("rdma,shm"); a name that is not one of
  /// kTransportCandidates is invalid_argument naming `what` and the name.
  static std::vector<std::string> parse_transport_list(std::string_view text, std::string_view what) {
    std::vector<std::string> names = detail::split_list(text);
    for (const auto& n : names)
      if (std::find(kTransportCandidates.begin(), kTransportCandidates.end(), n) == kTransportCandidates.end())
        throw Error(ErrorCode::invalid_argument, std::string(what) + "='" + std::string(text) + "': '" + n +
                                                     "' is not one of cuda_ipc, shm, rdma, tcp");
    return names;
  }

  /// Reads CHORUS_TRANSPORT, CHORUS_TRANSPORT_DISABLE, CHORUS_CONNECT, CHORUS_TIMEOUT, CHORUS_SOCKET_IFNAME,
  /// CHORUS_JOB_TOKEN, CHORUS_ALGO, CHORUS_CHUNK_BYTES, CHORUS_SHRINK_WAIT. Rank, world
  /// size and the init method are resolved at rendezvous (bootstrap/launch_env.hpp). A value that
  /// does not parse throws invalid_argument naming the variable.
  static Options from_env() {
    Options o;
    o.apply_env();
    return o;
  }

  /// Fills the fields that the environment sets, leaving the others as they are.
  void apply_env() {
    if (auto v = detail::env_string("CHORUS_TRANSPORT")) {
      if (*v != "auto" && *v != "tcp" && *v != "shm" && *v != "rdma" && *v != "cuda_ipc" && *v != "inproc")
        throw Error(ErrorCode::invalid_argument,
                    "CHORUS_TRANSPORT='" + *v + "' is not one of auto, tcp, shm, rdma, cuda_ipc");
      transport = *v;
    }
    if (auto v = detail::env_string("CHORUS_CONNECT")) {
      if (*v != "lazy" && *v != "eager")
        throw Error(ErrorCode::invalid_argument, "CHORUS_CONNECT='" + *v + "' is not one of lazy, eager");
      connect = *v;
    }
    if (auto v = detail::env_string("CHORUS_TIMEOUT")) timeout = detail::parse_seconds(*v, "CHORUS_TIMEOUT");
    if (auto v = detail::env_string("CHORUS_TRANSPORT_DISABLE"))
      transport_disable = parse_transport_list(*v, "CHORUS_TRANSPORT_DISABLE");
    if (auto v = detail::env_string("CHORUS_SOCKET_IFNAME")) {
      (void)detail::InterfaceFilter::parse(*v);  // a value that does not parse fails here, not at connection
      socket_ifname = *v;
    }
    if (auto v = detail::env_string("CHORUS_JOB_TOKEN")) job_token = *v;
    if (auto v = detail::env_string("CHORUS_ALGO")) algorithm = *v;
    if (auto v = detail::env_string("CHORUS_SHRINK_WAIT")) shrink_wait = detail::parse_seconds(*v, "CHORUS_SHRINK_WAIT");
    if (auto v = detail::env_string("CHORUS_CHUNK_BYTES")) {
      chunk_bytes = detail::parse_bytes(*v, "CHORUS_CHUNK_BYTES");
      if (chunk_bytes == 0) throw Error(ErrorCode::invalid_argument, "CHORUS_CHUNK_BYTES must be positive");
    }
  }
};

}  // namespace chorus
