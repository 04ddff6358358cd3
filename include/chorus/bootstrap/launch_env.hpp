// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// Which launcher started this process, and what it says about rank and world size, so that
/// torchrun, mpirun (Open MPI, MPICH/Hydra) and srun launch chorus programs without MPI.
///
/// | source   | rank                 | world size           | local rank                 | local size                 |
/// |----------|----------------------|----------------------|----------------------------|----------------------------|
/// | torchrun | RANK                 | WORLD_SIZE           | LOCAL_RANK                 | LOCAL_WORLD_SIZE           |
/// | openmpi  | OMPI_COMM_WORLD_RANK | OMPI_COMM_WORLD_SIZE | OMPI_COMM_WORLD_LOCAL_RANK | OMPI_COMM_WORLD_LOCAL_SIZE |
/// | mpich    | PMI_RANK             | PMI_SIZE             | MPI_LOCALRANKID            | MPI_LOCALNRANKS            |
/// | slurm    | SLURM_PROCID         | SLURM_NTASKS         | SLURM_LOCALID              | (*)                        |
/// (*) this node's entry of the step's tasks per node, SLURM_STEP_TASKS_PER_NODE (else
/// SLURM_TASKS_PER_NODE, else SLURM_NTASKS_PER_NODE), at index SLURM_NODEID: Slurm's compressed
/// list, "2(x3),1" for 2 tasks on each of the first three nodes and 1 on the fourth
/// (slurm_tasks_per_node). `srun -n 3 -N 2` sets "2,1": local sizes 2 and 1.
///
/// Precedence is the table's order: the innermost launcher wins (torchrun started by srun sets
/// RANK next to SLURM_PROCID; mpirun inside an allocation sets OMPI_* next to SLURM_*).
/// A launcher counts as present when its rank or its size variable is set; then both must be
/// set and parse, with 0 <= rank < size, else invalid_argument naming the variable.
///
/// Where the ranks meet when MASTER_ADDR is not set (the rendezvous decides, see
/// impl/rendezvous.hpp) needs two more facts from the launcher, read here:
///   * the job's id, the same on every rank of one run and different between runs: Open MPI sets
///     PMIX_NAMESPACE (4 and 5) and OMPI_MCA_ess_base_jobid (4); Slurm SLURM_JOB_ID and
///     SLURM_STEP_ID. MPICH's Hydra sets none in the environment: its PMI server tells each rank
///     the job's KVS name ("kvs_<pid>_<n>_<random>_<host>") over the socket PMI_FD names
///     (hydra_kvs_name).
///   * rank 0's host under Slurm: the first host of SLURM_STEP_NODELIST (srun puts task 0
///     there), else of SLURM_JOB_NODELIST, in Slurm's hostlist syntax (slurm_first_host).
///   * the store's port under Slurm when MASTER_PORT is not set: derived from SLURM_JOB_ID and
///     SLURM_STEP_ID (slurm_master_port), so every task of the step computes the same one.

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "chorus/bootstrap/pmi1.hpp"
#include "chorus/core/error.hpp"
#include "chorus/detail/env.hpp"

