// SPDX-License-Identifier: BSD-3-Clause
#include "chorus/testing/grid_emulator.hpp"

#include <doctest/doctest.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "chorus/reduce/host.hpp"
#include "support/sanitized.hpp"

// This file's own names: the files of tests/unit/ are compiled together (unity build).
namespace unit_test_kernels {

// The CUDA kernel bodies of reduce/cuda/kernels.hpp, run on the host by the grid emulator, against
// the host loops of reduce/host.hpp (tested on their own in test_reduce.cpp), bit for bit: every
// dtype and valid op, awkward counts, operands at different misalignments (packed path, scalar
// path, and the tail after the packs), in place, and special float values. The bytes around each
// output must stay untouched. reduce_many's body against n - 1 chained pairwise reduces the same way.

namespace {

using chorus::DataType;
using chorus::ReduceOp;

constexpr std::size_t kCounts[] = {0, 1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 257, 4099, 100003};
constexpr ReduceOp kOps[] = {ReduceOp::sum, ReduceOp::prod, ReduceOp::min,  ReduceOp::max,
                             ReduceOp::avg, ReduceOp::band, ReduceOp::bor,  ReduceOp::bxor};
constexpr int kWorldSizes[] = {1, 2, 3, 7, 300, 3000};  // 300, 3000: past the narrow floats' float division
constexpr std::size_t kGuard = 32;                      // bytes checked on either side of an output
constexpr unsigned char kSentinel = 0xa5;

/// Byte offsets from a 64-byte boundary of (out, a, b); rounded down to the element size, so
/// 8-byte elements see 0 and 8, 1-byte elements every offset.
constexpr std::array<std::array<std::size_t, 3>, 7> kOffsets = {{
    {0, 0, 0}, {8, 8, 8}, {4, 12, 0}, {0, 0, 8}, {1, 2, 3}, {15, 14, 13}, {5, 0, 9},
}};

/// A buffer of `bytes` at `offset` bytes past a 64-byte boundary, with kGuard sentinel bytes on
/// either side.
class Buffer {
 public:
  Buffer(std::size_t bytes, std::size_t offset) : bytes_(bytes), storage_(bytes + 2 * kGuard + 128, kSentinel) {
    const auto base = reinterpret_cast<std::uintptr_t>(storage_.data()) + kGuard;
    const std::uintptr_t aligned = (base + 63) & ~std::uintptr_t{63};
    begin_ = storage_.data() + (aligned - reinterpret_cast<std::uintptr_t>(storage_.data())) + offset;
  }
  unsigned char* data() { return begin_; }
  const unsigned char* data() const { return begin_; }
  std::size_t bytes() const { return bytes_; }
  /// Whether the guard bytes on both sides still hold the sentinel.
  bool guards_intact() const {
    for (std::size_t k = 1; k <= kGuard; ++k) {
      if (begin_[-static_cast<std::ptrdiff_t>(k)] != kSentinel || begin_[bytes_ + k - 1] != kSentinel) return false;
    }
    return true;
  }

