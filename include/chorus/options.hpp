// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// Options for creating a communicator. Options::from_env() fills them the way chorus::init()
/// does: from CHORUS_* variables and the launcher's variables (see docs/environment.md).

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "chorus/core/error.hpp"
#include "chorus/detail/env.hpp"

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
  /// "auto", "tcp", "shm", "rdma", "cuda_ipc" (CHORUS_TRANSPORT).
  std::string transport = "auto";
  /// Bound on every wait (CHORUS_TIMEOUT, seconds). Default 300 s.
  std::chrono::milliseconds timeout = std::chrono::seconds(300);
  /// Interface whose address links listen on (CHORUS_SOCKET_IFNAME); empty: the one that
  /// routes to MASTER_ADDR.
  std::string socket_ifname;
  /// Shared secret for the connection handshake (CHORUS_JOB_TOKEN); empty: no authentication.
  std::string job_token;
  /// Forces the collectives' algorithm ("ring", "tree", "recursive_doubling", ...; CHORUS_ALGO);
  /// empty: the cost model picks per call. A collective the algorithm does not apply to keeps
  /// the model's choice.
  std::string algorithm;
  /// Forces the pipeline slice size in bytes (CHORUS_CHUNK_BYTES); 0: the cost model's.
  std::size_t chunk_bytes = 0;

  /// Reads CHORUS_TRANSPORT, CHORUS_TIMEOUT, CHORUS_SOCKET_IFNAME, CHORUS_JOB_TOKEN. Rank, world
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
    if (auto v = detail::env_string("CHORUS_TIMEOUT")) timeout = detail::parse_seconds(*v, "CHORUS_TIMEOUT");
    if (auto v = detail::env_string("CHORUS_SOCKET_IFNAME")) socket_ifname = *v;
    if (auto v = detail::env_string("CHORUS_JOB_TOKEN")) job_token = *v;
    if (auto v = detail::env_string("CHORUS_ALGO")) algorithm = *v;
    if (auto v = detail::env_string("CHORUS_CHUNK_BYTES")) {
      chunk_bytes = detail::parse_bytes(*v, "CHORUS_CHUNK_BYTES");
      if (chunk_bytes == 0) throw Error(ErrorCode::invalid_argument, "CHORUS_CHUNK_BYTES must be positive");
    }
  }
};

}  // namespace chorus
