// Launcher detection: torchrun, Open MPI, MPICH/Hydra, Slurm.
#include "chorus/bootstrap/launch_env.hpp"

#include <doctest/doctest.h>

#include <map>
#include <string>

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
  // An uneven layout ("2(x3)") is not a local size; a plain number is.
  l = detect_launch(env({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "6"}, {"SLURM_NTASKS_PER_NODE", "2(x3)"}}));
  REQUIRE(l);
  CHECK(l->local_size == -1);
  l = detect_launch(env({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "6"}, {"SLURM_NTASKS_PER_NODE", "2"}}));
  REQUIRE(l);
  CHECK(l->local_size == 2);
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

}  // namespace unit_test_launch_env
