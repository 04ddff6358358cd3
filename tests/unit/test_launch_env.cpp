// SPDX-License-Identifier: BSD-3-Clause
// Launcher detection: torchrun, Open MPI, MPICH/Hydra, Slurm; the job id, Slurm's hostlist, and
// where env:// meets without MASTER_ADDR (a job's file store on one host, Slurm's first node).
// The variables are the ones real launchers set (seen with `mpirun.openmpi -np 2 env` from Open
// MPI 4.1 and `mpiexec.mpich -n 2 env` from MPICH/Hydra 4.0).
#include "chorus/bootstrap/launch_env.hpp"

#include <doctest/doctest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "chorus/bootstrap/init_method.hpp"  // the detail:: steps of rendezvous()
#include "chorus/bootstrap/rendezvous.hpp"

// This file's own names: the files of tests/unit/ are compiled together (unity build).
namespace unit_test_launch_env {

using chorus::detect_launch;
using chorus::Error;
using chorus::ErrorCode;

namespace {

chorus::GetEnv env(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end() || it->second.empty()) return std::nullopt;
    return it->second;
  };
}

/// The invalid_argument message detect_launch throws for `vars`.
std::string refusal(std::map<std::string, std::string> vars) {
  try {
    detect_launch(env(std::move(vars)));
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::invalid_argument);
    return e.what();
  }
  FAIL("accepted");
  return {};
}

bool mentions(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

}  // namespace

TEST_CASE("no launcher") {
  CHECK_FALSE(detect_launch(env({})).has_value());
  CHECK_FALSE(detect_launch(env({{"MASTER_ADDR", "x"}, {"LOCAL_RANK", "0"}})).has_value());
  CHECK_FALSE(detect_launch(env({{"RANK", ""}, {"WORLD_SIZE", ""}})).has_value());  // empty = unset
}

