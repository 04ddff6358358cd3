// SPDX-License-Identifier: BSD-3-Clause
// device::SimRuntime: the host implementation of the device runtime seam. Stream order, stream
// independence, events, cross-stream waits, flags, memory kinds, the compute-sanitizer-like checks,
// sticky errors and fault injection; reduce_many, and the executors' reduce_many on top of it.
#include "chorus/testing/sim_runtime.hpp"

#include <doctest/doctest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "chorus/exec/device.hpp"
#include "chorus/exec/host.hpp"
#include "chorus/reduce/host.hpp"
#include "support/sanitized.hpp"
#include "support/spawn.hpp"

namespace unit_test_sim_runtime {

using chorus::DataType;
using chorus::Error;
using chorus::ErrorCode;
using chorus::MemoryKind;
using chorus::ReduceOp;
using chorus::device::Event;
using chorus::device::SimRuntime;
using chorus::device::Stream;
using Clock = std::chrono::steady_clock;

constexpr std::uint64_t kLong = std::uint64_t(60) * 1000 * 1000 * 1000;  // 60 s: "never" in a test

// The text of the chorus::Error with `code` that `f` throws (chorus::test::Failure otherwise).
template <class F>
std::string error_of(F&& f, ErrorCode code = ErrorCode::system) {
  return chorus::test::expect_error(code, std::forward<F>(f), "the call").what();
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// A flag word in pinned memory, 0 (not set).
std::uint32_t* new_flag(SimRuntime& rt) {
  auto* flag = static_cast<std::uint32_t*>(rt.alloc_pinned(sizeof(std::uint32_t)));
  *flag = 0;
  return flag;
}

void release(std::uint32_t* flag) { std::atomic_ref<std::uint32_t>(*flag).store(1, std::memory_order_release); }

TEST_CASE("sim runtime: many operations on one stream apply in order") {
  SimRuntime rt;
  Stream s = rt.create_stream();
  const int steps = chorus::test::kSanitized ? 100 : 500;
  constexpr std::size_t n = 33;
  std::vector<std::int32_t> ones(n, 1);
  auto* acc = static_cast<std::int32_t*>(rt.alloc_device(n * 4));
  auto* one = static_cast<std::int32_t*>(rt.alloc_device(n * 4));
  rt.fill(acc, 0, n * 4, s);
  rt.copy(one, ones.data(), n * 4, s);
  // After the i-th reduce, a copy takes a snapshot: it sees exactly i + 1 in every element.
  std::vector<std::int32_t> snaps(std::size_t(steps) * n, -1);
  for (int i = 0; i < steps; ++i) {
    rt.reduce(ReduceOp::sum, DataType::int32, acc, acc, one, n, s);
    rt.copy(snaps.data() + std::size_t(i) * n, acc, n * 4, s);
  }
  rt.synchronize(s);
  int wrong = 0;
  for (int i = 0; i < steps; ++i)
    for (std::size_t k = 0; k < n; ++k) wrong += snaps[std::size_t(i) * n + k] != i + 1;
  CHECK(wrong == 0);
  rt.free_device(acc);
  rt.free_device(one);
  rt.destroy_stream(s);
}

TEST_CASE("sim runtime: a fill, a copy and a reduce give the expected bytes") {
  SimRuntime rt;
  for (Stream s : {Stream(nullptr), rt.create_stream()}) {
    constexpr std::size_t n = 1000;
    auto* a = static_cast<std::int32_t*>(rt.alloc_device(n * 4));
    auto* b = static_cast<std::int32_t*>(rt.alloc_device(n * 4));
    std::vector<std::int32_t> in(n), out(n, 0);
    std::iota(in.begin(), in.end(), 0);
    rt.fill(a, 0x01, n * 4, s);
    rt.copy(b, in.data(), n * 4, s);
    rt.reduce(ReduceOp::sum, DataType::int32, b, a, b, n, s);
    rt.copy(out.data(), b, n * 4, s);
    rt.synchronize(s);
    int wrong = 0;
    for (std::size_t i = 0; i < n; ++i) wrong += out[i] != 0x01010101 + std::int32_t(i);
    CHECK(wrong == 0);
    rt.free_device(a);
    rt.free_device(b);
    if (s != nullptr) rt.destroy_stream(s);
  }
}

TEST_CASE("sim runtime: reduce and finalize_avg give the host's bits") {
  SimRuntime rt;
  constexpr std::size_t n = 1000 + 17;
  std::vector<float> a(n), b(n), want(n), got(n);
  for (std::size_t i = 0; i < n; ++i) {
    a[i] = 0.1f * float(i) - 3.0f;
    b[i] = 1.0f / float(i + 1);
  }
  chorus::reduce(ReduceOp::sum, DataType::float32, want.data(), a.data(), b.data(), n);
  chorus::finalize_avg(DataType::float32, want.data(), n, 3);
  auto* da = rt.alloc_device(n * 4);
  auto* db = rt.alloc_device(n * 4);
  rt.copy(da, a.data(), n * 4, nullptr);
  rt.copy(db, b.data(), n * 4, nullptr);
  rt.reduce(ReduceOp::avg, DataType::float32, da, da, db, n, nullptr);
  rt.finalize_avg(DataType::float32, da, n, 3, nullptr);
  rt.copy(got.data(), da, n * 4, nullptr);
  rt.synchronize(Stream(nullptr));
  CHECK(std::memcmp(got.data(), want.data(), n * 4) == 0);
  rt.free_device(da);
  rt.free_device(db);
}

namespace {

/// Random bits for count elements of dt (NaNs, infinities and denormals among them for the floats).
std::vector<unsigned char> random_bytes(DataType dt, std::size_t count, std::mt19937_64& rng) {
  std::vector<unsigned char> v(count * chorus::size_of(dt));
  for (auto& b : v) b = static_cast<unsigned char>(rng() >> 11);
  return v;
}

/// The pairwise chain out = in[0] op in[1], out = out op in[2], ... on the host, from copies.
std::vector<unsigned char> chained(ReduceOp op, DataType dt, const std::vector<std::vector<unsigned char>>& in,
                                   int n, std::size_t count) {
  std::vector<unsigned char> want(count * chorus::size_of(dt) + 1);
  chorus::reduce(op, dt, want.data(), in[0].data(), in[1].data(), count);
  for (int k = 2; k < n; ++k) chorus::reduce(op, dt, want.data(), want.data(), in[std::size_t(k)].data(), count);
  return want;
}

}  // namespace

TEST_CASE("sim runtime: reduce_many equals the chained pairwise reduce, bit for bit") {
  // Every dtype and valid op, n = 2..kMaxReduceInputs, odd counts, out a buffer of its own and
  // each input in turn. The input array is overwritten right after the call: it is read there.
  SimRuntime rt;
  Stream s = rt.create_stream();
  constexpr std::size_t kMaxCount = 1031;
  constexpr int kMax = chorus::kMaxReduceInputs;
  std::vector<std::byte*> dev(std::size_t(kMax) + 1);
  for (auto& d : dev) d = static_cast<std::byte*>(rt.alloc_device(kMaxCount * 8));
  std::mt19937_64 rng(99);
  int cases = 0;
  int failures = 0;
  for (DataType dt : chorus::kAllDataTypes) {
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max, ReduceOp::avg, ReduceOp::band,
                        ReduceOp::bor, ReduceOp::bxor}) {
      if (!chorus::is_valid_op(dt, op)) continue;
      for (int n = 2; n <= kMax; ++n) {
        for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{13}, kMaxCount}) {
          const std::size_t bytes = count * chorus::size_of(dt);
          std::vector<std::vector<unsigned char>> in;
          for (int k = 0; k < n; ++k) in.push_back(random_bytes(dt, count, rng));
          const auto want = chained(op, dt, in, n, count);
          // out: its own buffer (dev[kMax]), then in place at input (cases % n).
          for (const int result_at : {-1, cases % n}) {
            std::array<const void*, kMax> srcs{};
            for (int k = 0; k < n; ++k) {
              rt.copy(dev[std::size_t(k)], in[std::size_t(k)].data(), bytes, s);
              srcs[std::size_t(k)] = dev[std::size_t(k)];
            }
            std::byte* out = result_at < 0 ? dev[std::size_t(kMax)] : dev[std::size_t(result_at)];
            rt.reduce_many(op, dt, out, srcs.data(), n, count, s);
            srcs.fill(nullptr);
            std::vector<unsigned char> got(bytes + 1);
            rt.copy(got.data(), out, bytes, s);
            rt.synchronize(s);
            ++cases;
            if (bytes != 0 && std::memcmp(got.data(), want.data(), bytes) != 0 && ++failures <= 10) {
              FAIL_CHECK(chorus::to_string(op) << " " << chorus::to_string(dt) << " n " << n << " count " << count
                                               << " out " << (result_at < 0 ? "separate" : "in place")
                                               << ": differs from the chained reduce");
            }
          }
        }
      }
    }
  }
  CHECK(failures == 0);
  MESSAGE(cases << " cases");
  for (auto* d : dev) rt.free_device(d);
  rt.destroy_stream(s);
}

