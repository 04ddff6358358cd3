// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// Rendezvous: from Options (and the environment) to a Bootstrap: this rank, the world size, a
/// store every rank shares, and the job's random nonce that rank 0 publishes through the store.
/// Transports open their links from a Bootstrap (each publishes its listen address in the store).

#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "chorus/bootstrap/store.hpp"
#include "chorus/config.hpp"
#include "chorus/detail/handshake/wire.hpp"  // JobNonce
#include "chorus/options.hpp"

namespace chorus {

struct Bootstrap {
  int rank = -1;
  int size = -1;
  std::shared_ptr<Store> store;  ///< already prefixed for this communicator
  Options options;
  JobNonce nonce{};              ///< the same on every rank of the job; carried in link handshakes
};

/// Resolves rank and world size (Options, else RANK/WORLD_SIZE, OMPI_COMM_WORLD_*, PMI_*, SLURM_*),
/// builds the store from Options::store or Options::init_method (env://, tcp://, file://), and
/// agrees on the job nonce. Throws invalid_argument with a clear message when something is
/// missing; timeout when the store cannot be reached in time.
CHORUS_DECL Bootstrap rendezvous(Options options);

}  // namespace chorus

// The bodies (bootstrap/impl/rendezvous.hpp): here in a header-only program; compiled once with
// CHORUS_SEPARATE_COMPILATION (config.hpp, CHORUS_DECL).
#if !defined(CHORUS_SEPARATE_COMPILATION)
#include "chorus/bootstrap/impl/rendezvous.hpp"
#endif
