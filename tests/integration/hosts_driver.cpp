// SPDX-License-Identifier: BSD-3-Clause
// One rank of the namespace-host tests (tests/integration/run_hosts.sh starts one per rank, on
// hosts made by tests/integration/hosts.sh): a communicator over chorus::init() (the default
// transport: shm inside a host, tcp across), checked against the host layout, then one of:
//
//   check          every collective (all_reduce, reduce_scatter, all_gather, broadcast, reduce,
//                  gather, scatter, all_to_all, barrier) x every dtype x every op that applies,
//                  counts 0, 1, 7, 1021, roots 0 and the last rank, in place and out of place;
//                  and, so that the pipelined, sliced paths run, (1<<20)+3 elements of float32
//                  (sum) and int8 (max) through all_reduce, reduce and broadcast (out of place,
//                  root the last rank), and about as many in all through reduce_scatter and
//                  all_gather ((1<<20)+3 / world per rank, made odd). Inputs and references are those of tests/support/fill.hpp (exact in
//                  any order of evaluation), every result compared bit for bit.
//   loop <seconds> 16 MiB float32 all_reduces (exact small integers) until <seconds> have passed,
//                  on one communicator, with HOSTS_ALGO forced where set (the link-cut test).
//
// HOSTS_ALGO (optional; empty or "auto": none): an algorithm forced through a second
// communicator (Options::algorithm, not CHORUS_ALGO, so that a collective without it is never
// forced) for the collectives HOSTS_FORCED lists (default: all_reduce,reduce_scatter,all_gather,
// broadcast,reduce). Each of those runs on both communicators with the same inputs: both must
// match the reference and each other, bit for bit. The other communicator never forces anything
// (CHORUS_ALGO is ignored).
//
// Environment: RANK, WORLD_SIZE, MASTER_ADDR, as for chorus::init(). Arguments:
//   hosts_driver <port file> <layout, e.g. 3,2,1> check | loop <seconds>
// Rank 0 hosts the store on MASTER_ADDR port 0 and publishes the port in <port file>; the others
// read it there (support/port_store.hpp). The layout gives the ranks of each host in order
// (3,2,1: ranks 0-2 on host 0, 3-4 on host 1, 5 on host 2); local_rank()/local_size() and how
// each peer is reached (shm on the same host, tcp across) must agree with it.
//
// Output lines (parsed by run_hosts.sh):
//   HOSTS_READY rank=R local_rank=L local_size=S links=K,K,.. wall=<epoch s>
//   HOSTS_WRONG rank=R case=<collective dtype op count root variant communicator> index=I got=G
//               expected=E bad=<mismatches>/<elements>              one per failed check
//   HOSTS_FIRST rank=R wall=<epoch s>                                loop: first call done
//   HOSTS_ERROR rank=R code=<ErrorCode> peer=P t=<s> wall=<epoch s> case=<..> msg=<what()>
//   HOSTS_DONE rank=R cases=N wrong=W seconds=S large_counts=S       the end of a run
// Exit: 0 all right, 4 a wrong result or layout, 3 a chorus::Error, 5 anything else, 2 usage.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "chorus/chorus.hpp"
#include "support/port_store.hpp"
// support/fill.hpp comes with support/spawn.hpp, which includes doctest: this program has no
// doctest cases and no doctest main, and takes doctest's implementation from chorus_test_doctest
// (tests/CMakeLists.txt).
#include "support/fill.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using Comm = chorus::Communicator<chorus::DefaultTransport>;
using chorus::DataType;
using chorus::ReduceOp;
using chorus::test::expected_all_reduce;
using chorus::test::input;
using chorus::test::pattern;

const Clock::time_point kStart = Clock::now();
double since_start() { return std::chrono::duration<double>(Clock::now() - kStart).count(); }
double wall() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

constexpr std::size_t kSmallCounts[] = {0, 1, 7, 1021};
constexpr std::size_t kLargeCount = (std::size_t{1} << 20) + 3;
constexpr DataType kLargeTypes[] = {DataType::float32, DataType::int8};
constexpr ReduceOp kLargeOps[] = {ReduceOp::sum, ReduceOp::max};  // float32 sum, int8 max

