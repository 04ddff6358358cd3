// SPDX-License-Identifier: BSD-3-Clause
// Persistent collectives (chorus/persistent.hpp): one operation of every kind (all_reduce in place
// and out of place with every op that applies, reduce, reduce_scatter, broadcast, scatter, gather,
// all_gather, all_to_all, barrier) made once and started three times with new contents, by
// start() + wait(), start() + test() until true, and run(), with a plain call between the rounds;
// every dtype (six under ASan, four under TSan: support/sanitized.hpp), counts 0, 1, primes and
// 1031, checked bit for bit against support/fill.hpp. Ranks as threads over inproc (worlds 1-5)
// and tcp, as processes over shm (worlds 2 and 4: the one-shot path of small all_reduces);
// simulated-device buffers on a stream and blocking, ranks as threads on one device (worlds 1-5);
// starts inside a group. Errors, not hangs: a second start before the first completed, an
// operation that is not valid or whose communicator is gone, bad arguments at init, and a rank
// that starts another operation than its peers (mismatch on every rank).
#include "chorus/persistent.hpp"

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "chorus/communicator.hpp"
#include "chorus/group.hpp"
#include "chorus/testing/sim_runtime.hpp"
#include "support/communicators.hpp"
#include "support/device_threads.hpp"
#include "support/fill.hpp"
#include "support/modes.hpp"
#include "support/sanitized.hpp"
#include "support/spawn.hpp"

// This file's own names: the files of tests/collective/ are compiled together (unity build).
namespace collective_test_persistent {

namespace {

using chorus::DataType;
using chorus::ReduceOp;
using chorus::test::expect;

constexpr std::size_t kCounts[] = {0, 1, 2, 3, 7, 13, 31, 1031};
constexpr int kRounds = 3;

std::size_t count_at(int k) { return kCounts[static_cast<std::size_t>(k) % std::size(kCounts)]; }

template <class T>
void same(const std::vector<T>& got, const std::vector<T>& want, const std::string& what, int me) {
  chorus::test::check_equal<T>(std::span<const T>(got), std::span<const T>(want), what, me);
}

/// Starts `op` as round `r` says: start() + wait(), start() + test() until true, or run().
template <class Op>
void start_round(Op& op, int r) {
  switch (r % 3) {
    case 0:
      op.start();
      op.wait();
      break;
    case 1:
      op.start();
      while (!op.test()) {
      }
      break;
    default: op.run(); break;
  }
}

/// One operation of each kind on `c`, each started kRounds times with the contents of its round.
template <class T, class Comm>
void persistent_case(Comm& c, int salt) {
  const int n = c.size(), me = c.rank();
  const std::size_t un = static_cast<std::size_t>(n);
  const DataType dt = chorus::data_type_of<T>;
  const int root = salt % n, root2 = (salt + 1) % n;
  std::vector<ReduceOp> ops;
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max, ReduceOp::avg, ReduceOp::band,
                      ReduceOp::bor, ReduceOp::bxor})
    if (chorus::is_valid_op(dt, op)) ops.push_back(op);
  auto where = [&](const std::string& what, int r) {
    return "persistent " + what + " " + std::string(chorus::to_string(dt)) + " (world " + std::to_string(n) + ", start " +
           std::to_string(r) + ")";
  };
  auto seed = [&](int kind, int r) { return static_cast<std::uint64_t>(1000 * salt + 10 * kind + r); };

  // Buffers, made once: an operation's buffers stay where they are; only their contents change.
  struct Reduction {
    ReduceOp op;
    bool in_place;
    std::vector<T> in, out;
    chorus::Persistent<typename Comm::transport_type> p;
  };
  std::vector<Reduction> ars;
  int k = salt;
  for (ReduceOp op : ops)
    for (bool in_place : {true, false}) {
      Reduction r{op, in_place, std::vector<T>(count_at(k)), std::vector<T>(count_at(k)), {}};
      ++k;
      r.p = in_place ? c.all_reduce_init(r.in, op) : c.all_reduce_init(r.in, r.out, op);
      ars.push_back(std::move(r));
    }
  const std::size_t cnt = count_at(k + 1), cnt2 = count_at(k + 2);
  std::vector<T> red_in(cnt), red_out(me == root ? cnt : 0);
  auto red = c.reduce_init(red_in, red_out, ReduceOp::max, root);
  std::vector<T> rs_in(cnt2 * un), rs_out(cnt2);
  auto rs = c.reduce_scatter_init(rs_in, rs_out, ReduceOp::sum);
  std::vector<T> bc(cnt);
  auto bcast = c.broadcast_init(bc, root2);
  std::vector<T> sc_in(me == root ? cnt2 * un : 0), sc_out(cnt2);
  auto scat = c.scatter_init(sc_in, sc_out, root);
  std::vector<T> ga_in(cnt), ga_out(me == root2 ? cnt * un : 0);
  auto gath = c.gather_init(ga_in, ga_out, root2);
  std::vector<T> ag_in(cnt2), ag_out(cnt2 * un);
  auto ag = c.all_gather_init(ag_in, ag_out);
  std::vector<T> a2a_in(cnt * un), a2a_out(cnt * un);
  auto a2a = c.all_to_all_init(a2a_in, a2a_out);
  auto bar = c.barrier_init();
  std::vector<T> plain(count_at(k + 3));

