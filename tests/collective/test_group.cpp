// SPDX-License-Identifier: BSD-3-Clause
// Group calls (chorus/group.hpp): a group of collectives of every fusable kind (all_reduce with
// every op that applies, reduce, broadcast, all_gather, reduce_scatter, barrier), kinds that run
// one by one (scatter, gather, all_to_all, an all_reduce too large to fuse) and a ring of sends and
// receives written in opposite orders on odd and even ranks, blocking and async forms, counts 0,
// 1, primes and 1031, every dtype (six under ASan, four under TSan: support/sanitized.hpp),
// compared bit for bit with the references of support/fill.hpp; ranks as threads over inproc
// (worlds 1-5) and tcp, as processes over shm; simulated-device buffers on a stream and blocking
// (shm processes at world 3; ranks as threads on one device, worlds 1-5, every dtype).
// Blocking sends of 4 MiB both ways complete inside a group; a group that differs between ranks is
// mismatch on every rank naming both groups, and runs nothing; waiting inside the group, split
// inside it, a second thread's group, an abandoned group and a communicator destroyed with its
// group open are errors, not hangs.
#include "chorus/group.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "chorus/communicator.hpp"
#include "chorus/testing/sim_runtime.hpp"
#include "support/communicators.hpp"
#include "support/device_threads.hpp"
#include "support/fill.hpp"
#include "support/modes.hpp"
#include "support/sanitized.hpp"
#include "support/spawn.hpp"

// This file's own names: the files of tests/collective/ are compiled together (unity build).
namespace collective_test_group {

namespace {

using chorus::DataType;
using chorus::ReduceOp;
using chorus::test::expect;

constexpr std::size_t kCounts[] = {0, 1, 2, 3, 7, 13, 31, 1031};

std::size_t count_at(int k) { return kCounts[static_cast<std::size_t>(k) % std::size(kCounts)]; }

std::string where(const std::string& what, DataType dt, int n, int k) {
  return what + " " + std::string(chorus::to_string(dt)) + " in a group (world " + std::to_string(n) + ", call " +
         std::to_string(k) + ")";
}

template <class T>
void same(const std::vector<T>& got, const std::vector<T>& want, const std::string& what, int me) {
  chorus::test::check_equal<T>(std::span<const T>(got), std::span<const T>(want), what, me);
}

/// One group of every kind on `c`, its results checked against the references.
template <class T, class Comm>
void group_case(Comm& c, int round) {
  const int n = c.size(), me = c.rank();
  const std::size_t un = static_cast<std::size_t>(n);
  const DataType dt = chorus::data_type_of<T>;
  const int root = round % n, root2 = (round + 1) % n;
  std::vector<ReduceOp> ops;
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max, ReduceOp::avg, ReduceOp::band,
                      ReduceOp::bor, ReduceOp::bxor})
    if (chorus::is_valid_op(dt, op)) ops.push_back(op);

