// SPDX-License-Identifier: BSD-3-Clause
// premul_sum (ReduceOp::premul_sum with Call::scalar, as NCCL's ncclRedOpCreatePreMulSum):
// all_reduce in place, out of place and async, reduce at every root, reduce_scatter; the floating
// dtypes (those of support/sanitized.hpp's subset under the sanitizers), counts 0, 1, primes and
// 1031, bit for bit against support/fill.hpp's sums scaled by the same power of two, and with a
// scalar of its own on each rank (rank + 1, exact) against a reference summed here; ranks as
// threads over inproc (worlds 1-5) and tcp, as processes over shm (worlds 2 and 4). A persistent
// operation reads its scalar at each start; calls in a group keep their own scalars. Device
// buffers (simulated runtime, ranks as threads on one device, worlds 1-5): all_reduce, reduce at
// every root and reduce_scatter, on a stream and blocking, with the scalar in host and in device
// memory. Errors: no scalar, an integer dtype, and a rank that calls sum where the others call
// premul_sum (mismatch on every rank).
#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "chorus/communicator.hpp"
#include "chorus/group.hpp"
#include "chorus/persistent.hpp"
#include "chorus/reduce/ops.hpp"
#include "chorus/testing/sim_runtime.hpp"
#include "support/communicators.hpp"
#include "support/device_threads.hpp"
#include "support/fill.hpp"
#include "support/modes.hpp"
#include "support/sanitized.hpp"
#include "support/spawn.hpp"