TEST_CASE("torchrun") {
  auto l = detect_launch(env({{"RANK", "3"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"}}));
  REQUIRE(l);
  CHECK(l->source == "torchrun");
  CHECK(l->rank == 3);
  CHECK(l->world_size == 8);
  CHECK(l->local_rank == 1);
  CHECK(l->local_size == 2);

  l = detect_launch(env({{"RANK", "0"}, {"WORLD_SIZE", "1"}}));
  REQUIRE(l);
  CHECK(l->local_rank == -1);
  CHECK(l->local_size == -1);
}

TEST_CASE("Open MPI") {
  auto l = detect_launch(env({{"OMPI_COMM_WORLD_RANK", "5"},
                              {"OMPI_COMM_WORLD_SIZE", "6"},
                              {"OMPI_COMM_WORLD_LOCAL_RANK", "2"},
                              {"OMPI_COMM_WORLD_LOCAL_SIZE", "3"}}));
  REQUIRE(l);
  CHECK(l->source == "openmpi");
  CHECK(l->rank == 5);
  CHECK(l->world_size == 6);
  CHECK(l->local_rank == 2);
  CHECK(l->local_size == 3);
}

TEST_CASE("MPICH / Hydra") {
  auto l = detect_launch(env({{"PMI_RANK", "1"}, {"PMI_SIZE", "4"}, {"MPI_LOCALRANKID", "1"}, {"MPI_LOCALNRANKS", "2"}}));
  REQUIRE(l);
  CHECK(l->source == "mpich");
  CHECK(l->rank == 1);
  CHECK(l->world_size == 4);
  CHECK(l->local_rank == 1);
  CHECK(l->local_size == 2);
}

TEST_CASE("Slurm") {
  auto l = detect_launch(env({{"SLURM_PROCID", "7"}, {"SLURM_NTASKS", "16"}, {"SLURM_LOCALID", "3"}}));
  REQUIRE(l);
  CHECK(l->source == "slurm");
  CHECK(l->rank == 7);
  CHECK(l->world_size == 16);
  CHECK(l->local_rank == 3);
  CHECK(l->local_size == -1);
  // A list of several nodes without SLURM_NODEID says nothing about this node; a plain number
  // (--ntasks-per-node) is every node's.
  l = detect_launch(env({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "6"}, {"SLURM_NTASKS_PER_NODE", "2(x3)"}}));
  REQUIRE(l);
  CHECK(l->local_size == -1);
  l = detect_launch(env({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "6"}, {"SLURM_NTASKS_PER_NODE", "2"}}));
  REQUIRE(l);
  CHECK(l->local_size == 2);
  l = detect_launch(env({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "6"}, {"SLURM_NTASKS_PER_NODE", "2"}, {"SLURM_NODEID", "2"}}));
  REQUIRE(l);
  CHECK(l->local_size == 2);
}

TEST_CASE("Slurm: uneven layouts, the local size of each node") {
  // srun -n 3 -N 2 (seen with Slurm 22.05): SLURM_STEP_TASKS_PER_NODE=2,1 on every task.
  auto task = [](const char* rank, const char* node, const char* local, std::string per_node, const char* n = "3") {
    return detect_launch(env({{"SLURM_PROCID", rank}, {"SLURM_NTASKS", n}, {"SLURM_NODEID", node}, {"SLURM_LOCALID", local},
                              {"SLURM_STEP_TASKS_PER_NODE", per_node}, {"SLURM_TASKS_PER_NODE", per_node}}));
  };
  auto l = task("0", "0", "0", "2,1");
  CHECK(l->local_rank == 0);
  CHECK(l->local_size == 2);
  l = task("1", "0", "1", "2,1");
  CHECK(l->local_size == 2);
  l = task("2", "1", "0", "2,1");
  CHECK(l->local_rank == 0);
  CHECK(l->local_size == 1);
  // 2(x3),1: nodes 0-2 have 2 tasks, node 3 one.
  for (const char* node : {"0", "1", "2"}) CHECK(task("0", node, "1", "2(x3),1", "7")->local_size == 2);
  CHECK(task("6", "3", "0", "2(x3),1", "7")->local_size == 1);
  CHECK(task("0", "1", "0", "1,3(x2),2", "9")->local_size == 3);
  CHECK(task("0", "3", "0", "1,3(x2),2", "9")->local_size == 2);
  // The step's list comes first: SLURM_TASKS_PER_NODE may be the whole allocation's.
  l = detect_launch(env({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"SLURM_NODEID", "1"},
                         {"SLURM_STEP_TASKS_PER_NODE", "1(x2)"}, {"SLURM_TASKS_PER_NODE", "4(x4)"}}));
  CHECK(l->local_size == 1);
  l = detect_launch(env({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "3"}, {"SLURM_NODEID", "1"}, {"SLURM_TASKS_PER_NODE", "2,1"}}));
  CHECK(l->local_size == 1);
  // One node: no SLURM_NODEID needed.
  l = detect_launch(env({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "4"}, {"SLURM_STEP_TASKS_PER_NODE", "4"}}));
  CHECK(l->local_size == 4);
  // SLURM_LOCALID beyond this node's tasks.
  CHECK(mentions(refusal({{"SLURM_PROCID", "2"}, {"SLURM_NTASKS", "3"}, {"SLURM_NODEID", "1"}, {"SLURM_LOCALID", "1"},
                          {"SLURM_STEP_TASKS_PER_NODE", "2,1"}}),
                 "SLURM_LOCALID=1 is out of range"));
}

