// SPDX-License-Identifier: BSD-3-Clause
#include "chorus/reduce/cuda/reduce.cuh"

#include <doctest/doctest.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "chorus/reduce/host.hpp"
#include "cuda/gpu_test.hpp"

// The reduction kernels of reduce/cuda on the GPU against the host loops of reduce/host.hpp, bit
// for bit: every dtype and valid op, odd counts, misaligned operands (the scalar path and the
// tail after the packs), in place, special float values, and a count past one grid's reach.

namespace {

using chorus::DataType;
using chorus::ReduceOp;
using chorus::test::gpu::cuda_require;
using chorus::test::gpu::DeviceMemory;

constexpr std::size_t kCounts[] = {1, 2, 3, 7, 17, 31, 257, 4099, 100003};
constexpr ReduceOp kOps[] = {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max,
                             ReduceOp::avg, ReduceOp::band, ReduceOp::bor, ReduceOp::bxor};
/// Byte offsets of (out, a, b) from a 256-byte boundary, rounded down to the element size.
constexpr std::array<std::array<std::size_t, 3>, 4> kOffsets = {{{0, 0, 0}, {8, 8, 8}, {2, 6, 0}, {1, 5, 11}}};

/// Inputs: random bits; for the float types a quarter of the elements replaced by special values
/// (quiet and signalling NaN of either sign, infinities, signed zeros, the smallest denormal).
std::vector<unsigned char> make_input(DataType dt, std::size_t count, std::mt19937_64& rng) {
  const std::size_t size = chorus::size_of(dt);
  std::vector<unsigned char> v(count * size);
  for (auto& byte : v) byte = static_cast<unsigned char>(rng() >> 7);
  const bool is_float = dt == DataType::float16 || dt == DataType::bfloat16 || dt == DataType::float32 ||
                        dt == DataType::float64;
  if (!is_float) return v;
  // Sign, exponent all ones or zero, and a mantissa pattern, built for the element's layout.
  const int exponent_bits = dt == DataType::float16 ? 5 : dt == DataType::float64 ? 11 : 8;
  const int mantissa_bits = static_cast<int>(size * 8) - 1 - exponent_bits;
  const std::uint64_t exp_ones = ((std::uint64_t{1} << exponent_bits) - 1) << mantissa_bits;
  const std::uint64_t quiet = std::uint64_t{1} << (mantissa_bits - 1);
  const std::uint64_t sign = std::uint64_t{1} << (size * 8 - 1);
  const std::uint64_t specials[] = {exp_ones | quiet, sign | exp_ones | quiet | 3, exp_ones | 1, exp_ones,
                                    sign | exp_ones,  0,                           sign,          1};
  for (std::size_t i = 0; i < count; i += 1 + rng() % 7) {
    const std::uint64_t s = specials[rng() % std::size(specials)];
    std::memcpy(v.data() + i * size, &s, size);
  }
  return v;
}

/// Index of the first differing element, or -1.
long long first_mismatch(const std::vector<unsigned char>& got, const std::vector<unsigned char>& want,
                         std::size_t size) {
  for (std::size_t k = 0; k < want.size(); ++k) {
    if (got[k] != want[k]) return static_cast<long long>(k / size);
  }
  return -1;
}

/// Runs reduce_async (+ finalize_avg_async for avg) on the device; the result as bytes.
std::vector<unsigned char> device_reduce(ReduceOp op, DataType dt, const std::vector<unsigned char>& a,
                                         const std::vector<unsigned char>& b, std::size_t count,
                                         const std::array<std::size_t, 3>& offsets, bool in_place, int world) {
  const std::size_t size = chorus::size_of(dt);
  const std::size_t bytes = count * size;
  const std::size_t region = (bytes + 16 + 255) / 256 * 256;  // cudaMalloc aligns to 256 bytes at least
  DeviceMemory mem(3 * region);
  unsigned char* d_out = mem.at(offsets[0] / size * size);
  unsigned char* d_a = mem.at(region + offsets[1] / size * size);
  unsigned char* d_b = mem.at(2 * region + offsets[2] / size * size);
  cuda_require(cudaMemcpy(d_a, a.data(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
  cuda_require(cudaMemcpy(d_b, b.data(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
  if (in_place) d_out = d_a;
  cuda_require(chorus::reduce_async(op, dt, d_out, d_a, d_b, count, nullptr), "reduce_async");
  if (op == ReduceOp::avg) cuda_require(chorus::finalize_avg_async(dt, d_out, count, world, nullptr), "finalize_avg_async");
  std::vector<unsigned char> got(bytes);
  cuda_require(cudaMemcpy(got.data(), d_out, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
  return got;
}

}  // namespace

TEST_CASE("kernels: reduce equals the host reduce bit for bit (every dtype and op, odd counts, misaligned)") {
  std::mt19937_64 rng(1123);
  int failures = 0;
  for (DataType dt : chorus::kAllDataTypes) {
    for (ReduceOp op : kOps) {
      if (!chorus::is_valid_op(dt, op)) continue;
      for (std::size_t count : kCounts) {
        for (const auto& offsets : kOffsets) {
          for (bool in_place : {false, true}) {
            const int world = 1 + static_cast<int>(count % 5);
            const auto a = make_input(dt, count, rng);
            const auto b = make_input(dt, count, rng);
            std::vector<unsigned char> want(a.size());
            chorus::reduce(op, dt, want.data(), a.data(), b.data(), count);
            if (op == ReduceOp::avg) chorus::finalize_avg(dt, want.data(), count, world);
            const auto got = device_reduce(op, dt, a, b, count, offsets, in_place, world);
            const long long bad = first_mismatch(got, want, chorus::size_of(dt));
            if (bad >= 0 && ++failures <= 10) {
              FAIL_CHECK(chorus::to_string(op) << " " << chorus::to_string(dt) << " count " << count << " offsets "
                                               << offsets[0] << "/" << offsets[1] << "/" << offsets[2]
                                               << (in_place ? " in place" : "") << ": element " << bad << " differs");
            }
          }
        }
      }
    }
  }
  CHECK(failures == 0);
}

TEST_CASE("kernels: finalize_avg equals the host finalize_avg for every dtype and world size") {
  std::mt19937_64 rng(7);
  for (DataType dt : chorus::kAllDataTypes) {
    for (int world : {1, 2, 3, 300, 3000}) {
      for (std::size_t count : {std::size_t{1}, std::size_t{17}, std::size_t{4099}}) {
        const std::size_t bytes = count * chorus::size_of(dt);
        auto want = make_input(dt, count, rng);
        DeviceMemory d(bytes);
        cuda_require(cudaMemcpy(d.get(), want.data(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
        cuda_require(chorus::finalize_avg_async(dt, d.get(), count, world, nullptr), "finalize_avg_async");
        std::vector<unsigned char> got(bytes);
        cuda_require(cudaMemcpy(got.data(), d.get(), bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
        chorus::finalize_avg(dt, want.data(), count, world);
        CAPTURE(chorus::to_string(dt));
        CAPTURE(world);
        CAPTURE(count);
        CHECK(first_mismatch(got, want, chorus::size_of(dt)) == -1);
      }
    }
  }
}

TEST_CASE("kernels: a buffer past one grid's reach (every thread loops)") {
  constexpr std::size_t kGridPacks =
      std::size_t{chorus::DeviceReduceTuning::kMaxBlocks} * chorus::DeviceReduceTuning::kThreadsPerBlock;
  constexpr std::size_t kCount = kGridPacks * 4 * 3 + 5;  // float32: three grids of packs and a tail
  std::mt19937_64 rng(3);
  const auto a = make_input(DataType::float32, kCount, rng);
  const auto b = make_input(DataType::float32, kCount, rng);
  std::vector<unsigned char> want(a.size());
  chorus::reduce(ReduceOp::max, DataType::float32, want.data(), a.data(), b.data(), kCount);
  for (const auto& offsets : {kOffsets[0], kOffsets[2]}) {
    CAPTURE(offsets[1]);
    CHECK(first_mismatch(device_reduce(ReduceOp::max, DataType::float32, a, b, kCount, offsets, false, 1), want, 4) ==
          -1);
  }
}

TEST_CASE("kernels: the launchers reject invalid arguments and launch nothing for count 0") {
  DeviceMemory d(64);
  CHECK(chorus::reduce_async(ReduceOp::band, DataType::float32, d.get(), d.get(), d.get(), 4, nullptr) ==
        cudaErrorInvalidValue);
  CHECK(chorus::reduce_async(static_cast<ReduceOp>(99), DataType::int32, d.get(), d.get(), d.get(), 4, nullptr) ==
        cudaErrorInvalidValue);
  CHECK(chorus::reduce_async(ReduceOp::sum, static_cast<DataType>(99), d.get(), d.get(), d.get(), 4, nullptr) ==
        cudaErrorInvalidValue);
  CHECK(chorus::finalize_avg_async(DataType::float32, d.get(), 4, 0, nullptr) == cudaErrorInvalidValue);
  CHECK(chorus::reduce_async(ReduceOp::sum, DataType::float32, nullptr, nullptr, nullptr, 0, nullptr) == cudaSuccess);
  CHECK(cudaDeviceSynchronize() == cudaSuccess);
}