  for (int r = 0; r < kRounds; ++r) {
    // Contents of this round, then every operation started once.
    for (std::size_t j = 0; j < ars.size(); ++j)
      for (std::size_t i = 0; i < ars[j].in.size(); ++i)
        ars[j].in[i] = chorus::test::input<T>(seed(static_cast<int>(j) + 20, r), n, me, i, ars[j].op);
    for (std::size_t i = 0; i < cnt; ++i) red_in[i] = chorus::test::input<T>(seed(1, r), n, me, i, ReduceOp::max);
    for (std::size_t i = 0; i < rs_in.size(); ++i) rs_in[i] = chorus::test::input<T>(seed(2, r), n, me, i, ReduceOp::sum);
    for (std::size_t i = 0; i < cnt; ++i)
      bc[i] = me == root2 ? chorus::test::pattern<T>(seed(3, r), root2, i) : chorus::test::pattern<T>(7, me, i);
    for (std::size_t i = 0; i < sc_in.size(); ++i) sc_in[i] = chorus::test::pattern<T>(seed(4, r), root, i);
    for (std::size_t i = 0; i < cnt; ++i) ga_in[i] = chorus::test::pattern<T>(seed(5, r), me, i);
    for (std::size_t i = 0; i < cnt2; ++i) ag_in[i] = chorus::test::pattern<T>(seed(6, r), me, i);
    for (std::size_t i = 0; i < a2a_in.size(); ++i) a2a_in[i] = chorus::test::pattern<T>(seed(7, r), me, i);
    for (std::size_t i = 0; i < plain.size(); ++i) plain[i] = chorus::test::input<T>(seed(8, r), n, me, i, ReduceOp::sum);

    for (Reduction& a : ars) start_round(a.p, r);
    start_round(red, r);
    c.all_reduce(plain, ReduceOp::sum);  // a plain call between the persistent ones
    start_round(rs, r);
    start_round(bcast, r);
    start_round(scat, r);
    start_round(bar, r);
    start_round(gath, r);
    start_round(ag, r);
    start_round(a2a, r);

    for (std::size_t j = 0; j < ars.size(); ++j) {
      const Reduction& a = ars[j];
      std::vector<T> want(a.in.size());
      for (std::size_t i = 0; i < want.size(); ++i)
        want[i] = chorus::test::expected_all_reduce<T>(seed(static_cast<int>(j) + 20, r), n, i, a.op);
      same(a.in_place ? a.in : a.out, want,
           where(std::string("all_reduce ") + std::string(chorus::to_string(a.op)) + (a.in_place ? " in place" : ""), r), me);
    }
    std::vector<T> want;
    if (me == root) {
      want.assign(cnt, T{});
      for (std::size_t i = 0; i < cnt; ++i) want[i] = chorus::test::expected_all_reduce<T>(seed(1, r), n, i, ReduceOp::max);
      same(red_out, want, where("reduce max", r), me);
    }
    want.assign(cnt2, T{});
    for (std::size_t i = 0; i < cnt2; ++i)
      want[i] = chorus::test::expected_all_reduce<T>(seed(2, r), n, static_cast<std::size_t>(me) * cnt2 + i, ReduceOp::sum);
    same(rs_out, want, where("reduce_scatter", r), me);
    want.assign(plain.size(), T{});
    for (std::size_t i = 0; i < want.size(); ++i) want[i] = chorus::test::expected_all_reduce<T>(seed(8, r), n, i, ReduceOp::sum);
    same(plain, want, where("plain all_reduce between them", r), me);
    want.assign(cnt, T{});
    for (std::size_t i = 0; i < cnt; ++i) want[i] = chorus::test::pattern<T>(seed(3, r), root2, i);
    same(bc, want, where("broadcast", r), me);
    want.assign(cnt2, T{});
    for (std::size_t i = 0; i < cnt2; ++i) want[i] = chorus::test::pattern<T>(seed(4, r), root, static_cast<std::size_t>(me) * cnt2 + i);
    same(sc_out, want, where("scatter", r), me);
    if (me == root2) {
      want.assign(cnt * un, T{});
      for (std::size_t p = 0; p < un; ++p)
        for (std::size_t i = 0; i < cnt; ++i) want[p * cnt + i] = chorus::test::pattern<T>(seed(5, r), static_cast<int>(p), i);
      same(ga_out, want, where("gather", r), me);
    }
    want.assign(cnt2 * un, T{});
    for (std::size_t p = 0; p < un; ++p)
      for (std::size_t i = 0; i < cnt2; ++i) want[p * cnt2 + i] = chorus::test::pattern<T>(seed(6, r), static_cast<int>(p), i);
    same(ag_out, want, where("all_gather", r), me);
    want.assign(cnt * un, T{});
    for (std::size_t p = 0; p < un; ++p)
      for (std::size_t i = 0; i < cnt; ++i)
        want[p * cnt + i] = chorus::test::pattern<T>(seed(7, r), static_cast<int>(p), static_cast<std::size_t>(me) * cnt + i);
    same(a2a_out, want, where("all_to_all", r), me);
  }
  expect(ars.empty() || ars[0].p.starts() == kRounds, "starts() counts every start, run() too");
}

