// SPDX-License-Identifier: BSD-3-Clause
// The hierarchical algorithms (algo/hierarchical.hpp) on host layouts made with Options::host_id
// over ranks as threads: 2 + 2, 3 + 2 + 1, 2 + 1, and hosts whose ranks interleave (r % 2). Every
// collective that has a hierarchical form, every dtype and every op that applies, counts 0, 1, 7,
// 1021 and 65537 (the small ones take the latency form, the largest the bandwidth form, checked
// through Communicator::planned), roots first, middle and last, in place and out of place,
// checked bit for bit against the exact references of support/fill.hpp (which every algorithm
// reaches, so the results also equal the flat algorithms'). Also: local_rank/local_size, the
// layout of a split, the model's choice across hosts, and forced algorithms that cannot run.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstddef>
#include <iterator>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "chorus/communicator.hpp"
#include "chorus/transport/inproc/transport.hpp"
#include "support/fill.hpp"
#include "support/sanitized.hpp"
#include "support/spawn.hpp"

namespace {

using namespace std::chrono_literals;
using chorus::DataType;
using chorus::ErrorCode;
using chorus::ReduceOp;
using chorus::algo::Algorithm;
using chorus::algo::CollectiveKind;
using chorus::test::check_equal;
using chorus::test::expected_all_reduce;
using chorus::test::input;
using chorus::test::pattern;
using chorus::test::seed_of;
using Comm = chorus::Communicator<chorus::inproc::Transport>;

struct Layout {
  const char* name;
  std::vector<int> host;  // host of each rank
};

const std::vector<Layout> kLayouts = {
    {"2+2", {0, 0, 1, 1}},
    {"3+2+1", {0, 0, 0, 1, 1, 2}},
    {"2+1", {0, 0, 1}},
    {"interleaved 3+3", {0, 1, 0, 1, 0, 1}},
};

constexpr std::size_t kCounts[] = {0, 1, 7, 1021, 65537};

/// Under a sanitizer the largest count runs for four of the twelve dtypes (support/sanitized.hpp).
template <class T>
bool runs_count(std::size_t count) {
  return count < kCounts[std::size(kCounts) - 1] || chorus::test::largest_counts_for(chorus::data_type_of<T>);
}

void expect(bool ok, const std::string& what) {
  if (!ok) throw chorus::test::Failure(what);
}

template <class F>
void expect_error(ErrorCode code, F&& f, const std::string& what, std::initializer_list<const char*> parts) {
  try {
    f();
  } catch (const chorus::Error& e) {
    expect(e.code() == code, what + ": wrong code: " + e.what());
    for (const char* p : parts)
      expect(std::string(e.what()).find(p) != std::string::npos, what + ": '" + p + "' missing in: " + e.what());
    return;
  }
  throw chorus::test::Failure(what + ": no error");
}

chorus::Options with_host(chorus::Options o, const Layout& l, int rank, const char* algorithm) {
  o.host_id = std::string(l.name) + "/" + std::to_string(l.host[static_cast<std::size_t>(rank)]);
  o.algorithm = algorithm;
  o.chunk_bytes = 4096;  // several slices per chunk at the largest count
  return o;
}

template <class T>
void reductions(Comm& comm, int rank, int n, const std::string& tag) {
  for (ReduceOp op : chorus::kAllReduceOps) {
    if (!chorus::is_valid_op(chorus::data_type_of<T>, op)) continue;
    for (std::size_t count : kCounts) {
      if (!runs_count<T>(count)) continue;
      const std::string what = tag + " " + std::string(chorus::to_string(chorus::data_type_of<T>)) + " " +
                               std::string(chorus::to_string(op)) + " count " + std::to_string(count);
      const auto seed = seed_of(1, count, static_cast<int>(op));
      auto want = [&](std::size_t i) { return expected_all_reduce<T>(seed, n, i, op); };
      // all_reduce, out of place and in place
      std::vector<T> in(count), out(count);
      for (std::size_t i = 0; i < count; ++i) in[i] = input<T>(seed, n, rank, i, op);
      comm.all_reduce(std::span<const T>(in), std::span<T>(out), op);
      check_equal<T>(out, want, "all_reduce " + what, rank);
      comm.all_reduce(std::span<T>(in), op);
      check_equal<T>(in, want, "all_reduce in place " + what, rank);
      // reduce to the first, a middle and the last rank
      for (int root : {0, n / 2, n - 1}) {
        std::vector<T> rin(count), rout(count, T{});
        for (std::size_t i = 0; i < count; ++i) rin[i] = input<T>(seed, n, rank, i, op);
        comm.reduce(std::span<const T>(rin), std::span<T>(rout), op, root);
        if (rank == root) check_equal<T>(rout, want, "reduce root " + std::to_string(root) + " " + what, rank);
      }
      // reduce_scatter: block r of every rank's input reduced (index r * count + i of the whole)
      std::vector<T> sin(count * static_cast<std::size_t>(n)), sout(count);
      for (std::size_t i = 0; i < sin.size(); ++i) sin[i] = input<T>(seed, n, rank, i, op);
      comm.reduce_scatter(std::span<const T>(sin), std::span<T>(sout), op);
      check_equal<T>(
          sout, [&](std::size_t i) { return expected_all_reduce<T>(seed, n, count * static_cast<std::size_t>(rank) + i, op); },
          "reduce_scatter " + what, rank);
    }
  }
}

template <class T>
void movements(Comm& comm, int rank, int n, const std::string& tag) {
  for (std::size_t count : kCounts) {
    if (!runs_count<T>(count)) continue;
    const std::string what = tag + " " + std::string(chorus::to_string(chorus::data_type_of<T>)) + " count " + std::to_string(count);
    const auto seed = seed_of(2, count);
    // all_gather
    std::vector<T> in(count), out(count * static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < count; ++i) in[i] = pattern<T>(seed, rank, i);
    comm.all_gather(std::span<const T>(in), std::span<T>(out));
    check_equal<T>(out, [&](std::size_t i) { return pattern<T>(seed, static_cast<int>(i / count), i % count); },
                   "all_gather " + what, rank);
    // broadcast from the first, a middle and the last rank
    for (int root : {0, n / 2, n - 1}) {
      std::vector<T> buf(count);
      for (std::size_t i = 0; i < count; ++i) buf[i] = pattern<T>(seed + 1, rank, i);
      comm.broadcast(std::span<T>(buf), root);
      check_equal<T>(buf, [&](std::size_t i) { return pattern<T>(seed + 1, root, i); },
                     "broadcast root " + std::to_string(root) + " " + what, rank);
    }
  }
}

}  // namespace