  // all_reduce: three calls per op (in place, out of place, async), each its own count and seed.
  struct Reduction {
    ReduceOp op;
    std::uint64_t seed;
    std::vector<T> in, out;
  };
  std::vector<Reduction> ars;
  int k = round;
  for (ReduceOp op : ops)
    for (int form = 0; form < 3; ++form, ++k) {
      Reduction r{op, 100 + static_cast<std::uint64_t>(k), std::vector<T>(count_at(k)), std::vector<T>(count_at(k))};
      for (std::size_t i = 0; i < r.in.size(); ++i) r.in[i] = chorus::test::input<T>(r.seed, n, me, i, op);
      ars.push_back(std::move(r));
    }
  // reduce (sum and max, root), broadcast (root2), all_gather, reduce_scatter (sum): two calls each.
  std::vector<Reduction> reds;
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::max})
    for (int j = 0; j < 2; ++j, ++k) {
      Reduction r{op, 200 + static_cast<std::uint64_t>(k), std::vector<T>(count_at(k)), {}};
      for (std::size_t i = 0; i < r.in.size(); ++i) r.in[i] = chorus::test::input<T>(r.seed, n, me, i, op);
      if (me == root) r.out.resize(r.in.size());
      reds.push_back(std::move(r));
    }
  std::vector<std::vector<T>> bcast(2), ag_in(2), ag_out(2), rs_in(2), rs_out(2);
  for (int j = 0; j < 2; ++j, ++k) {
    const std::size_t cnt = count_at(k + 3);
    bcast[j].resize(cnt);
    for (std::size_t i = 0; i < cnt; ++i)
      bcast[j][i] = me == root2 ? chorus::test::pattern<T>(300 + k, root2, i) : chorus::test::pattern<T>(7, me, i);
    ag_in[j].resize(cnt);
    ag_out[j].resize(cnt * un);
    for (std::size_t i = 0; i < cnt; ++i) ag_in[j][i] = chorus::test::pattern<T>(400 + k, me, i);
    rs_in[j].resize(cnt * un);
    rs_out[j].resize(cnt);
    for (std::size_t i = 0; i < rs_in[j].size(); ++i) rs_in[j][i] = chorus::test::input<T>(500 + k, n, me, i, ReduceOp::sum);
  }
  // One by one: a scatter, a gather, an all_to_all, and an all_reduce above the fusing bound.
  const std::size_t cnt = count_at(round + 5);
  std::vector<T> sc_in(me == root ? cnt * un : 0), sc_out(cnt), ga_out(me == root ? cnt * un : 0), ga_in(cnt);
  for (std::size_t i = 0; i < sc_in.size(); ++i) sc_in[i] = chorus::test::pattern<T>(600, root, i);
  for (std::size_t i = 0; i < cnt; ++i) ga_in[i] = chorus::test::pattern<T>(700, me, i);
  std::vector<T> a2a_in(cnt * un), a2a_out(cnt * un);
  for (std::size_t i = 0; i < a2a_in.size(); ++i) a2a_in[i] = chorus::test::pattern<T>(800, me, i);
  std::vector<T> big((std::size_t(256) << 10) / sizeof(T) + 5);
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = chorus::test::input<T>(900, n, me, i, ReduceOp::max);
  // A ring of sends and receives: even ranks write the receive first, odd ranks the send.
  const int right = (me + 1) % n, left = (me + n - 1) % n;
  std::vector<T> ring_out(count_at(round + 7)), ring_in(count_at(round + 7));
  for (std::size_t i = 0; i < ring_out.size(); ++i) ring_out[i] = chorus::test::pattern<T>(1000, me, i);

  std::vector<chorus::Request> reqs;
  {
    chorus::Group g(c);
    expect(c.in_group(), "in_group() inside the group");
    if (n > 1 && me % 2 == 0) c.recv(ring_in, left, 5);
    for (std::size_t j = 0; j < ars.size(); ++j) {
      Reduction& r = ars[j];
      if (j % 3 == 0) {
        r.out = r.in;
        c.all_reduce(r.out, r.op);
      } else if (j % 3 == 1) {
        c.all_reduce(r.in, r.out, r.op);
      } else {
        reqs.push_back(c.all_reduce_async(r.in, r.out, r.op));
      }
    }
    c.barrier();
    for (Reduction& r : reds) c.reduce(r.in, r.out, r.op, root);
    for (int j = 0; j < 2; ++j) {
      c.broadcast(bcast[j], root2);
      reqs.push_back(c.all_gather_async(ag_in[j], ag_out[j]));
      c.reduce_scatter(rs_in[j], rs_out[j], ReduceOp::sum);
    }
    c.scatter(sc_in, sc_out, root);
    c.gather(ga_in, ga_out, root);
    c.all_to_all(a2a_in, a2a_out);
    c.all_reduce(big, ReduceOp::max);
    reqs.push_back(c.barrier_async());
    if (n > 1) {
      c.send(ring_out, right, 5);
      if (me % 2 == 1) c.recv(ring_in, left, 5);
    }
    g.end();
  }
  expect(!c.in_group(), "no group after end()");
  for (chorus::Request& r : reqs) expect(r.test(), "a request of the group is complete after end()");

  for (std::size_t j = 0; j < ars.size(); ++j) {
    std::vector<T> want(ars[j].out.size());
    for (std::size_t i = 0; i < want.size(); ++i) want[i] = chorus::test::expected_all_reduce<T>(ars[j].seed, n, i, ars[j].op);
    same(ars[j].out, want, where("all_reduce " + std::string(chorus::to_string(ars[j].op)), dt, n, static_cast<int>(j)), me);
  }
  for (std::size_t j = 0; j < reds.size(); ++j) {
    if (me != root) continue;
    std::vector<T> want(reds[j].out.size());
    for (std::size_t i = 0; i < want.size(); ++i) want[i] = chorus::test::expected_all_reduce<T>(reds[j].seed, n, i, reds[j].op);
    same(reds[j].out, want, where("reduce", dt, n, static_cast<int>(j)), me);
  }
  for (int j = 0; j < 2; ++j) {
    const int kj = round + static_cast<int>(ops.size()) * 3 + 4 + j;
    std::vector<T> want(bcast[j].size());
    for (std::size_t i = 0; i < want.size(); ++i) want[i] = chorus::test::pattern<T>(300 + kj, root2, i);
    same(bcast[j], want, where("broadcast", dt, n, j), me);
    const std::size_t c1 = ag_in[j].size();
    want.assign(c1 * un, T{});
    for (std::size_t p = 0; p < un; ++p)
      for (std::size_t i = 0; i < c1; ++i) want[p * c1 + i] = chorus::test::pattern<T>(400 + kj, static_cast<int>(p), i);
    same(ag_out[j], want, where("all_gather", dt, n, j), me);
    want.assign(c1, T{});
    for (std::size_t i = 0; i < c1; ++i)
      want[i] = chorus::test::expected_all_reduce<T>(500 + kj, n, static_cast<std::size_t>(me) * c1 + i, ReduceOp::sum);
    same(rs_out[j], want, where("reduce_scatter", dt, n, j), me);
  }
  std::vector<T> want(cnt);
  for (std::size_t i = 0; i < cnt; ++i) want[i] = chorus::test::pattern<T>(600, root, static_cast<std::size_t>(me) * cnt + i);
  same(sc_out, want, where("scatter", dt, n, 0), me);
  if (me == root) {
    want.assign(cnt * un, T{});
    for (std::size_t p = 0; p < un; ++p)
      for (std::size_t i = 0; i < cnt; ++i) want[p * cnt + i] = chorus::test::pattern<T>(700, static_cast<int>(p), i);
    same(ga_out, want, where("gather", dt, n, 0), me);
  }
  want.assign(cnt * un, T{});
  for (std::size_t p = 0; p < un; ++p)
    for (std::size_t i = 0; i < cnt; ++i)
      want[p * cnt + i] = chorus::test::pattern<T>(800, static_cast<int>(p), static_cast<std::size_t>(me) * cnt + i);
  same(a2a_out, want, where("all_to_all", dt, n, 0), me);
  want.assign(big.size(), T{});
  for (std::size_t i = 0; i < want.size(); ++i) want[i] = chorus::test::expected_all_reduce<T>(900, n, i, ReduceOp::max);
  same(big, want, where("all_reduce max (not fused: 256 KiB + 5 elements)", dt, n, 0), me);
  if (n > 1) {
    want.assign(ring_in.size(), T{});
    for (std::size_t i = 0; i < want.size(); ++i) want[i] = chorus::test::pattern<T>(1000, left, i);
    same(ring_in, want, where("recv from the left", dt, n, 0), me);
  }
}

