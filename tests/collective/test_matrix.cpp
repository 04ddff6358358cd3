// SPDX-License-Identifier: BSD-3-Clause
// The collective matrix over inproc (ranks as threads): every collective x algorithm (all_reduce:
// ring, tree, recursive_doubling; broadcast: binomial, chain; reduce: binomial, ring; and the
// model's choice for each) x the twelve element types x every op that
// applies x world sizes {1, 2, 3, 4, 5, 8} x counts {0, 1, 2, 3, 7, 13, 1000} (and 1<<16 for six
// (dtype, op) pairs, (1<<20)+17 for float32 sum and int8 max; the data-movement collectives
// use the dtypes),
// in place and out of place, typed, async and type-erased forms, every root for small worlds.
//
// One test case per (collective, world size): one communicator per rank (two: slices of 64 bytes
// for the small counts, so that slicing shows on small data, and larger ones for the large counts)
// loops over every combination; creating communicators is the slow part. Every rank checks its
// own output, bit for bit, against the reference of support/fill.hpp, which is the same for
// every rank: so results are also bitwise identical across ranks. Every call has its own seed, so
// a stale buffer from an earlier call is caught; outputs start as random garbage, and a guard
// past each output buffer catches writes beyond it.
#include <doctest/doctest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "chorus/communicator.hpp"
#include "chorus/transport/inproc/transport.hpp"
#include "support/communicators.hpp"
#include "support/fill.hpp"
#include "support/forced.hpp"
#include "support/sanitized.hpp"
#include "support/spawn.hpp"

// This file's own names: the files of tests/collective/ are compiled together (unity build).
namespace collective_test_matrix {

namespace {

using namespace std::chrono_literals;
using chorus::DataType;
using chorus::ReduceOp;
using chorus::test::check_equal;
using chorus::test::expected_all_reduce;
using chorus::test::input;
using chorus::test::pattern;
using chorus::test::seed_of;
using Comm = chorus::Communicator<chorus::inproc::Transport>;

using chorus::test::kSanitized;

constexpr std::size_t kSmallCounts[] = {0, 1, 2, 3, 7, 13, 1000};
/// Sanitizer builds run 3-10x slower: the large counts shrink there (still many slices each).
constexpr std::size_t kLargeCounts[] = {kSanitized ? std::size_t{1} << 15 : std::size_t{1} << 16,
                                        kSanitized ? (std::size_t{1} << 17) + 17 : (std::size_t{1} << 20) + 17};
/// Pipeline slices of the communicator for the small counts: tiny, so 13 floats are 4 slices.
constexpr std::size_t kSmallSlice = 64;
/// ... and for the large counts with a forced algorithm (not a power of two on purpose; the
/// "auto" communicator keeps the model's slices).
constexpr std::size_t kLargeSlice = 1000;

/// (dtype, op) pairs that also run the large counts: all of them at 1<<16, the first two at the
/// largest. (The data-movement collectives use the dtype only.)
struct LargeCombo {
  DataType dtype;
  ReduceOp op;
};
constexpr LargeCombo kLargeCombos[] = {
    {DataType::float32, ReduceOp::sum},  {DataType::int8, ReduceOp::max},
    {DataType::bfloat16, ReduceOp::avg}, {DataType::float16, ReduceOp::prod},
    {DataType::float64, ReduceOp::min},  {DataType::int64, ReduceOp::sum},
};
constexpr std::size_t kLargestCombos = 2;

/// The large (count, combo) pairs to run.
template <class F>
void for_each_large(F&& f) {
  for (std::size_t c = 0; c < std::size(kLargeCounts); ++c)
    for (std::size_t k = 0; k < std::size(kLargeCombos); ++k) {
      if (c + 1 == std::size(kLargeCounts) && k >= kLargestCombos) continue;
      chorus::dispatch(kLargeCombos[k].dtype,
                       [&]<class T>(std::type_identity<T>) { f(kLargeCounts[c], kLargeCombos[k].op, T{}); });
    }
}

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

std::string dtype_name(DataType d) { return std::string(chorus::to_string(d)); }

/// References that every rank needs whole (all_reduce, all_gather of large counts): computed once
/// by the first rank that asks, handed to the others, dropped when all `consumers` have it.
class RefCache {
 public:
  explicit RefCache(int consumers) : consumers_(consumers) {}

