// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// Where rank 0's store is when an MPI launcher started the ranks on several hosts and nothing
/// names it (no MASTER_ADDR): rank 0 serves the store on an ephemeral port of the address it
/// publishes (CHORUS_SOCKET_IFNAME's, else its first interface other than loopback and docker's,
/// as NCCL picks), and hands "host:port" to the other ranks through the launcher's own key-value
/// service, the one MPI libraries use at MPI_Init:
///
///   MPICH's Hydra (mpiexec)  PMI-1 over the socket PMI_FD names (bootstrap/pmi1.hpp): rank 0
///                            puts, every rank enters the barrier, the others get; then finalize.
///   Open MPI (mpirun)        PMIx through libpmix.so.2 (bootstrap/pmix.hpp): rank 0 puts and
///                            commits, a fence over the job collects the data, the others get
///                            rank 0's value; then finalize.
///
/// A process makes this exchange once (PMI-1's server takes no second init after a finalize) and
/// keeps the store until it exits: its later communicators meet on the same store, one generation
/// after the other.

#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "chorus/bootstrap/launch_env.hpp"
#include "chorus/bootstrap/pmi1.hpp"
#include "chorus/bootstrap/pmix.hpp"
#include "chorus/bootstrap/tcp_store.hpp"
#include "chorus/bootstrap/tcp_store/endpoint.hpp"
#include "chorus/core/error.hpp"
#include "chorus/detail/env.hpp"
#include "chorus/detail/interfaces.hpp"

namespace chorus::detail {

/// The key rank 0's store address travels under in the launcher's key-value service.
inline constexpr const char* kLauncherStoreKey = "chorus_store";

/// The service `launch` offers, "" when it offers none this code speaks: "pmi1" under Hydra with
/// PMI_FD set, "pmix" under Open MPI where the environment makes this process a PMIx client
/// (PMIX_NAMESPACE, and PMIX_RANK or one of the server addresses PMIx 2 to 4.1 publish).
inline std::string launcher_kvs_kind(const LaunchInfo& launch, const GetEnv& getenv) {
  if (launch.source == "mpich" && getenv("PMI_FD")) return "pmi1";
  if (launch.source == "openmpi" && getenv("PMIX_NAMESPACE") &&
      (getenv("PMIX_RANK") || getenv("PMIX_SERVER_URI41") || getenv("PMIX_SERVER_URI4") ||
       getenv("PMIX_SERVER_URI3") || getenv("PMIX_SERVER_URI21") || getenv("PMIX_SERVER_URI2")))
    return "pmix";
  return {};
}

/// Rank 0 gives `value` (others pass ""): every rank returns rank 0's value, after all of them
/// took part. Errors (`system`, or `timeout` past `timeout`) name the rank and the service.
inline std::string launcher_exchange(const std::string& kind, int rank, const std::string& value,
                                     std::chrono::milliseconds timeout, const GetEnv& getenv) {
  const ErrorContext ctx{rank, -1, "rendezvous through the launcher's " + kind};
  if (kind == "pmi1") {
    const int fd = static_cast<int>(parse_int(*getenv("PMI_FD"), "PMI_FD", 0, 1 << 20));
    const Pmi1Connection pmi(fd, std::chrono::steady_clock::now() + timeout);
    auto fail = [&](const std::string& what) {
      return Error(ErrorCode::timeout, ctx,
                   what + ": Hydra's PMI server (PMI_FD=" + std::to_string(fd) + ") did not answer within " +
                       std::to_string(timeout.count()) + " ms (do every rank's program create its communicator?)");
    };
    const auto kvs = pmi.start();
    if (!kvs) throw fail("PMI-1 init and get_my_kvsname");
    if (rank == 0 &&
        !pmi.ask_ok("cmd=put kvsname=" + *kvs + " key=" + kLauncherStoreKey + " value=" + value + "\n", "put_result"))
      throw fail("PMI-1 put of " + std::string(kLauncherStoreKey));
    if (!pmi.ask_ok("cmd=barrier_in\n", "barrier_out")) throw fail("PMI-1 barrier (every rank of the job)");
    std::string got = value;
    if (rank != 0) {
      const auto line = pmi.ask("cmd=get kvsname=" + *kvs + " key=" + kLauncherStoreKey + "\n");
      const auto rc = line ? Pmi1Connection::field(*line, "rc") : std::nullopt;
      const auto v = line ? Pmi1Connection::field(*line, "value") : std::nullopt;
      if (!rc || *rc != "0" || !v) throw fail("PMI-1 get of rank 0's " + std::string(kLauncherStoreKey));
      got = *v;
    }
    if (!pmi.ask_ok("cmd=finalize\n", "finalize_ack")) throw fail("PMI-1 finalize");
    return got;
  }
  try {
    pmix::Client client(timeout);
    if (rank == 0) client.put(kLauncherStoreKey, value);
    client.fence();
    return rank == 0 ? value : client.get(0, kLauncherStoreKey);
  } catch (const Error& e) {
    throw Error(e.code(), ctx, e.message());
  }
}

/// The store of an mpirun/mpiexec job on several hosts without MASTER_ADDR (see the top of this
/// file), and its address as an init_method ("tcp://host:port"), which the tcp links route from.
/// `socket_ifname` is Options::socket_ifname; `token` the job token of the store's handshake.
/// The first call of the process makes the exchange; every later one returns the same store,
/// which lives until the process exits: its communicators meet on it one generation after the
/// other (impl/rendezvous.hpp), and no rank can reach a store that rank 0 has already let go.
inline std::pair<std::shared_ptr<Store>, std::string> launcher_store(const std::string& kind, int rank,
                                                                      const std::string& socket_ifname,
                                                                      std::chrono::milliseconds timeout,
                                                                      const std::string& token, const GetEnv& getenv) {
  struct Cache {
    std::mutex mutex;
    std::shared_ptr<Store> store;
    std::string address;
  };
  static Cache cache;
  std::lock_guard lock(cache.mutex);
  if (cache.store) return {cache.store, cache.address};
  if (rank == 0) {
    const std::string host = publishable_address(socket_ifname).to_string();
    auto server = std::make_shared<TcpStore>(host, 0, true, timeout, token);
    launcher_exchange(kind, rank, host_port_string(host, server->port()), timeout, getenv);
    cache.store = std::move(server);
    cache.address = "tcp://" + host_port_string(host, static_cast<TcpStore&>(*cache.store).port());
    return {cache.store, cache.address};
  }
  const std::string text = launcher_exchange(kind, rank, "", timeout, getenv);
  const auto colon = text.rfind(':');
  std::string host = colon == std::string::npos ? std::string() : text.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  const auto port =
      colon == std::string::npos ? 0 : parse_int(text.substr(colon + 1), "the port rank 0 published", 1, 65535);
  if (host.empty() || port == 0)
    throw Error(ErrorCode::mismatch, ErrorContext{rank, 0, "rendezvous through the launcher's " + kind},
                "rank 0 published '" + text + "' as its store's address, not host:port");
  cache.store = std::make_shared<TcpStore>(host, static_cast<std::uint16_t>(port), false, timeout, token);
  cache.address = "tcp://" + host_port_string(host, static_cast<std::uint16_t>(port));
  return {cache.store, cache.address};
}

}  // namespace chorus::detail