template <class Comm>
void every_case(Comm& c) {
  for (DataType dt : chorus::test::matrix_dtypes())  // six of the twelve under ASan, four under TSan
    chorus::dispatch(dt, [&]<class T>(std::type_identity<T>) {
      for (int round = 0; round < 2; ++round) group_case<T>(c, round);
    });
  c.barrier();  // the communicator goes on as before
}

template <class M>
void run(int n) {
  chorus::test::run_world<M>(n, [](auto& comm, auto&) { every_case(comm); });
}

}  // namespace

TEST_CASE("group: every fusable kind, one by one kinds, sends and receives: ranks as threads over inproc, worlds 1 to 5") {
  for (int n = 1; n <= 5; ++n) {
    CAPTURE(n);
    run<chorus::test::InprocThreads>(n);
  }
}

TEST_CASE("group: every fusable kind, one by one kinds, sends and receives: tcp threads, world 3") {
  run<chorus::test::TcpThreads>(3);
}

TEST_CASE("group: every fusable kind, one by one kinds, sends and receives: shm processes, world 4") {
  run<chorus::test::ShmProcesses>(4);
}

TEST_CASE("group: blocking sends of 4 MiB both ways, written send first on both ranks, complete") {
  chorus::test::run_world<chorus::test::TcpThreads>(2, [](auto& c, auto&) {
    const int me = c.rank(), peer = 1 - me;
    std::vector<std::uint32_t> out(std::size_t(1) << 20), in(out.size());
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<std::uint32_t>(i * 2654435761u) ^ static_cast<std::uint32_t>(me);
    c.group([&] {
      c.send(out, peer, 9);
      c.recv(in, peer, 9);
    });
    for (std::size_t i = 0; i < in.size(); ++i)
      if (in[i] != (static_cast<std::uint32_t>(i * 2654435761u) ^ static_cast<std::uint32_t>(peer)))
        expect(false, "element " + std::to_string(i) + " of the message from rank " + std::to_string(peer));
  });
}

