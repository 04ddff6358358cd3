// SPDX-License-Identifier: BSD-3-Clause
// Collectives over tcp with ranks as processes: a representative slice of the matrix (which runs
// over inproc, test_matrix.cpp). A smaller slice runs over shm and over the auto transport.
// World sizes 2, 3, 4; every collective; float32, int32 and bfloat16; sum and max (all_reduce:
// every op); counts 0, 1, 13, 100003 (10007 in the sanitizer builds); roots other than 0; in
// place and out of place; all_reduce, broadcast and reduce with each of their algorithms.
// Results are checked bit for bit against support/fill.hpp's reference on every rank.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "chorus/communicator.hpp"
#include "support/communicators.hpp"
#include "chorus/transport/tcp/transport.hpp"
#include "support/fill.hpp"
#include "support/sanitized.hpp"
#include "support/spawn.hpp"

// This file's own names: the files of tests/collective/ are compiled together (unity build).
namespace collective_test_tcp {

namespace {

using namespace std::chrono_literals;
using chorus::DataType;
using chorus::ReduceOp;
using chorus::test::check_equal;
using chorus::test::expected_all_reduce;
using chorus::test::input;
using chorus::test::pattern;
using chorus::test::seed_of;
using TcpComm = chorus::Communicator<chorus::tcp::Transport>;
using ShmComm = chorus::Communicator<chorus::shm::Transport>;
using AutoComm = chorus::Communicator<chorus::hybrid::Transport>;

/// The largest count shrinks in the sanitizer builds, which run 3-10x slower (still ~40 slices
/// of 1 KiB in float32 with a forced algorithm).
constexpr std::size_t kCounts[] = {0, 1, 13, chorus::test::kSanitized ? 10007 : 100003};
/// Calls f(std::type_identity<T>{}) for float32, int32 and bfloat16: only these three are
/// instantiated (chorus::dispatch over a DataType would compile the checks for all ten).
template <class F>
void for_each_dtype(F&& f) {
  f(std::type_identity<float>{});
  f(std::type_identity<std::int32_t>{});
  f(std::type_identity<chorus::bfloat16>{});
}
constexpr ReduceOp kOps[] = {ReduceOp::sum, ReduceOp::max};

enum class Coll {
  all_reduce = 1,
  broadcast,
  reduce,
  scatter,
  gather,
  all_gather,
  reduce_scatter,
  all_to_all
};

constexpr const char* name(Coll c) {
  switch (c) {
    case Coll::all_reduce:
      return "all_reduce";
    case Coll::broadcast:
      return "broadcast";
    case Coll::reduce:
      return "reduce";
    case Coll::scatter:
      return "scatter";
    case Coll::gather:
      return "gather";
    case Coll::all_gather:
      return "all_gather";
    case Coll::reduce_scatter:
      return "reduce_scatter";
    case Coll::all_to_all:
      return "all_to_all";
  }
  return "?";
}

/// Runs one collective call on every rank and checks this rank's result.
template <class Comm>
struct Runner {
  Comm& comm;
  std::string where;       ///< "(tcp, world 3, ring)"
  std::uint64_t call = 0;  ///< the same sequence on every rank

  int rank() const { return comm.rank(); }
  int world() const { return comm.size(); }