template <class Comm>
void every_case(Comm& c) {
  for (DataType dt : chorus::test::matrix_dtypes())  // six of the twelve under ASan, four under TSan
    chorus::dispatch(dt, [&]<class T>(std::type_identity<T>) { persistent_case<T>(c, static_cast<int>(dt)); });
  c.barrier();
}

template <class M>
void run(int n) {
  chorus::test::run_world<M>(n, [](auto& comm, auto&) { every_case(comm); });
}

}  // namespace

TEST_CASE("persistent: every kind, dtype and op, started three times with new contents: inproc threads, worlds 1 to 5") {
  for (int n = 1; n <= 5; ++n) {
    CAPTURE(n);
    run<chorus::test::InprocThreads>(n);
  }
}

TEST_CASE("persistent: every kind, dtype and op, started three times with new contents: tcp threads, world 3") {
  run<chorus::test::TcpThreads>(3);
}

TEST_CASE("persistent: every kind, dtype and op, started three times with new contents: shm processes, worlds 2 and 4") {
  run<chorus::test::ShmProcesses>(2);
  run<chorus::test::ShmProcesses>(4);
}

/// Device buffers: an all_reduce in place on a stream, one out of place run() blocking, and a
/// broadcast on the stream, each made once per dtype and count and started twice with new
/// contents; ranks as threads of one process on one simulated device (the collective kernel).
template <class T>
void device_case(chorus::Communicator<chorus::inproc::Transport>& c, chorus::device::SimRuntime& rt, chorus::device::Stream s,
                 std::size_t count) {
  const int n = c.size(), me = c.rank();
  const DataType dt = chorus::data_type_of<T>;
  const std::size_t bytes = count * sizeof(T);
  auto* a = static_cast<T*>(rt.alloc_device(bytes));
  auto* in = static_cast<T*>(rt.alloc_device(bytes));
  auto* out = static_cast<T*>(rt.alloc_device(bytes));
  auto* bc = static_cast<T*>(rt.alloc_device(bytes));
  auto on_stream = c.persistent({chorus::CallKind::all_reduce, a, a, count, dt, ReduceOp::sum});
  auto blocking = c.persistent({chorus::CallKind::all_reduce, in, out, count, dt, ReduceOp::max});
  auto bcast = c.persistent({chorus::CallKind::broadcast, bc, bc, count, dt, ReduceOp::sum, n - 1});
  for (int r = 0; r < 2; ++r) {
    const std::uint64_t seed = count * 100 + static_cast<std::uint64_t>(dt) * 10 + static_cast<std::uint64_t>(r);
    std::vector<T> ha(count), hin(count), hbc(count);
    for (std::size_t i = 0; i < count; ++i) {
      ha[i] = chorus::test::input<T>(seed, n, me, i, ReduceOp::sum);
      hin[i] = chorus::test::input<T>(seed + 1, n, me, i, ReduceOp::max);
      hbc[i] = me == n - 1 ? chorus::test::pattern<T>(seed + 2, n - 1, i) : chorus::test::pattern<T>(3, me, i);
    }
    rt.copy(a, ha.data(), bytes, s);
    rt.copy(in, hin.data(), bytes, s);
    rt.copy(bc, hbc.data(), bytes, s);
    rt.synchronize(s);
    on_stream.start(s);
    bcast.start(s);
    blocking.run();
    on_stream.wait();
    bcast.wait();
    rt.synchronize(s);
    const std::string where = " " + std::string(chorus::to_string(dt)) + " count " + std::to_string(count) + " (world " +
                              std::to_string(n) + ", device, start " + std::to_string(r) + ")";
    std::vector<T> want(count);
    for (std::size_t i = 0; i < count; ++i) want[i] = chorus::test::expected_all_reduce<T>(seed, n, i, ReduceOp::sum);
    same(chorus::test::read_device(rt, a, count, s), want, "persistent all_reduce sum on a stream" + where,
         me);
    for (std::size_t i = 0; i < count; ++i) want[i] = chorus::test::expected_all_reduce<T>(seed + 1, n, i, ReduceOp::max);
    same(chorus::test::read_device(rt, out, count, s), want, "persistent all_reduce max, run()" + where, me);
    for (std::size_t i = 0; i < count; ++i) want[i] = chorus::test::pattern<T>(seed + 2, n - 1, i);
    same(chorus::test::read_device(rt, bc, count, s), want, "persistent broadcast on a stream" + where, me);
  }
  // Ranks as threads share the device: freeing waits for all of it, so no rank frees while a
  // peer's call may still run, and none starts its next call while one frees.
  c.barrier();
  for (T* d : {a, in, out, bc}) rt.free_device(d);
  c.barrier();
}