  template <class T, class Make>
  std::shared_ptr<const std::vector<T>> get(std::uint64_t key, Make&& make) {
    std::lock_guard lk(mu_);
    Entry& e = map_[key];
    if (!e.data) e.data = std::make_shared<const std::vector<T>>(make());
    auto p = std::static_pointer_cast<const std::vector<T>>(e.data);
    if (++e.users == consumers_) map_.erase(key);
    return p;
  }

 private:
  struct Entry {
    std::shared_ptr<const void> data;
    int users = 0;
  };
  std::mutex mu_;
  std::map<std::uint64_t, Entry> map_;
  int consumers_;
};

/// What one rank knows during a test case.
struct Ctx {
  int rank = 0;
  int world = 1;
  std::string where;  ///< "(world 4, ring)"
  RefCache* cache = nullptr;
  std::uint64_t call = 0;  ///< calls so far: the same sequence on every rank

  /// A seed unique to this call (the same on every rank).
  template <class... I>
  std::uint64_t next_seed(I... parts) {
    return seed_of(call++, world, parts...);
  }
};

/// An output buffer of n elements filled with garbage, followed by kGuard elements that must
/// stay as they are.
template <class T>
class Guarded {
 public:
  static constexpr std::size_t kGuard = 9;
  Guarded(std::size_t n, std::uint64_t seed, int rank)
      : n_(n), seed_(seed ^ 0x6A4D), rank_(rank), v_(n + kGuard) {
    for (std::size_t i = 0; i < v_.size(); ++i) v_[i] = pattern<T>(seed_, rank_, i);
  }
  std::span<T> span() { return {v_.data(), n_}; }
  std::span<const T> cspan() const { return {v_.data(), n_}; }
  T* data() { return v_.data(); }
  /// The garbage the buffer started with, at element i.
  T initial(std::size_t i) const { return pattern<T>(seed_, rank_, i); }
  void check_guard(const std::string& what) const {
    check_equal<T>(
        std::span<const T>(v_).subspan(n_), [&](std::size_t i) { return initial(i); },
        what + ": the guard after the buffer", rank_, n_);
  }
  void check_untouched(const std::string& what) const {
    check_equal<T>(
        std::span<const T>(v_), [&](std::size_t i) { return initial(i); }, what + ": untouched", rank_);
  }

 private:
  std::size_t n_;
  std::uint64_t seed_;
  int rank_;
  std::vector<T> v_;
};

template <class T>
std::vector<T> reduction_input(std::uint64_t seed, int world, int rank, std::size_t n, ReduceOp op) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = input<T>(seed, world, rank, i, op);
  return v;
}

template <class T>
std::vector<T> pattern_input(std::uint64_t seed, int rank, std::size_t n) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = pattern<T>(seed, rank, i);
  return v;
}

/// Checks that an input buffer still holds what it was filled with.
template <class T>
void check_reduction_input(std::span<const T> in, std::uint64_t seed, const Ctx& x, ReduceOp op,
                           const std::string& what) {
  check_equal<T>(
      in, [&](std::size_t i) { return input<T>(seed, x.world, x.rank, i, op); }, what + ": input changed",
      x.rank);
}
template <class T>
void check_pattern_input(std::span<const T> in, std::uint64_t seed, const Ctx& x, const std::string& what) {
  check_equal<T>(
      in, [&](std::size_t i) { return pattern<T>(seed, x.rank, i); }, what + ": input changed", x.rank);
}

/// Roots to try: every rank in small worlds, else two that move from call to call.
std::vector<int> roots_for(const Ctx& x, std::size_t salt) {
  std::vector<int> roots;
  if (x.world <= 4) {
    for (int r = 0; r < x.world; ++r) roots.push_back(r);
  } else {
    const int a = static_cast<int>((x.call + salt) % static_cast<std::uint64_t>(x.world));
    roots = {a, (a + x.world / 2 + 1) % x.world};
  }
  return roots;
}

std::string describe(const char* coll, DataType dt, const char* op, std::size_t count, const char* variant,
                     const Ctx& x, int root = -1) {
  std::string s = std::string(coll) + " " + dtype_name(dt);
  if (op != nullptr) s += std::string(" ") + op;
  s += " count " + std::to_string(count);
  if (root >= 0) s += " root " + std::to_string(root);
  return s + " " + variant + " " + x.where;
}

