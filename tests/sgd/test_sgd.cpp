// SPDX-License-Identifier: BSD-3-Clause
// The data-parallel SGD helpers (include/chorus/sgd/):
//   - DistributedSampler: torch's sizes and padding, disjoint shards that cover the dataset, the
//     same permutation on every rank, a new one per epoch, a pinned order (platform-independent);
//   - GradientSynchronizer's buckets: reverse registration order, bounded by bucket_bytes, started
//     in bucket order whatever order the tensors are marked in (a recording communicator);
//     CHORUS_BUCKET_BYTES; misuse errors;
//   - bucketing equals average_gradients (inproc, ranks as threads): random models with many
//     tensors of uneven sizes, per-rank random marking orders, float32 and float16 gradients
//     bitwise, float16/bfloat16 wire compression within its rounding bound, no_sync accumulation;
//   - equivalence: P ranks with batch B give, after k steps, the weights of one process with batch
//     P*B (the example's MLP, SGD with momentum), P in {1, 2, 3, 4}; replicas bitwise identical
//     after every step; the same over tcp with ranks as processes and bfloat16 compression;
//   - the example's Fashion-MNIST reader: malformed, truncated and missing files are clear errors.
// The 1-epoch accuracy run is the example itself (examples/CMakeLists.txt, Release only).
#include "chorus/sgd/sgd.hpp"

#include <doctest/doctest.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <random>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "../../examples/02_train_fashion_mnist/fashion_mnist.hpp"
#include "../../examples/02_train_fashion_mnist/mlp.hpp"
#include "support/communicators.hpp"  // Communicator<inproc>, <tcp>: instantiated once, in the test main
#include "support/spawn.hpp"