TEST_CASE("persistent: simulated-device buffers, on a stream and blocking, every dtype: ranks as threads on one device, worlds 1 to 5") {
  chorus::test::run_device_threads(5, [](auto& c, chorus::device::SimRuntime& rt, chorus::device::Stream s) {
    for (DataType dt : chorus::test::matrix_dtypes())
      chorus::dispatch(dt, [&]<class T>(std::type_identity<T>) {
        for (std::size_t count : {std::size_t(1), std::size_t(13), std::size_t(1031)}) device_case<T>(c, rt, s, count);
      });
  });
}

TEST_CASE("persistent: starts inside a group run at its end; a moved communicator keeps its operations") {
  chorus::test::run_world<chorus::test::InprocThreads>(3, [](auto& c0, auto&) {
    auto c = std::move(c0);  // the operations below are made on, and reach, the moved-to communicator
    const int n = c.size(), me = c.rank();
    std::vector<std::int32_t> a(5), b(7);
    auto pa = c.all_reduce_init(a, ReduceOp::sum);
    auto pb = c.all_reduce_init(b, ReduceOp::max);
    for (int r = 0; r < 3; ++r) {
      for (std::size_t i = 0; i < a.size(); ++i) a[i] = chorus::test::input<std::int32_t>(40 + r, n, me, i, ReduceOp::sum);
      for (std::size_t i = 0; i < b.size(); ++i) b[i] = chorus::test::input<std::int32_t>(50 + r, n, me, i, ReduceOp::max);
      c.group([&] {
        pa.start();
        pb.run();  // blocking forms return at once inside a group
        expect(!pa.request().state() || !pa.request().state()->done(), "nothing ran before group_end");
      });
      expect(pa.test() && pb.test(), "the group's persistent starts are complete after group_end");
      for (std::size_t i = 0; i < a.size(); ++i)
        expect(a[i] == chorus::test::expected_all_reduce<std::int32_t>(40 + r, n, i, ReduceOp::sum), "all_reduce sum in a group");
      for (std::size_t i = 0; i < b.size(); ++i)
        expect(b[i] == chorus::test::expected_all_reduce<std::int32_t>(50 + r, n, i, ReduceOp::max), "all_reduce max in a group");
    }
    auto moved = std::move(c);  // moved again: the operations follow it
    pa.run();
    moved.barrier();
  });
}