TEST_CASE("sim runtime: reduce_many's checks, at the call and in the stream") {
  SimRuntime rt;
  constexpr std::size_t n = 16;
  auto* a = static_cast<std::byte*>(rt.alloc_device(n * 4));
  auto* b = static_cast<std::byte*>(rt.alloc_device(n * 4));
  auto* c = static_cast<std::byte*>(rt.alloc_device(n * 4));
  SUBCASE("input counts outside 2 to kMaxReduceInputs, or no array, throw at the call") {
    const void* srcs[chorus::kMaxReduceInputs + 1] = {a, b, c, a, b, c, a, b, c};
    for (std::size_t count : {std::size_t{0}, n}) {
      CAPTURE(count);
      for (int bad : {0, 1, chorus::kMaxReduceInputs + 1}) {
        CAPTURE(bad);
        CHECK(contains(error_of([&] { rt.reduce_many(ReduceOp::sum, DataType::int32, a, srcs, bad, count, nullptr); },
                                ErrorCode::invalid_argument),
                       "reduce_many"));
      }
      CHECK(contains(error_of([&] { rt.reduce_many(ReduceOp::sum, DataType::int32, a, nullptr, 2, count, nullptr); },
                              ErrorCode::invalid_argument),
                     "reduce_many"));
    }
    CHECK(contains(error_of([&] { rt.reduce_many(ReduceOp::band, DataType::float32, a, srcs, 3, n, nullptr); }),
                   "reduce_many_async: cudaErrorInvalidValue (1)"));
    rt.synchronize(Stream(nullptr));  // nothing reached the stream
  }
  SUBCASE("an input in host memory fails the stream with 700") {
    std::vector<std::int32_t> host(n, 1);
    const void* srcs[] = {a, b, host.data()};
    Stream s = rt.create_stream();
    rt.reduce_many(ReduceOp::sum, DataType::int32, c, srcs, 3, n, s);
    const std::string what = error_of([&] { rt.synchronize(s); });
    CHECK(contains(what, "reduce_many_async: cudaErrorIllegalAddress (700)"));
    CHECK(contains(what, "srcs[2]"));
    rt.destroy_stream(s);
  }
  SUBCASE("an input running past its device allocation fails the stream with 700") {
    const void* srcs[] = {a, b + 4, c};
    rt.reduce_many(ReduceOp::max, DataType::int32, a, srcs, 3, n, nullptr);
    const std::string what = error_of([&] { rt.synchronize(Stream(nullptr)); });
    CHECK(contains(what, "reduce_many_async: cudaErrorIllegalAddress (700)"));
    CHECK(contains(what, "srcs[1]"));
  }
  SUBCASE("out in host memory fails the stream with 700") {
    std::vector<std::int32_t> host(n, 1);
    const void* srcs[] = {a, b};
    rt.reduce_many(ReduceOp::sum, DataType::int32, host.data(), srcs, 2, n, nullptr);
    CHECK(contains(error_of([&] { rt.synchronize(Stream(nullptr)); }), "reduce_many_async: cudaErrorIllegalAddress (700)"));
    CHECK(host[0] == 1);
  }
  SUBCASE("fail_after(\"reduce_many\")") {
    const void* srcs[] = {a, b, c};
    rt.fail_after("reduce_many", 2, 719);
    rt.reduce_many(ReduceOp::sum, DataType::int32, a, srcs, 3, n, nullptr);  // 1st: runs
    rt.synchronize(Stream(nullptr));
    rt.reduce_many(ReduceOp::sum, DataType::int32, a, srcs, 3, n, nullptr);  // 2nd: fails in the stream
    CHECK(contains(error_of([&] { rt.synchronize(Stream(nullptr)); }), "reduce_many_async: cudaErrorLaunchFailure (719)"));
  }
}