TEST_CASE("hierarchical collectives on several host layouts, every dtype and op, odd counts") {
  for (const Layout& l : kLayouts) {
    const int n = static_cast<int>(l.host.size());
    CAPTURE(l.name);
    chorus::test::ThreadOptions topt;
    topt.timeout = 60s;
    chorus::test::run_threads(
        n,
        [&](int rank, chorus::Options o) {
          Comm comm = Comm::create(with_host(std::move(o), l, rank, "hierarchical"));
          // The layout as the communicator sees it.
          int local = 0, size = 0, hosts = 0;
          for (int r = 0; r < n; ++r) {
            if (l.host[static_cast<std::size_t>(r)] == l.host[static_cast<std::size_t>(rank)]) {
              if (r < rank) ++local;
              ++size;
            }
            hosts = std::max(hosts, l.host[static_cast<std::size_t>(r)] + 1);
          }
          expect(comm.local_rank() == local && comm.local_size() == size && comm.host_count() == hosts,
                 std::string(l.name) + ": rank " + std::to_string(rank) + " local " + std::to_string(comm.local_rank()) + "/" +
                     std::to_string(comm.local_size()) + " hosts " + std::to_string(comm.host_count()));
          // Both forms run: the latency form for one element, the bandwidth form for the largest count.
          const auto small = comm.planned(CollectiveKind::all_reduce, 4), large = comm.planned(CollectiveKind::all_reduce, 4 * 65537);
          expect(small.algorithm == Algorithm::hierarchical && small.latency, "4 bytes: the latency form");
          expect(large.algorithm == Algorithm::hierarchical && !large.latency, "256 KiB: the bandwidth form");
          const std::string tag = std::string(l.name) + " rank " + std::to_string(rank);
          for (DataType dt : chorus::test::matrix_dtypes())  // six of the twelve under ASan, four under TSan
            chorus::dispatch(dt, [&]<class T>(std::type_identity<T>) {
              reductions<T>(comm, rank, n, tag);
              movements<T>(comm, rank, n, tag);
            });
          // A split of the layout keeps its hosts: the odd ranks, then the even ones.
          Comm sub = comm.split(rank % 2, rank);
          std::vector<int> members;
          for (int r = rank % 2; r < n; r += 2) members.push_back(r);
          int slocal = 0, ssize = 0;
          for (int r : members)
            if (l.host[static_cast<std::size_t>(r)] == l.host[static_cast<std::size_t>(rank)]) {
              if (r < rank) ++slocal;
              ++ssize;
            }
          expect(sub.local_rank() == slocal && sub.local_size() == ssize,
                 tag + ": split local " + std::to_string(sub.local_rank()) + "/" + std::to_string(sub.local_size()));
          std::vector<std::int32_t> v(1000, rank + 1);
          try {
            sub.all_reduce(std::span(v), ReduceOp::sum);  // hierarchical where the split has a hierarchy
          } catch (const chorus::Error& e) {
            expect(e.code() == ErrorCode::invalid_argument && std::string(e.what()).find("no hierarchy") != std::string::npos,
                   tag + ": split: " + e.what());
            return;
          }
          std::int32_t sum = 0;
          for (int r : members) sum += r + 1;
          for (auto x : v) expect(x == sum, tag + ": split all_reduce");
        },
        topt);
  }
}