TEST_CASE("group: a group that differs between ranks is mismatch on every rank naming both groups, and runs nothing") {
  chorus::test::run_world<chorus::test::InprocThreads>(3, [](auto& c, auto&) {
    const int me = c.rank();
    std::vector<float> a(8, 1.0f), b(8, 2.0f);
    std::vector<chorus::Request> reqs;
    const auto e = chorus::test::expect_error(
        chorus::ErrorCode::mismatch,
        [&] {
          chorus::Group g(c);
          reqs.push_back(c.all_reduce_async(a, ReduceOp::sum));
          if (me == 2) reqs.push_back(c.broadcast_async(b, 0));  // rank 2's group: all_reduce, broadcast
          else reqs.push_back(c.all_reduce_async(b, ReduceOp::sum));
          g.end();
        },
        "rank 2's group differs");
    const std::string what = e.what();
    expect(what.find("2 all_reduce") != std::string::npos && what.find("1 all_reduce, 1 broadcast") != std::string::npos,
           "the error names both groups: " + what);
    expect(what.find(me == 2 ? "rank 0's has" : "rank 2's has") != std::string::npos, "the error names the other rank: " + what);
    for (chorus::Request& r : reqs)
      chorus::test::expect_error(chorus::ErrorCode::mismatch, [&] { r.wait(); }, "the group's requests carry it");
    expect(a[0] == 1.0f && b[0] == 2.0f, "nothing of the group ran");
    c.all_reduce(a, ReduceOp::sum);  // the communicator goes on
    expect(a[0] == 3.0f, "an all_reduce after the mismatched group");
  });
}