  template <class T>
  void run(Coll coll, std::size_t count, ReduceOp op, int root, bool in_place) {
    constexpr DataType dt = chorus::data_type_of<T>;
    const int r = rank(), n = world();
    const std::uint64_t seed = seed_of(call++, coll, dt, op, count, root, in_place);
    std::string what = std::string(name(coll)) + " " + std::string(chorus::to_string(dt));
    if (coll == Coll::all_reduce || coll == Coll::reduce || coll == Coll::reduce_scatter)
      what += " " + std::string(chorus::to_string(op));
    what += " count " + std::to_string(count);
    if (coll == Coll::broadcast || coll == Coll::reduce || coll == Coll::scatter || coll == Coll::gather)
      what += " root " + std::to_string(root);
    what += (in_place ? " in place " : " out of place ") + where;

    const std::size_t total = count * static_cast<std::size_t>(n);
    auto red_in = [&](std::size_t len) {
      std::vector<T> v(len);
      for (std::size_t i = 0; i < len; ++i) v[i] = input<T>(seed, n, r, i, op);
      return v;
    };
    auto pat_in = [&](int who, std::size_t len) {
      std::vector<T> v(len);
      for (std::size_t i = 0; i < len; ++i) v[i] = pattern<T>(seed, who, i);
      return v;
    };
    auto garbage = [&](std::size_t len) { return pat_in(r + 1000, len); };
    auto reduced = [&](std::size_t i) { return expected_all_reduce<T>(seed, n, i, op); };

    switch (coll) {
      case Coll::all_reduce: {
        std::vector<T> in = red_in(count), out = garbage(count);
        if (in_place) {
          comm.all_reduce(std::span<T>(in), op);
          check_equal<T>(in, reduced, what, r);
        } else {
          comm.all_reduce(std::span<const T>(in), std::span<T>(out), op);
          check_equal<T>(out, reduced, what, r);
          check_equal<T>(
              in, [&](std::size_t i) { return input<T>(seed, n, r, i, op); }, what + ": input", r);
        }
        break;
      }
      case Coll::broadcast: {
        std::vector<T> buf = r == root ? pat_in(root, count) : garbage(count);
        comm.broadcast(std::span<T>(buf), root);
        check_equal<T>(
            buf, [&](std::size_t i) { return pattern<T>(seed, root, i); }, what, r);
        break;
      }
      case Coll::reduce: {
        std::vector<T> in = red_in(count);
        if (in_place) {
          comm.reduce(std::span<const T>(in), std::span<T>(in), op, root);
          if (r == root)
            check_equal<T>(in, reduced, what, r);
          else
            check_equal<T>(
                in, [&](std::size_t i) { return input<T>(seed, n, r, i, op); }, what + ": input", r);
        } else {
          std::vector<T> out = r == root ? garbage(count) : std::vector<T>{};
          comm.reduce(std::span<const T>(in), std::span<T>(out), op, root);
          if (r == root) check_equal<T>(out, reduced, what, r);
        }
        break;
      }
      case Coll::scatter: {
        std::vector<T> in = r == root ? pat_in(root, total) : std::vector<T>{};
        auto want = [&](std::size_t i) { return pattern<T>(seed, root, r * count + i); };
        if (in_place && r == root) {
          comm.scatter(std::span<const T>(in), std::span<T>(in).subspan(root * count, count), root);
          check_equal<T>(
              in, [&](std::size_t i) { return pattern<T>(seed, root, i); }, what, r);
        } else {
          std::vector<T> out = garbage(count);
          comm.scatter(std::span<const T>(in), std::span<T>(out), root);
          check_equal<T>(out, want, what, r);
        }
        break;
      }
      case Coll::gather: {
        std::vector<T> in = pat_in(r, count);
        std::vector<T> out = r == root ? garbage(total) : std::vector<T>{};
        auto want = [&](std::size_t j) { return pattern<T>(seed, static_cast<int>(j / count), j % count); };
        if (in_place && r == root) {
          std::span<T> mine = std::span<T>(out).subspan(root * count, count);
          std::copy(in.begin(), in.end(), mine.begin());
          comm.gather(std::span<const T>(mine), std::span<T>(out), root);
        } else {
          comm.gather(std::span<const T>(in), std::span<T>(out), root);
        }
        if (r == root) check_equal<T>(out, want, what, r);
        break;
      }
      case Coll::all_gather: {
        std::vector<T> in = pat_in(r, count), out = garbage(total);
        auto want = [&](std::size_t j) { return pattern<T>(seed, static_cast<int>(j / count), j % count); };
        if (in_place) {
          std::span<T> mine = std::span<T>(out).subspan(r * count, count);
          std::copy(in.begin(), in.end(), mine.begin());
          comm.all_gather(std::span<const T>(mine), std::span<T>(out));
        } else {
          comm.all_gather(std::span<const T>(in), std::span<T>(out));
        }
        check_equal<T>(out, want, what, r);
        break;
      }
      case Coll::reduce_scatter: {
        std::vector<T> in = red_in(total);
        const std::size_t base = r * count;
        if (in_place) {
          std::span<T> mine = std::span<T>(in).subspan(base, count);
          comm.reduce_scatter(std::span<const T>(in), mine, op);
          check_equal<T>(std::span<const T>(mine), reduced, what, r, base);
        } else {
          std::vector<T> out = garbage(count);
          comm.reduce_scatter(std::span<const T>(in), std::span<T>(out), op);
          check_equal<T>(
              out, [&](std::size_t i) { return reduced(base + i); }, what, r);
        }
        break;
      }
      case Coll::all_to_all: {
        std::vector<T> in = pat_in(r, total), out = garbage(total);
        comm.all_to_all(std::span<const T>(in), std::span<T>(out));
        check_equal<T>(
            out,
            [&](std::size_t j) {
              return pattern<T>(seed, static_cast<int>(j / count), r * count + j % count);
            },
            what, r);
        break;
      }
    }
  }
};

/// "(tcp, world 3)" or "(tcp, world 3, ring)". (A stream: concatenating std::string temporaries
/// here trips g++ 12's -Wrestrict false positive.)
inline std::string where_text(std::string_view transport, int world, std::string_view algo = {}) {
  std::ostringstream os;
  os << '(' << transport << ", world " << world;
  if (!algo.empty()) os << ", " << algo;
  os << ')';
  return os.str();
}

/// Ranks as processes, every wait bounded.
template <class Body>
void run_procs(int world, const Body& body) {
  chorus::test::ProcessOptions p;
  p.timeout = 240s;
  p.comm_timeout = 30s;
  chorus::test::run_processes(
      world, [&](int, chorus::Options o) { body(std::move(o)); }, p);
}

/// Every collective, each dtype, sum and max where there is an op, each count, roots other than
/// 0, in place and out of place. Small slices (64 bytes) for the small counts.
template <class Comm>
void collectives(int world) {
  run_procs(world, [world](chorus::Options o) {
    chorus::Options small_o = o;
    small_o.chunk_bytes = 64;
    Comm small = Comm::create(small_o);
    Comm large = Comm::create(o);
    const std::string where = where_text(Comm::transport_type::kName, world);
    Runner<Comm> rs{small, where}, rl{large, where};
    const std::vector<int> roots = world > 2 ? std::vector<int>{world - 1, world / 2} : std::vector<int>{1};
    for (std::size_t count : kCounts) {
      Runner<Comm>& run = count > 1000 ? rl : rs;
      for_each_dtype([&]<class T>(std::type_identity<T>) {
        for (bool in_place : {false, true}) {
          for (ReduceOp op : kOps) {
            run.template run<T>(Coll::all_reduce, count, op, -1, in_place);
            run.template run<T>(Coll::reduce_scatter, count, op, -1, in_place);
            for (int root : roots) run.template run<T>(Coll::reduce, count, op, root, in_place);
          }
          for (int root : roots) {
            run.template run<T>(Coll::broadcast, count, ReduceOp::sum, root, in_place);
            run.template run<T>(Coll::scatter, count, ReduceOp::sum, root, in_place);
            run.template run<T>(Coll::gather, count, ReduceOp::sum, root, in_place);
          }
          run.template run<T>(Coll::all_gather, count, ReduceOp::sum, -1, in_place);
          if (!in_place) run.template run<T>(Coll::all_to_all, count, ReduceOp::sum, -1, false);
        }
      });
    }
    small.barrier();
    large.barrier();
  });
}

/// Each algorithm forced: all_reduce (ring, tree, recursive_doubling: every op), broadcast
/// (binomial, chain) and reduce (binomial, ring: sum and max), each dtype and count, in and out of
/// place, the last rank as root. Each algorithm is forced (collective:algorithm pairs) on the
/// collectives that have it: forced on one that lacks it, it is an invalid_argument error (tested
/// in test_algorithms.cpp).
template <class Comm>
void algorithms(int world) {
  run_procs(world, [world](chorus::Options o) {
    for (const char* algo : {"ring", "tree", "recursive_doubling", "binomial", "chain", ""}) {
      const std::string name = *algo ? algo : "auto";
      chorus::Options ao = o;
      // Forced on the collectives that have it only: the others (the barrier below) keep the model's.
      const std::string n = algo;
      ao.algorithm = n == "ring"       ? "all_reduce:ring,reduce:ring"
                     : n == "binomial" ? "broadcast:binomial,reduce:binomial"
                     : n == "chain"    ? "broadcast:chain"
                     : n.empty()       ? ""
                                       : "all_reduce:" + n;
      ao.chunk_bytes = 1024;
      Comm comm = Comm::create(ao);
      Runner<Comm> run{comm, where_text(Comm::transport_type::kName, world, name)};
      const bool all_reduce =
          name == "ring" || name == "tree" || name == "recursive_doubling" || name == "auto";
      const bool broadcast = name == "binomial" || name == "chain" || name == "auto";
      const bool reduce = name == "binomial" || name == "ring" || name == "auto";
      for (std::size_t count : kCounts)
        for_each_dtype([&]<class T>(std::type_identity<T>) {
          for (bool in_place : {false, true}) {
            if (all_reduce)
              for (ReduceOp op : chorus::kAllReduceOps)
                run.template run<T>(Coll::all_reduce, count, op, -1, in_place);
            if (broadcast) run.template run<T>(Coll::broadcast, count, ReduceOp::sum, world - 1, in_place);
            if (reduce)
              for (ReduceOp op : kOps) run.template run<T>(Coll::reduce, count, op, world - 1, in_place);
          }
        });
      comm.barrier();
    }
  });
}

}  // namespace

TEST_CASE("tcp processes: every collective world 2") { collectives<TcpComm>(2); }
TEST_CASE("tcp processes: every collective world 3") { collectives<TcpComm>(3); }
TEST_CASE("tcp processes: every collective world 4") { collectives<TcpComm>(4); }
TEST_CASE("tcp processes: forced algorithms world 2") { algorithms<TcpComm>(2); }
TEST_CASE("tcp processes: forced algorithms world 3") { algorithms<TcpComm>(3); }
TEST_CASE("tcp processes: forced algorithms world 4") { algorithms<TcpComm>(4); }
// The shm slice: every collective at world 2 and 3, forced algorithms at world 3; and the
// default (auto) transport, which is shm here.
TEST_CASE("shm processes: every collective world 2") { collectives<ShmComm>(2); }
TEST_CASE("shm processes: every collective world 3") { collectives<ShmComm>(3); }
TEST_CASE("shm processes: forced algorithms world 3") { algorithms<ShmComm>(3); }
TEST_CASE("auto processes: every collective world 4") { collectives<AutoComm>(4); }

}  // namespace collective_test_tcp
