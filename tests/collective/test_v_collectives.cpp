// SPDX-License-Identifier: BSD-3-Clause
// The v-collectives (v_collectives.hpp): all_gather_v, gather_v, scatter_v and reduce_scatter_v
// with a count per rank (0, 1, primes, 1031), blocks back to back and at displacements (in reverse
// rank order, with gaps that must stay untouched), every dtype (six under ASan, four under TSan:
// support/sanitized.hpp) and, for reduce_scatter_v, every op that applies, compared bit for bit
// with the references of support/fill.hpp; ranks as threads over inproc (worlds 1-5) and tcp, as
// processes over shm; and the same cases on simulated-device buffers (device::SimRuntime, ranks as
// threads of one process, worlds 1-5: the buffers uploaded before the call, read back after, and
// mixed with host ones). Bad arguments are invalid_argument; counts that disagree between ranks are
// mismatch; two different v-collectives on two ranks time out (or see the other's abort after its
// timeout) naming the peer.
#include <doctest/doctest.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "chorus/all_to_all_v.hpp"
#include "chorus/communicator.hpp"
#include "chorus/v_collectives.hpp"
#include "support/communicators.hpp"
#include "support/device_threads.hpp"
#include "support/fill.hpp"
#include "support/modes.hpp"
#include "support/sanitized.hpp"
#include "support/spawn.hpp"

// This file's own names: the files of tests/collective/ are compiled together (unity build).
namespace collective_test_v_collectives {

namespace {

using chorus::DataType;
using chorus::ReduceOp;
using chorus::test::expect;

constexpr std::size_t kCounts[] = {0, 1, 2, 3, 7, 13, 31, 1031};

/// Rank p's count in round `round`: every entry of kCounts turns up across ranks and rounds.
std::size_t count_of(int p, int round) {
  return kCounts[static_cast<std::size_t>(p * 3 + round * 5 + 1) % std::size(kCounts)];
}

/// The layout of one round: counts, and displacements (empty: back to back) with the size of out.
struct Layout {
  std::vector<std::size_t> counts, displs;
  std::size_t total = 0;     ///< sum of counts
  std::size_t out_size = 0;  ///< elements out must hold
  std::size_t at(int p) const {
    std::size_t a = 0;
    if (!displs.empty()) return displs[static_cast<std::size_t>(p)];
    for (int q = 0; q < p; ++q) a += counts[static_cast<std::size_t>(q)];
    return a;
  }
};

/// Back to back, or (displaced) in reverse rank order with a gap of 2 elements before each block.
Layout layout(int n, int round, bool displaced) {
  Layout l;
  for (int p = 0; p < n; ++p) l.counts.push_back(count_of(p, round));
  for (auto c : l.counts) l.total += c;
  l.out_size = l.total;
  if (displaced) {
    l.displs.assign(static_cast<std::size_t>(n), 0);
    std::size_t a = 0;
    for (int p = n - 1; p >= 0; --p) {
      a += 2;
      l.displs[static_cast<std::size_t>(p)] = a;
      a += l.counts[static_cast<std::size_t>(p)];
    }
    l.out_size = a + 1;
  }
  return l;
}

std::string where(const char* op, DataType dt, int n, int round, bool displaced) {
  return std::string(op) + " " + std::string(chorus::to_string(dt)) + " (world " + std::to_string(n) + ", round " +
         std::to_string(round) + (displaced ? ", displaced)" : ")");
}

/// Where a case's buffers live: host memory, or the simulated device.
struct Place {
  chorus::device::SimRuntime* rt = nullptr;
  chorus::device::Stream st{};
  bool mixed = false;  ///< on the device: the outputs stay in host memory (inputs on the device)
};

/// A host vector as the call sees it: the vector itself, or a device copy of it (uploaded here,
/// read back into the vector by back()).
template <class T>
class At {
 public:
  At(const Place& pl, std::vector<T>& h, bool output) : pl_(pl), h_(h) {
    if (pl_.rt == nullptr || (output && pl_.mixed)) return;
    d_ = static_cast<T*>(pl_.rt->alloc_device(h.size() * sizeof(T)));
    if (!h.empty()) pl_.rt->copy(d_, h.data(), h.size() * sizeof(T), pl_.st);
    pl_.rt->synchronize(pl_.st);
  }
  At(const At&) = delete;
  At& operator=(const At&) = delete;
  ~At() {
    if (d_ != nullptr) pl_.rt->free_device(d_);
  }
  T* ptr() { return d_ != nullptr ? d_ : h_.data(); }
  void back() {
    if (d_ != nullptr) h_ = chorus::test::read_device(*pl_.rt, d_, h_.size(), pl_.st);
  }

