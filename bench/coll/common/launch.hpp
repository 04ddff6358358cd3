// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// How a *_perf process becomes a rank.
///
/// 1. Started plainly: it is the launcher. chorus::launch_local starts --nranks copies of the
///    program on this host (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set; the launcher hosts the
///    store) and returns the first failure's exit status.
/// 2. Started by torchrun, launch_local, mpirun or srun: init_method env://, as any chorus
///    program. torchrun needs --no_python (and Debian's --redirects 1 --tee 1):
///      torchrun --no_python --redirects 1 --tee 1 --nproc_per_node 4 all_reduce_perf -b 8 -e 1M
///    and its ranks join the torch store its agent serves on MASTER_PORT (docs/torch.md, "C++
///    programs under torchrun"). Without MASTER_ADDR, the rendezvous finds the store itself
///    (docs/environment.md): under mpirun with every rank on this host, a file store named after the launcher's job id
///    that the ranks remove once all have opened it; under srun, the first host of the node list
///    and, without MASTER_PORT, a port derived from the job and step ids; across hosts, an error
///    that asks for MASTER_ADDR and
///    MASTER_PORT (mpirun -x MASTER_ADDR=host0 -x MASTER_PORT=29500 ...).

#include <chrono>

#include "chorus/chorus.hpp"
#include "coll/common/settings.hpp"

namespace chorus::bench {

/// Options for Comm::create: the environment, then the command line's settings.
inline Options job_options(const Settings& s) {
  Options o = Options::from_env();
  if (s.transport != "auto" && !s.threads) o.transport = s.transport;
  if (!s.algorithm.empty()) o.algorithm = s.algorithm;
  if (s.chunk_bytes != 0) o.chunk_bytes = s.chunk_bytes;
  if (s.timeout_s > 0) o.timeout = std::chrono::seconds(s.timeout_s);
  return o;
}

}  // namespace chorus::bench