TEST_CASE("group: waiting inside it, split inside it, group_end without a group, another thread's group, destroyed open: errors") {
  chorus::test::run_world<chorus::test::InprocThreads>(2, [](auto& c, auto&) {
    const int me = c.rank();
    std::vector<int> v(4, me + 1);
    c.group([&] {
      chorus::Request r = c.all_reduce_async(v, ReduceOp::sum);
      const auto e = chorus::test::expect_error(chorus::ErrorCode::invalid_argument, [&] { r.wait(); }, "a wait inside");
      expect(std::string(e.what()).find("group_end") != std::string::npos, std::string("the error says why: ") + e.what());
      chorus::test::expect_error(chorus::ErrorCode::invalid_argument, [&] { (void)c.split(0, me); }, "split inside");
      bool refused = false;
      std::thread other([&] {
        try {
          c.group_start();
        } catch (const chorus::Error& x) {
          refused = x.code() == chorus::ErrorCode::invalid_argument;
        }
      });
      other.join();
      expect(refused, "a second thread's group_start while one is open");
    });
    expect(v[0] == 3 && v[3] == 3, "the group's all_reduce ran at its end");
    chorus::test::expect_error(chorus::ErrorCode::invalid_argument, [&] { c.group_end(); }, "group_end without a group");
    // Nested: the outermost end runs it.
    c.group_start();
    c.group_start();
    c.all_reduce(v, ReduceOp::sum);
    c.group_end();
    expect(v[0] == 3 && c.in_group(), "an inner group_end runs nothing");
    c.group_end();
    expect(v[0] == 6, "the outer group_end runs the group");
    // Abandoned by an exception: its requests fail, nothing is sent, on every rank alike.
    chorus::Request r;
    try {
      c.group([&] {
        r = c.all_reduce_async(v, ReduceOp::sum);
        throw std::runtime_error("the caller's own error");
      });
    } catch (const std::runtime_error&) {
    }
    chorus::test::expect_error(chorus::ErrorCode::invalid_argument, [&] { r.wait(); }, "an abandoned group's request");
    expect(!c.in_group() && v[0] == 6, "the abandoned group ran nothing");
    // A communicator destroyed with its group open: the group's requests fail at once.
    chorus::Request orphan;
    {
      auto sub = c.split(0, me);
      sub.group_start();
      orphan = sub.all_reduce_async(v, ReduceOp::sum);
    }
    chorus::test::expect_error(chorus::ErrorCode::aborted, [&] { orphan.wait(); },
                               "a request of a communicator destroyed with its group open");
    expect(v[0] == 6, "the destroyed communicator's group ran nothing");
    c.barrier();
  });
}

TEST_CASE("group: simulated-device buffers, on a stream and blocking: shm processes, world 3") {
  chorus::test::run_processes(3, [](int, chorus::Options o) {
    chorus::device::SimRuntime rt;  // outlives the communicator
    auto c = chorus::Communicator<chorus::shm::Transport>::create(std::move(o));
    c.set_device_runtime(&rt);
    const int n = c.size(), me = c.rank();
    const chorus::device::Stream s = rt.create_stream();
    for (std::size_t count : {std::size_t(1), std::size_t(13), std::size_t(1031)}) {
      std::vector<float> host(count);
      for (std::size_t i = 0; i < count; ++i) host[i] = chorus::test::input<float>(count, n, me, i, ReduceOp::sum);
      auto* a = static_cast<float*>(rt.alloc_device(count * sizeof(float)));
      auto* b = static_cast<float*>(rt.alloc_device(count * sizeof(float)));
      rt.copy(a, host.data(), count * sizeof(float), s);
      rt.copy(b, host.data(), count * sizeof(float), s);
      rt.synchronize(s);
      chorus::Request on_stream;
      c.group([&] {
        on_stream = c.all_reduce(a, a, count, DataType::float32, ReduceOp::sum, s);
        c.all_reduce(std::span<float>(b, count), ReduceOp::sum);  // blocking, default stream
      });
      on_stream.wait();
      rt.synchronize(s);
      for (float* d : {a, b}) {
        std::vector<float> got(count), want(count);
        rt.copy(got.data(), d, count * sizeof(float), s);
        rt.synchronize(s);
        for (std::size_t i = 0; i < count; ++i) want[i] = chorus::test::expected_all_reduce<float>(count, n, i, ReduceOp::sum);
        same(got, want, where(d == a ? "all_reduce on a stream" : "all_reduce blocking", DataType::float32, n, 0), me);
      }
      rt.free_device(a);
      rt.free_device(b);
    }
    rt.destroy_stream(s);
    c.barrier();
  });
}