TEST_CASE("the model picks hierarchical for large messages across hosts and flat on one host") {
  const Layout two{"2+2", {0, 0, 1, 1}}, one{"1 host", {0, 0, 0, 0}};
  // inproc is as fast between "hosts" as inside one: tell the model the hosts' links are 1 Gbit/s.
  ::setenv("CHORUS_NET_BANDWIDTH", "1gbit", 1);
  struct Unset {
    ~Unset() { ::unsetenv("CHORUS_NET_BANDWIDTH"); }
  } unset;
  chorus::test::run_threads(4, [&](int rank, chorus::Options o) {
    Comm across = Comm::create(with_host(o, two, rank, ""));
    const auto big = across.planned(CollectiveKind::all_reduce, 64 << 20);
    expect(big.algorithm == Algorithm::hierarchical && !big.latency, "64 MiB across 2 hosts: hierarchical");
    Comm alone = Comm::create(with_host(o, one, rank, ""));
    for (std::size_t b : {std::size_t(8), std::size_t(1) << 26})
      expect(alone.planned(CollectiveKind::all_reduce, b).algorithm != Algorithm::hierarchical, "one host: flat");
  });
}

TEST_CASE("a forced algorithm that a collective or layout cannot run is invalid_argument") {
  const Layout one{"1 host", {0, 0, 0}}, apart{"apart", {0, 1, 2}}, two{"2+1", {0, 0, 1}};
  chorus::test::run_threads(3, [&](int rank, chorus::Options o) {
    std::vector<float> v(10, 1.0f), out(30);
    {
      Comm c = Comm::create(with_host(o, one, rank, "all_reduce:hierarchical"));
      expect_error(ErrorCode::invalid_argument, [&] { c.all_reduce(std::span(v), ReduceOp::sum); }, "one host",
                   {"hierarchical", "1 host: 3 ranks", "no hierarchy"});
      c.barrier();  // the library's and the user's barrier: dissemination, whatever all_reduce is forced to
    }
    {
      Comm c = Comm::create(with_host(o, apart, rank, "all_reduce:hierarchical"));
      expect_error(ErrorCode::invalid_argument, [&] { c.all_reduce(std::span(v), ReduceOp::sum); }, "a rank per host",
                   {"3 hosts: 1 + 1 + 1 ranks", "no hierarchy"});
      c.broadcast(std::span(v), 0);  // not forced
    }
    {
      Comm c = Comm::create(with_host(o, two, rank, "hierarchical"));
      expect_error(ErrorCode::invalid_argument, [&] { c.gather(std::span<const float>(v), std::span(out), 0); }, "gather",
                   {"gather has no hierarchical algorithm", "direct"});
      expect_error(ErrorCode::invalid_argument, [&] { c.barrier(); }, "barrier", {"barrier has no hierarchical algorithm"});
      auto sub = c.split(0, rank);  // the library's own calls take no override
      c.all_reduce(std::span(v), ReduceOp::sum);
      expect(v[0] == 3.0f, "2+1 forced hierarchical all_reduce");
    }
    {
      Comm c = Comm::create(with_host(o, two, rank, "all_gather:tree"));
      expect_error(ErrorCode::invalid_argument, [&] { c.all_gather(std::span<const float>(v), std::span(out)); }, "all_gather tree",
                   {"all_gather has no tree algorithm", "ring, hierarchical"});
    }
    expect_error(ErrorCode::invalid_argument, [&] { (void)Comm::create(with_host(o, two, rank, "all_reduce:ring,bogus:ring")); },
                 "unknown collective", {"'bogus' is not a collective"});
  });
}

