#pragma once
/// How a *_perf process becomes a rank.
///
/// 1. Started plainly: it is the launcher. chorus::launch_local starts --nranks copies of the
///    program on this host (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set; the launcher hosts the
///    store) and returns the first failure's exit status.
/// 2. Started by torchrun, launch_local, or anything that sets MASTER_ADDR: init_method env://.
/// 3. Started by mpirun (Open MPI, MPICH/Hydra) or srun, which give rank and size but no store
///    address: the ranks meet in a file store, $TMPDIR/chorus-bench-<uid>-<job>.store (TMPDIR
///    defaults to /tmp), where <job> is the launcher's job id, the same in every rank of one run
///    and different between runs: PMIX_NAMESPACE (Open MPI 4 and 5), OMPI_MCA_ess_base_jobid,
///    SLURM_JOB_ID.SLURM_STEP_ID, else the parent's pid (mpirun or its per-host daemon is every
///    local rank's parent). Once every rank has joined (a barrier after the communicator is
///    created), rank 0 removes the file: the ranks keep it open, so nothing is lost, and no stale
///    store is left for a later run. A file on one host cannot join ranks on several: when the
///    launcher says that ranks live on other hosts, the program stops at once and asks for
///    MASTER_ADDR and MASTER_PORT (mpirun -x MASTER_ADDR=host0 -x MASTER_PORT=29500 ...).

#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdio>
#include <string>

#include "chorus/chorus.hpp"
#include "chorus/detail/env.hpp"
#include "coll/common/descriptor.hpp"
#include "coll/common/settings.hpp"

namespace chorus::bench {

class JobStore {
 public:
  /// Options for Comm::create: the settings, the environment, and where the store is.
  Options options(const Settings& s) {
    Options o = Options::from_env();
    if (s.transport != "auto") o.transport = s.transport;
    if (!s.algorithm.empty()) o.algorithm = s.algorithm;
    if (s.chunk_bytes != 0) o.chunk_bytes = s.chunk_bytes;
    if (s.timeout_s > 0) o.timeout = std::chrono::seconds(s.timeout_s);
    if (chorus::detail::env_string("MASTER_ADDR")) return o;  // env://
    const auto launch = detect_launch();
    if (!launch) return o;  // rendezvous explains what is missing
    if (launch->local_size > 0 && launch->local_size < launch->world_size)
      throw Error(ErrorCode::invalid_argument,
                  "the " + launch->source + " job has ranks on several hosts (" + std::to_string(launch->local_size) +
                      " of " + std::to_string(launch->world_size) +
                      " here): set MASTER_ADDR (rank 0's host) and MASTER_PORT (a free port) for every rank, "
                      "e.g. mpirun -x MASTER_ADDR=host0 -x MASTER_PORT=29500 ...");
    file_ = path_for(job_key());
    o.init_method = "file://" + file_;
    return o;
  }

  /// Call on every rank once the communicator exists: rank 0 removes the file store (if any)
  /// after every rank has passed the barrier, hence opened it.
  void joined(Comm& comm) {
    comm.barrier();
    if (comm.rank() == 0 && !file_.empty()) ::unlink(file_.c_str());
  }

  const std::string& file() const { return file_; }

 private:
  static std::string sanitize(std::string s) {
    for (char& c : s)
      if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_')) c = '_';
    return s;
  }

  static std::string job_key() {
    using chorus::detail::env_string;
    if (auto v = env_string("PMIX_NAMESPACE")) return "pmix-" + sanitize(*v);
    if (auto v = env_string("OMPI_MCA_ess_base_jobid")) return "ompi-" + sanitize(*v);
    if (auto v = env_string("SLURM_JOB_ID"))
      return "slurm-" + sanitize(*v) + "." + sanitize(env_string("SLURM_STEP_ID").value_or("0"));
    return "ppid-" + std::to_string(::getppid());
  }

  static std::string path_for(const std::string& key) {
    std::string dir = chorus::detail::env_string("TMPDIR").value_or("/tmp");
    if (dir.front() != '/') dir = "/tmp";  // file:// takes an absolute path
    while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
    return dir + "/chorus-bench-" + std::to_string(::getuid()) + "-" + key + ".store";
  }

  std::string file_;
};

}  // namespace chorus::bench