/// Device buffers in one group: an all_reduce in place on a stream, one out of place blocking (the
/// default stream), a broadcast and a reduce_scatter on the stream; ranks as threads of one process
/// on one simulated device (the collective kernel).
template <class T>
void device_group_case(chorus::Communicator<chorus::inproc::Transport>& c, chorus::device::SimRuntime& rt,
                       chorus::device::Stream s, std::size_t count) {
  const int n = c.size(), me = c.rank();
  const std::size_t un = static_cast<std::size_t>(n);
  const DataType dt = chorus::data_type_of<T>;
  const std::uint64_t seed = count * 100 + static_cast<std::uint64_t>(dt);
  std::vector<T> ha(count), hin(count), hbc(count), hrs(count * un);
  for (std::size_t i = 0; i < count; ++i) {
    ha[i] = chorus::test::input<T>(seed, n, me, i, ReduceOp::sum);
    hin[i] = chorus::test::input<T>(seed + 1, n, me, i, ReduceOp::max);
    hbc[i] = me == n - 1 ? chorus::test::pattern<T>(seed + 2, n - 1, i) : chorus::test::pattern<T>(3, me, i);
  }
  for (std::size_t i = 0; i < hrs.size(); ++i) hrs[i] = chorus::test::input<T>(seed + 3, n, me, i, ReduceOp::sum);
  const std::vector<T> zeros(count);  // lives until the stream has read it (synchronize below)
  auto upload = [&](const std::vector<T>& h) {
    auto* d = static_cast<T*>(rt.alloc_device(h.size() * sizeof(T)));
    rt.copy(d, h.data(), h.size() * sizeof(T), s);
    return d;
  };
  T* a = upload(ha);
  T* in = upload(hin);
  T* out = upload(zeros);
  T* bc = upload(hbc);
  T* rs_in = upload(hrs);
  T* rs_out = upload(zeros);
  rt.synchronize(s);
  std::vector<chorus::Request> on_stream;
  c.group([&] {
    on_stream.push_back(c.all_reduce(a, a, count, dt, ReduceOp::sum, s));
    c.all_reduce(in, out, count, dt, ReduceOp::max);  // blocking, on the default stream
    on_stream.push_back(c.broadcast(bc, count, dt, n - 1, s));
    on_stream.push_back(c.reduce_scatter(rs_in, rs_out, count, dt, ReduceOp::sum, s));
  });
  for (chorus::Request& r : on_stream) r.wait();
  rt.synchronize(s);
  const std::string at = " " + std::string(chorus::to_string(dt)) + " count " + std::to_string(count) + " in a group (world " +
                         std::to_string(n) + ", device)";
  std::vector<T> want(count);
  for (std::size_t i = 0; i < count; ++i) want[i] = chorus::test::expected_all_reduce<T>(seed, n, i, ReduceOp::sum);
  same(chorus::test::read_device(rt, a, count, s), want, "all_reduce sum on a stream" + at, me);
  for (std::size_t i = 0; i < count; ++i) want[i] = chorus::test::expected_all_reduce<T>(seed + 1, n, i, ReduceOp::max);
  same(chorus::test::read_device(rt, out, count, s), want, "all_reduce max, blocking" + at, me);
  for (std::size_t i = 0; i < count; ++i) want[i] = chorus::test::pattern<T>(seed + 2, n - 1, i);
  same(chorus::test::read_device(rt, bc, count, s), want, "broadcast on a stream" + at, me);
  for (std::size_t i = 0; i < count; ++i)
    want[i] = chorus::test::expected_all_reduce<T>(seed + 3, n, static_cast<std::size_t>(me) * count + i, ReduceOp::sum);
  same(chorus::test::read_device(rt, rs_out, count, s), want, "reduce_scatter on a stream" + at, me);
  // Ranks as threads share the device: freeing waits for all of it, so no rank frees while a
  // peer's call may still run, and none starts its next call while one frees.
  c.barrier();
  for (T* d : {a, in, out, bc, rs_in, rs_out}) rt.free_device(d);
  c.barrier();
}

TEST_CASE("group: simulated-device buffers, on a stream and blocking, every dtype: ranks as threads on one device, worlds 1 to 5") {
  chorus::test::run_device_threads(5, [](auto& c, chorus::device::SimRuntime& rt, chorus::device::Stream s) {
    for (DataType dt : chorus::test::matrix_dtypes())  // six of the twelve under ASan, four under TSan
      chorus::dispatch(dt, [&]<class T>(std::type_identity<T>) {
        for (std::size_t count : {std::size_t(1), std::size_t(13), std::size_t(1031)}) device_group_case<T>(c, rt, s, count);
      });
  });
}

}  // namespace collective_test_group