TEST_CASE("exec: reduce_many of the host and device executors equals the chained reduce") {
  // The host executor chains its pairwise reduce block by block (out an input after the second goes
  // through a buffer); the device executor launches one reduce_many. Counts past the host's block,
  // out separate and at each input.
  SimRuntime rt;
  chorus::exec::HostExecutor host;
  chorus::exec::DeviceExecutor device(rt, std::chrono::milliseconds(60000));
  std::mt19937_64 rng(7);
  constexpr int kN = 5;
  for (DataType dt : {DataType::int8, DataType::float16, DataType::float32, DataType::float64}) {
    for (std::size_t count : {std::size_t{0}, std::size_t{3}, std::size_t{8191}, std::size_t{20011}}) {
      const std::size_t bytes = count * chorus::size_of(dt);
      std::vector<std::vector<unsigned char>> in;
      for (int k = 0; k < kN; ++k) in.push_back(random_bytes(dt, count, rng));
      const auto want = chained(ReduceOp::sum, dt, in, kN, count);
      for (int result_at = -1; result_at < kN; ++result_at) {
        CAPTURE(chorus::to_string(dt));
        CAPTURE(count);
        CAPTURE(result_at);
        // Host.
        auto copies = in;
        std::vector<unsigned char> out(bytes + 1);
        const std::byte* srcs[kN];
        for (int k = 0; k < kN; ++k) srcs[k] = reinterpret_cast<const std::byte*>(copies[std::size_t(k)].data());
        auto* result = result_at < 0 ? reinterpret_cast<std::byte*>(out.data())
                                     : reinterpret_cast<std::byte*>(copies[std::size_t(result_at)].data());
        host.reduce_many(ReduceOp::sum, dt, result, srcs, kN, count);
        CHECK((bytes == 0 || std::memcmp(result, want.data(), bytes) == 0));
        // Device.
        std::byte* dev[kN + 1];
        for (int k = 0; k <= kN; ++k) dev[k] = static_cast<std::byte*>(rt.alloc_device(bytes));
        for (int k = 0; k < kN; ++k) {
          rt.copy(dev[k], in[std::size_t(k)].data(), bytes, nullptr);
          srcs[k] = dev[k];
        }
        rt.synchronize(Stream(nullptr));
        std::byte* dev_out = result_at < 0 ? dev[kN] : dev[result_at];
        device.reduce_many(ReduceOp::sum, dt, dev_out, srcs, kN, count);
        device.end_call();
        std::vector<unsigned char> got(bytes + 1);
        rt.copy(got.data(), dev_out, bytes, nullptr);
        rt.synchronize(Stream(nullptr));
        CHECK((bytes == 0 || std::memcmp(got.data(), want.data(), bytes) == 0));
        for (auto* d : dev) rt.free_device(d);
      }
    }
  }
  const std::byte* one[1] = {nullptr};
  CHECK(contains(error_of([&] { host.reduce_many(ReduceOp::sum, DataType::int32, nullptr, one, 1, 0); },
                          ErrorCode::invalid_argument),
                 "reduce_many"));
  CHECK(contains(error_of([&] { device.reduce_many(ReduceOp::sum, DataType::int32, nullptr, one, 1, 0); },
                          ErrorCode::invalid_argument),
                 "reduce_many"));
}

TEST_CASE("sim runtime: a stream blocked on a flag does not block another") {
  SimRuntime rt;
  Stream blocked = rt.create_stream();
  Stream free_running = rt.create_stream();
  auto* flag = new_flag(rt);
  std::int32_t src = 42, dst_blocked = 0, dst_free = 0;
  Event after = rt.create_event();
  rt.wait_flag(blocked, flag, kLong);
  rt.copy(&dst_blocked, &src, 4, blocked);
  rt.record(after, blocked);
  rt.copy(&dst_free, &src, 4, free_running);
  rt.synchronize(free_running);  // returns although `blocked` waits
  CHECK(dst_free == 42);
  CHECK_FALSE(rt.query(after));
  release(flag);
  rt.synchronize(blocked);
  CHECK(rt.query(after));
  CHECK(dst_blocked == 42);
  rt.destroy_event(after);
  rt.destroy_stream(blocked);
  rt.destroy_stream(free_running);
  rt.free_pinned(flag);
}