TEST_CASE("Slurm's tasks per node: the parser") {
  using chorus::slurm_tasks_per_node;
  auto runs = [](std::string_view v) {
    std::string s;
    for (const auto& r : slurm_tasks_per_node(v, "V").runs) s += std::to_string(r.tasks) + "x" + std::to_string(r.nodes) + " ";
    return s;
  };
  CHECK(runs("2") == "2x1 ");
  CHECK(runs("2,1") == "2x1 1x1 ");
  CHECK(runs("2(x3)") == "2x3 ");
  CHECK(runs("2(x3),1") == "2x3 1x1 ");
  CHECK(runs("1,16(x2),3(x1)") == "1x1 16x2 3x1 ");
  CHECK(runs("007(x02)") == "7x2 ");
  const auto l = slurm_tasks_per_node("2(x3),1", "V");
  CHECK(l.nodes() == 4);
  CHECK(l.tasks() == 7);
  CHECK(l.on_node(0) == 2);
  CHECK(l.on_node(2) == 2);
  CHECK(l.on_node(3) == 1);
  CHECK(l.on_node(4) == -1);
  CHECK(slurm_tasks_per_node("16777216(x16777216)", "V").tasks() == std::int64_t(1) << 48);
  // Garbage: an error naming the variable, the value and the entry.
  for (const char* bad : {"", ",", "2,", ",2", "2,,1", "x", "2(x)", "2(3)", "2(x3", "2x3", "2(x3))", "2(x3)1", "(x3)",
                          "2(x0)", "0", "-1", "+2", " 2", "2 ", "2(x 3)", "two", "2(x3),1(x2", "2((x3))",
                          "999999999", "2(x16777217)", "16777216(x16777216),1(x1)", "2;1", "2(y3)"}) {
    CAPTURE(bad);
    try {
      slurm_tasks_per_node(bad, "SLURM_STEP_TASKS_PER_NODE");
      FAIL("accepted");
    } catch (const Error& e) {
      CHECK(e.code() == ErrorCode::invalid_argument);
      CHECK(mentions(e.what(), "SLURM_STEP_TASKS_PER_NODE='" + std::string(bad) + "'"));
      CHECK(mentions(e.what(), "like 2(x3),1"));
    }
  }
  // Through detect_launch: the error names this task's rank and the variable.
  std::string what = refusal({{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "4"}, {"SLURM_NODEID", "1"},
                              {"SLURM_STEP_TASKS_PER_NODE", "2(x2"}});
  CHECK(mentions(what, "rank 3 (from SLURM_PROCID, before rank assignment)"));
  CHECK(mentions(what, "SLURM_STEP_TASKS_PER_NODE='2(x2'"));
  CHECK(mentions(what, "entry '2(x2'"));
  what = refusal({{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "4"}, {"SLURM_NODEID", "2"}, {"SLURM_STEP_TASKS_PER_NODE", "2(x2)"}});
  CHECK(mentions(what, "rank 3"));
  CHECK(mentions(what, "SLURM_NODEID=2 is past the 2 nodes"));
  // A step's list that does not add up to SLURM_NTASKS describes another world: no local size.
  CHECK(detect_launch(env({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "5"}, {"SLURM_NODEID", "0"},
                           {"SLURM_STEP_TASKS_PER_NODE", "2(x2)"}}))->local_size == -1);
  what = refusal({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_NODEID", "x"}, {"SLURM_STEP_TASKS_PER_NODE", "2(x2)"}});
  CHECK(mentions(what, "SLURM_NODEID"));
}

TEST_CASE("precedence: the innermost launcher wins") {
  std::map<std::string, std::string> all = {{"RANK", "1"},          {"WORLD_SIZE", "2"},   {"OMPI_COMM_WORLD_RANK", "3"},
                                            {"OMPI_COMM_WORLD_SIZE", "4"}, {"PMI_RANK", "5"},     {"PMI_SIZE", "6"},
                                            {"SLURM_PROCID", "7"},  {"SLURM_NTASKS", "8"}};
  auto l = detect_launch(env(all));
  REQUIRE(l);
  CHECK(l->source == "torchrun");
  CHECK(l->rank == 1);
  all.erase("RANK");
  all.erase("WORLD_SIZE");
  l = detect_launch(env(all));
  REQUIRE(l);
  CHECK(l->source == "openmpi");
  CHECK(l->rank == 3);
  all.erase("OMPI_COMM_WORLD_RANK");
  all.erase("OMPI_COMM_WORLD_SIZE");
  l = detect_launch(env(all));
  REQUIRE(l);
  CHECK(l->source == "mpich");
  CHECK(l->world_size == 6);
  all.erase("PMI_RANK");
  all.erase("PMI_SIZE");
  l = detect_launch(env(all));
  REQUIRE(l);
  CHECK(l->source == "slurm");
  CHECK(l->rank == 7);
}

TEST_CASE("unparsable values name the variable") {
  CHECK(mentions(refusal({{"RANK", "one"}, {"WORLD_SIZE", "2"}}), "RANK='one'"));
  CHECK(mentions(refusal({{"RANK", "0"}, {"WORLD_SIZE", "2x"}}), "WORLD_SIZE='2x'"));
  CHECK(mentions(refusal({{"RANK", "-1"}, {"WORLD_SIZE", "2"}}), "RANK"));
  CHECK(mentions(refusal({{"RANK", "0"}, {"WORLD_SIZE", "0"}}), "WORLD_SIZE"));
  CHECK(mentions(refusal({{"RANK", " 1"}, {"WORLD_SIZE", "2"}}), "RANK"));
  CHECK(mentions(refusal({{"RANK", "0"}, {"WORLD_SIZE", "99999999999999999999"}}), "WORLD_SIZE"));
  CHECK(mentions(refusal({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "x"}}), "LOCAL_RANK"));
  CHECK(mentions(refusal({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "z"}}),
                 "OMPI_COMM_WORLD_LOCAL_SIZE"));
  CHECK(mentions(refusal({{"PMI_RANK", "0.5"}, {"PMI_SIZE", "2"}}), "PMI_RANK"));
  CHECK(mentions(refusal({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "two"}}), "SLURM_NTASKS"));
}