/// For a large count: the reference through the cache (one computation for all ranks).
constexpr std::size_t kCacheFrom = std::size_t{1} << 14;

// ---- all_reduce ----------------------------------------------------------------------------

/// Variants: 0 in place, 1 out of place, 2 out of place through the type-erased async form,
/// 3 in place through the typed async form.
template <class T>
void all_reduce_case(Comm& c, Ctx& x, std::size_t count, ReduceOp op, int variant) {
  constexpr DataType dt = chorus::data_type_of<T>;
  static const char* kVariant[] = {"in place", "out of place", "type-erased async", "in place async"};
  const std::uint64_t seed = x.next_seed(Coll::all_reduce, dt, op, count, variant);
  const std::string what =
      describe("all_reduce", dt, chorus::to_string(op).data(), count, kVariant[variant], x);
  std::vector<T> in = reduction_input<T>(seed, x.world, x.rank, count, op);
  Guarded<T> out(count, seed, x.rank);
  std::span<const T> result;
  if (variant == 0 || variant == 3) {
    // In place: the input buffer (with a guard of its own) is the output.
    in.resize(count + Guarded<T>::kGuard, chorus::test::from_bits<T>(0x5A5A5A5A5A5A5A5Aull));
    std::span<T> buf(in.data(), count);
    if (variant == 0)
      c.all_reduce(buf, op);
    else
      c.all_reduce_async(buf, op).wait();
    check_equal<T>(
        std::span<const T>(in).subspan(count),
        [](std::size_t) { return chorus::test::from_bits<T>(0x5A5A5A5A5A5A5A5Aull); },
        what + ": the guard after the buffer", x.rank, count);
    result = buf;
  } else {
    if (variant == 1)
      c.all_reduce(std::span<const T>(in), out.span(), op);
    else
      c.all_reduce_async(in.data(), out.data(), count, dt, op).wait();
    out.check_guard(what);
    check_reduction_input<T>(in, seed, x, op, what);
    result = out.cspan();
  }
  if (count >= kCacheFrom) {
    auto ref = x.cache->get<T>(seed, [&] {
      std::vector<T> v(count);
      for (std::size_t i = 0; i < count; ++i) v[i] = expected_all_reduce<T>(seed, x.world, i, op);
      return v;
    });
    check_equal<T>(result, std::span<const T>(*ref), what, x.rank);
  } else {
    check_equal<T>(
        result, [&](std::size_t i) { return expected_all_reduce<T>(seed, x.world, i, op); }, what, x.rank);
  }
}

void run_all_reduce(int world, const char* algorithm) {
  RefCache cache(world);
  chorus::test::ThreadOptions topt;
  topt.timeout = 30s;
  const std::string algo_name = *algorithm ? algorithm : "auto";
  chorus::test::run_threads(
      world,
      [&](int rank, chorus::Options o) {
        Ctx x{rank, world, "(world " + std::to_string(world) + ", " + algo_name + ")", &cache};
        chorus::Options small_o = o, large_o = o;
        small_o.algorithm = large_o.algorithm = chorus::test::forced_where_it_applies(algorithm);
        small_o.chunk_bytes = kSmallSlice;
        large_o.chunk_bytes = *algorithm ? kLargeSlice : 0;
        Comm small = Comm::create(small_o);
        Comm large = Comm::create(large_o);
        chorus::test::expect_eq(small.rank(), rank, "rank");
        chorus::test::expect_eq(small.size(), world, "size");
        for (std::size_t count : kSmallCounts)
          for (DataType dt : chorus::test::matrix_dtypes())  // six of the twelve under ASan, four under TSan
            chorus::dispatch(dt, [&]<class T>(std::type_identity<T>) {
              for (ReduceOp op : chorus::kAllReduceOps)
                for (int variant = 0; variant < 4; ++variant) {
                  all_reduce_case<T>(small, x, count, op, variant);
                }
            });
        for_each_large([&](std::size_t count, ReduceOp op, auto t) {
          for (int variant : {0, 2}) all_reduce_case<decltype(t)>(large, x, count, op, variant);
        });
      },
      topt);
}