std::string env(const char* name, const char* fallback = "") {
  const char* v = std::getenv(name);
  return v != nullptr ? v : fallback;
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

/// local_rank()/local_size() where the communicator has them (-1 until then).
template <class C>
std::pair<int, int> local_of(const C& c) {
  if constexpr (requires { c.local_rank(); c.local_size(); })
    return {c.local_rank(), c.local_size()};
  else
    return {-1, -1};
}

/// The collective being run (for an error's line).
std::string g_case = "setup";

/// Runs the cases and counts what went wrong.
class Checker {
 public:
  Checker(int rank, int world, Comm& auto_comm, Comm* forced, std::string algo, std::vector<std::string> forced_colls,
          std::shared_ptr<chorus::Store> store)
      : rank_(rank), world_(world), auto_(auto_comm), forced_(forced), algo_(std::move(algo)),
        forced_colls_(std::move(forced_colls)), store_(std::move(store)) {}

  int cases() const { return cases_; }
  int wrong() const { return wrong_; }
  /// Seconds the large counts took.
  double large_seconds() const { return large_seconds_; }

  void run_all() {
    for (std::size_t count : kSmallCounts)
      for (DataType dt : chorus::kAllDataTypes) dispatch_type(dt, count, nullptr);
    const double t = since_start();
    for (std::size_t k = 0; k < std::size(kLargeTypes); ++k) dispatch_type(kLargeTypes[k], kLargeCount, &kLargeOps[k]);
    large_seconds_ = since_start() - t;
    barriers();
  }

 private:
  /// Every collective for one (dtype, count); `only_op`: the one reduction to run (large counts).
  void dispatch_type(DataType dt, std::size_t count, const ReduceOp* only_op) {
    chorus::dispatch(dt, [&]<class T>(std::type_identity<T>) {
      std::vector<ReduceOp> ops;
      if (only_op != nullptr) {
        ops.push_back(*only_op);
      } else {
        ops.assign(chorus::kAllReduceOps.begin(), chorus::kAllReduceOps.end());
        for (ReduceOp op : chorus::kBitwiseReduceOps)
          if (chorus::is_valid_op(dt, op)) ops.push_back(op);
      }
      const int roots[] = {0, world_ - 1};
      if (only_op != nullptr) {
        // Large: out of place, the last rank as root, the collectives that slice and pipeline
        // their data; reduce_scatter and all_gather move about as much in all (count per rank).
        const std::size_t per_rank = (count / static_cast<std::size_t>(world_)) | 1;
        all_reduce<T>(count, *only_op, false);
        reduce<T>(count, *only_op, world_ - 1, false);
        broadcast<T>(count, world_ - 1);
        reduce_scatter<T>(per_rank, *only_op, false);
        all_gather<T>(per_rank, false);
        return;
      }
      for (bool in_place : {false, true}) {
        for (ReduceOp op : ops) {
          all_reduce<T>(count, op, in_place);
          reduce_scatter<T>(count, op, in_place);
          for (int root : roots) reduce<T>(count, op, root, in_place);
        }
        all_gather<T>(count, in_place);
        all_to_all<T>(count, in_place);
        for (int root : roots) {
          gather<T>(count, root, in_place);
          scatter<T>(count, root, in_place);
          if (!in_place) broadcast<T>(count, root);  // always in place: once per root
        }
      }
    });
  }

  /// Runs `call` (which makes its inputs from the seed, calls the collective on the communicator
  /// it is given and returns what this rank checks) on the automatic communicator, and on the
  /// forced one where `coll` is forced; checks each against expected(i), and the two against
  /// each other.
  template <class T, class Call, class Expected>
  void run_case(std::string_view coll, const std::string& what, Call&& call, Expected&& expected) {
    g_case = what + " auto";
    const std::vector<T> got = call(auto_);
    check<T>(got, expected, g_case);
    if (forced_ != nullptr && std::ranges::find(forced_colls_, coll) != forced_colls_.end()) {
      g_case = what + " " + algo_;
      const std::vector<T> got_forced = call(*forced_);
      check<T>(got_forced, expected, g_case);
      check<T>(got_forced, [&](std::size_t i) { return i < got.size() ? got[i] : T{}; }, g_case + " vs auto");
    }
  }

  template <class T, class Expected>
  void check(const std::vector<T>& got, Expected&& expected, const std::string& what) {
    ++cases_;
    std::size_t bad = 0, first = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      if (chorus::test::same_bits(got[i], expected(i))) continue;
      if (bad++ == 0) first = i;
    }
    if (bad == 0) return;
    ++wrong_;
    std::printf("HOSTS_WRONG rank=%d case=%s index=%zu got=%s expected=%s bad=%zu/%zu\n", rank_, what.c_str(), first,
                chorus::test::show(got[first]).c_str(), chorus::test::show(expected(first)).c_str(), bad, got.size());
    std::fflush(stdout);
  }

  template <class... I>
  std::uint64_t seed(I... parts) {
    return chorus::test::seed_of(call_++, parts...);
  }

  template <class T>
  std::string name(const char* coll, std::size_t count, std::optional<ReduceOp> op, int root, bool in_place) const {
    std::string s = std::string(coll) + " " + std::string(chorus::to_string(chorus::data_type_of<T>));
    if (op) s += " " + std::string(chorus::to_string(*op));
    s += " count=" + std::to_string(count);
    if (root >= 0) s += " root=" + std::to_string(root);
    return s + (in_place ? " in_place" : " out_of_place");
  }

  template <class T>
  std::vector<T> reduction_input(std::uint64_t s, std::size_t n, ReduceOp op) const {
    std::vector<T> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = input<T>(s, world_, rank_, i, op);
    return v;
  }
  template <class T>
  std::vector<T> pattern_of(std::uint64_t s, int r, std::size_t n) const {
    std::vector<T> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = pattern<T>(s, r, i);
    return v;
  }
  /// An output buffer that starts as garbage unique to the call, so that stale data shows.
  template <class T>
  std::vector<T> garbage(std::uint64_t s, std::size_t n) const {
    return pattern_of<T>(s ^ 0x6A4D, rank_, n);
  }

  template <class T>
  void all_reduce(std::size_t count, ReduceOp op, bool in_place) {
    const std::uint64_t s = seed(1, chorus::data_type_of<T>, op, count, in_place);
    run_case<T>(
        "all_reduce", name<T>("all_reduce", count, op, -1, in_place),
        [&](Comm& c) {
          std::vector<T> in = reduction_input<T>(s, count, op);
          if (in_place) {
            c.all_reduce(std::span<T>(in), op);
            return in;
          }
          std::vector<T> out = garbage<T>(s, count);
          c.all_reduce(std::span<const T>(in), std::span<T>(out), op);
          return out;
        },
        [&](std::size_t i) { return expected_all_reduce<T>(s, world_, i, op); });
  }

  template <class T>
  void reduce_scatter(std::size_t count, ReduceOp op, bool in_place) {
    const std::uint64_t s = seed(2, chorus::data_type_of<T>, op, count, in_place);
    const std::size_t base = static_cast<std::size_t>(rank_) * count;
    run_case<T>(
        "reduce_scatter", name<T>("reduce_scatter", count, op, -1, in_place),
        [&](Comm& c) {
          std::vector<T> in = reduction_input<T>(s, count * static_cast<std::size_t>(world_), op);
          if (in_place) {  // out is block rank of in
            std::span<T> mine = std::span<T>(in).subspan(base, count);
            c.reduce_scatter(std::span<const T>(in), mine, op);
            return std::vector<T>(mine.begin(), mine.end());
          }
          std::vector<T> out = garbage<T>(s, count);
          c.reduce_scatter(std::span<const T>(in), std::span<T>(out), op);
          return out;
        },
        [&](std::size_t i) { return expected_all_reduce<T>(s, world_, base + i, op); });
  }

  template <class T>
  void reduce(std::size_t count, ReduceOp op, int root, bool in_place) {
    const std::uint64_t s = seed(3, chorus::data_type_of<T>, op, count, root, in_place);
    const bool is_root = rank_ == root;
    run_case<T>(
        "reduce", name<T>("reduce", count, op, root, in_place),
        [&](Comm& c) {
          std::vector<T> in = reduction_input<T>(s, count, op);
          if (in_place) {  // in == out on every rank; non-roots' buffer stays as it was
            c.reduce(std::span<const T>(in), std::span<T>(in), op, root);
            return in;
          }
          std::vector<T> out = is_root ? garbage<T>(s, count) : std::vector<T>{};
          c.reduce(std::span<const T>(in), std::span<T>(out), op, root);
          return out;
        },
        [&](std::size_t i) {
          return is_root ? expected_all_reduce<T>(s, world_, i, op) : input<T>(s, world_, rank_, i, op);
        });
  }

  template <class T>
  void all_gather(std::size_t count, bool in_place) {
    const std::uint64_t s = seed(4, chorus::data_type_of<T>, count, in_place);
    run_case<T>(
        "all_gather", name<T>("all_gather", count, std::nullopt, -1, in_place),
        [&](Comm& c) {
          std::vector<T> in = pattern_of<T>(s, rank_, count);
          std::vector<T> out = garbage<T>(s, count * static_cast<std::size_t>(world_));
          if (in_place) {  // in is block rank of out
            std::span<T> mine = std::span<T>(out).subspan(static_cast<std::size_t>(rank_) * count, count);
            std::ranges::copy(in, mine.begin());
            c.all_gather(std::span<const T>(mine), std::span<T>(out));
          } else {
            c.all_gather(std::span<const T>(in), std::span<T>(out));
          }
          return out;
        },
        [&](std::size_t j) { return pattern<T>(s, static_cast<int>(j / count), j % count); });
  }

  template <class T>
  void all_to_all(std::size_t count, bool in_place) {
    const std::uint64_t s = seed(5, chorus::data_type_of<T>, count, in_place);
    run_case<T>(
        "all_to_all", name<T>("all_to_all", count, std::nullopt, -1, in_place),
        [&](Comm& c) {
          // Block p of rank q's in is pattern(s, q, p * count + i); it lands as block q of p's out.
          std::vector<T> in = pattern_of<T>(s, rank_, count * static_cast<std::size_t>(world_));
          if (in_place) {
            c.all_to_all(std::span<const T>(in), std::span<T>(in));
            return in;
          }
          std::vector<T> out = garbage<T>(s, in.size());
          c.all_to_all(std::span<const T>(in), std::span<T>(out));
          return out;
        },
        [&](std::size_t j) {
          return pattern<T>(s, static_cast<int>(j / count), static_cast<std::size_t>(rank_) * count + j % count);
        });
  }

  template <class T>
  void gather(std::size_t count, int root, bool in_place) {
    const std::uint64_t s = seed(6, chorus::data_type_of<T>, count, root, in_place);
    const bool is_root = rank_ == root;
    run_case<T>(
        "gather", name<T>("gather", count, std::nullopt, root, in_place),
        [&](Comm& c) {
          std::vector<T> in = pattern_of<T>(s, rank_, count);
          std::vector<T> out = is_root ? garbage<T>(s, count * static_cast<std::size_t>(world_)) : std::vector<T>{};
          if (in_place && is_root) {  // in is block root of out
            std::span<T> mine = std::span<T>(out).subspan(static_cast<std::size_t>(root) * count, count);
            std::ranges::copy(in, mine.begin());
            c.gather(std::span<const T>(mine), std::span<T>(out), root);
          } else {
            c.gather(std::span<const T>(in), std::span<T>(out), root);
          }
          return out;
        },
        [&](std::size_t j) { return pattern<T>(s, static_cast<int>(j / count), j % count); });
  }

  template <class T>
  void scatter(std::size_t count, int root, bool in_place) {
    const std::uint64_t s = seed(7, chorus::data_type_of<T>, count, root, in_place);
    const bool is_root = rank_ == root;
    const std::size_t total = count * static_cast<std::size_t>(world_);
    run_case<T>(
        "scatter", name<T>("scatter", count, std::nullopt, root, in_place),
        [&](Comm& c) {
          std::vector<T> in = is_root ? pattern_of<T>(s, root, total) : std::vector<T>{};
          if (in_place && is_root) {  // out is block root of in: the whole buffer stays as it was
            std::span<T> mine = std::span<T>(in).subspan(static_cast<std::size_t>(root) * count, count);
            c.scatter(std::span<const T>(in), mine, root);
            return in;
          }
          std::vector<T> out = garbage<T>(s, count);
          c.scatter(std::span<const T>(in), std::span<T>(out), root);
          return out;
        },
        [&](std::size_t i) {
          return pattern<T>(s, root, (in_place && is_root) ? i : static_cast<std::size_t>(rank_) * count + i);
        });
  }

  template <class T>
  void broadcast(std::size_t count, int root) {
    const std::uint64_t s = seed(8, chorus::data_type_of<T>, count, root);
    run_case<T>(
        "broadcast", name<T>("broadcast", count, std::nullopt, root, true),
        [&](Comm& c) {
          std::vector<T> buf = rank_ == root ? pattern_of<T>(s, root, count) : garbage<T>(s, count);
          c.broadcast(std::span<T>(buf), root);
          return buf;
        },
        [&](std::size_t i) { return pattern<T>(s, root, i); });
  }

  /// barrier: every rank counts itself in the store before it; after it, every rank must see
  /// all of them counted (on each communicator).
  void barriers() {
    std::vector<std::pair<Comm*, std::string>> comms{{&auto_, "auto"}};
    if (forced_ != nullptr && std::ranges::find(forced_colls_, "barrier") != forced_colls_.end())
      comms.emplace_back(forced_, algo_);
    for (auto& [c, label] : comms)
      for (int round = 0; round < 3; ++round) {
        const std::string key = "hosts_barrier/" + label + "/" + std::to_string(round);
        g_case = "barrier round=" + std::to_string(round) + " " + label;
        store_->add(key, 1);
        c->barrier();
        const std::int64_t seen = store_->add(key, 0);
        ++cases_;
        if (seen != world_) {
          ++wrong_;
          std::printf("HOSTS_WRONG rank=%d case=%s index=0 got=%lld expected=%d bad=1/1\n", rank_, g_case.c_str(),
                      static_cast<long long>(seen), world_);
          std::fflush(stdout);
        }
      }
    // Rank 0 serves the store and may leave after this: nobody reads the store past it.
    g_case = "final barrier";
    auto_.barrier();
  }

  int rank_, world_;
  Comm& auto_;
  Comm* forced_;
  std::string algo_;
  std::vector<std::string> forced_colls_;
  std::shared_ptr<chorus::Store> store_;
  std::uint64_t call_ = 0;
  int cases_ = 0, wrong_ = 0;
  double large_seconds_ = 0;
};