// This file's own names: the files of tests/sgd/ are compiled together (unity build).
namespace sgd_test_sgd {

namespace {

using chorus::DataType;
using chorus::ReduceOp;
using chorus::sgd::Compression;
using chorus::sgd::DistributedSampler;
using chorus::sgd::GradientSynchronizer;
using chorus::sgd::SyncOptions;
using chorus::test::expect;
using chorus::test::expect_eq;
using Inproc = chorus::Communicator<chorus::inproc::Transport>;
using Tcp = chorus::Communicator<chorus::tcp::Transport>;

// ---- DistributedSampler ---------------------------------------------------------------------

/// The padded epoch list rebuilt from every rank's indices (position r + k*W from rank r).
std::vector<std::size_t> gather_ranks(std::size_t n, int world, bool shuffle, std::uint64_t seed, bool drop_last,
                                      std::uint64_t epoch) {
  std::vector<std::size_t> all;
  for (int r = 0; r < world; ++r) {
    DistributedSampler s(n, r, world, shuffle, seed, drop_last);
    s.set_epoch(epoch);
    const auto idx = s.indices();
    REQUIRE(idx.size() == s.size());
    if (all.empty()) all.assign(s.total_size(), SIZE_MAX);
    for (std::size_t k = 0; k < idx.size(); ++k) all[std::size_t(r) + k * std::size_t(world)] = idx[k];
  }
  return all;
}

TEST_CASE("sampler: torch's sizes and padding; shards disjoint, covering, one permutation on every rank") {
  for (std::size_t n : {0, 1, 3, 7, 10, 64, 1001}) {
    for (int world : {1, 2, 3, 4, 7}) {
      for (bool drop_last : {false, true}) {
        for (bool shuffle : {false, true}) {
          CAPTURE(n);
          CAPTURE(world);
          CAPTURE(drop_last);
          CAPTURE(shuffle);
          const auto w = std::size_t(world);
          DistributedSampler s(n, 0, world, shuffle, 5, drop_last);
          // torch: ceil(N / W) per rank, or with drop_last ceil((N - W) / W) = floor(N / W).
          const std::size_t per = drop_last ? n / w : (n + w - 1) / w;
          CHECK(s.size() == per);
          CHECK(s.total_size() == per * w);
          const auto all = gather_ranks(n, world, shuffle, 5, drop_last, 3);
          REQUIRE(all.size() == per * w);
          // The first min(N, total) positions are distinct indices of the dataset: the shards are
          // disjoint, and without drop_last they cover it; the rest repeats the list's beginning.
          const std::size_t distinct = std::min(n, all.size());
          std::set<std::size_t> seen(all.begin(), all.begin() + std::ptrdiff_t(distinct));
          CHECK(seen.size() == distinct);
          CHECK((seen.empty() || *seen.rbegin() < n));
          if (!drop_last) CHECK(seen.size() == n);
          for (std::size_t p = n; p < all.size(); ++p) CHECK(all[p] == all[p % n]);
          if (!shuffle)
            for (std::size_t p = 0; p < distinct; ++p) CHECK(all[p] == p);
        }
      }
    }
  }
}

TEST_CASE("sampler: a new order per epoch, the same for the same (seed, epoch), pinned") {
  const auto e0 = gather_ranks(1000, 4, true, 7, false, 0);
  const auto e1 = gather_ranks(1000, 4, true, 7, false, 1);
  CHECK(e0 != e1);
  CHECK(e0 == gather_ranks(1000, 4, true, 7, false, 0));
  CHECK(e0 != gather_ranks(1000, 4, true, 8, false, 0));
  DistributedSampler s(1000, 2, 4, true, 7);
  s.set_epoch(1);
  const auto a = s.indices();
  s.set_epoch(0);
  s.set_epoch(1);
  CHECK(a == s.indices());
  // The permutation is specified (mt19937_64, unbiased Fisher-Yates), not left to the standard
  // library: the same numbers on every platform, so ranks on different hosts agree.
  DistributedSampler pinned(10, 0, 1, true, 42);
  pinned.set_epoch(3);
  CHECK(pinned.indices() == std::vector<std::size_t>{5, 2, 0, 1, 8, 7, 9, 6, 4, 3});
}

TEST_CASE("sampler: bad rank or world size is invalid_argument") {
  CHECK_THROWS_AS(DistributedSampler(10, 0, 0), chorus::Error);
  CHECK_THROWS_AS(DistributedSampler(10, -1, 2), chorus::Error);
  CHECK_THROWS_AS(DistributedSampler(10, 2, 2), chorus::Error);
}

// ---- GradientSynchronizer with a recording communicator --------------------------------------

/// A world of one that records the collectives it is asked for (and performs them: the identity).
struct RecordingComm {
  struct Call {
    std::size_t count;
    DataType dt;
    ReduceOp op;
  };
  std::vector<Call> calls;
  int rank() const { return 0; }
  int size() const { return 1; }
  chorus::Request all_reduce_async(const void* in, void* out, std::size_t n, DataType dt, ReduceOp op) {
    calls.push_back({n, dt, op});
    if (in != out) std::memcpy(out, in, n * chorus::size_of(dt));
    return {};
  }
  chorus::Request broadcast_async(void*, std::size_t n, DataType dt, int) {
    calls.push_back({n, dt, ReduceOp::sum});
    return {};
  }
};
static_assert(chorus::sgd::Collectives<RecordingComm>);
static_assert(chorus::sgd::Collectives<Inproc>);

std::vector<std::size_t> counts_of(const RecordingComm& c) {
  std::vector<std::size_t> v;
  for (auto& call : c.calls) v.push_back(call.count);
  return v;
}

TEST_CASE("synchronizer: buckets in reverse registration order, started in bucket order") {
  // Tensor sizes in registration order; 1024-byte buckets (256 floats).
  std::vector<std::vector<float>> grads;
  for (std::size_t n : {10, 300, 5, 1000, 0, 7, 2000}) grads.emplace_back(n, 1.5f);
  RecordingComm comm;
  GradientSynchronizer sync(comm, grads, SyncOptions{.bucket_bytes = 1024});
  static_assert(std::same_as<decltype(sync), GradientSynchronizer<RecordingComm, float>>);
  // Walking backwards, a bucket closes once it holds >= 1024 bytes.
  REQUIRE(sync.bucket_count() == 4);
  auto tensors = [&](std::size_t b) {
    auto t = sync.bucket_tensors(b);
    return std::vector<std::size_t>(t.begin(), t.end());
  };
  CHECK(tensors(0) == std::vector<std::size_t>{6});
  CHECK(tensors(1) == std::vector<std::size_t>{5, 4, 3});
  CHECK(tensors(2) == std::vector<std::size_t>{2, 1});
  CHECK(tensors(3) == std::vector<std::size_t>{0});
  CHECK(sync.bucket_elements(1) == 1007);
  CHECK(sync.wire_type() == DataType::float32);

  for (int step = 0; step < 2; ++step) {
    comm.calls.clear();
    sync.mark_ready(0);  // completes bucket 3, which must wait for buckets 0-2
    CHECK(comm.calls.empty());
    sync.mark_ready(std::span<const float>(grads[6]));  // completes bucket 0: starts at once
    CHECK(counts_of(comm) == std::vector<std::size_t>{2000});
    sync.mark_ready(1);
    sync.mark_ready(2);  // bucket 2 complete, bucket 1 not: nothing starts
    CHECK(comm.calls.size() == 1);
    sync.finish();  // marks 3, 4, 5: buckets 1, 2, 3 start in that order
    CHECK(counts_of(comm) == std::vector<std::size_t>{2000, 1007, 305, 10});
    for (auto& c : comm.calls) CHECK((c.dt == DataType::float32 && c.op == ReduceOp::avg));
    CHECK(sync.last_step().buckets == 4);
    CHECK(sync.last_step().started_early == 1);
    for (auto& g : grads)
      for (float v : g) CHECK(v == 1.5f);  // a world of one: the average is the gradient
  }

  // Misuse: unknown index or span, twice in a step, no_sync in the middle of a step.
  CHECK_THROWS_AS(sync.mark_ready(7), chorus::Error);
  std::vector<float> other(10);
  CHECK_THROWS_AS(sync.mark_ready(std::span<const float>(other)), chorus::Error);
  sync.mark_ready(3);
  CHECK_THROWS_AS(sync.mark_ready(3), chorus::Error);
  CHECK_THROWS_AS((void)sync.no_sync(), chorus::Error);
  sync.finish();
  {
    auto guard = sync.no_sync();
    CHECK_FALSE(sync.syncing());
    CHECK_THROWS_AS((void)sync.no_sync(), chorus::Error);
    comm.calls.clear();
    sync.mark_ready(6);
    sync.finish();
    CHECK(comm.calls.empty());
  }
  CHECK(sync.syncing());
}

TEST_CASE("synchronizer: compressed buckets count wire bytes; sum of pre-divided addends") {
  std::vector<std::vector<float>> grads;
  for (std::size_t n : {10, 300, 5, 1000, 0, 7, 2000}) grads.emplace_back(n, 0.25f);
  RecordingComm comm;
  GradientSynchronizer sync(comm, grads, SyncOptions{.bucket_bytes = 1024, .compression = Compression::float16});
  REQUIRE(sync.bucket_count() == 3);  // 2000 | 7 0 1000 | 5 300 10 (2-byte elements)
  CHECK(sync.bucket_elements(2) == 315);
  CHECK(sync.wire_type() == DataType::float16);
  sync.finish();
  REQUIRE(comm.calls.size() == 3);
  for (auto& c : comm.calls) CHECK((c.dt == DataType::float16 && c.op == ReduceOp::sum));
  for (auto& g : grads)
    for (float v : g) CHECK(v == 0.25f);

  // broadcast_parameters: one broadcast per non-empty tensor; a root outside the world is refused.
  comm.calls.clear();
  chorus::sgd::broadcast_parameters(comm, grads, 0);
  CHECK(comm.calls.size() == 6);
  CHECK_THROWS_AS(chorus::sgd::broadcast_parameters(comm, grads, 1), chorus::Error);
}

TEST_CASE("synchronizer: CHORUS_BUCKET_BYTES") {
  struct Restore {
    ~Restore() { ::unsetenv("CHORUS_BUCKET_BYTES"); }
  } restore;
  ::unsetenv("CHORUS_BUCKET_BYTES");
  CHECK(chorus::sgd::bucket_bytes_from_env() == 25u << 20);
  ::setenv("CHORUS_BUCKET_BYTES", "64K", 1);
  CHECK(chorus::sgd::bucket_bytes_from_env() == 65536);
  std::vector<float> g(40000);
  RecordingComm comm;
  GradientSynchronizer sync(comm, std::vector<std::span<float>>{g, g});  // two 160000-byte tensors
  CHECK(sync.options().bucket_bytes == 65536);
  CHECK(sync.bucket_count() == 2);
  for (const char* bad : {"0", "lots", "-5", "12Q"}) {
    CAPTURE(bad);
    ::setenv("CHORUS_BUCKET_BYTES", bad, 1);
    CHECK_THROWS_AS(chorus::sgd::bucket_bytes_from_env(), chorus::Error);
  }
}

// ---- Bucketing equals average_gradients (inproc, ranks as threads) --------------------------

/// Exactly representable values (multiples of 1/64 in [-4, 4]): every sum over <= 4 ranks is
/// exact in float and float16, so avg's result does not depend on the order of the additions.
template <class G>
std::vector<std::vector<G>> random_grads(const std::vector<std::size_t>& sizes, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::vector<std::vector<G>> g;
  for (std::size_t n : sizes) {
    std::vector<G> t(n);
    for (auto& v : t) v = G(float(int(gen() % 513) - 256) / 64.0f);
    g.push_back(std::move(t));
  }
  return g;
}

template <class G>
bool bitwise_equal(const std::vector<std::vector<G>>& a, const std::vector<std::vector<G>>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i].size() != b[i].size() ||
        (!a[i].empty() && std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(G)) != 0))
      return false;
  return true;
}