TEST_CASE("out of range") {
  CHECK(mentions(refusal({{"RANK", "2"}, {"WORLD_SIZE", "2"}}), "out of range"));
  CHECK(mentions(refusal({{"SLURM_PROCID", "9"}, {"SLURM_NTASKS", "4"}}), "SLURM_PROCID"));
  CHECK(mentions(refusal({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}}),
                 "LOCAL_RANK"));
}

TEST_CASE("half a launcher is an error naming the missing variable") {
  CHECK(mentions(refusal({{"RANK", "0"}}), "WORLD_SIZE is not set"));
  CHECK(mentions(refusal({{"WORLD_SIZE", "4"}}), "RANK is not set"));
  CHECK(mentions(refusal({{"OMPI_COMM_WORLD_RANK", "0"}}), "OMPI_COMM_WORLD_SIZE"));
  CHECK(mentions(refusal({{"PMI_SIZE", "3"}}), "PMI_RANK"));
  CHECK(mentions(refusal({{"SLURM_PROCID", "0"}}), "SLURM_NTASKS"));
}

TEST_CASE("the process environment overload") {
  // Whatever this test runs under, it must not throw on a clean or a launcher environment.
  CHECK_NOTHROW(detect_launch());
}

TEST_CASE("the job id each launcher carries") {
  // Open MPI 4.1 sets both; 5 (PRRTE) names its namespace "prterun-<host>-<pid>@1".
  auto l = detect_launch(env({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"},
                              {"PMIX_NAMESPACE", "952696833"}, {"OMPI_MCA_ess_base_jobid", "952696833"}}));
  REQUIRE(l);
  CHECK(l->job_id == "pmix-952696833");
  l = detect_launch(env({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"PMIX_NAMESPACE", "prterun-vm-21559@1"}}));
  CHECK(l->job_id == "pmix-prterun-vm-21559_1");
  l = detect_launch(env({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_MCA_ess_base_jobid", "77"}}));
  CHECK(l->job_id == "ompi-77");
  l = detect_launch(env({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_JOB_ID", "4242"}, {"SLURM_STEP_ID", "3"}}));
  CHECK(l->job_id == "slurm-4242.3");
  // Hydra's environment has no job id (its PMI server gives one, see below); torchrun's is not read.
  l = detect_launch(env({{"PMI_RANK", "0"}, {"PMI_SIZE", "2"}, {"MPI_LOCALNRANKS", "2"}, {"PMI_FD", "6"}}));
  CHECK(l->job_id.empty());
  l = detect_launch(env({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"PMIX_NAMESPACE", "x"}}));
  CHECK(l->job_id.empty());
}

TEST_CASE("Slurm hostlists: the first host") {
  using chorus::slurm_first_host;
  CHECK(slurm_first_host("node[01-04,07],gpu-[1-2]", "L") == "node01");
  CHECK(slurm_first_host("a1,b[3-5]", "L") == "a1");
  CHECK(slurm_first_host("gpu-[7,2-3]", "L") == "gpu-7");
  CHECK(slurm_first_host("rack[2-3]-n[05,9]", "L") == "rack2-n05");
  CHECK(slurm_first_host("login", "L") == "login");
  CHECK(slurm_first_host("n[1-2],m[010-012]x", "L") == "n1");
  for (const char* bad : {"node[01-04", "node01]", "n[]", "n[a-b]", "n[3-1]", "n[1-]", "n[1,,2]", "a,,b", ",a", "a,",
                          "n[1[2]]"}) {
    CAPTURE(bad);
    try {
      slurm_first_host(bad, "SLURM_JOB_NODELIST");
      FAIL("accepted");
    } catch (const Error& e) {
      CHECK(e.code() == ErrorCode::invalid_argument);
      CHECK(mentions(e.what(), "SLURM_JOB_NODELIST='" + std::string(bad) + "'"));
    }
  }
}

namespace {

using chorus::detail::InitMethod;

/// parse_init_method("env://") over `vars`, counting the job id lookups (Hydra's PMI server).
InitMethod env_method(std::map<std::string, std::string> vars, int* lookups = nullptr) {
  return chorus::detail::parse_init_method("env://", env(std::move(vars)), [lookups](const chorus::LaunchInfo& l) {
    if (lookups) ++*lookups;
    CHECK(l.source == "mpich");
    return std::string("hydra-kvs_21892_0_145764462_vm");
  });
}

std::string env_refusal(std::map<std::string, std::string> vars) {
  try {
    env_method(std::move(vars));
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::invalid_argument);
    return e.what();
  }
  FAIL("accepted");
  return {};
}

const std::string kUid = std::to_string(::getuid());

}  // namespace

TEST_CASE("env:// under mpirun on one host without MASTER_ADDR: the job's file store") {
  const std::map<std::string, std::string> ompi = {{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "3"},
                                                   {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "3"},
                                                   {"PMIX_NAMESPACE", "952696833"}};
  int lookups = 0;
  auto m = env_method(ompi, &lookups);
  CHECK(m.kind == InitMethod::Kind::file);
  CHECK(m.job_file);
  CHECK(m.path == "/tmp/chorus-" + kUid + "-pmix-952696833.store");
  CHECK(lookups == 0);
  auto with = [](std::map<std::string, std::string> vars, const std::string& k, const std::string& v) {
    vars[k] = v;
    return vars;
  };
  CHECK(env_method(with(ompi, "TMPDIR", "/scratch/me//")).path == "/scratch/me/chorus-" + kUid + "-pmix-952696833.store");
  CHECK(env_method(with(ompi, "TMPDIR", "relative/dir")).path == "/tmp/chorus-" + kUid + "-pmix-952696833.store");
  // MPICH/Hydra: the id comes from its PMI server.
  const std::map<std::string, std::string> mpich = {{"PMI_RANK", "0"}, {"PMI_SIZE", "3"}, {"MPI_LOCALRANKID", "0"},
                                                    {"MPI_LOCALNRANKS", "3"}, {"PMI_FD", "6"}};
  m = env_method(mpich, &lookups);
  CHECK(m.job_file);
  CHECK(m.path == "/tmp/chorus-" + kUid + "-hydra-kvs_21892_0_145764462_vm.store");
  CHECK(lookups == 1);
  // With MASTER_ADDR, as before: a TCP store.
  m = env_method(with(with(ompi, "MASTER_ADDR", "10.1.2.3"), "MASTER_PORT", "29500"));
  CHECK(m.kind == InitMethod::Kind::tcp);
  CHECK_FALSE(m.job_file);
  CHECK(m.host == "10.1.2.3");
}

TEST_CASE("env:// without MASTER_ADDR across hosts, or with no launcher, says what to set") {
  auto what = env_refusal({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                           {"PMIX_NAMESPACE", "1"}});
  CHECK(mentions(what, "several hosts (2 of 4 here)"));
  CHECK(mentions(what, "MASTER_ADDR"));
  CHECK(mentions(what, "MASTER_PORT"));
  CHECK(mentions(what, "mpirun -x MASTER_ADDR=host0"));
  what = env_refusal({{"PMI_RANK", "0"}, {"PMI_SIZE", "4"}, {"MPI_LOCALNRANKS", "1"}});
  CHECK(mentions(what, "mpich job has ranks on several hosts (1 of 4 here)"));
  CHECK(mentions(what, "mpiexec -genv MASTER_ADDR"));
  what = env_refusal({{"PMI_RANK", "0"}, {"PMI_SIZE", "4"}});
  CHECK(mentions(what, "does not say how many ranks are on this host"));
  what = env_refusal({{"RANK", "0"}, {"WORLD_SIZE", "2"}});
  CHECK(mentions(what, "MASTER_ADDR is not set"));
  what = env_refusal({});
  CHECK(mentions(what, "MASTER_ADDR is not set"));
  what = env_refusal({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}});
  CHECK(mentions(what, "SLURM_JOB_NODELIST"));
}

TEST_CASE("env:// under srun without MASTER_ADDR: the first host of the node list") {
  std::map<std::string, std::string> slurm = {{"SLURM_PROCID", "2"}, {"SLURM_NTASKS", "4"},
                                              {"SLURM_JOB_NODELIST", "node[01-04,07],gpu-[1-2]"}, {"MASTER_PORT", "29500"}};
  auto m = env_method(slurm);
  CHECK(m.kind == InitMethod::Kind::tcp);
  CHECK(m.host == "node01");
  CHECK(m.port == 29500);
  CHECK(chorus::master_addr(env(slurm)) == std::optional<std::string>("node01"));
  slurm["SLURM_STEP_NODELIST"] = "gpu-[2-3]";  // the step's nodes: task 0 runs on its first
  CHECK(env_method(slurm).host == "gpu-2");
  slurm["MASTER_ADDR"] = "head";
  CHECK(env_method(slurm).host == "head");
  slurm.erase("MASTER_ADDR");
  slurm.erase("MASTER_PORT");
  const auto what = env_refusal(slurm);
  CHECK(mentions(what, "MASTER_PORT"));
  CHECK(mentions(what, "gpu-2"));
  // Only srun's ranks: torchrun inside an allocation sets MASTER_ADDR itself.
  CHECK_FALSE(chorus::master_addr(env({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"SLURM_JOB_NODELIST", "n1"}})).has_value());
}

TEST_CASE("env:// under srun without MASTER_PORT: a port derived from the job and step") {
  std::map<std::string, std::string> slurm = {{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "4"}, {"SLURM_STEP_NODELIST", "n[3-4]"},
                                              {"SLURM_JOB_ID", "1"}, {"SLURM_STEP_ID", "0"}};
  auto m = env_method(slurm);
  CHECK(m.host == "n3");
  CHECK(m.port == 15016);  // 15000 + (16 x 1 + 0) mod 15000
  CHECK(mentions(m.port_origin, "SLURM_JOB_ID=1 and SLURM_STEP_ID=0"));
  slurm["SLURM_STEP_ID"] = "5";
  CHECK(env_method(slurm).port == 15021);
  slurm["SLURM_JOB_ID"] = "123456";  // 16 x 123456 + 5 = 1975301, mod 15000 = 10301
  CHECK(env_method(slurm).port == 25301);
  slurm["SLURM_JOB_ID"] = "937";  // 16 x 937 + 5 = 14997: the top of the range ...
  slurm["SLURM_STEP_ID"] = "2";
  CHECK(env_method(slurm).port == 29994);
  slurm["SLURM_STEP_ID"] = "8";  // ... and past it, back to the bottom
  CHECK(env_method(slurm).port == 15000);
  slurm.erase("SLURM_STEP_ID");  // unset counts as step 0
  CHECK(env_method(slurm).port == 29992);
  // Every task of a step gets the same port, whatever its rank.
  slurm["SLURM_PROCID"] = "3";
  CHECK(env_method(slurm).port == 29992);
  // MASTER_PORT wins, and then nothing is derived.
  slurm["MASTER_PORT"] = "29500";
  CHECK(env_method(slurm).port == 29500);
  CHECK(env_method(slurm).port_origin.empty());
  slurm.erase("MASTER_PORT");
  slurm["SLURM_JOB_ID"] = "12x";
  CHECK(mentions(env_refusal(slurm), "SLURM_JOB_ID"));
  slurm["SLURM_JOB_ID"] = "12";
  slurm["SLURM_STEP_ID"] = "-1";
  CHECK(mentions(env_refusal(slurm), "SLURM_STEP_ID"));
  // Not under srun: no port is derived from a stray SLURM_JOB_ID.
  const auto what = env_refusal({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"SLURM_JOB_ID", "7"}});
  CHECK(mentions(what, "needs MASTER_PORT"));
}

