// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// Body of chorus::rendezvous() (declared in bootstrap/rendezvous.hpp).
///
/// Steps:
///   1. Options::apply_env(); rank and world size from Options, else from the launcher
///      (launch_env.hpp). Neither: invalid_argument.
///   2. The store: Options::store, else from init_method:
///        "" or "env://"     MASTER_ADDR and MASTER_PORT: rank 0 serves a TcpStore bound to
///                           MASTER_ADDR:MASTER_PORT, the others connect. Under torchrun's
///                           static rendezvous (TORCHELASTIC_USE_AGENT_STORE=True) its agent
///                           serves a torch TCPStore there: every rank joins it as a TorchStore
///                           client, under "chorus/torchelastic/attempt_<restart count>/"
///                           (torch_store.hpp). Without MASTER_ADDR:
///                           under srun, MASTER_ADDR is the first host of the step's node list
///                           and, without MASTER_PORT, the port is derived from SLURM_JOB_ID and
///                           SLURM_STEP_ID (slurm_master_port); under mpirun (Open MPI, MPICH) with
///                           every rank on this host, a FileStore in $TMPDIR (else /tmp) named
///                           after the launcher's job id (job_file_store); under mpirun with
///                           ranks on several hosts, a TcpStore rank 0 serves on an ephemeral
///                           port, its address handed out through the launcher's PMI-1 or PMIx
///                           service (launcher_kvs.hpp); otherwise invalid_argument saying what
///                           to set;
///        "tcp://host:port"  the same with host and port from the URL (IPv6: tcp://[::1]:29500);
///        "file:///path"     a FileStore on that path (a fresh path per job).
///      TcpStores use Options::job_token for their handshake and Options::timeout as bound.
///   3. The generation. One store may carry several rendezvous one after the other (two
///      communicators created through the same MemoryStore; one file store used twice). Each
///      rank counts its own rendezvous through the store: g = add("chorus/rank<r>/rendezvous", 1).
///      Rendezvous are collective, so the g-th call of every rank belongs to the same
///      communicator, and its keys live under "chorus/g<g>/". No rank waits on a counter that
///      another communicator could move, and a fast rank that starts generation g+1 early just
///      waits for rank 0 to get there. (A single global counter bumped by rank 0 would not do:
///      the other ranks could not tell which value is theirs.) Ranks must call rendezvous on a
///      shared store in the same order, and a reused file store must start empty.
///   4. The nonce. Rank 0 draws 16 random bytes and publishes "chorus/g<g>/world_size" and then
///      "chorus/g<g>/nonce" (hex); the others get the nonce (bounded by the timeout) and check
///      that rank 0's world size is theirs (mismatch otherwise).
///   5. The Bootstrap's store is PrefixStore("chorus/g<g>/comm/", store): transports publish their
///      addresses there without colliding with other generations. Bootstrap::options has the
///      resolved rank and world size and Options::store = the unprefixed store.

#include <charconv>
#include <memory>
#include <string>
#include <utility>

#include "chorus/bootstrap/creation_notice.hpp"
#include "chorus/bootstrap/init_method.hpp"
#include "chorus/bootstrap/rendezvous.hpp"
#include "chorus/detail/crypto.hpp"
#include "chorus/detail/env.hpp"
#include "chorus/detail/log.hpp"

namespace chorus {

CHORUS_DECL Bootstrap rendezvous(Options options) {
  options.apply_env();
  // The logging variables are read at the first log line; reading them here makes a bad
  // CHORUS_DEBUG, CHORUS_DEBUG_SUBSYS fail the communicator's creation, not a later log call.
  (void)detail::Logger::instance();
  const auto [rank, size] = detail::resolve_rank_and_size(options, GetEnv(&detail::env_string));
  ErrorContext ctx{rank, -1, "rendezvous"};
  std::string resolved_init_method;
  std::shared_ptr<Store> store =
      options.store ? options.store : detail::make_store(options, rank, size, &resolved_init_method);
  if (!resolved_init_method.empty()) options.init_method = resolved_init_method;

  const std::int64_t gen = store->add("chorus/rank" + std::to_string(rank) + "/rendezvous", 1);
  const std::string prefix = "chorus/g" + std::to_string(gen) + "/";
  ctx.op = "rendezvous (generation " + std::to_string(gen) + ")";

  JobNonce nonce{};
  if (rank == 0) {
    detail::random_bytes(nonce);
    store->set(prefix + "world_size", std::to_string(size));
    store->set(prefix + "nonce", detail::nonce_to_hex(nonce));  // last: its presence means all is set
  } else {
    std::string hex;
    try {
      hex = store->get(prefix + "nonce", options.setup_bound());
    } catch (const Error& e) {
      if (e.code() != ErrorCode::timeout) throw;
      throw Error(ErrorCode::timeout, ctx,
                  "rank 0 did not publish the job nonce within " + std::to_string(options.setup_bound().count()) +
                      " ms: is rank 0 running with the same store, and do all ranks create communicators in the "
                      "same order? (" + e.what() + ")");
    }
    nonce = detail::nonce_from_hex(hex, ctx);
    const std::string root_size = store->get(prefix + "world_size", options.setup_bound());
    if (root_size != std::to_string(size)) {
      const Error e(ErrorCode::mismatch, ctx,
                    "world size " + std::to_string(size) + " here but " + root_size + " on rank 0");
      // Rank 0's job waits for this rank: tell it why it will not come (creation_notice.hpp). A
      // rank outside rank 0's world is not waited for and says nothing.
      int root_n = 0;
      const auto parsed = std::from_chars(root_size.data(), root_size.data() + root_size.size(), root_n);
      if (parsed.ec == std::errc() && rank < root_n)
        detail::publish_creation_failure(*store, prefix + "failed", rank, e);
      throw e;
    }
  }
  detail::log(detail::LogLevel::info, detail::LogSubsys::bootstrap, rank, "rendezvous: generation ", gen, ", world size ", size);

  Bootstrap b;
  b.rank = rank;
  b.size = size;
  b.store = std::make_shared<WatchedStore>(std::make_shared<PrefixStore>(prefix + "comm/", store), store,
                                           prefix + "failed", rank);
  options.rank = rank;
  options.world_size = size;
  options.store = store;
  b.options = std::move(options);
  b.nonce = nonce;
  return b;
}

}  // namespace chorus