/// One synchronised step: the tensors marked in a random order (different per rank), the last
/// quarter left to finish().
template <class Sync>
void sync_step(Sync& sync, std::size_t tensors, std::mt19937_64& gen) {
  std::vector<std::size_t> order(tensors);
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::shuffle(order.begin(), order.end(), gen);
  for (std::size_t k = 0; k < tensors * 3 / 4; ++k) sync.mark_ready(order[k]);
  sync.finish();
}

template <class G>
void check_bucketing_equals_average(int world, Compression compression) {
  // Many tensors of uneven sizes (0, 1, a few, thousands), the same shapes on every rank.
  std::mt19937_64 shape_gen(99);
  std::vector<std::size_t> sizes;
  for (int i = 0; i < 41; ++i) {
    const auto kind = shape_gen() % 4;
    sizes.push_back(kind == 0 ? shape_gen() % 3 : kind == 1 ? shape_gen() % 50 : 100 + shape_gen() % 3000);
  }
  std::vector<std::vector<std::vector<G>>> inputs;  // every rank's, for the rounding bound
  for (int r = 0; r < world; ++r) inputs.push_back(random_grads<G>(sizes, 17 + std::uint64_t(r)));
  chorus::test::run_threads(world, [&](int rank, chorus::Options o) {
    o.chunk_bytes = 1024;  // several ring slices per bucket
    auto comm = Inproc::create(std::move(o));
    std::mt19937_64 order_gen(1000 + std::uint64_t(rank));
    auto grads = inputs[std::size_t(rank)];
    auto reference = grads;
    chorus::sgd::average_gradients(comm, reference);

    GradientSynchronizer sync(comm, grads, SyncOptions{.bucket_bytes = 3000, .compression = compression});
    expect(sync.bucket_count() > 5, "several buckets");
    sync_step(sync, sizes.size(), order_gen);
    if (compression == Compression::none) {
      expect(bitwise_equal(grads, reference), "synchronizer == average_gradients, bitwise");
    } else {
      // Rounding each pre-divided addend and each of P-1 partial sums to the wire type.
      const double u = compression == Compression::float16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
      double worst = 0;
      for (std::size_t t = 0; t < sizes.size(); ++t)
        for (std::size_t i = 0; i < sizes[t]; ++i) {
          // sum_r |x_r| / P bounds every pre-divided addend and partial sum.
          double scale = 0;
          for (int r = 0; r < world; ++r) scale += std::abs(double(float(inputs[std::size_t(r)][t][i])));
          scale /= world;
          const double err = std::abs(double(float(grads[t][i])) - double(float(reference[t][i])));
          worst = std::max(worst, err / ((world + 1) * u * scale + std::ldexp(1.0, -24)));
        }
      expect(worst <= 1.0, "compressed result within the rounding bound (worst " + std::to_string(worst) + ")");
    }

    // Two steps under no_sync accumulate locally; the next step averages the accumulated sums.
    auto fresh = random_grads<G>(sizes, 500 + std::uint64_t(rank));
    for (std::size_t t = 0; t < sizes.size(); ++t) std::copy(fresh[t].begin(), fresh[t].end(), grads[t].begin());
    {
      auto guard = sync.no_sync();
      for (std::size_t t = 0; t < sizes.size(); ++t) sync.mark_ready(t);
      sync.finish();
      expect(bitwise_equal(grads, fresh), "no_sync leaves the gradients alone");
      for (auto& t : grads)
        for (auto& v : t) v = G(float(v) * 2.0f);  // "a second micro-batch with the same gradient"
    }
    auto doubled = grads;
    chorus::sgd::average_gradients(comm, doubled);
    sync_step(sync, sizes.size(), order_gen);
    if (compression == Compression::none) expect(bitwise_equal(grads, doubled), "accumulated step, bitwise");
  });
}