 private:
  std::size_t bytes_;
  std::vector<unsigned char> storage_;
  unsigned char* begin_;
};

/// Random elements of dt as bytes: random bits, with special values mixed in for the floating-point
/// types (NaN with payloads and both signs, infinities, signed zeros, denormals, extremes).
std::vector<unsigned char> random_elements(DataType dt, std::size_t count, std::mt19937_64& rng) {
  const std::size_t size = chorus::size_of(dt);
  std::vector<unsigned char> v(count * size);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<unsigned char>(rng());
  std::vector<std::uint64_t> specials;
  switch (dt) {
    case DataType::float16:
      specials = {0x0000, 0x8000, 0x7c00, 0xfc00, 0x7e00, 0xfe01, 0x7c01, 0x0001, 0x83ff, 0x7bff, 0xfbff, 0x3c00};
      break;
    case DataType::bfloat16:
      specials = {0x0000, 0x8000, 0x7f80, 0xff80, 0x7fc0, 0xffc1, 0x7f81, 0x0001, 0x807f, 0x7f7f, 0xff7f, 0x3f80};
      break;
    case DataType::float32:
      specials = {0x00000000, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000, 0xffc00123, 0x7f800001,
                  0x00000001, 0x807fffff, 0x7f7fffff, 0xff7fffff, 0x3f800000};
      break;
    case DataType::float64:
      specials = {0x0ull,
                  0x8000000000000000ull,
                  0x7ff0000000000000ull,
                  0xfff0000000000000ull,
                  0x7ff8000000000000ull,
                  0xfff8000000000123ull,
                  0x7ff0000000000001ull,
                  0x0000000000000001ull,
                  0x800fffffffffffffull,
                  0x7fefffffffffffffull,
                  0x3ff0000000000000ull};
      break;
    default:
      return v;
  }
  for (std::size_t i = 0; i < count; ++i) {
    if (rng() % 4 != 0) continue;
    const std::uint64_t s = specials[rng() % specials.size()];
    std::memcpy(v.data() + i * size, &s, size);  // little-endian: the low bytes are the value
  }
  return v;
}

/// "" when the first `bytes` of got and want agree, else where they first differ.
std::string first_difference(const unsigned char* got, const unsigned char* want, std::size_t bytes,
                             std::size_t element) {
  for (std::size_t k = 0; k < bytes; ++k) {
    if (got[k] != want[k]) {
      return "element " + std::to_string(k / element) + " of " + std::to_string(bytes / element) +
             " differs (byte " + std::to_string(k) + ": got " + std::to_string(got[k]) + ", want " +
             std::to_string(want[k]) + ")";
    }
  }
  return "";
}

/// Where out lives relative to the operands.
enum class Placement { separate, out_is_a, out_is_b };

/// One emulated reduce (and, for avg, finalize) against the host's; "" when they agree.
std::string check_case(ReduceOp op, DataType dt, std::size_t count, const std::array<std::size_t, 3>& offsets,
                       Placement placement, int world_size, std::mt19937_64& rng) {
  const std::size_t size = chorus::size_of(dt);
  const std::size_t bytes = count * size;
  const auto a_init = random_elements(dt, count, rng);
  const auto b_init = random_elements(dt, count, rng);
  auto round = [size](std::size_t off) { return off / size * size; };

  Buffer out(bytes, round(offsets[0]));
  Buffer a(bytes, round(offsets[1]));
  Buffer b(bytes, round(offsets[2]));
  if (bytes != 0) {
    std::memcpy(a.data(), a_init.data(), bytes);
    std::memcpy(b.data(), b_init.data(), bytes);
  }
  Buffer* result = &out;
  if (placement == Placement::out_is_a) result = &a;
  if (placement == Placement::out_is_b) result = &b;
  chorus::device::emulate_reduce(op, dt, result->data(), a.data(), b.data(), count);
  if (op == ReduceOp::avg) chorus::device::emulate_finalize_avg(dt, result->data(), count, world_size);

  // The host reference, in a buffer of its own (and in place where the emulator was).
  std::vector<unsigned char> want(bytes + 1);
  chorus::reduce(op, dt, want.data(), a_init.data(), b_init.data(), count);
  if (op == ReduceOp::avg) chorus::finalize_avg(dt, want.data(), count, world_size);

  if (!out.guards_intact() || !a.guards_intact() || !b.guards_intact()) return "a byte outside a buffer changed";
  if (placement != Placement::separate) {
    for (std::size_t k = 0; k < out.bytes(); ++k) {
      if (out.data()[k] != kSentinel) return "out was written although the result goes to an operand";
    }
  }
  if (placement != Placement::out_is_a && bytes != 0 && std::memcmp(a.data(), a_init.data(), bytes) != 0)
    return "operand a changed";
  if (placement != Placement::out_is_b && bytes != 0 && std::memcmp(b.data(), b_init.data(), bytes) != 0)
    return "operand b changed";
  return first_difference(result->data(), want.data(), bytes, size);
}

std::string describe(ReduceOp op, DataType dt, std::size_t count, const std::array<std::size_t, 3>& offsets,
                     Placement placement) {
  const char* where = placement == Placement::separate ? "separate" : placement == Placement::out_is_a ? "out==a"
                                                                                                        : "out==b";
  return std::string(chorus::to_string(op)) + " " + std::string(chorus::to_string(dt)) + " count " +
         std::to_string(count) + " offsets " + std::to_string(offsets[0]) + "/" + std::to_string(offsets[1]) + "/" +
         std::to_string(offsets[2]) + " " + where;
}

}  // namespace

TEST_CASE("grid emulator: reduce kernel body equals the host reduce, bit for bit") {
  std::mt19937_64 rng(20261123);
  int cases = 0;
  int failures = 0;
  for (DataType dt : chorus::kAllDataTypes) {
    if (!chorus::test::runs_dtype(dt))
      continue;  // six of the twelve under ASan, four under TSan (sanitized.hpp)
    for (ReduceOp op : kOps) {
      if (!chorus::is_valid_op(dt, op)) continue;
      for (std::size_t count : kCounts) {
        for (const auto& offsets : kOffsets) {
          for (Placement placement : {Placement::separate, Placement::out_is_a, Placement::out_is_b}) {
            // The largest count in two layouts (packs; elements only), the others in every one.
            if (count > 5000 && (placement != Placement::separate || (offsets[0] != 0 && offsets[0] != 1))) continue;
            // In place: the misaligned layouts once each, not for every count.
            if (placement != Placement::separate && count > 300 && offsets[0] != 0) continue;
            const int world = kWorldSizes[static_cast<std::size_t>(cases) % std::size(kWorldSizes)];
            const std::string bad = check_case(op, dt, count, offsets, placement, world, rng);
            ++cases;
            if (!bad.empty() && ++failures <= 10) {
              FAIL_CHECK(describe(op, dt, count, offsets, placement) << " (world " << world << "): " << bad);
            }
          }
        }
      }
    }
  }
  CHECK(failures == 0);
  MESSAGE(cases << " cases");
}

TEST_CASE("grid emulator: finalize_avg kernel body equals the host finalize_avg for every world size") {
  std::mt19937_64 rng(17);
  for (DataType dt : chorus::kAllDataTypes) {
    for (int world : kWorldSizes) {
      for (std::size_t count : kCounts) {
        for (std::size_t offset : {std::size_t{0}, std::size_t{1}, std::size_t{8}}) {
          const std::size_t size = chorus::size_of(dt);
          const auto init = random_elements(dt, count, rng);
          Buffer data(count * size, offset / size * size);
          if (count != 0) std::memcpy(data.data(), init.data(), count * size);
          std::vector<unsigned char> want(init);
          chorus::device::emulate_finalize_avg(dt, data.data(), count, world);
          chorus::finalize_avg(dt, want.data(), count, world);
          CAPTURE(chorus::to_string(dt));
          CAPTURE(world);
          CAPTURE(count);
          CAPTURE(offset);
          CHECK(data.guards_intact());
          CHECK(first_difference(data.data(), want.data(), count * size, size) == "");
        }
      }
    }
  }
}

TEST_CASE("grid emulator: buffers beyond one grid's reach (threads loop more than once)") {
  // One grid covers kMaxBlocks * kThreadsPerBlock packs (16 MiB of each operand); int32 with 2.5
  // grids' worth of elements, aligned (packs) and misaligned (elements, 10 rounds per thread).
  constexpr std::size_t kGridPacks =
      std::size_t{chorus::DeviceReduceTuning::kMaxBlocks} * chorus::DeviceReduceTuning::kThreadsPerBlock;
  constexpr std::size_t kCount = kGridPacks * 4 * 5 / 2 + 3;
  static_assert(chorus::reduce_launch_shape<std::int32_t>(kCount).blocks == chorus::DeviceReduceTuning::kMaxBlocks);
  std::mt19937_64 rng(5);
  for (const auto& offsets : {std::array<std::size_t, 3>{0, 0, 0}, std::array<std::size_t, 3>{4, 0, 8}}) {
    CAPTURE(offsets[0]);
    CHECK(check_case(ReduceOp::sum, DataType::int32, kCount, offsets, Placement::separate, 1, rng) == "");
  }
}

TEST_CASE("grid emulator: launch shapes and invalid arguments") {
  using chorus::DeviceReduceTuning;
  CHECK(chorus::reduce_launch_shape<float>(0).blocks == 1);
  CHECK(chorus::reduce_launch_shape<float>(1024).blocks == 1);   // 256 packs of 4
  CHECK(chorus::reduce_launch_shape<float>(1025).blocks == 2);
  CHECK(chorus::reduce_launch_shape<std::int8_t>(4096).blocks == 1);
  CHECK(chorus::finalize_avg_launch_shape(257).blocks == 2);
  CHECK(chorus::finalize_avg_launch_shape(std::size_t{1} << 40).blocks == DeviceReduceTuning::kMaxBlocks);
  CHECK(chorus::reduce_launch_shape<double>(7).threads == DeviceReduceTuning::kThreadsPerBlock);

  float x[4] = {1, 2, 3, 4};
  auto code_of = [](auto&& f) {
    try {
      f();
    } catch (const chorus::Error& e) {
      return static_cast<int>(e.code());
    }
    return -1;
  };
  const int invalid = static_cast<int>(chorus::ErrorCode::invalid_argument);
  CHECK(code_of([&] { chorus::device::emulate_reduce(ReduceOp::band, DataType::float32, x, x, x, 4); }) == invalid);
  CHECK(code_of([&] { chorus::device::emulate_reduce(static_cast<ReduceOp>(99), DataType::float32, x, x, x, 4); }) ==
        invalid);
  CHECK(code_of([&] { chorus::device::emulate_reduce(ReduceOp::sum, static_cast<DataType>(99), x, x, x, 4); }) ==
        invalid);
  CHECK(code_of([&] { chorus::device::emulate_finalize_avg(static_cast<DataType>(99), x, 4, 2); }) == invalid);
  CHECK(code_of([&] { chorus::device::emulate_finalize_avg(DataType::float32, x, 4, 0); }) == invalid);
  CHECK(x[0] == 1.0f);
  CHECK(x[3] == 4.0f);
}

namespace {

/// One emulated reduce_many of n random inputs against n - 1 chained emulated pairwise reduces of
/// copies of them; "" when they agree. `result_at`: the input out is (in place), or -1 for a
/// buffer of its own. `misaligned`: the inputs at odd element offsets (the element loop), else all
/// 16-byte aligned (packs, then the tail).
std::string check_many_case(ReduceOp op, DataType dt, int n, std::size_t count, int result_at, bool misaligned,
                            std::mt19937_64& rng) {
  const std::size_t size = chorus::size_of(dt);
  const std::size_t bytes = count * size;
  std::vector<std::vector<unsigned char>> init;
  std::vector<Buffer> inputs;
  inputs.reserve(static_cast<std::size_t>(n));
  for (int k = 0; k < n; ++k) {
    init.push_back(random_elements(dt, count, rng));
    const std::size_t offset = misaligned ? (static_cast<std::size_t>(k) * 3 + 1) * size % 16 / size * size : 0;
    inputs.emplace_back(bytes, offset);
    if (bytes != 0) std::memcpy(inputs.back().data(), init.back().data(), bytes);
  }
  Buffer out(bytes, 0);

  // The reference: the pairwise chain want = s0 op s1, want = want op s2, ... on copies.
  std::vector<unsigned char> want(bytes + 1);
  chorus::device::emulate_reduce(op, dt, want.data(), init[0].data(), init[1].data(), count);
  for (int k = 2; k < n; ++k)
    chorus::device::emulate_reduce(op, dt, want.data(), want.data(), init[static_cast<std::size_t>(k)].data(), count);

  std::array<const void*, chorus::kMaxReduceInputs> srcs{};
  for (int k = 0; k < n; ++k) srcs[static_cast<std::size_t>(k)] = inputs[static_cast<std::size_t>(k)].data();
  Buffer* result = result_at < 0 ? &out : &inputs[static_cast<std::size_t>(result_at)];
  chorus::device::emulate_reduce_many(op, dt, result->data(), srcs.data(), n, count);

  if (!out.guards_intact()) return "a byte outside out changed";
  if (result_at >= 0) {
    for (std::size_t k = 0; k < out.bytes(); ++k) {
      if (out.data()[k] != kSentinel) return "out was written although the result goes to an input";
    }
  }
  for (int k = 0; k < n; ++k) {
    const auto& in = inputs[static_cast<std::size_t>(k)];
    if (!in.guards_intact()) return "a byte outside input " + std::to_string(k) + " changed";
    if (k != result_at && bytes != 0 && std::memcmp(in.data(), init[static_cast<std::size_t>(k)].data(), bytes) != 0)
      return "input " + std::to_string(k) + " changed";
  }
  return first_difference(result->data(), want.data(), bytes, size);
}

}  // namespace

TEST_CASE("grid emulator: reduce_many kernel body equals the chained pairwise reduce, bit for bit") {
  // Every dtype and valid op, n = 2..kMaxReduceInputs, odd counts, aligned and misaligned inputs,
  // out a buffer of its own or each of the inputs in turn.
  std::mt19937_64 rng(20260405);
  int cases = 0;
  int failures = 0;
  for (DataType dt : chorus::kAllDataTypes) {
    if (!chorus::test::runs_dtype(dt))
      continue;  // six of the twelve under ASan, four under TSan (sanitized.hpp)
    for (ReduceOp op : kOps) {
      if (!chorus::is_valid_op(dt, op)) continue;
      for (int n = 2; n <= chorus::kMaxReduceInputs; ++n) {
        for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{13}, std::size_t{1031}}) {
          for (bool misaligned : {false, true}) {
            for (int result_at = -1; result_at < n; ++result_at) {
              const std::string bad = check_many_case(op, dt, n, count, result_at, misaligned, rng);
              ++cases;
              if (!bad.empty() && ++failures <= 10) {
                FAIL_CHECK(chorus::to_string(op) << " " << chorus::to_string(dt) << " n " << n << " count " << count
                                                 << (misaligned ? " misaligned" : " aligned") << " out "
                                                 << (result_at < 0 ? std::string("separate")
                                                                   : "== input " + std::to_string(result_at))
                                                 << ": " << bad);
              }
            }
          }
        }
      }
    }
  }
  CHECK(failures == 0);
  MESSAGE(cases << " cases");
}

