// SPDX-License-Identifier: BSD-3-Clause
// Host reduction throughput: chorus::reduce(op, dtype, out, a, b, count) over three distinct
// buffers of 4 KiB, 256 KiB, 4 MiB and 64 MiB each (L1, L2, L3, memory on most machines), against
// a memcpy of the same buffer size as the baseline; every dtype with every op (prod, min and max
// at 256 KiB and 64 MiB only), avg's final division, and float32 sum in place (a op= b, the
// in_place_reduce_speedup of the simulator's model, sim/include/chorus/sim/network.hpp).
//
// Bytes processed count what the call reads and writes: 3 x buffer bytes for a reduction (a, b
// read, out written), 2 x for memcpy. So GB/s compares directly with the machine's bandwidth.
//
//   reduce_bench --benchmark_min_time=0.05
//   reduce_bench --benchmark_filter='float16|memcpy'

#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "chorus/reduce/host.hpp"

namespace {

using chorus::DataType;
using chorus::ReduceOp;

constexpr std::int64_t kSizes[] = {4 << 10, 256 << 10, 4 << 20, 64 << 20};

/// Inputs whose sums, products, minima and maxima stay ordinary numbers (no inf, NaN or
/// subnormals, which can be slower than the common case).
template <class T>
std::vector<T> make_input(std::size_t n, int salt) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    const int k = static_cast<int>((i * 7 + static_cast<std::size_t>(salt)) % 13);
    if constexpr (std::is_integral_v<T>) {
      v[i] = static_cast<T>(k * 3 + salt);
    } else {
      v[i] = T(1.0 + 0.001 * (k - 6));  // products stay near 1
    }
  }
  return v;
}

/// out = a op b; with `in_place`, a op= b (out is a), as recursive doubling and the double tree
/// reduce: the same bytes counted, but the stores hit lines the loads just brought in, where out
/// of place they must first fetch out's.
void bm_reduce(benchmark::State& state, DataType dt, ReduceOp op, bool in_place) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  const std::size_t count = bytes / chorus::size_of(dt);
  chorus::dispatch(dt, [&]<class T>(std::type_identity<T>) {
    std::vector<T> a = make_input<T>(count, 1);
    const std::vector<T> b = make_input<T>(count, 2);
    std::vector<T> out_of_place(in_place ? 0 : count);
    T* out = in_place ? a.data() : out_of_place.data();
    for (auto _ : state) {
      chorus::reduce(op, dt, out, a.data(), b.data(), count);
      benchmark::DoNotOptimize(out);
      benchmark::ClobberMemory();
    }
  });
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * 3 *
                          static_cast<std::int64_t>(bytes));
}

void bm_memcpy(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  const std::vector<unsigned char> src(bytes, 1);
  std::vector<unsigned char> dst(bytes);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), bytes);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * 2 *
                          static_cast<std::int64_t>(bytes));
}

void with_sizes(benchmark::internal::Benchmark* b) {
  for (std::int64_t s : kSizes) b->Arg(s);
}

void bm_finalize_avg(benchmark::State& state, DataType dt) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  const std::size_t count = bytes / chorus::size_of(dt);
  chorus::dispatch(dt, [&]<class T>(std::type_identity<T>) {
    const std::vector<T> init = make_input<T>(count, 1);
    std::vector<T> data = init;
    for (auto _ : state) {
      chorus::finalize_avg(dt, data.data(), count, 1);  // divides by 1: the values stay as they are
      benchmark::DoNotOptimize(data.data());
      benchmark::ClobberMemory();
    }
  });
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * 2 *
                          static_cast<std::int64_t>(bytes));
}

void with_two_sizes(benchmark::internal::Benchmark* b) {
  b->Arg(256 << 10);  // in cache
  b->Arg(64 << 20);   // from memory
}

/// Every dtype with every op: sum at the four sizes, prod, min and max at two (in cache, from
/// memory). avg reduces as sum (reduce/host.hpp) and then divides once: avg_finalize/<dtype>
/// times that division (bytes processed: read + write).
[[maybe_unused]] const bool kRegistered = [] {
  benchmark::RegisterBenchmark("memcpy", bm_memcpy)->Apply(with_sizes);
  benchmark::RegisterBenchmark("reduce_in_place/float32/sum", bm_reduce, DataType::float32, ReduceOp::sum, true)
      ->Apply(with_sizes);
  auto add = [](DataType dt, ReduceOp op, void (*sizes)(benchmark::internal::Benchmark*)) {
    const std::string name =
        "reduce/" + std::string(chorus::to_string(dt)) + "/" + std::string(chorus::to_string(op));
    benchmark::RegisterBenchmark(name.c_str(), bm_reduce, dt, op, false)->Apply(sizes);
  };
  for (DataType dt : chorus::kAllDataTypes) {
    add(dt, ReduceOp::sum, with_sizes);
    for (ReduceOp op : {ReduceOp::prod, ReduceOp::min, ReduceOp::max}) add(dt, op, with_two_sizes);
    const std::string name = "avg_finalize/" + std::string(chorus::to_string(dt));
    benchmark::RegisterBenchmark(name.c_str(), bm_finalize_avg, dt)->Apply(with_two_sizes);
  }
  return true;
}();

}  // namespace

BENCHMARK_MAIN();
