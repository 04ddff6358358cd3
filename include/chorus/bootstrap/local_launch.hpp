// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// Local launcher: start N ranks of this very program on this host, the way
/// `torchrun --standalone --nproc-per-node N` does, without any launcher installed.
///
///   int main(int argc, char** argv) {
///     if (!chorus::launched_by_launcher()) return chorus::launch_local(4, argc, argv);
///     auto comm = chorus::init();   // RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT are set
///     ...
///   }
///
/// The launcher hosts the store itself (on 127.0.0.1, an ephemeral port) and tells the ranks with
/// CHORUS_AGENT_STORE=1, so rank 0 connects to it instead of hosting one. When a rank fails, the
/// others are stopped (SIGTERM, then SIGKILL after a grace period) and the launcher's exit status
/// is the first failure's.

#include <chrono>

#include "chorus/config.hpp"

namespace chorus {

/// True when this process was started as a rank (by launch_local, torchrun, mpirun or srun).
CHORUS_DECL bool launched_by_launcher();

/// Starts `nranks` copies of /proc/self/exe with argv, as ranks 0..nranks-1, and waits for them.
/// Returns 0 when all exit 0, else the first failure's exit status (128+signal for a signal).
CHORUS_DECL int launch_local(int nranks, int argc, char** argv,
                             std::chrono::milliseconds store_timeout = std::chrono::seconds(300));

}  // namespace chorus

// The bodies (bootstrap/impl/local_launch.hpp): here in a header-only program; compiled once with
// CHORUS_SEPARATE_COMPILATION (config.hpp, CHORUS_DECL).
#if !defined(CHORUS_SEPARATE_COMPILATION)
#include "chorus/bootstrap/impl/local_launch.hpp"
#endif