TEST_CASE("synchronizer == average_gradients: float32, worlds 2, 3, 4") {
  for (int world : {2, 3, 4}) check_bucketing_equals_average<float>(world, Compression::none);
}
TEST_CASE("synchronizer == average_gradients: float16 gradients, world 3") {
  check_bucketing_equals_average<chorus::float16>(3, Compression::none);
}
TEST_CASE("synchronizer == average_gradients: float16 and bfloat16 compression, worlds 2 and 4") {
  for (int world : {2, 4}) {
    check_bucketing_equals_average<float>(world, Compression::float16);
    check_bucketing_equals_average<float>(world, Compression::bfloat16);
  }
}

// ---- Equivalence with one large batch; replicas bitwise identical ---------------------------

constexpr int kIn = 30, kClasses = 5, kBatch = 8, kSteps = 6;
const std::vector<int> kSizes{kIn, 24, 16, kClasses};

/// A fixed synthetic dataset: enough samples for kSteps steps of 4 ranks x kBatch.
struct Synthetic {
  mlp::Matrix x;
  std::vector<std::uint8_t> y;
  Synthetic() : x(kIn, 4 * kBatch * kSteps), y(std::size_t(x.cols())) {
    std::mt19937_64 gen(2024);
    std::normal_distribution<float> normal;  // values only; nothing depends on their exact bits
    for (Eigen::Index j = 0; j < x.cols(); ++j) {
      y[std::size_t(j)] = std::uint8_t(gen() % kClasses);
      for (Eigen::Index i = 0; i < kIn; ++i) x(i, j) = normal(gen) + (i % kClasses == y[std::size_t(j)] ? 1.0f : 0.0f);
    }
  }
  /// Columns [begin, begin + n).
  mlp::Matrix batch(Eigen::Index begin, Eigen::Index n) const { return x.middleCols(begin, n); }
  std::span<const std::uint8_t> labels(Eigen::Index begin, Eigen::Index n) const {
    return std::span<const std::uint8_t>(y).subspan(std::size_t(begin), std::size_t(n));
  }
};