TEST_CASE("hierarchical bandwidth forms in pipelined segments (more segments than rails in flight)") {
  // 16 MiB and more: four segments of 4 MiB or more (algo/hierarchical.hpp, Pipeline), so rails
  // of several segments are in flight and their lanes are reused.
  for (const Layout& l : {kLayouts[0], kLayouts[1]}) {
    const int n = static_cast<int>(l.host.size());
    CAPTURE(l.name);
    chorus::test::run_threads(n, [&](int rank, chorus::Options o) {
      chorus::Options ho = with_host(std::move(o), l, rank, "hierarchical");
      ho.chunk_bytes = 0;  // the model's slices
      Comm comm = Comm::create(ho);
      const std::string tag = std::string(l.name) + " rank " + std::to_string(rank);
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::max}) {
        const std::size_t count = (std::size_t(1) << 22) + 3;  // floats: 16 MiB
        const auto seed = seed_of(3, static_cast<int>(op));
        std::vector<float> in(count), out(count);
        for (std::size_t i = 0; i < count; ++i) in[i] = input<float>(seed, n, rank, i, op);
        comm.all_reduce(std::span<const float>(in), std::span<float>(out), op);
        check_equal<float>(out, [&](std::size_t i) { return expected_all_reduce<float>(seed, n, i, op); }, "all_reduce " + tag, rank);
        const std::size_t block = count / static_cast<std::size_t>(n) + 1;
        std::vector<float> sin(block * static_cast<std::size_t>(n)), sout(block);
        for (std::size_t i = 0; i < sin.size(); ++i) sin[i] = input<float>(seed, n, rank, i, op);
        comm.reduce_scatter(std::span<const float>(sin), std::span<float>(sout), op);
        check_equal<float>(
            sout, [&](std::size_t i) { return expected_all_reduce<float>(seed, n, block * static_cast<std::size_t>(rank) + i, op); },
            "reduce_scatter " + tag, rank);
        std::vector<std::int32_t> gin(block), gout(block * static_cast<std::size_t>(n));
        for (std::size_t i = 0; i < block; ++i) gin[i] = pattern<std::int32_t>(seed, rank, i);
        comm.all_gather(std::span<const std::int32_t>(gin), std::span<std::int32_t>(gout));
        check_equal<std::int32_t>(
            gout, [&](std::size_t i) { return pattern<std::int32_t>(seed, static_cast<int>(i / block), i % block); },
            "all_gather " + tag, rank);
      }
    });
  }
}