TEST_CASE("sim runtime: a kernel's first launch while a wait_flag holds a stream is refused; loaded kernels are not") {
  // CUDA loads kernels lazily, and a load may wait for the whole device: on a GPU the reduce below
  // would wait for the wait_flag kernel, which waits for the host's release that comes after it.
  SimRuntime rt;
  Stream held = rt.create_stream();
  Stream work = rt.create_stream();
  auto* flag = new_flag(rt);
  auto* d = static_cast<std::int32_t*>(rt.alloc_device(8 * sizeof(std::int32_t)));
  rt.fill(d, 0, 8 * sizeof(std::int32_t), work);
  rt.reduce(ReduceOp::max, DataType::int32, d, d, d, 8, work);  // loads max/int32: nothing held yet
  rt.wait_flag(held, flag, kLong);
  rt.reduce(ReduceOp::max, DataType::int32, d, d, d, 8, work);  // already loaded: fine
  const std::string why = error_of([&] { rt.reduce(ReduceOp::sum, DataType::int32, d, d, d, 8, work); },
                                   ErrorCode::system);
  CHECK(contains(why, "reduce_async: cudaErrorLaunchFailure (719)"));
  CHECK(contains(why, "lazy loading"));
  CHECK(contains(why, "wait_flag"));
  // avg launches sum's kernel; the refused launch loaded nothing.
  CHECK(contains(error_of([&] { rt.reduce(ReduceOp::avg, DataType::int32, d, d, d, 8, work); }, ErrorCode::system),
                 "lazy loading"));
  release(flag);
  rt.synchronize(held);
  rt.reduce(ReduceOp::sum, DataType::int32, d, d, d, 8, work);  // nothing held: loads
  // A wait_value holds a stream the same way (a peer's step flag, in a direct collective).
  auto* word = static_cast<std::uint64_t*>(rt.alloc_device(sizeof(std::uint64_t)));
  auto* abort = new_flag(rt);
  rt.fill(word, 0, sizeof(std::uint64_t), work);
  rt.synchronize(work);
  rt.wait_value(held, word, 1, abort, 7, kLong);
  CHECK(contains(error_of([&] { rt.finalize_avg(DataType::int32, d, 8, 2, work); }, ErrorCode::system),
                 "finalize_avg_async: cudaErrorLaunchFailure (719)"));
  std::atomic_ref<std::uint64_t>(*word).store(1, std::memory_order_release);  // the simulated device is host memory
  rt.synchronize(held);
  CHECK(*abort == 0u);
  // After load_kernels every kernel is loaded: a first launch beside a held stream is fine.
  rt.load_kernels();
  auto* flag2 = new_flag(rt);
  rt.wait_flag(held, flag2, kLong);
  rt.reduce(ReduceOp::prod, DataType::float64, d, d, d, 4, work);
  rt.finalize_avg(DataType::int32, d, 8, 2, work);
  rt.synchronize(work);
  release(flag2);
  rt.synchronize(held);
  rt.free_device(d);
  rt.free_device(word);
  rt.free_pinned(abort);
  rt.free_pinned(flag);
  rt.free_pinned(flag2);
  rt.destroy_stream(held);
  rt.destroy_stream(work);
}

TEST_CASE("sim runtime: events mark queue positions; query and synchronize") {
  SimRuntime rt;
  Stream s = rt.create_stream();
  Event e = rt.create_event();
  CHECK(rt.query(e));  // never recorded: complete, as in CUDA
  rt.synchronize(e);
  auto* flag = new_flag(rt);
  Event before = rt.create_event();
  rt.record(before, s);
  rt.wait_flag(s, flag, kLong);
  rt.record(e, s);
  rt.synchronize(before);  // reached although the stream waits after it
  CHECK(rt.query(before));
  CHECK_FALSE(rt.query(e));
  // The event is not reached early: give the worker a moment it could misuse, then check again.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK_FALSE(rt.query(e));
  std::thread setter([&] { release(flag); });
  rt.synchronize(e);
  setter.join();
  CHECK(rt.query(e));
  // Recording again moves the event to the new position.
  *flag = 0;
  rt.wait_flag(s, flag, kLong);
  rt.record(e, s);
  CHECK_FALSE(rt.query(e));
  release(flag);
  rt.synchronize(e);
  CHECK(rt.query(e));
  rt.destroy_event(e);
  rt.destroy_event(before);
  rt.destroy_stream(s);
  rt.free_pinned(flag);
}

TEST_CASE("sim runtime: wait(stream, event) orders work across streams") {
  SimRuntime rt;
  Stream producer = rt.create_stream();
  Stream consumer = rt.create_stream();
  auto* flag = new_flag(rt);
  auto* d = static_cast<std::int32_t*>(rt.alloc_device(4));
  const std::int32_t seven = 7;
  std::int32_t out = 0;
  Event produced = rt.create_event();
  Event consumed = rt.create_event();
  rt.fill(d, 0, 4, producer);
  rt.wait_flag(producer, flag, kLong);
  rt.copy(d, &seven, 4, producer);
  rt.record(produced, producer);
  rt.wait(consumer, produced);
  rt.copy(&out, d, 4, consumer);
  rt.record(consumed, consumer);
  CHECK_FALSE(rt.query(consumed));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // it must not run early
  CHECK_FALSE(rt.query(consumed));
  CHECK(out == 0);
  release(flag);
  rt.synchronize(consumer);
  CHECK(out == 7);
  CHECK(rt.query(produced));
  // Waiting on an event never recorded is a no-op.
  Event never = rt.create_event();
  rt.wait(consumer, never);
  rt.synchronize(consumer);
  rt.destroy_event(never);
  rt.destroy_event(produced);
  rt.destroy_event(consumed);
  rt.free_device(d);
  rt.free_pinned(flag);
  rt.destroy_stream(producer);
  rt.destroy_stream(consumer);
}

TEST_CASE("sim runtime: wait_flag is released by a host store from another thread") {
  SimRuntime rt;
  Stream s = rt.create_stream();
  auto* flags = static_cast<std::uint32_t*>(rt.alloc_pinned(64));
  std::memset(flags, 0, 64);
  std::uint32_t payload_host = 0;
  auto* payload = static_cast<std::uint32_t*>(rt.alloc_pinned(4));
  *payload = 0;
  rt.wait_flag(s, flags + 3, kLong);
  rt.copy(&payload_host, payload, 4, s);  // reads what the host wrote before its release store
  const auto t0 = Clock::now();
  std::thread setter([&] {
    *payload = 0xabcd;
    release(flags + 3);
  });
  rt.synchronize(s);
  setter.join();
  CHECK(payload_host == 0xabcdu);
  CHECK(Clock::now() - t0 < std::chrono::seconds(30));
  rt.free_pinned(flags);
  rt.free_pinned(payload);
  rt.destroy_stream(s);
}

TEST_CASE("sim runtime: wait_flag gives up after its timeout and the stream goes on") {
  SimRuntime rt;
  Stream s = rt.create_stream();
  auto* flag = new_flag(rt);
  std::int32_t src = 5, dst = 0;
  const auto t0 = Clock::now();
  rt.wait_flag(s, flag, 30ull * 1000 * 1000);  // 30 ms
  rt.copy(&dst, &src, 4, s);
  rt.synchronize(s);  // no error: the caller reports a timed-out flag its own way
  CHECK(Clock::now() - t0 >= std::chrono::milliseconds(30));
  CHECK(dst == 5);
  // A flag that is already set does not wait at all (timeout 0 still loads once).
  release(flag);
  dst = 0;
  rt.wait_flag(s, flag, 0);
  rt.copy(&dst, &src, 4, s);
  rt.synchronize(s);
  CHECK(dst == 5);
  rt.free_pinned(flag);
  rt.destroy_stream(s);
}