constexpr std::uint64_t kSeed = 7;
constexpr float kLr = 0.1f, kMomentum = 0.9f;

/// One process, batch world * kBatch, kSteps steps.
std::vector<float> single_process(const Synthetic& data, int world) {
  mlp::Mlp model(kSizes);
  model.init(kSeed);
  mlp::Sgd opt(model.parameters().size(), kLr, kMomentum);
  const Eigen::Index big = Eigen::Index(world) * kBatch;
  for (int s = 0; s < kSteps; ++s) {
    model.forward_backward(data.batch(s * big, big), data.labels(s * big, big));
    opt.step(model.parameters(), model.gradients());
  }
  return {model.parameters().begin(), model.parameters().end()};
}

/// Rank `rank` of `world`: its kBatch slice of every global batch; replicas compared bit for bit
/// with rank 0's after every step. Returns the final weights.
template <class Comm>
std::vector<float> data_parallel(Comm& comm, const Synthetic& data, SyncOptions options) {
  const int rank = comm.rank(), world = comm.size();
  mlp::Mlp model(kSizes);
  model.init(kSeed + 1000 * std::uint64_t(rank));  // different on every rank until the broadcast
  chorus::sgd::broadcast_parameters(comm, model.parameter_tensors(), 0);
  mlp::Sgd opt(model.parameters().size(), kLr, kMomentum);
  GradientSynchronizer sync(comm, model.gradient_tensors(), options);
  expect(world == 1 || sync.bucket_count() > 1, "several buckets");
  const Eigen::Index big = Eigen::Index(world) * kBatch;
  std::vector<float> root_copy;
  for (int s = 0; s < kSteps; ++s) {
    const Eigen::Index begin = s * big + rank * kBatch;
    model.forward_backward(data.batch(begin, kBatch), data.labels(begin, kBatch),
                           [&](std::size_t t) { sync.mark_ready(t); });
    sync.finish();
    opt.step(model.parameters(), model.gradients());
    root_copy.assign(model.parameters().begin(), model.parameters().end());
    comm.broadcast(std::span<float>(root_copy), 0);
    expect(std::memcmp(root_copy.data(), model.parameters().data(), root_copy.size() * sizeof(float)) == 0,
           "rank " + std::to_string(rank) + ": weights bitwise equal to rank 0's after step " + std::to_string(s));
  }
  return {model.parameters().begin(), model.parameters().end()};
}

