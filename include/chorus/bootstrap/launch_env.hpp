#pragma once
/// Which launcher started this process, and what it says about rank and world size, so that
/// torchrun, mpirun (Open MPI, MPICH/Hydra) and srun launch chorus programs without MPI.
///
/// | source   | rank                 | world size           | local rank                 | local size                 |
/// |----------|----------------------|----------------------|----------------------------|----------------------------|
/// | torchrun | RANK                 | WORLD_SIZE           | LOCAL_RANK                 | LOCAL_WORLD_SIZE           |
/// | openmpi  | OMPI_COMM_WORLD_RANK | OMPI_COMM_WORLD_SIZE | OMPI_COMM_WORLD_LOCAL_RANK | OMPI_COMM_WORLD_LOCAL_SIZE |
/// | mpich    | PMI_RANK             | PMI_SIZE             | MPI_LOCALRANKID            | MPI_LOCALNRANKS            |
/// | slurm    | SLURM_PROCID         | SLURM_NTASKS         | SLURM_LOCALID              | SLURM_NTASKS_PER_NODE (*)  |
/// (*) only when it is a plain number (Slurm writes "2(x3)" for uneven layouts).
///
/// Precedence is the table's order: the innermost launcher wins (torchrun started by srun sets
/// RANK next to SLURM_PROCID; mpirun inside an allocation sets OMPI_* next to SLURM_*).
/// A launcher counts as present when its rank or its size variable is set; then both must be
/// set and parse, with 0 <= rank < size, else invalid_argument naming the variable.

#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "chorus/core/error.hpp"
#include "chorus/detail/env.hpp"

namespace chorus {

struct LaunchInfo {
  int rank = -1;
  int world_size = -1;
  int local_rank = -1;  ///< -1 when the launcher does not say
  int local_size = -1;  ///< -1 when the launcher does not say
  std::string source;   ///< "torchrun", "openmpi", "mpich", "slurm"
};

/// Reads a variable: nullopt when unset or empty (like detail::env_string).
using GetEnv = std::function<std::optional<std::string>(const char*)>;

/// The launch described by the variables `getenv` returns (injectable for tests), or nullopt
/// when no known launcher's variables are set.
inline std::optional<LaunchInfo> detect_launch(const GetEnv& getenv) {
  struct Launcher {
    const char* source;
    const char* rank;
    const char* size;
    const char* local_rank;
    const char* local_size;
  };
  static constexpr Launcher kLaunchers[] = {
      {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
      {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
       "OMPI_COMM_WORLD_LOCAL_SIZE"},
      {"mpich", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
      {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
  };
  constexpr std::int64_t kMaxRanks = 1 << 24;
  for (const auto& l : kLaunchers) {
    const auto rank = getenv(l.rank);
    const auto size = getenv(l.size);
    if (!rank && !size) continue;
    if (!rank || !size)
      throw Error(ErrorCode::invalid_argument, std::string(rank ? l.size : l.rank) + " is not set but " +
                                                   (rank ? l.rank : l.size) + " is (" + l.source + " launch)");
    LaunchInfo info;
    info.source = l.source;
    info.world_size = static_cast<int>(detail::parse_int(*size, l.size, 1, kMaxRanks));
    info.rank = static_cast<int>(detail::parse_int(*rank, l.rank, 0, kMaxRanks - 1));
    if (info.rank >= info.world_size)
      throw Error(ErrorCode::invalid_argument, std::string(l.rank) + "=" + *rank + " is out of range for " + l.size +
                                                   "=" + *size);
    if (auto ls = getenv(l.local_size)) {
      const bool slurm_list = std::string_view(l.source) == "slurm" && ls->find_first_not_of("0123456789") != std::string::npos;
      if (!slurm_list) info.local_size = static_cast<int>(detail::parse_int(*ls, l.local_size, 1, kMaxRanks));
    }
    if (auto lr = getenv(l.local_rank)) {
      info.local_rank = static_cast<int>(detail::parse_int(*lr, l.local_rank, 0, kMaxRanks - 1));
      if (info.local_size > 0 && info.local_rank >= info.local_size)
        throw Error(ErrorCode::invalid_argument, std::string(l.local_rank) + "=" + *lr + " is out of range for " +
                                                     l.local_size + "=" + std::to_string(info.local_size));
    }
    return info;
  }
  return std::nullopt;
}

/// The launch described by this process's environment.
inline std::optional<LaunchInfo> detect_launch() { return detect_launch(GetEnv(&detail::env_string)); }

}  // namespace chorus