/// What the step-flag tests use: a runtime, a stream, a zeroed 64-bit word of device memory and a
/// zeroed abort word of pinned memory, released at scope exit.
struct FlagRig {
  SimRuntime rt;
  Stream s = rt.create_stream();
  std::uint64_t* word = static_cast<std::uint64_t*>(rt.alloc_device(64));
  std::uint32_t* abort = new_flag(rt);
  FlagRig() {
    rt.fill(word, 0, 64, s);
    rt.synchronize(s);
  }
  ~FlagRig() {
    rt.free_device(word);
    rt.free_pinned(abort);
    rt.destroy_stream(s);
  }
  FlagRig(const FlagRig&) = delete;
  FlagRig& operator=(const FlagRig&) = delete;
};

TEST_CASE("sim runtime: wait_value waits for another stream's write_value and sees the work before it") {
  FlagRig rig;
  SimRuntime& rt = rig.rt;
  // The wait_flag and write_value below launch while the wait_value holds a stream: loaded lazily
  // they would wait for it (on a GPU; here they throw). tests/cuda/test_runtime.cpp's twin does the same.
  rt.load_kernels();
  Stream producer = rig.s;
  Stream consumer = rt.create_stream();
  std::uint64_t* word = rig.word;
  std::uint32_t* abort = rig.abort;
  auto* data = static_cast<std::uint32_t*>(rt.alloc_device(4));
  auto* gate = new_flag(rt);
  const std::uint32_t src = 0x1234;
  std::uint32_t got = 0;
  Event after = rt.create_event();
  rt.wait_value(consumer, word, 2, abort, 7, kLong);
  rt.copy(&got, data, 4, consumer);
  rt.record(after, consumer);
  rt.wait_flag(producer, gate, kLong);  // the producer holds until the consumer's wait is queued
  rt.copy(data, &src, 4, producer);
  rt.write_value(producer, word, 1);  // below the value waited for: the wait goes on
  CHECK_FALSE(rt.query(after));
  release(gate);
  rt.synchronize(producer);
  CHECK_FALSE(rt.query(after));
  rt.write_value(producer, word, 3);  // at least the value: the wait ends
  rt.synchronize(consumer);
  CHECK(got == src);
  CHECK(*abort == 0u);
  // A word already past the value does not wait at all.
  rt.wait_value(consumer, word, 3, abort, 7, 0);
  rt.synchronize(consumer);
  CHECK(*abort == 0u);
  rt.destroy_event(after);
  rt.free_device(data);
  rt.free_pinned(gate);
  rt.destroy_stream(consumer);
}

TEST_CASE("sim runtime: wait_value gives up on its timeout (storing on_timeout) and at once when aborted") {
  FlagRig rig;
  auto& [rt, s, word, abort] = rig;
  std::int32_t src = 5, dst = 0;
  auto t0 = Clock::now();
  rt.wait_value(s, word, 1, abort, 7, 30ull * 1000 * 1000);  // 30 ms
  rt.copy(&dst, &src, 4, s);
  rt.synchronize(s);  // no error: the caller reads the abort word
  CHECK(Clock::now() - t0 >= std::chrono::milliseconds(30));
  CHECK(dst == 5);
  CHECK(*abort == 7u);
  // The word is set: every later wait gives up at once, and leaves it as it is.
  t0 = Clock::now();
  rt.wait_value(s, word, 1, abort, 9, kLong);
  rt.synchronize(s);
  CHECK(Clock::now() - t0 < std::chrono::seconds(30));
  CHECK(*abort == 7u);
  // The host sets it while a wait runs: the wait ends, and does not store its on_timeout.
  *abort = 0;
  Event e = rt.create_event();
  rt.wait_value(s, word, 100, abort, 9, kLong);
  rt.record(e, s);
  CHECK_FALSE(rt.query(e));
  std::thread host([&] { std::atomic_ref<std::uint32_t>(*abort).store(0xffffffffu, std::memory_order_release); });
  rt.synchronize(s);
  host.join();
  CHECK(rt.query(e));
  CHECK(*abort == 0xffffffffu);
  rt.destroy_event(e);
}

TEST_CASE("sim runtime: write_value and wait_value check their words; fail_after and stall_after reach them") {
  FlagRig rig;
  auto& [rt, s, word, abort] = rig;
  std::uint64_t host_word = 0;
  std::uint32_t host_abort = 0;
  CHECK(contains(error_of([&] { rt.write_value(s, &host_word, 1); }), "not in a live device allocation"));
  CHECK(contains(error_of([&] { rt.write_value(s, reinterpret_cast<std::uint64_t*>(reinterpret_cast<std::byte*>(word) + 4), 1); }),
                 "not aligned"));
  CHECK(contains(error_of([&] { rt.wait_value(s, &host_word, 1, abort, 1, 0); }), "not in a live device allocation"));
  CHECK(contains(error_of([&] { rt.wait_value(s, word, 1, &host_abort, 1, 0); }), "not an aligned word of pinned memory"));
  CHECK(contains(error_of([&] { rt.wait_value(s, word, 1, abort, 0, 0); }), "on_timeout is 0"));
  rt.fail_after("wait_value", 1, 719);
  rt.wait_value(s, word, 0, abort, 1, 0);
  CHECK(contains(error_of([&] { rt.synchronize(s); }), "cudaLaunchKernel: cudaErrorLaunchFailure (719)"));
  Stream t = rt.create_stream();
  rt.stall_after("write_value", 2, std::chrono::milliseconds(50));
  const auto t0 = Clock::now();
  rt.write_value(t, word, 1);
  rt.write_value(t, word, 2);  // held 50 ms, then run
  rt.synchronize(t);
  CHECK(Clock::now() - t0 >= std::chrono::milliseconds(50));
  std::uint64_t back = 0;
  rt.copy(&back, word, 8, t);
  rt.synchronize(t);
  CHECK(back == 2u);
  CHECK(contains(error_of([&] { rt.stall_after("alloc_device", 1, std::chrono::milliseconds(1)); }, ErrorCode::invalid_argument),
                 "not a stream operation"));
  rt.destroy_stream(t);
}