// ---- broadcast -----------------------------------------------------------------------------

/// Variants: 0 typed, 1 typed async, 2 type-erased async.
template <class T>
void broadcast_case(Comm& c, Ctx& x, std::size_t count, int root, int variant) {
  constexpr DataType dt = chorus::data_type_of<T>;
  static const char* kVariant[] = {"typed", "typed async", "type-erased async"};
  const std::uint64_t seed = x.next_seed(Coll::broadcast, dt, count, root, variant);
  const std::string what = describe("broadcast", dt, nullptr, count, kVariant[variant], x, root);
  Guarded<T> buf(count, seed, x.rank);
  if (x.rank == root)
    for (std::size_t i = 0; i < count; ++i) buf.span()[i] = pattern<T>(seed, root, i);
  if (variant == 0)
    c.broadcast(buf.span(), root);
  else if (variant == 1)
    c.broadcast_async(buf.span(), root).wait();
  else
    c.broadcast_async(buf.data(), count, dt, root).wait();
  buf.check_guard(what);
  check_equal<T>(
      buf.cspan(), [&](std::size_t i) { return pattern<T>(seed, root, i); }, what, x.rank);
}

// ---- reduce --------------------------------------------------------------------------------

/// Variants: 0 out of place (out empty on non-roots), 1 out of place with a full-size out on
/// non-roots (must stay untouched), 2 in place (in == out on every rank), 3 type-erased async.
template <class T>
void reduce_case(Comm& c, Ctx& x, std::size_t count, ReduceOp op, int root, int variant) {
  constexpr DataType dt = chorus::data_type_of<T>;
  static const char* kVariant[] = {"out of place", "out of place, full out on non-roots", "in place",
                                   "type-erased async"};
  const std::uint64_t seed = x.next_seed(Coll::reduce, dt, op, count, root, variant);
  const std::string what =
      describe("reduce", dt, chorus::to_string(op).data(), count, kVariant[variant], x, root);
  const bool is_root = x.rank == root;
  auto expected = [&](std::size_t i) { return expected_all_reduce<T>(seed, x.world, i, op); };
  if (variant == 2) {
    Guarded<T> buf(count, seed, x.rank);
    for (std::size_t i = 0; i < count; ++i) buf.span()[i] = input<T>(seed, x.world, x.rank, i, op);
    c.reduce(buf.cspan(), buf.span(), op, root);
    buf.check_guard(what);
    if (is_root)
      check_equal<T>(buf.cspan(), expected, what, x.rank);
    else
      check_reduction_input<T>(buf.cspan(), seed, x, op, what);
    return;
  }
  const std::vector<T> in = reduction_input<T>(seed, x.world, x.rank, count, op);
  const std::size_t out_n = (is_root || variant == 1) ? count : 0;
  Guarded<T> out(out_n, seed, x.rank);
  if (variant == 3)
    c.reduce_async(in.data(), out.data(), count, dt, op, root).wait();
  else
    c.reduce(std::span<const T>(in), out.span(), op, root);
  check_reduction_input<T>(in, seed, x, op, what);
  if (is_root) {
    out.check_guard(what);
    check_equal<T>(out.cspan(), expected, what, x.rank);
  } else {
    out.check_untouched(what + " (non-root out)");
  }
}

// ---- scatter -------------------------------------------------------------------------------

/// Variants: 0 typed (in empty on non-roots), 1 in place on the root (out is block root of in),
/// 2 type-erased async.
template <class T>
void scatter_case(Comm& c, Ctx& x, std::size_t count, int root, int variant) {
  constexpr DataType dt = chorus::data_type_of<T>;
  static const char* kVariant[] = {"typed", "in place on the root", "type-erased async"};
  const std::uint64_t seed = x.next_seed(Coll::scatter, dt, count, root, variant);
  const std::string what = describe("scatter", dt, nullptr, count, kVariant[variant], x, root);
  const bool is_root = x.rank == root;
  const std::size_t total = count * static_cast<std::size_t>(x.world);
  const std::vector<T> in = is_root ? pattern_input<T>(seed, root, total) : std::vector<T>{};
  auto expected = [&](std::size_t i) { return pattern<T>(seed, root, x.rank * count + i); };
  if (variant == 1 && is_root) {
    std::vector<T> buf = in;
    std::span<T> mine = std::span<T>(buf).subspan(root * count, count);
    c.scatter(std::span<const T>(buf), mine, root);
    check_equal<T>(
        std::span<const T>(buf), [&](std::size_t i) { return pattern<T>(seed, root, i); }, what, x.rank);
    return;
  }
  Guarded<T> out(count, seed, x.rank);
  if (variant == 2)
    c.scatter_async(in.data(), out.data(), count, dt, root).wait();
  else
    c.scatter(std::span<const T>(in), out.span(), root);
  out.check_guard(what);
  if (is_root) check_pattern_input<T>(in, seed, x, what);
  check_equal<T>(out.cspan(), expected, what, x.rank);
}