double relative_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    norm += double(b[i]) * b[i];
  }
  return std::sqrt(diff / norm);
}

TEST_CASE("equivalence: P ranks x batch B == one process x batch P*B, P in {1, 2, 3, 4}; replicas bitwise identical") {
  const Synthetic data;
  for (int world : {1, 2, 3, 4}) {
    CAPTURE(world);
    const auto reference = single_process(data, world);
    // The initial weights must have moved, or the comparison proves little.
    mlp::Mlp initial(kSizes);
    initial.init(kSeed);
    const std::vector<float> start(initial.parameters().begin(), initial.parameters().end());
    CHECK(relative_difference(start, reference) > 1e-2);
    std::vector<std::vector<float>> finals(static_cast<std::size_t>(world));
    chorus::test::run_threads(world, [&](int rank, chorus::Options o) {
      auto comm = Inproc::create(std::move(o));
      finals[std::size_t(rank)] = data_parallel(comm, data, SyncOptions{.bucket_bytes = 1024});
    });
    for (int r = 0; r < world; ++r) {
      CAPTURE(r);
      const double rel = relative_difference(finals[std::size_t(r)], reference);
      MESSAGE("world " << world << " rank " << r << ": relative difference " << rel);
      CHECK(rel < 1e-5);
    }
  }
}