TEST_CASE("grid emulator: reduce_many folds the inputs in their order") {
  // Float addition is not associative: reversing the inputs changes the result, so the test above
  // would see a body that folds them in another order.
  const float x[3][4] = {{1e20f, 1e20f, 1e20f, 1e20f}, {-1e20f, -1e20f, -1e20f, -1e20f}, {1.0f, 1.0f, 1.0f, 1.0f}};
  alignas(16) float out[4] = {};
  const void* in_order[] = {x[0], x[1], x[2]};
  chorus::device::emulate_reduce_many(ReduceOp::sum, DataType::float32, out, in_order, 3, 4);
  CHECK(out[0] == 1.0f);  // (1e20 + -1e20) + 1
  CHECK(out[3] == 1.0f);
  const void* reversed[] = {x[2], x[1], x[0]};
  chorus::device::emulate_reduce_many(ReduceOp::sum, DataType::float32, out, reversed, 3, 4);
  CHECK(out[0] == 0.0f);  // (1 + -1e20) + 1e20
}

TEST_CASE("grid emulator: reduce_many refuses input counts outside 2 to kMaxReduceInputs") {
  alignas(16) float x[4] = {1, 2, 3, 4};
  const void* srcs[chorus::kMaxReduceInputs + 1] = {x, x, x, x, x, x, x, x, x};
  auto code_of = [](auto&& f) {
    try {
      f();
    } catch (const chorus::Error& e) {
      return static_cast<int>(e.code());
    }
    return -1;
  };
  const int invalid = static_cast<int>(chorus::ErrorCode::invalid_argument);
  using chorus::device::emulate_reduce_many;
  for (std::size_t count : {std::size_t{0}, std::size_t{4}}) {
    CAPTURE(count);
    CHECK(code_of([&] { emulate_reduce_many(ReduceOp::sum, DataType::float32, x, srcs, 1, count); }) == invalid);
    CHECK(code_of([&] { emulate_reduce_many(ReduceOp::sum, DataType::float32, x, srcs, 9, count); }) == invalid);
    CHECK(code_of([&] { emulate_reduce_many(ReduceOp::sum, DataType::float32, x, srcs, 0, count); }) == invalid);
    CHECK(code_of([&] { emulate_reduce_many(ReduceOp::sum, DataType::float32, x, nullptr, 2, count); }) == invalid);
    CHECK(code_of([&] { emulate_reduce_many(ReduceOp::bor, DataType::float32, x, srcs, 2, count); }) == invalid);
    CHECK(code_of([&] { emulate_reduce_many(ReduceOp::sum, static_cast<DataType>(99), x, srcs, 2, count); }) ==
          invalid);
  }
  CHECK(x[0] == 1.0f);
  CHECK(x[3] == 4.0f);
  emulate_reduce_many(ReduceOp::sum, DataType::float32, x, srcs, 8, 4);  // 8 inputs: taken
  CHECK(x[0] == 8.0f);
  CHECK(x[3] == 32.0f);
}

TEST_CASE("grid emulator: the comparison sees a single wrong bit") {
  // The checks above would catch a wrong element: flip one bit of one emulated result.
  std::vector<unsigned char> a(40, 1);
  std::vector<unsigned char> b(a);
  CHECK(first_difference(a.data(), b.data(), a.size(), 4) == "");
  b[37] ^= 0x10;
  CHECK(first_difference(a.data(), b.data(), a.size(), 4).rfind("element 9 of 10", 0) == 0);
}

}  // namespace unit_test_kernels