// ---- gather --------------------------------------------------------------------------------

/// Variants: 0 typed (out empty on non-roots), 1 in place on the root (in is block root of out),
/// 2 type-erased async.
template <class T>
void gather_case(Comm& c, Ctx& x, std::size_t count, int root, int variant) {
  constexpr DataType dt = chorus::data_type_of<T>;
  static const char* kVariant[] = {"typed", "in place on the root", "type-erased async"};
  const std::uint64_t seed = x.next_seed(Coll::gather, dt, count, root, variant);
  const std::string what = describe("gather", dt, nullptr, count, kVariant[variant], x, root);
  const bool is_root = x.rank == root;
  const std::size_t total = count * static_cast<std::size_t>(x.world);
  auto expected = [&](std::size_t j) { return pattern<T>(seed, static_cast<int>(j / count), j % count); };
  const std::vector<T> in = pattern_input<T>(seed, x.rank, count);
  Guarded<T> out(is_root ? total : 0, seed, x.rank);
  if (variant == 1 && is_root) {
    std::span<T> mine = out.span().subspan(root * count, count);
    for (std::size_t i = 0; i < count; ++i) mine[i] = in[i];
    c.gather(std::span<const T>(mine), out.span(), root);
  } else if (variant == 2) {
    c.gather_async(in.data(), out.data(), count, dt, root).wait();
  } else {
    c.gather(std::span<const T>(in), out.span(), root);
  }
  check_pattern_input<T>(in, seed, x, what);
  out.check_guard(what);
  if (is_root) check_equal<T>(out.cspan(), expected, what, x.rank);
}

// ---- all_gather ----------------------------------------------------------------------------

/// Variants: 0 out of place, 1 in place (in is block rank of out), 2 type-erased async.
template <class T>
void all_gather_case(Comm& c, Ctx& x, std::size_t count, int variant) {
  constexpr DataType dt = chorus::data_type_of<T>;
  static const char* kVariant[] = {"out of place", "in place", "type-erased async"};
  const std::uint64_t seed = x.next_seed(Coll::all_gather, dt, count, variant);
  const std::string what = describe("all_gather", dt, nullptr, count, kVariant[variant], x);
  const std::size_t total = count * static_cast<std::size_t>(x.world);
  auto expected = [&](std::size_t j) { return pattern<T>(seed, static_cast<int>(j / count), j % count); };
  const std::vector<T> in = pattern_input<T>(seed, x.rank, count);
  Guarded<T> out(total, seed, x.rank);
  if (variant == 1) {
    std::span<T> mine = out.span().subspan(x.rank * count, count);
    for (std::size_t i = 0; i < count; ++i) mine[i] = in[i];
    c.all_gather(std::span<const T>(mine), out.span());
  } else if (variant == 2) {
    c.all_gather_async(in.data(), out.data(), count, dt).wait();
  } else {
    c.all_gather(std::span<const T>(in), out.span());
  }
  check_pattern_input<T>(in, seed, x, what);
  out.check_guard(what);
  if (total >= kCacheFrom) {
    auto ref = x.cache->get<T>(seed, [&] {
      std::vector<T> v(total);
      for (std::size_t j = 0; j < total; ++j) v[j] = expected(j);
      return v;
    });
    check_equal<T>(out.cspan(), std::span<const T>(*ref), what, x.rank);
  } else {
    check_equal<T>(out.cspan(), expected, what, x.rank);
  }
}

// ---- reduce_scatter ------------------------------------------------------------------------