TEST_CASE("tcp processes: replicas stay bitwise identical, bfloat16 compression, world 3") {
  const Synthetic data;
  chorus::test::run_processes(3, [&](int, chorus::Options o) {
    auto comm = Tcp::create(std::move(o));
    const auto weights = data_parallel(comm, data, SyncOptions{.bucket_bytes = 512, .compression = Compression::bfloat16});
    // Compression changes the numbers, not the training: still near the exact run.
    const double rel = relative_difference(weights, single_process(data, 3));
    expect(rel < 2e-2, "bfloat16-compressed run near the exact one: relative difference " + std::to_string(rel));
  });
}

// ---- The example's Fashion-MNIST reader ------------------------------------------------------

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "chorus-sgd-test-XXXXXX").string();
    REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

std::vector<std::uint8_t> be32(std::uint32_t v) {
  return {std::uint8_t(v >> 24), std::uint8_t(v >> 16), std::uint8_t(v >> 8), std::uint8_t(v)};
}

/// Writes bytes gzip-compressed.
void write_gz(const std::filesystem::path& p, const std::vector<std::uint8_t>& bytes) {
  gzFile f = gzopen(p.c_str(), "wb");
  REQUIRE(f != nullptr);
  if (!bytes.empty()) REQUIRE(gzwrite(f, bytes.data(), unsigned(bytes.size())) == int(bytes.size()));
  REQUIRE(gzclose(f) == Z_OK);
}

std::vector<std::uint8_t> idx_images(std::uint32_t magic, std::uint32_t n, std::uint32_t rows, std::uint32_t cols,
                                     std::size_t pixels) {
  std::vector<std::uint8_t> b;
  for (auto v : {magic, n, rows, cols}) {
    auto w = be32(v);
    b.insert(b.end(), w.begin(), w.end());
  }
  for (std::size_t i = 0; i < pixels; ++i) b.push_back(std::uint8_t(i));
  return b;
}
std::vector<std::uint8_t> idx_labels(std::uint32_t magic, std::uint32_t n, std::vector<std::uint8_t> labels) {
  std::vector<std::uint8_t> b = be32(magic);
  auto w = be32(n);
  b.insert(b.end(), w.begin(), w.end());
  b.insert(b.end(), labels.begin(), labels.end());
  return b;
}

/// load_idx must throw DatasetError whose message contains `needle`.
void expect_dataset_error(const TempDir& d, const std::vector<std::uint8_t>& images,
                          const std::vector<std::uint8_t>& labels, const std::string& needle) {
  write_gz(d.path / "img.gz", images);
  write_gz(d.path / "lab.gz", labels);
  try {
    (void)fmnist::load_idx((d.path / "img.gz").string(), (d.path / "lab.gz").string());
    FAIL("no error; expected one containing '" << needle << "'");
  } catch (const fmnist::DatasetError& e) {
    INFO(e.what());
    CHECK(std::string(e.what()).find(needle) != std::string::npos);
  }
}