namespace chorus {

struct LaunchInfo {
  int rank = -1;
  int world_size = -1;
  int local_rank = -1;  ///< -1 when the launcher does not say
  int local_size = -1;  ///< -1 when the launcher does not say
  std::string source;   ///< "torchrun", "openmpi", "mpich", "slurm"
  /// The launcher's id for this run, from its variables (see the top of this file), with the
  /// characters a file name cannot hold replaced by '_'; "" when the variables carry none.
  std::string job_id;
};

/// Reads a variable: nullopt when unset or empty (like detail::env_string).
using GetEnv = std::function<std::optional<std::string>(const char*)>;

namespace detail {

/// `s` with every character other than [A-Za-z0-9._-] replaced by '_': safe in a file name.
inline std::string file_name_safe(std::string s) {
  for (char& c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_')) c = '_';
  return s;
}

/// The launchers' variables, in order of precedence (the table at the top of this file).
struct Launcher {
  const char* source;
  const char* rank;
  const char* size;
  const char* local_rank;
  const char* local_size;
};
inline constexpr Launcher kLaunchers[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {"mpich", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_STEP_TASKS_PER_NODE"},
};

}  // namespace detail

/// How a message names this process: "rank 3" once its rank is known (`rank` >= 0). Before that,
/// the rank the launcher's variable gives, marked as such: "rank 3 (from OMPI_COMM_WORLD_RANK,
/// before rank assignment)" (the first launcher of the table whose rank variable holds a
/// number), else "before rank assignment". Never throws: it labels errors, whatever the
/// variables hold.
inline std::string rank_label(int rank, const GetEnv& getenv) {
  if (rank >= 0) return "rank " + std::to_string(rank);
  for (const auto& l : detail::kLaunchers) {
    const auto v = getenv(l.rank);
    if (v && v->size() <= 9 && v->find_first_not_of("0123456789") == std::string::npos)
      return "rank " + std::to_string(std::stoi(*v)) + " (from " + l.rank + ", before rank assignment)";
  }
  return "before rank assignment";
}

/// rank_label() of this process's environment.
inline std::string rank_label(int rank) { return rank_label(rank, GetEnv(&detail::env_string)); }

/// The job id a launcher's variables carry (LaunchInfo::job_id), "" when none.
inline std::string launch_job_id(std::string_view source, const GetEnv& getenv) {
  if (source == "openmpi") {
    if (auto v = getenv("PMIX_NAMESPACE")) return detail::file_name_safe("pmix-" + *v);
    if (auto v = getenv("OMPI_MCA_ess_base_jobid")) return detail::file_name_safe("ompi-" + *v);
  } else if (source == "slurm") {
    if (auto v = getenv("SLURM_JOB_ID"))
      return detail::file_name_safe("slurm-" + *v + "." + getenv("SLURM_STEP_ID").value_or("0"));
  }
  return {};
}

/// The first host of a Slurm hostlist ("node[01-04,07],gpu-[1-2]" -> "node01", "a1,b[3-5]" ->
/// "a1", "rack[2-3]-n[5,9]" -> "rack2-n5"), keeping the digits as written (zero padding). The
/// whole list is checked: brackets that do not pair, an empty item or range, a range that is not
/// "digits" or "lo-hi" with lo <= hi is invalid_argument naming `what` (the variable).
inline std::string slurm_first_host(std::string_view list, std::string_view what) {
  auto bad = [&](const std::string& why) {
    return Error(ErrorCode::invalid_argument,
                 std::string(what) + "='" + std::string(list) + "' is not a Slurm hostlist: " + why);
  };
  auto digits = [](std::string_view t) {
    return !t.empty() && t.find_first_not_of("0123456789") == std::string_view::npos;
  };
  std::string first;
  bool in_first = true;  // still in the list's first item
  std::size_t item_chars = 0;
  for (std::size_t i = 0; i < list.size(); ++i) {
    const char c = list[i];
    if (c == ',') {
      if (item_chars == 0) throw bad("an empty host name");
      in_first = false;
      item_chars = 0;
      continue;
    }
    ++item_chars;
    if (c == ']') throw bad("']' without '['");
    if (c != '[') {
      if (in_first) first += c;
      continue;
    }
    const std::size_t close = list.find(']', i);
    if (close == std::string_view::npos) throw bad("'[' without ']'");
    const std::string_view ranges = list.substr(i + 1, close - i - 1);
    if (ranges.find('[') != std::string_view::npos) throw bad("nested '['");
    std::size_t start = 0;
    for (;;) {  // "lo-hi" or "n", comma-separated
      const std::size_t end = std::min(ranges.find(',', start), ranges.size());
      const std::string_view r = ranges.substr(start, end - start);
      const std::size_t dash = r.find('-');
      const std::string_view lo = r.substr(0, dash), hi = dash == std::string_view::npos ? lo : r.substr(dash + 1);
      if (!digits(lo) || !digits(hi)) throw bad("'[" + std::string(ranges) + "]' holds a range that is not n or lo-hi");
      constexpr std::int64_t kMaxIndex = 999'999'999'999'999'999;
      if (lo.size() > 18 || hi.size() > 18 ||
          detail::parse_int(lo, what, 0, kMaxIndex) > detail::parse_int(hi, what, 0, kMaxIndex))
        throw bad("the range '" + std::string(r) + "'");
      if (in_first && start == 0) first += lo;
      if (end == ranges.size()) break;
      start = end + 1;
    }
    i = close;
  }
  if (item_chars == 0) throw bad("an empty host name");
  return first;
}

/// Rank 0's host under Slurm, or nullopt when no node list is set (see the top of this file).
inline std::optional<std::string> slurm_master_host(const GetEnv& getenv) {
  for (const char* name : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"})
    if (auto v = getenv(name)) return slurm_first_host(*v, name);
  return std::nullopt;
}

/// Slurm's tasks per node, as SLURM_STEP_TASKS_PER_NODE, SLURM_TASKS_PER_NODE and
/// SLURM_NTASKS_PER_NODE write them: comma-separated entries, each "<tasks>" for one node or
/// "<tasks>(x<nodes>)" for that many nodes in a row. "2(x3),1" is 2, 2, 2, 1.
struct SlurmTasksPerNode {
  struct Run {
    int tasks = 0;  ///< on each node of the run, >= 1
    int nodes = 0;  ///< >= 1
  };
  std::vector<Run> runs;

  /// Nodes in all.
  std::int64_t nodes() const {
    std::int64_t n = 0;
    for (const auto& r : runs) n += r.nodes;
    return n;
  }
  /// Tasks in all.
  std::int64_t tasks() const {
    std::int64_t n = 0;
    for (const auto& r : runs) n += std::int64_t(r.tasks) * r.nodes;
    return n;
  }
  /// The tasks on node `node` (0-based), or -1 past the last node.
  int on_node(std::int64_t node) const {
    for (const auto& r : runs) {
      if (node < r.nodes) return r.tasks;
      node -= r.nodes;
    }
    return -1;
  }
};

/// Parses Slurm's tasks-per-node list (SlurmTasksPerNode); `what` names the variable. Anything
/// else (an empty entry, "2(x)", "2(3)", "x3", "0", a sign, spaces, text after ')') is
/// invalid_argument naming `what`, the value and the entry at fault.
inline SlurmTasksPerNode slurm_tasks_per_node(std::string_view value, std::string_view what) {
  constexpr std::int64_t kMax = 1 << 24;
  auto bad = [&](std::string_view entry, const std::string& why) {
    return Error(ErrorCode::invalid_argument,
                 std::string(what) + "='" + std::string(value) + "' is not Slurm's tasks per node (like 2(x3),1): entry '" +
                     std::string(entry) + "' " + why);
  };
  auto number = [&](std::string_view entry, std::string_view digits, const char* role) {
    if (digits.empty() || digits.size() > 8 || digits.find_first_not_of("0123456789") != std::string_view::npos)
      throw bad(entry, std::string("has no plain number of ") + role);
    const std::int64_t v = std::stoll(std::string(digits));
    if (v < 1 || v > kMax) throw bad(entry, std::string("has ") + role + " out of range 1.." + std::to_string(kMax));
    return static_cast<int>(v);
  };
  SlurmTasksPerNode out;
  std::int64_t nodes = 0;
  std::size_t start = 0;
  for (;;) {
    const std::size_t end = std::min(value.find(',', start), value.size());
    const std::string_view entry = value.substr(start, end - start);
    if (entry.empty()) throw bad(entry, "is empty");
    SlurmTasksPerNode::Run run;
    const std::size_t open = entry.find('(');
    if (open == std::string_view::npos) {
      run = {number(entry, entry, "tasks"), 1};
    } else {
      if (entry.back() != ')' || entry.substr(open + 1, 1) != "x" || entry.find('(', open + 1) != std::string_view::npos)
        throw bad(entry, "is not <tasks> or <tasks>(x<nodes>)");
      run = {number(entry, entry.substr(0, open), "tasks"),
             number(entry, entry.substr(open + 2, entry.size() - open - 3), "nodes")};
    }
    nodes += run.nodes;
    if (nodes > kMax) throw bad(entry, "brings the nodes past " + std::to_string(kMax));
    out.runs.push_back(run);
    if (end == value.size()) break;
    start = end + 1;
  }
  return out;
}

/// The store's port under Slurm when MASTER_PORT is not set: 15000 + (16 x SLURM_JOB_ID +
/// SLURM_STEP_ID) mod 15000, from 15000 to 29999, below Linux's ephemeral ports (32768 and up by
/// default), so no outgoing connection holds it by chance. Every task of a step computes the same
/// port; the steps of one job differ (16 steps before the formula wraps), as do consecutive jobs.
/// Nullopt when SLURM_JOB_ID is not set; a SLURM_JOB_ID or SLURM_STEP_ID that is not a number is
/// invalid_argument naming it. SLURM_STEP_ID unset counts as 0.
inline std::optional<std::uint16_t> slurm_master_port(const GetEnv& getenv) {
  const auto job = getenv("SLURM_JOB_ID");
  if (!job) return std::nullopt;
  constexpr std::int64_t kMaxId = std::int64_t(1) << 40;
  const auto job_id = detail::parse_int(*job, "SLURM_JOB_ID", 0, kMaxId);
  const auto step = getenv("SLURM_STEP_ID");
  const auto step_id = step ? detail::parse_int(*step, "SLURM_STEP_ID", 0, kMaxId) : 0;
  return static_cast<std::uint16_t>(15000 + (16 * job_id + step_id) % 15000);
}

/// The KVS name Hydra's PMI-1 server gives this rank, over the connected socket PMI_FD names:
/// "cmd=init", "cmd=get_my_kvsname", then "cmd=finalize" (Hydra takes a rank that exits after
/// init without finalize for a failed one, and kills the job's other ranks). Nullopt when PMI_FD
/// is not set or the server does not answer within `timeout`. (A program that also calls
/// MPI_Init under mpiexec should set MASTER_ADDR, so that this exchange does not come first.)
inline std::optional<std::string> hydra_kvs_name(const GetEnv& getenv,
                                                 std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  const auto fd_text = getenv("PMI_FD");
  if (!fd_text) return std::nullopt;
  const int fd = static_cast<int>(detail::parse_int(*fd_text, "PMI_FD", 0, 1 << 20));
  const detail::Pmi1Connection pmi(fd, std::chrono::steady_clock::now() + timeout);
  const auto name = pmi.start();
  if (!name || !pmi.ask_ok("cmd=finalize\n", "finalize_ack")) return std::nullopt;
  return name;
}

/// This task's local size under srun (the table at the top of this file): the entry at
/// SLURM_NODEID of the first of SLURM_STEP_TASKS_PER_NODE, SLURM_TASKS_PER_NODE and
/// SLURM_NTASKS_PER_NODE that is set (without SLURM_NODEID, only a list of one node says); -1
/// when none is set, or when the step's list does not add up to `world_size` (SLURM_NTASKS). A
/// list that does not parse, or a SLURM_NODEID past its nodes, is invalid_argument naming the
/// variable and this task's rank.
inline int slurm_local_size(const GetEnv& getenv, int world_size) {
  for (const char* name : {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE"}) {
    const auto v = getenv(name);
    if (!v) continue;
    try {
      const SlurmTasksPerNode list = slurm_tasks_per_node(*v, name);
      // A step's list that does not add up to SLURM_NTASKS does not describe this task's world
      // (a component of a heterogeneous step, say): no local size, rather than a wrong one.
      if (std::string_view(name) == "SLURM_STEP_TASKS_PER_NODE" && list.tasks() != world_size) return -1;
      if (list.nodes() == 1) return list.on_node(0);  // one node, or (--ntasks-per-node) every node
      const auto node_text = getenv("SLURM_NODEID");
      if (!node_text) return -1;  // several nodes, and nothing says which one this is
      const int tasks = list.on_node(detail::parse_int(*node_text, "SLURM_NODEID", 0, std::int64_t(1) << 24));
      if (tasks < 0)
        throw Error(ErrorCode::invalid_argument, "SLURM_NODEID=" + *node_text + " is past the " +
                                                     std::to_string(list.nodes()) + " nodes of " + name + "='" + *v + "'");
      return tasks;
    } catch (const Error& e) {
      const std::string message = e.message();
      throw Error(ErrorCode::invalid_argument, rank_label(-1, getenv) + ": " + message);
    }
  }
  return -1;
}

/// The launch described by the variables `getenv` returns (injectable for tests), or nullopt
/// when no known launcher's variables are set.
inline std::optional<LaunchInfo> detect_launch(const GetEnv& getenv) {
  constexpr std::int64_t kMaxRanks = 1 << 24;
  for (const auto& l : detail::kLaunchers) {
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
    if (std::string_view(l.source) == "slurm") {
      info.local_size = slurm_local_size(getenv, info.world_size);
    } else if (auto ls = getenv(l.local_size)) {
      info.local_size = static_cast<int>(detail::parse_int(*ls, l.local_size, 1, kMaxRanks));
    }
    if (auto lr = getenv(l.local_rank)) {
      info.local_rank = static_cast<int>(detail::parse_int(*lr, l.local_rank, 0, kMaxRanks - 1));
      const bool slurm = std::string_view(l.source) == "slurm";
      if (info.local_size > 0 && info.local_rank >= info.local_size)
        throw Error(ErrorCode::invalid_argument,
                    (slurm ? rank_label(-1, getenv) + ": " : std::string()) + l.local_rank + "=" + *lr +
                        " is out of range for " +
                        (slurm ? "this node's " + std::to_string(info.local_size) + " task(s) (Slurm's tasks per node at SLURM_NODEID)"
                               : std::string(l.local_size) + "=" + std::to_string(info.local_size)));
    }
    info.job_id = launch_job_id(info.source, getenv);
    return info;
  }
  return std::nullopt;
}

/// MASTER_ADDR, else under srun (Slurm the launcher) the first host of the node list; nullopt
/// when neither. The rendezvous's store and the tcp links' listen address both start from it.
inline std::optional<std::string> master_addr(const GetEnv& getenv) {
  if (auto a = getenv("MASTER_ADDR")) return a;
  const auto launch = detect_launch(getenv);
  if (launch && launch->source == "slurm") return slurm_master_host(getenv);
  return std::nullopt;
}

/// The launch described by this process's environment.
inline std::optional<LaunchInfo> detect_launch() { return detect_launch(GetEnv(&detail::env_string)); }

/// torchrun's agent store. With its static rendezvous (torchrun's default), the agent of node 0
/// serves a torch TCPStore on MASTER_ADDR:MASTER_PORT and sets TORCHELASTIC_USE_AGENT_STORE=True
/// for its workers, with TORCHELASTIC_RESTART_COUNT, the number of times the worker group was
/// restarted. Returns that count when the variable is "True", nullopt when it is unset or "False"
/// (torchrun's other rendezvous: rank 0 serves the store itself); any other value, or a restart
/// count that is missing or not a number, is invalid_argument naming the variable.
inline std::optional<int> torch_agent_store_attempt(const GetEnv& getenv) {
  const auto use = getenv("TORCHELASTIC_USE_AGENT_STORE");
  if (!use || *use == "False") return std::nullopt;
  if (*use != "True")
    throw Error(ErrorCode::invalid_argument,
                "TORCHELASTIC_USE_AGENT_STORE='" + *use + "' is not True or False (torchrun sets one of them)");
  const auto count = getenv("TORCHELASTIC_RESTART_COUNT");
  if (!count)
    throw Error(ErrorCode::invalid_argument,
                "TORCHELASTIC_USE_AGENT_STORE=True but TORCHELASTIC_RESTART_COUNT is not set (torchrun sets both)");
  return static_cast<int>(detail::parse_int(*count, "TORCHELASTIC_RESTART_COUNT", 0, 1 << 30));
}

}  // namespace chorus