/// Variants: 0 out of place, 1 in place (out is block rank of in), 2 type-erased async.
template <class T>
void reduce_scatter_case(Comm& c, Ctx& x, std::size_t count, ReduceOp op, int variant) {
  constexpr DataType dt = chorus::data_type_of<T>;
  static const char* kVariant[] = {"out of place", "in place", "type-erased async"};
  const std::uint64_t seed = x.next_seed(Coll::reduce_scatter, dt, op, count, variant);
  const std::string what =
      describe("reduce_scatter", dt, chorus::to_string(op).data(), count, kVariant[variant], x);
  const std::size_t total = count * static_cast<std::size_t>(x.world);
  const std::size_t base = x.rank * count;
  auto expected = [&](std::size_t i) { return expected_all_reduce<T>(seed, x.world, base + i, op); };
  if (variant == 1) {
    std::vector<T> in = reduction_input<T>(seed, x.world, x.rank, total, op);
    std::span<T> mine = std::span<T>(in).subspan(base, count);
    c.reduce_scatter(std::span<const T>(in), mine, op);
    check_equal<T>(
        std::span<const T>(mine), [&](std::size_t i) { return expected(i - base); }, what, x.rank, base);
    return;
  }
  const std::vector<T> in = reduction_input<T>(seed, x.world, x.rank, total, op);
  Guarded<T> out(count, seed, x.rank);
  if (variant == 2)
    c.reduce_scatter_async(in.data(), out.data(), count, dt, op).wait();
  else
    c.reduce_scatter(std::span<const T>(in), out.span(), op);
  check_reduction_input<T>(in, seed, x, op, what);
  out.check_guard(what);
  check_equal<T>(out.cspan(), expected, what, x.rank);
}

// ---- all_to_all ----------------------------------------------------------------------------

/// Variants: 0 typed, 1 typed async, 2 type-erased async, 3 in place (in and out one buffer).
template <class T>
void all_to_all_case(Comm& c, Ctx& x, std::size_t count, int variant) {
  constexpr DataType dt = chorus::data_type_of<T>;
  static const char* kVariant[] = {"typed", "typed async", "type-erased async", "in place"};
  const std::uint64_t seed = x.next_seed(Coll::all_to_all, dt, count, variant);
  const std::string what = describe("all_to_all", dt, nullptr, count, kVariant[variant], x);
  const std::size_t total = count * static_cast<std::size_t>(x.world);
  // Block p of rank q's in is pattern(seed, q, p * count + i); it lands as block q of rank p's out.
  auto expected = [&](std::size_t j) {
    return pattern<T>(seed, static_cast<int>(j / count), x.rank * count + j % count);
  };
  const std::vector<T> in = pattern_input<T>(seed, x.rank, total);
  Guarded<T> out(total, seed, x.rank);
  if (variant == 0) {
    c.all_to_all(std::span<const T>(in), out.span());
  } else if (variant == 1) {
    c.all_to_all_async(std::span<const T>(in), out.span()).wait();
  } else if (variant == 2) {
    c.all_to_all_async(in.data(), out.data(), count, dt).wait();
  } else {
    std::copy(in.begin(), in.end(), out.span().begin());
    c.all_to_all(std::span<const T>(out.span()), out.span());
  }
  check_pattern_input<T>(in, seed, x, what);
  out.check_guard(what);
  check_equal<T>(out.cspan(), expected, what, x.rank);
}

// ---- the driver for everything but all_reduce ----------------------------------------------

/// Block size for the collectives whose buffers grow with the world (scatter, gather, all_gather,
/// reduce_scatter, all_to_all) at a large count: about count elements in all, odd-sized blocks.
std::size_t large_block(std::size_t count, int world) { return count / static_cast<std::size_t>(world) + 1; }