/// The loop of the link-cut test: 16 MiB float32 all_reduces of small integers (exact).
int loop(Comm& c, int rank, double seconds) {
  const int n = c.size();
  std::vector<float> v((std::size_t{16} << 20) / sizeof(float));
  std::uint64_t iter = 0;
  g_case = "all_reduce float32 sum 16MiB loop";
  while (since_start() < seconds) {
    std::fill(v.begin(), v.end(), static_cast<float>(rank + 1));
    c.all_reduce(std::span<float>(v), ReduceOp::sum);
    const float want = static_cast<float>(n * (n + 1) / 2);
    const auto bad = std::ranges::find_if(v, [&](float x) { return x != want; });
    if (bad != v.end()) {
      std::printf("HOSTS_WRONG rank=%d case=%s iter=%llu index=%td got=%g expected=%g bad=?/%zu\n", rank,
                  g_case.c_str(), static_cast<unsigned long long>(iter), bad - v.begin(), static_cast<double>(*bad),
                  static_cast<double>(want), v.size());
      return 4;
    }
    if (iter++ == 0) {
      std::printf("HOSTS_FIRST rank=%d wall=%.3f\n", rank, wall());
      std::fflush(stdout);
    }
  }
  std::printf("HOSTS_DONE rank=%d cases=%llu wrong=0 seconds=%.2f\n", rank, static_cast<unsigned long long>(iter),
              since_start());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const bool usage_ok = (argc == 4 && std::string_view(argv[3]) == "check") ||
                        (argc == 5 && std::string_view(argv[3]) == "loop");
  if (!usage_ok) {
    std::fprintf(stderr, "usage: %s <port file> <layout, e.g. 3,2,1> check | loop <seconds>\n", argv[0]);
    return 2;
  }
  const std::string port_file = argv[1];
  std::vector<int> layout;
  for (const std::string& part : split_commas(argv[2])) layout.push_back(std::atoi(part.c_str()));
  int rank = -1;
  try {
    rank = std::atoi(env("RANK", "-1").c_str());
    const std::string master = env("MASTER_ADDR");
    if (rank < 0 || master.empty())
      throw chorus::Error(chorus::ErrorCode::invalid_argument, "RANK and MASTER_ADDR must be set");
    chorus::Options o = chorus::Options::from_env();
    o.algorithm.clear();  // never forced through CHORUS_ALGO: HOSTS_ALGO, per collective
    auto store = chorus::test::open_port_file_store(rank, master, port_file, o.timeout);
    std::string algo = env("HOSTS_ALGO");
    if (algo == "auto") algo.clear();
    const std::vector<std::string> forced_colls =
        split_commas(env("HOSTS_FORCED", "all_reduce,reduce_scatter,all_gather,broadcast,reduce"));

    // check: `comm` never forces; `forced` (HOSTS_ALGO) runs the forced collectives again.
    // loop: one communicator, forced, since it runs all_reduce only.
    const bool loop_mode = std::string_view(argv[3]) == "loop";
    chorus::Options auto_o = o;
    auto_o.store = std::make_shared<chorus::PrefixStore>("auto/", store);
    if (loop_mode) auto_o.algorithm = algo;
    Comm comm = chorus::init(auto_o);
    std::optional<Comm> forced;
    if (!algo.empty() && !loop_mode) {
      chorus::Options forced_o = o;
      forced_o.algorithm = algo;
      forced_o.store = std::make_shared<chorus::PrefixStore>("forced/", store);
      forced.emplace(chorus::init(forced_o));
    }
    const int world = comm.size();

    // The layout: host of every rank; local rank and size of this one; how each peer is reached.
    int wrong = 0, sum = 0;
    std::vector<int> host_of;
    for (std::size_t h = 0; h < layout.size(); ++h)
      for (int i = 0; i < layout[h]; ++i) host_of.push_back(static_cast<int>(h)), ++sum;
    if (sum != world || std::ranges::any_of(layout, [](int n) { return n <= 0; }))
      throw chorus::Error(chorus::ErrorCode::invalid_argument,
                          std::string("layout ") + argv[2] + " does not add up to WORLD_SIZE " + std::to_string(world));
    const int host = host_of[static_cast<std::size_t>(rank)];
    const int want_local_rank = static_cast<int>(std::ranges::count(host_of.begin(), host_of.begin() + rank, host));
    const int want_local_size = layout[static_cast<std::size_t>(host)];
    const auto [local_rank, local_size] = local_of(comm);
    std::string links;
    for (int p = 0; p < world; ++p) {
      if (p > 0) links += ',';
      const std::string_view kind = p == rank ? std::string_view("self") : comm.transport().link_kind(p);
      links.append(kind);
      const std::string_view want = p == rank ? "self" : host_of[static_cast<std::size_t>(p)] == host ? "shm" : "tcp";
      if (kind != want) {
        std::printf("HOSTS_WRONG rank=%d case=layout index=%d got=%.*s expected=%.*s bad=1/1\n", rank, p,
                    static_cast<int>(kind.size()), kind.data(), static_cast<int>(want.size()), want.data());
        ++wrong;
      }
    }
    std::printf("HOSTS_READY rank=%d local_rank=%d local_size=%d links=%s wall=%.3f\n", rank, local_rank, local_size,
                links.c_str(), wall());
    if (local_rank < 0) {
      std::printf("HOSTS_NOTE rank=%d this chorus has no Communicator::local_rank()/local_size(): not checked\n", rank);
    } else if (local_rank != want_local_rank || local_size != want_local_size) {
      std::printf("HOSTS_WRONG rank=%d case=local_rank/local_size index=0 got=%d/%d expected=%d/%d bad=1/1\n", rank,
                  local_rank, local_size, want_local_rank, want_local_size);
      ++wrong;
    }
    std::fflush(stdout);

    if (loop_mode) {
      const int rc = loop(comm, rank, std::atof(argv[4]));
      return wrong > 0 ? 4 : rc;
    }
    Checker checker(rank, world, comm, forced ? &*forced : nullptr, algo, forced_colls, store);
    checker.run_all();
    wrong += checker.wrong();
    std::printf("HOSTS_DONE rank=%d cases=%d wrong=%d seconds=%.2f large_counts=%.2f\n", rank, checker.cases(), wrong,
                since_start(), checker.large_seconds());
    std::fflush(stdout);
    return wrong > 0 ? 4 : 0;
  } catch (const chorus::Error& e) {
    std::printf("HOSTS_ERROR rank=%d code=%s peer=%d t=%.3f wall=%.3f case=%s msg=%s\n", rank,
                std::string(chorus::to_string(e.code())).c_str(), e.peer(), since_start(), wall(), g_case.c_str(),
                e.what());
    std::fflush(stdout);
    return 3;
  } catch (const std::exception& e) {
    std::printf("HOSTS_ERROR rank=%d code=other peer=-1 t=%.3f wall=%.3f case=%s msg=%s\n", rank, since_start(),
                wall(), g_case.c_str(), e.what());
    std::fflush(stdout);
    return 5;
  }
}