TEST_CASE("sim runtime: kind_of says device exactly inside live device allocations") {
  SimRuntime rt;
  auto* d = static_cast<std::byte*>(rt.alloc_device(1000));
  auto* p = static_cast<std::byte*>(rt.alloc_pinned(1000));
  int on_stack = 0;
  std::vector<int> heap(10);
  CHECK(rt.kind_of(d) == MemoryKind::device);
  CHECK(rt.kind_of(d + 1) == MemoryKind::device);
  CHECK(rt.kind_of(d + 999) == MemoryKind::device);
  CHECK(rt.kind_of(d + 1000) == MemoryKind::host);  // one past the end
  CHECK(rt.kind_of(d - 1) == MemoryKind::host);
  CHECK(rt.kind_of(p) == MemoryKind::host);  // pinned memory is host memory
  CHECK(rt.kind_of(p + 10) == MemoryKind::host);
  CHECK(rt.kind_of(&on_stack) == MemoryKind::host);
  CHECK(rt.kind_of(heap.data()) == MemoryKind::host);
  CHECK(rt.kind_of(nullptr) == MemoryKind::host);
  CHECK(reinterpret_cast<std::uintptr_t>(p) % 64 == 0);
  CHECK(reinterpret_cast<std::uintptr_t>(d) % 256 == 0);
  // alloc_device(0): valid, unique, device.
  void* z1 = rt.alloc_device(0);
  void* z2 = rt.alloc_device(0);
  CHECK(z1 != nullptr);
  CHECK(z1 != z2);
  CHECK(rt.kind_of(z1) == MemoryKind::device);
  rt.free_device(z1);
  rt.free_device(z2);
  rt.free_device(d);
  CHECK(rt.kind_of(d) == MemoryKind::host);  // freed
  rt.free_pinned(p);
  // Two runtimes have arenas of their own.
  SimRuntime other;
  void* o = other.alloc_device(16);
  CHECK(other.kind_of(o) == MemoryKind::device);
  CHECK(rt.kind_of(o) == MemoryKind::host);
  other.free_device(o);
}

TEST_CASE("sim runtime: an out-of-bounds copy surfaces at synchronize and stays (sticky)") {
  SimRuntime rt;
  Stream s = rt.create_stream();
  Stream other = rt.create_stream();
  auto* d = rt.alloc_device(100);
  std::vector<std::byte> host(200, std::byte{1});
  Event e = rt.create_event();
  auto* flag = new_flag(rt);
  // Held by the flag until all is enqueued (a launch on a stream that has failed throws).
  rt.wait_flag(s, flag, kLong);
  rt.copy(d, host.data(), 200, s);  // enqueues fine: the check runs in the stream
  rt.record(e, s);
  release(flag);
  const std::string first = error_of([&] { rt.synchronize(s); });
  CHECK(contains(first, "cudaMemcpyAsync: cudaErrorInvalidValue (1)"));
  // Sticky: the next synchronize, a query of an event on the stream and a launch all throw it.
  CHECK(error_of([&] { rt.synchronize(s); }) == first);
  CHECK(error_of([&] { rt.query(e); }) == first);
  CHECK(error_of([&] { rt.synchronize(e); }) == first);
  CHECK(error_of([&] { rt.fill(d, 0, 10, s); }) == first);
  // Another stream is not affected.
  std::int32_t src = 3, dst = 0;
  rt.copy(&dst, &src, 4, other);
  rt.synchronize(other);
  CHECK(dst == 3);
  rt.destroy_event(e);
  rt.free_device(d);
  rt.free_pinned(flag);
  rt.destroy_stream(s);
  rt.destroy_stream(other);
}

TEST_CASE("sim runtime: work after a failed operation on its stream is skipped") {
  SimRuntime rt;
  Stream s = rt.create_stream();
  auto* flag = new_flag(rt);
  auto* d = rt.alloc_device(64);
  std::int32_t src = 9, dst = 0;
  rt.wait_flag(s, flag, kLong);      // so that both are queued before either runs
  rt.copy(d, &src, 128, s);          // out of bounds: fails
  rt.copy(&dst, &src, 4, s);         // skipped
  release(flag);
  CHECK(contains(error_of([&] { rt.synchronize(s); }), "cudaMemcpyAsync: cudaErrorInvalidValue (1)"));
  CHECK(dst == 0);
  rt.free_device(d);
  rt.free_pinned(flag);
  rt.destroy_stream(s);
}

TEST_CASE("sim runtime: the sanitizer checks of copies, fills and kernels") {
  SimRuntime rt;
  std::vector<std::byte> host(256);
  SUBCASE("null host side") {
    void* d = rt.alloc_device(64);
    rt.copy(d, nullptr, 8, nullptr);
    CHECK(contains(error_of([&] { rt.synchronize(Stream(nullptr)); }), "cudaMemcpyAsync: cudaErrorInvalidValue (1)"));
  }
  SUBCASE("interior pointer running past the end") {
    auto* d = static_cast<std::byte*>(rt.alloc_device(64));
    Stream s = rt.create_stream();
    rt.fill(d + 32, 0, 32, s);  // exactly to the end: fine
    rt.synchronize(s);
    rt.fill(d + 32, 0, 33, s);
    CHECK(contains(error_of([&] { rt.synchronize(s); }), "cudaMemsetAsync: cudaErrorInvalidValue (1)"));
  }
  SUBCASE("use after free") {
    void* d = rt.alloc_device(64);
    rt.free_device(d);
    rt.copy(host.data(), d, 8, nullptr);
    CHECK(contains(error_of([&] { rt.synchronize(Stream(nullptr)); }), "cudaMemcpyAsync: cudaErrorInvalidValue (1)"));
  }
  SUBCASE("past the end of a pinned buffer") {
    void* p = rt.alloc_pinned(16);
    void* d = rt.alloc_device(64);
    rt.copy(d, p, 32, nullptr);
    CHECK(contains(error_of([&] { rt.synchronize(Stream(nullptr)); }), "cudaMemcpyAsync: cudaErrorInvalidValue (1)"));
  }
  SUBCASE("a kernel on host memory") {
    void* d = rt.alloc_device(64);
    rt.reduce(ReduceOp::sum, DataType::float32, d, d, host.data(), 16, nullptr);
    CHECK(contains(error_of([&] { rt.synchronize(Stream(nullptr)); }), "reduce_async: cudaErrorIllegalAddress (700)"));
  }
  SUBCASE("a kernel past the end of device memory") {
    void* d = rt.alloc_device(64);
    rt.finalize_avg(DataType::float64, d, 9, 2, nullptr);
    CHECK(contains(error_of([&] { rt.synchronize(Stream(nullptr)); }),
                   "finalize_avg_async: cudaErrorIllegalAddress (700)"));
  }
}