 private:
  const Place& pl_;
  std::vector<T>& h_;
  T* d_ = nullptr;
};

template <class T>
T filler(std::size_t i) {
  return chorus::test::pattern<T>(0xF111, 99, i);
}

template <class T, class Comm>
void all_gather_v_case(Comm& c, int round, bool displaced, const Place& pl) {
  const int n = c.size(), me = c.rank();
  const Layout l = layout(n, round, displaced);
  const std::uint64_t seed = 1000 + static_cast<std::uint64_t>(round);
  std::vector<T> in(l.counts[me]), out(l.out_size), want(l.out_size);
  for (std::size_t i = 0; i < in.size(); ++i) in[i] = chorus::test::pattern<T>(seed, me, i);
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = want[i] = filler<T>(i);
  for (int p = 0; p < n; ++p)
    for (std::size_t i = 0; i < l.counts[p]; ++i) want[l.at(p) + i] = chorus::test::pattern<T>(seed, p, i);
  At<T> din(pl, in, false), dout(pl, out, true);
  chorus::all_gather_v(c, din.ptr(), in.size(), dout.ptr(), l.counts, l.displs, chorus::data_type_of<T>);
  dout.back();
  chorus::test::check_equal<T>(std::span<const T>(out), std::span<const T>(want),
                               where("all_gather_v", chorus::data_type_of<T>, n, round, displaced), me);
}

template <class T, class Comm>
void gather_v_case(Comm& c, int round, bool displaced, const Place& pl) {
  const int n = c.size(), me = c.rank(), root = round % n;
  const Layout l = layout(n, round, displaced);
  const std::uint64_t seed = 2000 + static_cast<std::uint64_t>(round);
  std::vector<T> in(l.counts[me]);
  for (std::size_t i = 0; i < in.size(); ++i) in[i] = chorus::test::pattern<T>(seed, me, i);
  At<T> din(pl, in, false);
  if (me != root) {  // the counts are the root's business: pass none
    chorus::gather_v(c, din.ptr(), in.size(), nullptr, {}, {}, chorus::data_type_of<T>, root);
    return;
  }
  std::vector<T> out(l.out_size), want(l.out_size);
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = want[i] = filler<T>(i);
  for (int p = 0; p < n; ++p)
    for (std::size_t i = 0; i < l.counts[p]; ++i) want[l.at(p) + i] = chorus::test::pattern<T>(seed, p, i);
  At<T> dout(pl, out, true);
  chorus::gather_v(c, din.ptr(), in.size(), dout.ptr(), l.counts, l.displs, chorus::data_type_of<T>, root);
  dout.back();
  chorus::test::check_equal<T>(std::span<const T>(out), std::span<const T>(want),
                               where("gather_v", chorus::data_type_of<T>, n, round, displaced), me);
}

template <class T, class Comm>
void scatter_v_case(Comm& c, int round, bool displaced, const Place& pl) {
  const int n = c.size(), me = c.rank(), root = (round + 1) % n;
  const Layout l = layout(n, round, displaced);
  const std::uint64_t seed = 3000 + static_cast<std::uint64_t>(round);
  std::vector<T> in, out(l.counts[me] + 1, filler<T>(7));
  if (me == root) {
    in.resize(l.out_size);
    for (std::size_t i = 0; i < in.size(); ++i) in[i] = filler<T>(i);
    for (int p = 0; p < n; ++p)
      for (std::size_t i = 0; i < l.counts[p]; ++i) in[l.at(p) + i] = chorus::test::pattern<T>(seed, p, i);
  }
  At<T> din(pl, in, false), dout(pl, out, true);
  chorus::scatter_v(c, me == root ? din.ptr() : nullptr,
                    me == root ? std::span<const std::size_t>(l.counts) : std::span<const std::size_t>(),
                    me == root ? std::span<const std::size_t>(l.displs) : std::span<const std::size_t>(),
                    dout.ptr(), l.counts[me], chorus::data_type_of<T>, root);
  dout.back();
  std::vector<T> want(out.size(), filler<T>(7));  // the element past the block stays
  for (std::size_t i = 0; i < l.counts[me]; ++i) want[i] = chorus::test::pattern<T>(seed, me, i);
  chorus::test::check_equal<T>(std::span<const T>(out), std::span<const T>(want),
                               where("scatter_v", chorus::data_type_of<T>, n, round, displaced), me);
}

template <class T, class Comm>
void reduce_scatter_v_case(Comm& c, int round, ReduceOp op, const Place& pl) {
  const int n = c.size(), me = c.rank();
  const Layout l = layout(n, round, false);
  const std::uint64_t seed = 4000 + static_cast<std::uint64_t>(round);
  // Block p of every rank's in is the slice [at(p), at(p) + counts[p]) of one all_reduce's inputs.
  std::vector<T> in(l.total), out(l.counts[me] + 1, filler<T>(5));
  for (std::size_t i = 0; i < in.size(); ++i) in[i] = chorus::test::input<T>(seed, n, me, i, op);
  At<T> din(pl, in, false), dout(pl, out, true);
  chorus::reduce_scatter_v(c, din.ptr(), dout.ptr(), l.counts, chorus::data_type_of<T>, op);
  dout.back();
  std::vector<T> want(out.size(), filler<T>(5));
  for (std::size_t i = 0; i < l.counts[me]; ++i)
    want[i] = chorus::test::expected_all_reduce<T>(seed, n, l.at(me) + i, op);
  chorus::test::check_equal<T>(
      std::span<const T>(out), std::span<const T>(want),
      where("reduce_scatter_v", chorus::data_type_of<T>, n, round, false) + " " + std::string(chorus::to_string(op)), me);
}

/// Every v-collective, every dtype of this build, two rounds, both layouts; reduce_scatter_v with
/// every op that applies.
template <class Comm>
void every_case(Comm& c, const Place& pl = {}) {
  for (DataType dt : chorus::test::matrix_dtypes())  // six of the twelve under ASan, four under TSan
    chorus::dispatch(dt, [&]<class T>(std::type_identity<T>) {
      for (int round = 0; round < 2; ++round) {
        for (bool displaced : {false, true}) {
          all_gather_v_case<T>(c, round, displaced, pl);
          gather_v_case<T>(c, round, displaced, pl);
          scatter_v_case<T>(c, round, displaced, pl);
        }
        for (ReduceOp op : {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max, ReduceOp::avg,
                            ReduceOp::band, ReduceOp::bor, ReduceOp::bxor})
          if (chorus::is_valid_op(dt, op)) reduce_scatter_v_case<T>(c, round, op, pl);
      }
    });
  c.barrier();  // the collectives are unaffected
}

template <class M>
void run(int n) {
  chorus::test::run_world<M>(n, [](auto& comm, auto&) { every_case(comm); });
}

}  // namespace

TEST_CASE("all_gather_v, gather_v, scatter_v, reduce_scatter_v: ranks as threads over inproc, worlds 1 to 5") {
  for (int n = 1; n <= 5; ++n) {
    CAPTURE(n);
    run<chorus::test::InprocThreads>(n);
  }
}

TEST_CASE("all_gather_v, gather_v, scatter_v, reduce_scatter_v: tcp threads, world 3") {
  run<chorus::test::TcpThreads>(3);
}

TEST_CASE("all_gather_v, gather_v, scatter_v, reduce_scatter_v: shm processes, world 4") {
  run<chorus::test::ShmProcesses>(4);
}

TEST_CASE(
    "all_gather_v, gather_v, scatter_v, reduce_scatter_v: simulated-device buffers, every dtype and op: "
    "ranks as threads on one device, worlds 1 to 5") {
  chorus::test::run_device_threads(5, [](auto& c, chorus::device::SimRuntime& rt, chorus::device::Stream st) {
    every_case(c, Place{&rt, st, false});
    every_case(c, Place{&rt, st, true});  // inputs on the device, outputs in host memory
  });
}

TEST_CASE("all_to_all_v: simulated-device buffers: ranks as threads on one device, worlds 1 to 5") {
  chorus::test::run_device_threads(5, [](auto& c, chorus::device::SimRuntime& rt, chorus::device::Stream st) {
    const int n = c.size(), me = c.rank();
    const Place pl{&rt, st, false};
    for (int round = 0; round < 2; ++round) {
      // Rank r sends count_of(r + p, round) elements to rank p.
      std::vector<std::size_t> send(static_cast<std::size_t>(n)), recv(static_cast<std::size_t>(n));
      for (int p = 0; p < n; ++p) {
        send[static_cast<std::size_t>(p)] = count_of(me + 2 * p, round);
        recv[static_cast<std::size_t>(p)] = count_of(p + 2 * me, round);
      }
      std::size_t ns = 0, nr = 0;
      for (int p = 0; p < n; ++p)
        ns += send[static_cast<std::size_t>(p)], nr += recv[static_cast<std::size_t>(p)];
      std::vector<std::int32_t> in(ns), out(nr), want(nr);
      const std::uint64_t seed = 5000 + static_cast<std::uint64_t>(round);
      for (std::size_t i = 0, p = 0, k = 0; i < ns; ++i, ++k) {  // block p: pattern of (me, p)
        while (k == send[p]) k = 0, ++p;
        in[i] = chorus::test::pattern<std::int32_t>(seed, me * 64 + static_cast<int>(p), k);
      }
      for (std::size_t i = 0, p = 0, k = 0; i < nr; ++i, ++k) {
        while (k == recv[p]) k = 0, ++p;
        want[i] = chorus::test::pattern<std::int32_t>(seed, static_cast<int>(p) * 64 + me, k);
      }
      At<std::int32_t> din(pl, in, false), dout(pl, out, true);
      chorus::all_to_all_v(c, din.ptr(), send, dout.ptr(), recv, DataType::int32);
      dout.back();
      chorus::test::check_equal<std::int32_t>(
          std::span<const std::int32_t>(out), std::span<const std::int32_t>(want),
          "all_to_all_v int32 on device buffers (world " + std::to_string(n) + ")", me);
    }
    c.barrier();
  });
}

TEST_CASE("gather_v, scatter_v: bad arguments are invalid_argument naming the rank") {
  chorus::test::run_world<chorus::test::InprocThreads>(2, [](auto& c, auto&) {
    const int me = c.rank();
    std::vector<float> buf(64);
    const std::vector<std::size_t> three = {1, 1, 1}, ones = {1, 1};
    auto e = chorus::test::expect_error(
        chorus::ErrorCode::invalid_argument,
        [&] { chorus::all_gather_v(c, buf.data(), 1, buf.data(), three, {}, DataType::float32); },
        "three counts for two ranks");
    expect(std::string(e.what()).find("rank " + std::to_string(me)) != std::string::npos,
           std::string("the error names the rank: ") + e.what());
    chorus::test::expect_error(
        chorus::ErrorCode::invalid_argument,
        [&] { chorus::all_gather_v(c, buf.data(), 2, buf.data(), ones, {}, DataType::float32); },
        "a contribution of 2 against its entry 1");
    chorus::test::expect_error(
        chorus::ErrorCode::invalid_argument,
        [&] { chorus::all_gather_v(c, buf.data(), 1, buf.data(), ones, three, DataType::float32); },
        "three displacements for two ranks");
    chorus::test::expect_error(
        chorus::ErrorCode::invalid_argument,
        [&] { chorus::gather_v(c, buf.data(), 1, buf.data(), ones, {}, DataType::float32, 2); }, "root 2 of 2");
    chorus::test::expect_error(
        chorus::ErrorCode::invalid_argument,
        [&] { chorus::scatter_v(c, buf.data(), ones, {}, buf.data(), 1, DataType::float32, -1); }, "root -1");
    chorus::test::expect_error(
        chorus::ErrorCode::invalid_argument,
        [&] { chorus::reduce_scatter_v(c, buf.data(), buf.data(), ones, DataType::float32, ReduceOp::band); },
        "band on float32");
    c.barrier();  // nothing was sent: the communicator still works
  });
}

TEST_CASE("all_gather_v, reduce_scatter_v: counts that disagree between ranks are mismatch naming both sizes") {
  chorus::test::run_world<chorus::test::TcpThreads>(2, [](auto& c, auto&) {
    const int me = c.rank();
    std::vector<float> in(8, 1.0f), out(16);
    // Rank 1 contributes 4 elements; rank 0 expects 5 from it.
    const std::vector<std::size_t> counts = me == 0 ? std::vector<std::size_t>{1, 5} : std::vector<std::size_t>{1, 4};
    if (me == 0) {
      const auto e = chorus::test::expect_error(
          chorus::ErrorCode::mismatch,
          [&] { chorus::all_gather_v(c, in.data(), 1, out.data(), counts, {}, DataType::float32); }, "4 sent, 5 expected");
      const std::string what = e.what();
      expect(what.find("16 bytes") != std::string::npos && what.find("20 bytes") != std::string::npos,
             "the error names both sizes (4 and 5 floats): " + what);
    } else {
      try {
        chorus::all_gather_v(c, in.data(), 4, out.data(), counts, {}, DataType::float32);
      } catch (const chorus::Error&) {  // the sender may learn of it too
      }
    }
  });
  chorus::test::run_world<chorus::test::TcpThreads>(2, [](auto& c, auto&) {
    const int me = c.rank();
    std::vector<float> in(8, 1.0f), out(8);
    // Rank 0 thinks rank 1's block has 3 elements; rank 1 thinks 2: rank 1 receives 3, expects 2.
    const std::vector<std::size_t> counts = me == 0 ? std::vector<std::size_t>{2, 3} : std::vector<std::size_t>{2, 2};
    if (me == 1) {
      chorus::test::expect_error(
          chorus::ErrorCode::mismatch,
          [&] { chorus::reduce_scatter_v(c, in.data(), out.data(), counts, DataType::float32, ReduceOp::sum); },
          "3 sent, 2 expected");
    } else {
      try {
        chorus::reduce_scatter_v(c, in.data(), out.data(), counts, DataType::float32, ReduceOp::sum);
      } catch (const chorus::Error&) {
      }
    }
  });
}

TEST_CASE("gather_v against scatter_v on the other rank: a timeout naming the peer, not a crossed block") {
  chorus::test::run_world<chorus::test::InprocThreads>(
      2,
      [](auto& c, auto&) {
        const int me = c.rank();
        std::vector<float> buf(4, 2.0f);
        const std::vector<std::size_t> ones = {1, 1};
        // Rank 0 gathers to itself (waits for rank 1's block); rank 1 waits for rank 0's scatter.
        // The first to time out aborts the communicator: the other sees a timeout of its own or
        // peer_failure ("peer 0 aborted after a timeout"); either names the peer.
        try {
          if (me == 0)
            chorus::gather_v(c, buf.data(), 1, buf.data(), ones, {}, DataType::float32, 0);
          else
            chorus::scatter_v(c, nullptr, {}, {}, buf.data(), 1, DataType::float32, 0);
          expect(false, "two different v-collectives completed");
        } catch (const chorus::Error& e) {
          const std::string what = e.what();
          expect(e.code() == chorus::ErrorCode::timeout || e.code() == chorus::ErrorCode::peer_failure,
                 "a timeout or the peer's abort after its timeout, not: " + what);
          expect(what.find("peer " + std::to_string(1 - me)) != std::string::npos, "the error names the peer: " + what);
        }
      },
      std::chrono::milliseconds(500));
}

}  // namespace collective_test_v_collectives