/// Runs small_case for every small count and dtype, large_case for the large ones, with
/// `algorithm` forced ("" for the model's choice).
template <class Small, class Large>
void run_matrix(int world, const char* algorithm, Small&& small_case, Large&& large_case) {
  RefCache cache(world);
  chorus::test::ThreadOptions topt;
  topt.timeout = 30s;
  const std::string where =
      "(world " + std::to_string(world) + (*algorithm ? std::string(", ") + algorithm : std::string()) + ")";
  chorus::test::run_threads(
      world,
      [&](int rank, chorus::Options o) {
        Ctx x{rank, world, where, &cache};
        chorus::Options small_o = o, large_o = o;
        small_o.algorithm = large_o.algorithm = chorus::test::forced_where_it_applies(algorithm);
        small_o.chunk_bytes = kSmallSlice;
        large_o.chunk_bytes = *algorithm ? kLargeSlice : 0;
        Comm small = Comm::create(small_o);
        Comm large = Comm::create(large_o);
        for (std::size_t count : kSmallCounts)
          for (DataType dt : chorus::test::matrix_dtypes())  // six of the twelve under ASan, four under TSan
            chorus::dispatch(dt, [&]<class T>(std::type_identity<T>) { small_case(small, x, count, T{}); });
        for_each_large([&](std::size_t count, ReduceOp op, auto t) { large_case(large, x, count, op, t); });
      },
      topt);
}

void run_broadcast(int world, const char* algorithm) {
  run_matrix(
      world, algorithm,
      [](Comm& c, Ctx& x, std::size_t count, auto t) {
        using T = decltype(t);
        for (int root : roots_for(x, count))
          for (int variant = 0; variant < 3; ++variant) broadcast_case<T>(c, x, count, root, variant);
      },
      [](Comm& c, Ctx& x, std::size_t count, ReduceOp, auto t) {
        using T = decltype(t);
        broadcast_case<T>(c, x, count, static_cast<int>(count % static_cast<std::size_t>(x.world)), 0);
        broadcast_case<T>(c, x, count, x.world - 1, 2);
      });
}

void run_reduce(int world, const char* algorithm) {
  run_matrix(
      world, algorithm,
      [](Comm& c, Ctx& x, std::size_t count, auto t) {
        using T = decltype(t);
        for (ReduceOp op : chorus::kAllReduceOps)
          for (int root : roots_for(x, count + static_cast<std::size_t>(op)))
            for (int variant = 0; variant < 4; ++variant) {
              reduce_case<T>(c, x, count, op, root, variant);
            }
      },
      [](Comm& c, Ctx& x, std::size_t count, ReduceOp op, auto t) {
        using T = decltype(t);
        reduce_case<T>(c, x, count, op, x.world - 1, 0);
        reduce_case<T>(c, x, count, op, static_cast<int>(count % static_cast<std::size_t>(x.world)), 2);
      });
}

void run_scatter(int world) {
  run_matrix(
      world, "",
      [](Comm& c, Ctx& x, std::size_t count, auto t) {
        using T = decltype(t);
        for (int root : roots_for(x, count))
          for (int variant = 0; variant < 3; ++variant) scatter_case<T>(c, x, count, root, variant);
      },
      [](Comm& c, Ctx& x, std::size_t count, ReduceOp, auto t) {
        using T = decltype(t);
        const std::size_t block = large_block(count, x.world);
        scatter_case<T>(c, x, block, x.world - 1, 0);
        scatter_case<T>(c, x, block, static_cast<int>(count % static_cast<std::size_t>(x.world)), 1);
      });
}

void run_gather(int world) {
  run_matrix(
      world, "",
      [](Comm& c, Ctx& x, std::size_t count, auto t) {
        using T = decltype(t);
        for (int root : roots_for(x, count))
          for (int variant = 0; variant < 3; ++variant) gather_case<T>(c, x, count, root, variant);
      },
      [](Comm& c, Ctx& x, std::size_t count, ReduceOp, auto t) {
        using T = decltype(t);
        const std::size_t block = large_block(count, x.world);
        gather_case<T>(c, x, block, x.world - 1, 0);
        gather_case<T>(c, x, block, static_cast<int>(count % static_cast<std::size_t>(x.world)), 1);
      });
}

void run_all_gather(int world) {
  run_matrix(
      world, "",
      [](Comm& c, Ctx& x, std::size_t count, auto t) {
        using T = decltype(t);
        for (int variant = 0; variant < 3; ++variant) all_gather_case<T>(c, x, count, variant);
      },
      [](Comm& c, Ctx& x, std::size_t count, ReduceOp, auto t) {
        using T = decltype(t);
        const std::size_t block = large_block(count, x.world);
        all_gather_case<T>(c, x, block, 0);
        all_gather_case<T>(c, x, block, 1);
      });
}