TEST_CASE("sim runtime: invalid arguments throw at the call") {
  SimRuntime rt;
  CHECK(rt.device_count() == 1);
  rt.set_device(0);
  CHECK(rt.current_device() == 0);
  CHECK(contains(error_of([&] { rt.set_device(1); }), "cudaSetDevice: cudaErrorInvalidDevice (101)"));
  int x = 0;
  CHECK(contains(error_of([&] { rt.free_device(&x); }), "cudaFree: cudaErrorInvalidValue (1)"));
  auto* d = static_cast<std::byte*>(rt.alloc_device(64));
  CHECK(contains(error_of([&] { rt.free_device(d + 8); }), "cudaFree"));  // interior pointer
  CHECK(contains(error_of([&] { rt.free_pinned(&x); }), "cudaFreeHost: cudaErrorInvalidValue (1)"));
  rt.free_device(nullptr);
  rt.free_pinned(nullptr);
  CHECK(contains(error_of([&] { rt.wait_flag(nullptr, reinterpret_cast<std::uint32_t*>(&x), 0); }),
                 "cudaHostGetDevicePointer: cudaErrorInvalidValue (1)"));  // not pinned
  CHECK(contains(error_of([&] { rt.reduce(ReduceOp::band, DataType::float32, d, d, d, 4, nullptr); }),
                 "reduce_async: cudaErrorInvalidValue (1)"));
  CHECK(contains(error_of([&] { rt.finalize_avg(DataType::float32, d, 4, 0, nullptr); }),
                 "finalize_avg_async: cudaErrorInvalidValue (1)"));
  Stream s = rt.create_stream();
  rt.destroy_stream(s);
  CHECK(contains(error_of([&] { rt.copy(d, &x, 4, s); }), "cudaMemcpyAsync: cudaErrorInvalidResourceHandle (400)"));
  CHECK(contains(error_of([&] { rt.synchronize(s); }), "cudaStreamSynchronize: cudaErrorInvalidResourceHandle"));
  Event e = rt.create_event();
  rt.destroy_event(e);
  CHECK(contains(error_of([&] { rt.query(e); }), "cudaEventQuery: cudaErrorInvalidResourceHandle (400)"));
  CHECK(error_of([&] { rt.fail_after("launch", 1, 1); }, ErrorCode::invalid_argument).find("launch") !=
        std::string::npos);
  rt.synchronize(Stream(nullptr));  // nothing of the above reached the stream
  rt.free_device(d);
}

TEST_CASE("sim runtime: fail_after makes the n-th call fail") {
  SimRuntime rt;
  SUBCASE("stream work fails inside its stream") {
    Stream s = rt.create_stream();
    auto* d = static_cast<std::int32_t*>(rt.alloc_device(8));
    const std::int32_t v[2] = {11, 22};
    rt.fail_after("copy", 2, 700);
    rt.copy(d, v, 4, s);          // 1st: runs
    rt.copy(d + 1, v + 1, 4, s);  // 2nd: fails in the stream, not here
    CHECK(contains(error_of([&] { rt.synchronize(s); }), "cudaMemcpyAsync: cudaErrorIllegalAddress (700)"));
    std::int32_t back[2] = {0, 0};
    rt.copy(back, d, 8, nullptr);
    rt.synchronize(Stream(nullptr));
    CHECK(back[0] == 11);
    CHECK(back[1] != 22);
    rt.free_device(d);
    rt.destroy_stream(s);
  }
  SUBCASE("kernels") {
    void* d = rt.alloc_device(64);
    rt.fail_after("reduce", 1, 719);
    rt.reduce(ReduceOp::sum, DataType::int8, d, d, d, 64, nullptr);
    CHECK(contains(error_of([&] { rt.synchronize(Stream(nullptr)); }), "reduce_async: cudaErrorLaunchFailure (719)"));
  }
  SUBCASE("allocations fail at the call, once") {
    rt.fail_after("alloc_device", 2, 2);
    void* a = rt.alloc_device(16);
    CHECK(contains(error_of([&] { rt.alloc_device(16); }), "cudaMalloc: cudaErrorMemoryAllocation (2)"));
    void* b = rt.alloc_device(16);
    rt.free_device(a);
    rt.free_device(b);
    rt.fail_after("create_stream", 1, 100);  // a "no GPU" error is unsupported, as in CudaRuntime
    CHECK(contains(error_of([&] { rt.create_stream(); }, ErrorCode::unsupported),
                   "cudaStreamCreateWithFlags: cudaErrorNoDevice (100)"));
  }
  SUBCASE("from CHORUS_SIM_FAIL") {
    ::setenv("CHORUS_SIM_FAIL", "alloc_pinned:1:2,fill:2:1", 1);
    SimRuntime env_rt;
    ::unsetenv("CHORUS_SIM_FAIL");
    CHECK(contains(error_of([&] { env_rt.alloc_pinned(8); }), "cudaHostAlloc: cudaErrorMemoryAllocation (2)"));
    void* d = env_rt.alloc_device(8);
    env_rt.fill(d, 1, 8, nullptr);
    env_rt.synchronize(Stream(nullptr));
    env_rt.fill(d, 1, 8, nullptr);
    CHECK(contains(error_of([&] { env_rt.synchronize(Stream(nullptr)); }), "cudaMemsetAsync: cudaErrorInvalidValue (1)"));
  }
  SUBCASE("a CHORUS_SIM_FAIL that does not parse") {
    for (const char* bad : {"copy", "copy:0:1", "copy:1:x", "nosuchcall:1:1"}) {
      ::setenv("CHORUS_SIM_FAIL", bad, 1);
      const std::string what = error_of([] { SimRuntime r; }, ErrorCode::invalid_argument);
      CHECK(contains(what, bad));
    }
    ::unsetenv("CHORUS_SIM_FAIL");
  }
}