TEST_CASE("fashion-mnist reader: well-formed, malformed, truncated, corrupt and missing files") {
  TempDir d;
  const std::vector<std::uint8_t> good_labels = idx_labels(0x801, 3, {0, 9, 4});
  // Well-formed: 3 images of 2x2.
  write_gz(d.path / "img.gz", idx_images(0x803, 3, 2, 2, 12));
  write_gz(d.path / "lab.gz", good_labels);
  const auto ds = fmnist::load_idx((d.path / "img.gz").string(), (d.path / "lab.gz").string());
  CHECK(ds.count == 3);
  CHECK(ds.pixels_per_image() == 4);
  CHECK(ds.image(2)[3] == 11);
  CHECK(ds.labels[1] == 9);

  expect_dataset_error(d, idx_images(0x804, 3, 2, 2, 12), good_labels, "magic number");
  expect_dataset_error(d, idx_images(0x803, 3, 2, 2, 11), good_labels, "truncated: 3 images needs 12 bytes");
  expect_dataset_error(d, idx_images(0x803, 3, 2, 2, 13), good_labels, "data continues");
  expect_dataset_error(d, {0, 0, 8}, good_labels, "truncated: the header");
  expect_dataset_error(d, {}, good_labels, "truncated");
  expect_dataset_error(d, idx_images(0x803, 3, 0, 2, 0), good_labels, "image size 0x2");
  expect_dataset_error(d, idx_images(0x803, 0xffffffffu, 28, 28, 0), good_labels, "implausibly many");
  expect_dataset_error(d, idx_images(0x803, 3, 2, 2, 12), idx_labels(0x801, 2, {1, 2}), "2 labels for 3 images");
  expect_dataset_error(d, idx_images(0x803, 3, 2, 2, 12), idx_labels(0x801, 3, {1, 10, 2}), "label 10 of item 1");
  expect_dataset_error(d, idx_images(0x803, 3, 2, 2, 12), idx_labels(0x801, 3, {1, 2}), "truncated: 3 labels");

  // A gzip stream cut in the middle, and one with a damaged body.
  {
    write_gz(d.path / "full.gz", idx_images(0x803, 3, 2, 2, 12));
    std::vector<char> bytes(std::filesystem::file_size(d.path / "full.gz"));
    {
      std::FILE* f = std::fopen((d.path / "full.gz").c_str(), "rb");
      REQUIRE(f != nullptr);
      REQUIRE(std::fread(bytes.data(), 1, bytes.size(), f) == bytes.size());
      std::fclose(f);
    }
    auto write_raw = [&](const std::vector<char>& b) {
      std::FILE* f = std::fopen((d.path / "img.gz").c_str(), "wb");
      REQUIRE(f != nullptr);
      std::fwrite(b.data(), 1, b.size(), f);
      std::fclose(f);
    };
    write_gz(d.path / "lab.gz", good_labels);
    write_raw(std::vector<char>(bytes.begin(), bytes.begin() + std::ptrdiff_t(bytes.size() - 12)));
    CHECK_THROWS_AS(fmnist::load_idx((d.path / "img.gz").string(), (d.path / "lab.gz").string()), fmnist::DatasetError);
    auto damaged = bytes;
    for (std::size_t i = 12; i + 8 < damaged.size(); ++i) damaged[i] = char(0xff);
    write_raw(damaged);
    CHECK_THROWS_AS(fmnist::load_idx((d.path / "img.gz").string(), (d.path / "lab.gz").string()), fmnist::DatasetError);
  }

  // Missing files: a message that names the file and the package.
  CHECK_THROWS_AS(fmnist::load_idx((d.path / "nope.gz").string(), (d.path / "lab.gz").string()), fmnist::DatasetError);
  const std::string msg = fmnist::missing_files_message(d.path.string());
  CHECK(msg.find("train-images-idx3-ubyte.gz") != std::string::npos);
  CHECK(msg.find("dataset-fashion-mnist") != std::string::npos);

  // The installed dataset, when present, reads as 60000 + 10000 images of 28x28.
  if (fmnist::missing_files_message(fmnist::kDefaultDir).empty()) {
    const auto files = fmnist::files_in(fmnist::kDefaultDir);
    const auto test = fmnist::load_idx(files.test_images, files.test_labels);
    CHECK(test.count == 10000);
    CHECK(test.rows == 28);
    CHECK(test.cols == 28);
  } else {
    MESSAGE("dataset-fashion-mnist is not installed: the installed files are not checked");
  }
}

}  // namespace

}  // namespace sgd_test_sgd