void run_reduce_scatter(int world) {
  run_matrix(
      world, "",
      [](Comm& c, Ctx& x, std::size_t count, auto t) {
        using T = decltype(t);
        for (ReduceOp op : chorus::kAllReduceOps)
          for (int variant = 0; variant < 3; ++variant) {
            reduce_scatter_case<T>(c, x, count, op, variant);
          }
      },
      [](Comm& c, Ctx& x, std::size_t count, ReduceOp op, auto t) {
        using T = decltype(t);
        const std::size_t block = large_block(count, x.world);
        reduce_scatter_case<T>(c, x, block, op, 0);
        reduce_scatter_case<T>(c, x, block, op, 1);
      });
}

void run_all_to_all(int world) {
  run_matrix(
      world, "",
      [](Comm& c, Ctx& x, std::size_t count, auto t) {
        using T = decltype(t);
        for (int variant = 0; variant < 4; ++variant) all_to_all_case<T>(c, x, count, variant);
      },
      [](Comm& c, Ctx& x, std::size_t count, ReduceOp, auto t) {
        using T = decltype(t);
        all_to_all_case<T>(c, x, large_block(count, x.world), 0);
      });
}

/// Barrier: nobody leaves round k before everybody has arrived at it.
void run_barrier(int world) {
  constexpr int kRounds = 50;
  std::vector<std::atomic<int>> arrived(kRounds);
  chorus::test::ThreadOptions topt;
  topt.timeout = 30s;
  chorus::test::run_threads(
      world,
      [&](int rank, chorus::Options o) {
        Comm c = Comm::create(std::move(o));
        for (int k = 0; k < kRounds; ++k) {
          arrived[k].fetch_add(1);
          if (k % 2 == 0)
            c.barrier();
          else
            c.barrier_async().wait();
          chorus::test::expect_eq(arrived[k].load(), world,
                                  "ranks arrived at barrier round " + std::to_string(k) + " when rank " +
                                      std::to_string(rank) + " left it");
        }
      },
      topt);
}

}  // namespace

// One test case per (collective, world size), so that ctest spreads them over the cores.
#define CHORUS_MATRIX_CASES(W)                                                                              \
  TEST_CASE("matrix: all_reduce ring world " #W) { run_all_reduce(W, "ring"); }                             \
  TEST_CASE("matrix: all_reduce tree world " #W) { run_all_reduce(W, "tree"); }                             \
  TEST_CASE("matrix: all_reduce recursive_doubling world " #W) { run_all_reduce(W, "recursive_doubling"); } \
  TEST_CASE("matrix: all_reduce auto world " #W) { run_all_reduce(W, ""); }                                 \
  TEST_CASE("matrix: broadcast binomial world " #W) { run_broadcast(W, "binomial"); }                       \
  TEST_CASE("matrix: broadcast chain world " #W) { run_broadcast(W, "chain"); }                             \
  TEST_CASE("matrix: broadcast auto world " #W) { run_broadcast(W, ""); }                                   \
  TEST_CASE("matrix: reduce binomial world " #W) { run_reduce(W, "binomial"); }                             \
  TEST_CASE("matrix: reduce ring world " #W) { run_reduce(W, "ring"); }                                     \
  TEST_CASE("matrix: reduce auto world " #W) { run_reduce(W, ""); }                                         \
  TEST_CASE("matrix: scatter world " #W) { run_scatter(W); }                                                \
  TEST_CASE("matrix: gather world " #W) { run_gather(W); }                                                  \
  TEST_CASE("matrix: all_gather world " #W) { run_all_gather(W); }                                          \
  TEST_CASE("matrix: reduce_scatter world " #W) { run_reduce_scatter(W); }                                  \
  TEST_CASE("matrix: all_to_all world " #W) { run_all_to_all(W); }                                          \
  TEST_CASE("matrix: barrier world " #W) { run_barrier(W); }

CHORUS_MATRIX_CASES(1)
CHORUS_MATRIX_CASES(2)
CHORUS_MATRIX_CASES(3)
CHORUS_MATRIX_CASES(4)
CHORUS_MATRIX_CASES(5)
CHORUS_MATRIX_CASES(8)

}  // namespace collective_test_matrix