TEST_CASE("sim runtime: elapsed_ms between timing events is the workers' clock, monotone") {
  SimRuntime rt;
  Stream s = rt.create_stream();
  auto* flag = new_flag(rt);
  Event t0 = rt.create_event(true), t1 = rt.create_event(true), t2 = rt.create_event(true);
  rt.record(t0, s);
  rt.wait_flag(s, flag, 20ull * 1000 * 1000);  // 20 ms, never set
  rt.record(t1, s);
  rt.record(t2, s);
  CHECK(contains(error_of([&] { rt.elapsed_ms(t0, t2); }), "cudaEventElapsedTime: cudaErrorNotReady (600)"));
  rt.synchronize(t2);
  const float a = rt.elapsed_ms(t0, t1), b = rt.elapsed_ms(t0, t2), c = rt.elapsed_ms(t1, t2);
  CHECK(a >= 19.99f);
  CHECK(b >= a);
  CHECK(c >= 0.0f);
  CHECK(rt.elapsed_ms(t2, t0) <= 0.0f);
  // Recorded again: the time is the new record's, not that of the earlier one still queued.
  auto* hold = new_flag(rt);
  auto* hold2 = new_flag(rt);
  Event mid = rt.create_event();
  rt.wait_flag(s, hold, kLong);
  rt.record(t1, s);
  rt.record(mid, s);
  rt.wait_flag(s, hold2, kLong);
  rt.record(t1, s);
  release(hold);
  rt.synchronize(mid);  // the earlier record of t1 has passed, the later one not
  CHECK(contains(error_of([&] { rt.elapsed_ms(t0, t1); }), "cudaEventElapsedTime: cudaErrorNotReady (600)"));
  release(hold2);
  rt.synchronize(t1);
  CHECK(rt.elapsed_ms(t2, t1) >= 0.0f);
  Event plain = rt.create_event();
  rt.record(plain, s);
  rt.synchronize(s);
  CHECK(contains(error_of([&] { rt.elapsed_ms(t0, plain); }), "cudaEventElapsedTime: cudaErrorInvalidResourceHandle"));
  for (Event e : {t0, t1, t2, mid, plain}) rt.destroy_event(e);
  rt.free_pinned(flag);
  rt.free_pinned(hold);
  rt.free_pinned(hold2);
  rt.destroy_stream(s);
}

TEST_CASE("sim runtime: destroy_stream lets queued work finish; destruction does not hang") {
  std::int32_t src = 8, dst = 0;
  {
    SimRuntime rt;
    Stream s = rt.create_stream();
    auto* flag = new_flag(rt);
    Event done = rt.create_event();
    rt.wait_flag(s, flag, kLong);
    rt.copy(&dst, &src, 4, s);
    rt.record(done, s);
    rt.destroy_stream(s);  // returns at once
    CHECK_FALSE(rt.query(done));
    release(flag);
    rt.synchronize(done);
    CHECK(dst == 8);
    rt.destroy_event(done);
  }
  const auto t0 = Clock::now();
  {
    SimRuntime rt;
    Stream s = rt.create_stream();
    auto* flag = new_flag(rt);
    rt.alloc_device(1 << 20);  // left for the destructor
    rt.wait_flag(s, flag, kLong);
    for (int i = 0; i < 100; ++i) rt.copy(&dst, &src, 4, s);
    rt.wait_flag(nullptr, flag, kLong);
  }
  CHECK(Clock::now() - t0 < std::chrono::seconds(30));
}

TEST_CASE("sim runtime: threads share one runtime") {
  SimRuntime rt;
  const int threads = 4, rounds = chorus::test::kSanitized ? 20 : 100;
  std::atomic<int> wrong{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      Stream s = rt.create_stream();
      for (int r = 0; r < rounds; ++r) {
        const std::size_t n = 64 + std::size_t(r);
        std::vector<std::uint8_t> in(n, std::uint8_t(t * 16 + r)), out(n, 0);
        void* d = rt.alloc_device(n);
        rt.copy(d, in.data(), n, s);
        rt.reduce(ReduceOp::max, DataType::uint8, d, d, d, n, s);
        rt.copy(out.data(), d, n, s);
        rt.synchronize(s);
        if (out != in || rt.kind_of(d) != MemoryKind::device) ++wrong;
        rt.free_device(d);
      }
      rt.destroy_stream(s);
    });
  }
  for (auto& th : ts) th.join();
  CHECK(wrong.load() == 0);
}

TEST_CASE("sim runtime: the arena reuses freed addresses only after wrapping around") {
  SimRuntime rt(std::size_t(1) << 20);  // 256 pages
  void* first = rt.alloc_device(100);
  rt.free_device(first);
  void* second = rt.alloc_device(100);
  CHECK(second != first);  // a stale pointer to `first` stays dead
  rt.free_device(second);
  // Many more allocations than fit at once: freed ranges come back, nothing runs out.
  for (int i = 0; i < 1000; ++i) {
    void* p = rt.alloc_device(std::size_t(4096) * (1 + i % 7));
    CHECK(rt.kind_of(p) == MemoryKind::device);
    rt.free_device(p);
  }
  CHECK(contains(error_of([&] { rt.alloc_device(std::size_t(2) << 20); }), "cudaMalloc: cudaErrorMemoryAllocation (2)"));
}

}  // namespace unit_test_sim_runtime