TEST_CASE("Hydra's PMI server names the job") {
  int fds[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
  std::vector<std::string> heard;
  std::thread server([&] {  // Hydra's side, as hydra_pmi_proxy answers
    auto line = [&] {
      std::string l;
      char c = 0;
      while (::read(fds[1], &c, 1) == 1 && c != '\n') l += c;
      return l;
    };
    auto say = [&](const std::string& t) { CHECK(::write(fds[1], t.data(), t.size()) == ssize_t(t.size())); };
    heard.push_back(line());
    say("cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0\n");
    heard.push_back(line());
    say("cmd=my_kvsname kvsname=kvs_21892_0_145764462_vm\n");
    heard.push_back(line());
    say("cmd=finalize_ack\n");
  });
  const auto name = chorus::hydra_kvs_name(env({{"PMI_FD", std::to_string(fds[0])}}));
  server.join();
  CHECK(name == std::optional<std::string>("kvs_21892_0_145764462_vm"));
  CHECK(heard ==
        std::vector<std::string>{"cmd=init pmi_version=1 pmi_subversion=1", "cmd=get_my_kvsname", "cmd=finalize"});
  // A server that does not answer: nullopt in time, not a hang.
  CHECK_FALSE(chorus::hydra_kvs_name(env({{"PMI_FD", std::to_string(fds[0])}}), std::chrono::milliseconds(50)).has_value());
  CHECK_FALSE(chorus::hydra_kvs_name(env({})).has_value());
  ::close(fds[0]);
  ::close(fds[1]);
}

TEST_CASE("a job's file store: its name is gone once every rank has opened it") {
  const auto dir = std::filesystem::temp_directory_path() / ("chorus-test-job-file-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "job.store").string();
  constexpr int kRanks = 3;
  std::vector<std::shared_ptr<chorus::Store>> stores(kRanks);
  std::vector<std::string> errors(kRanks);
  std::vector<std::thread> ranks;
  for (int r = 0; r < kRanks; ++r)
    ranks.emplace_back([&, r] {
      try {
        stores[r] = chorus::detail::job_file_store(path, kRanks, std::chrono::seconds(10));
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : ranks) t.join();
  for (int r = 0; r < kRanks; ++r) CHECK_MESSAGE(errors[r].empty(), errors[r]);
  CHECK_FALSE(std::filesystem::exists(path));
  // The ranks still share the store through the open file.
  stores[0]->set("k", "v");
  CHECK(stores[2]->get("k", std::chrono::seconds(1)) == "v");
  stores.clear();
  // A rank that never comes: a timeout that names the file, which stays (nobody removed it).
  try {
    chorus::detail::job_file_store(path, 2, std::chrono::milliseconds(100));
    FAIL("no timeout");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::timeout);
    CHECK(mentions(e.what(), path));
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("rank_label: the rank once known; before that, the launcher's variable or 'before rank assignment'") {
  using chorus::rank_label;
  CHECK(rank_label(5, env({})) == "rank 5");
  CHECK(rank_label(5, env({{"RANK", "2"}})) == "rank 5");  // a known rank wins over the variables
  CHECK(rank_label(-1, env({})) == "before rank assignment");
  CHECK(rank_label(-1, env({{"RANK", "3"}})) == "rank 3 (from RANK, before rank assignment)");
  CHECK(rank_label(-1, env({{"OMPI_COMM_WORLD_RANK", "3"}})) ==
        "rank 3 (from OMPI_COMM_WORLD_RANK, before rank assignment)");
  CHECK(rank_label(-1, env({{"PMI_RANK", "0"}})) == "rank 0 (from PMI_RANK, before rank assignment)");
  CHECK(rank_label(-1, env({{"SLURM_PROCID", "7"}})) == "rank 7 (from SLURM_PROCID, before rank assignment)");
  // The table's precedence (torchrun inside srun), and a value that is no rank is passed over.
  CHECK(rank_label(-1, env({{"RANK", "1"}, {"SLURM_PROCID", "7"}})) == "rank 1 (from RANK, before rank assignment)");
  CHECK(rank_label(-1, env({{"RANK", "x"}, {"SLURM_PROCID", "7"}})) ==
        "rank 7 (from SLURM_PROCID, before rank assignment)");
  CHECK(rank_label(-1, env({{"RANK", "-1"}})) == "before rank assignment");
  CHECK(rank_label(-1, env({{"RANK", "99999999999"}})) == "before rank assignment");
}

}  // namespace unit_test_launch_env