TEST_CASE("persistent: a second start before the first completed, an invalid operation, a destroyed communicator, bad arguments: errors") {
  chorus::test::run_world<chorus::test::InprocThreads>(2, [](auto& c, auto&) {
    using Tr = typename std::remove_reference_t<decltype(c)>::transport_type;
    const int me = c.rank();
    std::vector<float> v(4, static_cast<float>(me + 1));
    auto op = c.all_reduce_init(v, ReduceOp::sum);
    op.wait();  // nothing started: returns at once
    expect(op.test() && op.starts() == 0, "wait() and test() with nothing started");
    // Rank 1 starts only after rank 0 has been refused its second start: rank 0's first start
    // cannot have completed before.
    std::vector<int> token(1, 7);
    if (me == 0) {
      op.start();
      const auto e = chorus::test::expect_error(chorus::ErrorCode::invalid_argument, [&] { op.start(); }, "a second start");
      expect(std::string(e.what()).find("previous start") != std::string::npos, std::string("the error says why: ") + e.what());
      chorus::test::expect_error(chorus::ErrorCode::invalid_argument, [&] { op.run(); }, "run() while started");
      c.send(token, 1, 3);
    } else {
      c.recv(token, 0, 3);
      op.start();
    }
    op.wait();
    expect(v[0] == 3.0f && v[3] == 3.0f, "the first start's sum");
    op.start();  // again once complete
    op.wait();
    expect(v[0] == 6.0f && op.starts() == (me == 0 ? 2u : 2u), "the second start's sum");

    chorus::Persistent<Tr> none;
    expect(!none.valid(), "a default operation is not valid");
    chorus::test::expect_error(chorus::ErrorCode::invalid_argument, [&] { none.start(); }, "start() of an invalid operation");
    auto taken = std::move(op);
    chorus::test::expect_error(chorus::ErrorCode::invalid_argument, [&] { op.run(); }, "run() of a moved-from operation");
    taken.run();
    expect(v[0] == 12.0f, "the moved-to operation runs");

    std::vector<float> three(3);
    chorus::test::expect_error(chorus::ErrorCode::invalid_argument, [&] { (void)c.all_reduce_init(v, three, ReduceOp::sum); },
                               "all_reduce_init with sizes that differ");
    chorus::test::expect_error(chorus::ErrorCode::invalid_argument, [&] { (void)c.broadcast_init(v, 5); },
                               "broadcast_init with a root out of range");
    chorus::test::expect_error(chorus::ErrorCode::invalid_argument, [&] { (void)c.all_reduce_init(v, ReduceOp::band); },
                               "all_reduce_init of floats with band");
    chorus::test::expect_error(chorus::ErrorCode::invalid_argument,
                               [&] { (void)c.persistent(chorus::Call{.kind = chorus::CallKind::split}); },
                               "persistent(Call) of a kind that is no collective");

    chorus::Persistent<Tr> orphan;
    {
      auto sub = c.split(0, me);
      orphan = sub.all_reduce_init(v, ReduceOp::sum);
      orphan.run();
      expect(v[0] == 24.0f, "an operation of a split communicator");
    }
    const auto gone = chorus::test::expect_error(chorus::ErrorCode::invalid_argument, [&] { orphan.start(); },
                                                 "a start after its communicator was destroyed");
    expect(std::string(gone.what()).find("destroyed") != std::string::npos, std::string("the error says why: ") + gone.what());
    c.barrier();
  });
}

TEST_CASE("persistent: a rank that starts another operation than its peers gets mismatch, and so do they") {
  chorus::test::run_world<chorus::test::InprocThreads>(3, [](auto& c, auto&) {
    const int me = c.rank();
    std::vector<double> a(5, 1.0), b(5, 2.0);
    auto sum = c.all_reduce_init(a, ReduceOp::sum);
    auto bc = c.broadcast_init(b, 0);
    sum.run();  // agreed: every rank runs the sum
    expect(a[0] == 3.0, "the agreed start");
    const auto e = chorus::test::expect_error(
        chorus::ErrorCode::mismatch, [&] { me == 2 ? bc.run() : sum.run(); }, "rank 2 starts the broadcast, the others the sum");
    const std::string what = e.what();
    expect(what.find("all_reduce") != std::string::npos && what.find("broadcast") != std::string::npos,
           "the error names both calls: " + what);
  });
}

}  // namespace collective_test_persistent