// This file's own names: the files of tests/collective/ are compiled together (unity build).
namespace collective_test_premul {

namespace {

using chorus::CallKind;
using chorus::DataType;
using chorus::ReduceOp;
using chorus::test::expect;

constexpr std::size_t kCounts[] = {0, 1, 2, 3, 7, 13, 31, 1031};

std::vector<DataType> float_dtypes() {
  std::vector<DataType> v;
  for (DataType dt : chorus::test::matrix_dtypes())
    if (chorus::is_valid_op(dt, ReduceOp::premul_sum)) v.push_back(dt);
  return v;
}

template <class T>
void same(const std::vector<T>& got, const std::vector<T>& want, const std::string& what, int me) {
  chorus::test::check_equal<T>(std::span<const T>(got), std::span<const T>(want), what, me);
}

/// fill.hpp's exact sum of element i, times `s` (a power of two: the scaled sum is exact too).
template <class T>
T scaled_sum(std::uint64_t seed, int n, std::size_t i, T s) {
  return chorus::Prod{}(chorus::test::expected_all_reduce<T>(seed, n, i, ReduceOp::sum), s);
}

/// Every kind with premul_sum on `c`, the same power-of-two scalar on every rank.
template <class T, class Comm>
void same_scalar_case(Comm& c, int salt) {
  const int n = c.size(), me = c.rank();
  const std::size_t un = static_cast<std::size_t>(n);
  const DataType dt = chorus::data_type_of<T>;
  const T s(salt % 2 == 0 ? 0.5f : 0.25f);
  auto where = [&](const std::string& what, std::size_t count) {
    return "premul_sum " + what + " " + std::string(chorus::to_string(dt)) + " count " + std::to_string(count) +
           " (world " + std::to_string(n) + ")";
  };
  for (std::size_t k = 0; k < std::size(kCounts); ++k) {
    const std::size_t count = kCounts[k];
    const std::uint64_t seed = 1000 * static_cast<std::uint64_t>(salt) + k;
    auto input = [&](std::uint64_t sd, std::size_t len) {
      std::vector<T> v(len);
      for (std::size_t i = 0; i < len; ++i) v[i] = chorus::test::input<T>(sd, n, me, i, ReduceOp::sum);
      return v;
    };
    std::vector<T> want(count);
    // all_reduce: in place, out of place, async.
    std::vector<T> inplace = input(seed, count), in = input(seed + 1, count), out(count), in2 = input(seed + 2, count),
                   out2(count);
    c.start({CallKind::all_reduce, inplace.data(), inplace.data(), count, dt, ReduceOp::premul_sum, -1, &s},
            chorus::CallMode::blocking);
    c.start({CallKind::all_reduce, in.data(), out.data(), count, dt, ReduceOp::premul_sum, -1, &s}, chorus::CallMode::blocking);
    chorus::Request r =
        c.start({CallKind::all_reduce, in2.data(), out2.data(), count, dt, ReduceOp::premul_sum, -1, &s}, chorus::CallMode::async);
    r.wait();
    for (std::size_t i = 0; i < count; ++i) want[i] = scaled_sum<T>(seed, n, i, s);
    same(inplace, want, where("all_reduce in place", count), me);
    for (std::size_t i = 0; i < count; ++i) want[i] = scaled_sum<T>(seed + 1, n, i, s);
    same(out, want, where("all_reduce out of place", count), me);
    expect(in == input(seed + 1, count), where("all_reduce leaves its input as it was", count));
    for (std::size_t i = 0; i < count; ++i) want[i] = scaled_sum<T>(seed + 2, n, i, s);
    same(out2, want, where("all_reduce async", count), me);
    // reduce at every root.
    for (int root = 0; root < n; ++root) {
      std::vector<T> rin = input(seed + 10 + static_cast<std::uint64_t>(root), count), rout(me == root ? count : 0);
      c.start({CallKind::reduce, rin.data(), rout.data(), count, dt, ReduceOp::premul_sum, root, &s}, chorus::CallMode::blocking);
      if (me != root) continue;
      for (std::size_t i = 0; i < count; ++i) want[i] = scaled_sum<T>(seed + 10 + static_cast<std::uint64_t>(root), n, i, s);
      same(rout, want, where("reduce root " + std::to_string(root), count), me);
    }
    // reduce_scatter.
    std::vector<T> rs_in = input(seed + 20, count * un), rs_out(count);
    c.start({CallKind::reduce_scatter, rs_in.data(), rs_out.data(), count, dt, ReduceOp::premul_sum, -1, &s},
            chorus::CallMode::blocking);
    for (std::size_t i = 0; i < count; ++i) want[i] = scaled_sum<T>(seed + 20, n, static_cast<std::size_t>(me) * count + i, s);
    same(rs_out, want, where("reduce_scatter", count), me);
  }
}

/// A scalar of its own on each rank (rank + 1) over small integers: every product and sum exact.
/// The fp8 types count exactly only up to 8 (E5M2) or 16 (E4M3): scalars 1 and 2 over -1, 0, 1,
/// whose partial sums stay within 7 for up to 5 ranks.
template <class T, class Comm>
void own_scalar_case(Comm& c) {
  const int n = c.size(), me = c.rank();
  const DataType dt = chorus::data_type_of<T>;
  constexpr bool kSmall = chorus::test::kIsFloat8<T>;
  auto scalar = [](int r) { return static_cast<float>(kSmall ? r % 2 + 1 : r + 1); };
  const T s(scalar(me));
  for (std::size_t count : {std::size_t(1), std::size_t(13), std::size_t(1031)}) {
    auto value = [](int r, std::size_t i) {
      return static_cast<float>(kSmall ? static_cast<int>(i % 3) - 1 : static_cast<int>(i % 7) - 3 + r);
    };
    std::vector<T> v(count), want(count);
    for (std::size_t i = 0; i < count; ++i) v[i] = T(value(me, i));
    c.start({CallKind::all_reduce, v.data(), v.data(), count, dt, ReduceOp::premul_sum, -1, &s}, chorus::CallMode::blocking);
    for (std::size_t i = 0; i < count; ++i) {
      float sum = 0;
      for (int r = 0; r < n; ++r) sum += scalar(r) * value(r, i);
      want[i] = T(sum);
    }
    same(v, want,
         "premul_sum all_reduce with each rank's own scalar " + std::string(chorus::to_string(dt)) + " count " +
             std::to_string(count) + " (world " + std::to_string(n) + ")",
         me);
  }
}

template <class Comm>
void every_case(Comm& c) {
  for (DataType dt : float_dtypes())
    chorus::dispatch(dt, [&]<class T>(std::type_identity<T>) {
      if constexpr (chorus::test::kIsFloat<T>) {
        same_scalar_case<T>(c, static_cast<int>(dt));
        own_scalar_case<T>(c);
      }
    });
  c.barrier();
}

template <class M>
void run(int n) {
  chorus::test::run_world<M>(n, [](auto& comm, auto&) { every_case(comm); });
}

}  // namespace

TEST_CASE("premul_sum: all_reduce, reduce and reduce_scatter, every floating dtype: inproc threads, worlds 1 to 5") {
  for (int n = 1; n <= 5; ++n) {
    CAPTURE(n);
    run<chorus::test::InprocThreads>(n);
  }
}

TEST_CASE("premul_sum: all_reduce, reduce and reduce_scatter, every floating dtype: tcp threads, world 3") {
  run<chorus::test::TcpThreads>(3);
}

TEST_CASE("premul_sum: all_reduce, reduce and reduce_scatter, every floating dtype: shm processes, worlds 2 and 4") {
  run<chorus::test::ShmProcesses>(2);
  run<chorus::test::ShmProcesses>(4);
}

TEST_CASE("premul_sum: a persistent operation reads its scalar at each start; calls in a group keep their own scalars") {
  chorus::test::run_world<chorus::test::InprocThreads>(3, [](auto& c, auto&) {
    const int n = c.size(), me = c.rank();
    std::vector<double> v(5);
    double s = 1;
    auto op = c.persistent({CallKind::all_reduce, v.data(), v.data(), v.size(), DataType::float64, ReduceOp::premul_sum, -1, &s});
    for (int r = 0; r < 3; ++r) {
      s = r == 0 ? 1.0 : r == 1 ? 0.5 : 4.0;
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(me + 1) + static_cast<double>(i);
      op.run();
      for (std::size_t i = 0; i < v.size(); ++i)
        expect(v[i] == s * (n * (n + 1) / 2.0 + n * static_cast<double>(i)), "persistent premul_sum start " + std::to_string(r));
    }
    std::vector<float> a(4, 1.0f), b(4, 1.0f);
    const float sa = 2.0f, sb = 0.25f;
    c.group([&] {
      c.start({CallKind::all_reduce, a.data(), a.data(), a.size(), DataType::float32, ReduceOp::premul_sum, -1, &sa},
              chorus::CallMode::async);
      c.start({CallKind::all_reduce, b.data(), b.data(), b.size(), DataType::float32, ReduceOp::premul_sum, -1, &sb},
              chorus::CallMode::async);
    });
    expect(a[0] == 2.0f * n && b[3] == 0.25f * n, "two premul_sums of one group, each with its scalar");
  });
}

TEST_CASE("premul_sum: no scalar, an integer dtype, and sum against premul_sum: errors") {
  chorus::test::run_world<chorus::test::InprocThreads>(2, [](auto& c, auto&) {
    const int me = c.rank();
    std::vector<float> v(3, 1.0f);
    std::vector<int> w(3, 1);
    const float s = 2.0f;
    const int si = 2;
    const auto e = chorus::test::expect_error(
        chorus::ErrorCode::invalid_argument,
        [&] { c.start({CallKind::all_reduce, v.data(), v.data(), v.size(), DataType::float32, ReduceOp::premul_sum}, chorus::CallMode::blocking); },
        "premul_sum without a scalar");
    expect(std::string(e.what()).find("scalar") != std::string::npos, std::string("the error says why: ") + e.what());
    chorus::test::expect_error(
        chorus::ErrorCode::invalid_argument,
        [&] { c.start({CallKind::all_reduce, w.data(), w.data(), w.size(), DataType::int32, ReduceOp::premul_sum, -1, &si}, chorus::CallMode::blocking); },
        "premul_sum of int32");
    c.barrier();  // the communicator goes on
    // Sum on rank 1, premul_sum on rank 0: mismatch on both, naming both ops.
    const auto m = chorus::test::expect_error(
        chorus::ErrorCode::mismatch,
        [&] {
          c.start({CallKind::all_reduce, v.data(), v.data(), v.size(), DataType::float32, me == 0 ? ReduceOp::premul_sum : ReduceOp::sum,
                   -1, &s},
                  chorus::CallMode::blocking);
        },
        "premul_sum against sum");
    expect(std::string(m.what()).find("premul_sum") != std::string::npos, std::string("the error names premul_sum: ") + m.what());
  });
}

/// Device buffers: all_reduce, reduce and reduce_scatter premul_sum on a stream (scalar in host
/// memory, then in device memory) and blocking; ranks as threads of one process on one simulated
/// device.
template <class T>
void device_case(chorus::Communicator<chorus::inproc::Transport>& c, chorus::device::SimRuntime& rt, chorus::device::Stream st,
                 std::size_t count) {
  const int n = c.size(), me = c.rank();
  const DataType dt = chorus::data_type_of<T>;
  const std::size_t bytes = count * sizeof(T);
  const T s(0.5f), s_dev_value(0.25f);
  const std::uint64_t seed = count * 10 + static_cast<std::uint64_t>(dt);
  std::vector<T> h(count);
  for (std::size_t i = 0; i < count; ++i) h[i] = chorus::test::input<T>(seed, n, me, i, ReduceOp::sum);
  auto* a = static_cast<T*>(rt.alloc_device(bytes));
  auto* b = static_cast<T*>(rt.alloc_device(bytes));
  auto* out = static_cast<T*>(rt.alloc_device(bytes));
  auto* s_dev = static_cast<T*>(rt.alloc_device(sizeof(T)));
  rt.copy(a, h.data(), bytes, st);
  rt.copy(b, h.data(), bytes, st);
  rt.copy(s_dev, &s_dev_value, sizeof(T), st);
  rt.synchronize(st);
  chorus::Request r1 = c.start({CallKind::all_reduce, a, a, count, dt, ReduceOp::premul_sum, -1, &s}, chorus::CallMode::async, st);
  chorus::Request r2 = c.start({CallKind::all_reduce, b, out, count, dt, ReduceOp::premul_sum, -1, s_dev}, chorus::CallMode::async, st);
  r1.wait();
  r2.wait();
  c.start({CallKind::all_reduce, b, b, count, dt, ReduceOp::premul_sum, -1, &s}, chorus::CallMode::blocking);  // default stream
  rt.synchronize(st);
  const std::string at = " " + std::string(chorus::to_string(dt)) + " count " + std::to_string(count) + " (world " +
                         std::to_string(n) + ", device)";
  std::vector<T> want(count);
  for (std::size_t i = 0; i < count; ++i) want[i] = scaled_sum<T>(seed, n, i, s);
  same(chorus::test::read_device(rt, a, count, st), want,
       "premul_sum all_reduce on a stream, scalar in host memory" + at, me);
  same(chorus::test::read_device(rt, b, count, st), want, "premul_sum all_reduce blocking" + at, me);
  for (std::size_t i = 0; i < count; ++i) want[i] = scaled_sum<T>(seed, n, i, s_dev_value);
  same(chorus::test::read_device(rt, out, count, st), want,
       "premul_sum all_reduce on a stream, scalar in device memory" + at, me);
  // reduce at every root (the scalar in host memory at even roots, in device memory at odd ones)
  // and reduce_scatter: off the root the input is scaled into device scratch, freed behind the call.
  const std::size_t un = static_cast<std::size_t>(n);
  std::vector<T> hr(count), hs(count * un);
  for (std::size_t i = 0; i < count; ++i) hr[i] = chorus::test::input<T>(seed + 1, n, me, i, ReduceOp::sum);
  for (std::size_t i = 0; i < hs.size(); ++i)
    hs[i] = chorus::test::input<T>(seed + 2, n, me, i, ReduceOp::sum);
  auto* rin = static_cast<T*>(rt.alloc_device(bytes));
  auto* rout = static_cast<T*>(rt.alloc_device(bytes));
  auto* sin = static_cast<T*>(rt.alloc_device(hs.size() * sizeof(T)));
  rt.copy(rin, hr.data(), bytes, st);
  rt.copy(sin, hs.data(), hs.size() * sizeof(T), st);
  rt.synchronize(st);
  for (int root = 0; root < n; ++root) {
    const T* scalar = root % 2 == 0 ? &s : s_dev;
    c.start({CallKind::reduce, rin, rout, count, dt, ReduceOp::premul_sum, root, scalar},
            chorus::CallMode::async, st)
        .wait();
    rt.synchronize(st);
    if (me != root) continue;
    for (std::size_t i = 0; i < count; ++i)
      want[i] = scaled_sum<T>(seed + 1, n, i, root % 2 == 0 ? s : s_dev_value);
    same(chorus::test::read_device(rt, rout, count, st), want,
         "premul_sum reduce on a stream, root " + std::to_string(root) + at, me);
  }
  same(chorus::test::read_device(rt, rin, count, st), hr, "premul_sum reduce leaves its input as it was" + at,
       me);
  c.start({CallKind::reduce_scatter, sin, out, count, dt, ReduceOp::premul_sum, -1, &s},
          chorus::CallMode::blocking);
  for (std::size_t i = 0; i < count; ++i)
    want[i] = scaled_sum<T>(seed + 2, n, static_cast<std::size_t>(me) * count + i, s);
  same(chorus::test::read_device(rt, out, count, st), want, "premul_sum reduce_scatter blocking" + at, me);
  c.start({CallKind::reduce_scatter, sin, rout, count, dt, ReduceOp::premul_sum, -1, s_dev},
          chorus::CallMode::async, st)
      .wait();
  for (std::size_t i = 0; i < count; ++i)
    want[i] = scaled_sum<T>(seed + 2, n, static_cast<std::size_t>(me) * count + i, s_dev_value);
  same(chorus::test::read_device(rt, rout, count, st), want,
       "premul_sum reduce_scatter on a stream, scalar in device memory" + at, me);
  c.barrier();  // ranks as threads share the device: no rank frees while a peer's call may run
  for (T* d : {a, b, out, s_dev, rin, rout, sin}) rt.free_device(d);
  c.barrier();
}

TEST_CASE(
    "premul_sum: simulated-device buffers, all_reduce, reduce at every root and reduce_scatter, on a stream "
    "and blocking, scalar in host or device memory: ranks as threads, worlds 1 to 5") {
  chorus::test::run_device_threads(5, [](auto& c, chorus::device::SimRuntime& rt, chorus::device::Stream st) {
    for (DataType dt : float_dtypes())
      chorus::dispatch(dt, [&]<class T>(std::type_identity<T>) {
        if constexpr (chorus::test::kIsFloat<T>)
          for (std::size_t count : {std::size_t(1), std::size_t(13), std::size_t(1031)})
            device_case<T>(c, rt, st, count);
      });
  });
}

}  // namespace collective_test_premul
