// SPDX-License-Identifier: BSD-3-Clause
// The one-shot all_reduce through the shm links' mailboxes (algo/intranode/one_shot.hpp), with ranks as
// processes: every dtype and op (the bitwise ones on the integer types) at worlds 2, 3 and 4,
// counts 0, 1, 2, 3, 7, 13, 1000 and the largest a mailbox holds, in place and out of place,
// checked bit for bit against support/fill.hpp's reference; the largest count plus one forced (an
// error) and chosen by the model (another algorithm); split communicators (no mailboxes)
// interleaved with their parent, in turn and at once; a differing call (mismatch, through the
// mailbox and through the store); a killed rank.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstddef>
#include <cstring>
#include <set>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "chorus/algo/intranode/one_shot.hpp"
#include "chorus/communicator.hpp"
#include "support/communicators.hpp"
#include "support/fill.hpp"
#include "support/sanitized.hpp"
#include "support/spawn.hpp"

// This file's own names: the files of tests/collective/ are compiled together (unity build).
namespace collective_test_one_shot {

namespace {

using namespace std::chrono_literals;
using chorus::DataType;
using chorus::ErrorCode;
using chorus::ReduceOp;
using chorus::test::check_equal;
using chorus::test::expect_error;
using chorus::test::expected_all_reduce;
using chorus::test::input;
using ShmComm = chorus::Communicator<chorus::shm::Transport>;
using AutoComm = chorus::Communicator<chorus::hybrid::Transport>;
using Clock = std::chrono::steady_clock;

constexpr std::size_t kMailbox = chorus::algo::one_shot_max_bytes<chorus::shm::Transport>();
static_assert(kMailbox == chorus::algo::one_shot_max_bytes<chorus::hybrid::Transport>() && kMailbox >= 1024);

/// Every rank has its verdict: the communicators live until then, so that no rank's exit
/// (closing its links) reaches a peer before the error it is meant to get.
void all_judged(chorus::Store& store, int rank, int world, const std::string& key) {
  store.set(key + "/" + std::to_string(rank), "1");
  std::vector<std::string> keys;
  for (int r = 0; r < world; ++r) keys.push_back(key + "/" + std::to_string(r));
  store.wait(keys, 20s);
}

chorus::test::ProcessOptions process_options(std::set<int> killed = {}) {
  chorus::test::ProcessOptions p;
  p.timeout = 120s;
  p.comm_timeout = 20s;
  p.expect_killed = std::move(killed);
  return p;
}

/// One all_reduce of `count` elements checked against the reference; `call` makes the seed.
template <class T, class Comm>
void check_all_reduce(Comm& c, std::uint64_t call, std::size_t count, ReduceOp op, bool in_place,
                      const std::string& where) {
  constexpr DataType dt = chorus::data_type_of<T>;
  const int n = c.size(), r = c.rank();
  const std::uint64_t seed = chorus::test::seed_of(call, dt, op, count, in_place);
  const std::string what = "all_reduce " + std::string(chorus::to_string(dt)) + " " +
                           std::string(chorus::to_string(op)) + " count " + std::to_string(count) +
                           (in_place ? " in place " : " out of place ") + where;
  std::vector<T> in(count), out(count + 1);
  for (std::size_t i = 0; i < count; ++i) in[i] = input<T>(seed, n, r, i, op);
  const T guard = input<T>(seed + 1, n, r, 0, op);
  out[count] = guard;
  if (in_place) {
    std::copy(in.begin(), in.end(), out.begin());
    c.all_reduce(std::span<T>(out.data(), count), op);
  } else {
    c.all_reduce(std::span<const T>(in), std::span<T>(out.data(), count), op);
  }
  check_equal<T>(std::span<const T>(out.data(), count),
                 [&](std::size_t i) { return expected_all_reduce<T>(seed, n, i, op); }, what, r);
  chorus::test::expect(std::memcmp(&out[count], &guard, sizeof(T)) == 0, what + ": wrote past the output");
}

/// An all_reduce in flight (async, out of place), checked by check().
template <class T>
struct InFlight {
  std::vector<T> in, out;
  std::uint64_t seed = 0;
  ReduceOp op = ReduceOp::sum;
  int n = 0, r = 0;
  std::string what;
  chorus::Request req;

  template <class Comm>
  InFlight(Comm& c, std::uint64_t call, std::size_t count, ReduceOp o, std::string w)
      : in(count), out(count), op(o), n(c.size()), r(c.rank()), what(std::move(w)) {
    seed = chorus::test::seed_of(call, chorus::data_type_of<T>, op, count);
    for (std::size_t i = 0; i < count; ++i) in[i] = input<T>(seed, n, r, i, op);
    req = c.all_reduce_async(std::span<const T>(in), std::span<T>(out), op);
  }
  void check() {
    req.wait();
    check_equal<T>(std::span<const T>(out), [&](std::size_t i) { return expected_all_reduce<T>(seed, n, i, op); },
                   what, r);
  }
};

/// Every dtype and op, the small counts and the mailbox's largest, in and out of place, with
/// one_shot forced; then the largest + 1: an error when forced, another algorithm under auto.
void every_dtype_and_op(int world) {
  chorus::test::run_processes(
      world,
      [world](int, chorus::Options o) {
        chorus::Options forced_o = o;
        forced_o.algorithm = "all_reduce:one_shot";  // its barrier keeps the model's
        ShmComm forced = ShmComm::create(forced_o);
        AutoComm automatic = AutoComm::create(o);
        const std::string where = "(one_shot, world " + std::to_string(world) + ")";
        std::uint64_t call = 0;
        for (DataType dt : chorus::test::matrix_dtypes())  // six of the twelve under ASan, four under TSan
          chorus::dispatch(dt, [&]<class T>(std::type_identity<T>) {
            const std::size_t largest = kMailbox / sizeof(T);
            for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{2}, std::size_t{3}, std::size_t{7},
                                      std::size_t{13}, std::size_t{1000}, largest}) {
              if (count > largest) continue;  // 1000 of an 8-byte type
              for (ReduceOp op : chorus::kAllReduceOps)
                for (bool in_place : {false, true}) check_all_reduce<T>(forced, ++call, count, op, in_place, where);
              if constexpr (std::is_integral_v<T>)
                for (ReduceOp op : chorus::kBitwiseReduceOps)
                  for (bool in_place : {false, true}) check_all_reduce<T>(forced, ++call, count, op, in_place, where);
            }
            // One past what a mailbox holds: the model's other algorithms (the same results),
            // and an error naming the limit when one_shot is forced (on every rank alike).
            check_all_reduce<T>(automatic, ++call, largest + 1, ReduceOp::sum, false, "(auto, past the mailbox)");
            check_all_reduce<T>(automatic, ++call, largest, ReduceOp::max, true, "(auto, the largest)");
            std::vector<T> big(largest + 1);
            expect_error(ErrorCode::invalid_argument, [&] { forced.all_reduce(std::span<T>(big), ReduceOp::sum); },
                         "one_shot forced past the mailbox");
          });
        forced.barrier();
      },
      process_options());
}

}  // namespace

TEST_CASE("one_shot: every dtype and op, world 2") { every_dtype_and_op(2); }
TEST_CASE("one_shot: every dtype and op, world 3") { every_dtype_and_op(3); }
TEST_CASE("one_shot: every dtype and op, world 4") { every_dtype_and_op(4); }

// A split communicator shares its parent's transport and so its links' mailboxes: it must take
// the other algorithms, however its calls interleave with the parent's. (Were it to use the
// mailboxes, its messages would be read as the parent's: a mismatch or wrong results.)
TEST_CASE("one_shot: split communicators interleaved with their parent, world 4") {
  chorus::test::run_processes(
      4,
      [](int rank, chorus::Options o) {
        ShmComm world = ShmComm::create(o);
        ShmComm half = world.split(rank % 2, rank);
        ShmComm all = world.split(0, -rank);  // every rank, in reverse order
        std::uint64_t call = 100;
        for (int k = 0; k < 20; ++k) {
          check_all_reduce<float>(world, ++call, 13, ReduceOp::sum, k % 2 == 0, "(world)");
          check_all_reduce<std::int32_t>(half, ++call, 7, ReduceOp::max, false, "(half)");
          check_all_reduce<double>(all, ++call, 3, ReduceOp::avg, true, "(all, reversed)");
          check_all_reduce<float>(world, ++call, 1, ReduceOp::prod, false, "(world)");
        }
        // At the same time: each communicator's calls run on its own worker thread.
        for (int k = 0; k < 50; ++k) {
          InFlight<float> a(world, ++call, 13, ReduceOp::sum, "(world, async)");
          InFlight<std::int32_t> b(half, ++call, 7, ReduceOp::max, "(half, async)");
          InFlight<double> c(all, ++call, 3, ReduceOp::min, "(all, async)");
          InFlight<float> d(world, ++call, 100, ReduceOp::avg, "(world, async)");
          a.check();
          b.check();
          c.check();
          d.check();
        }
        chorus::Options forced_o = o;
        forced_o.algorithm = "one_shot";
        ShmComm forced = ShmComm::create(forced_o);
        ShmComm sub = forced.split(0, rank);
        std::vector<float> v(4, 1.0f);
        expect_error(ErrorCode::invalid_argument, [&] { sub.all_reduce(std::span<float>(v), ReduceOp::sum); },
                     "one_shot forced on a split communicator");
        world.barrier();
      },
      process_options());
}

// Rank 2 calls with another count (then another op): every rank gets mismatch naming both calls.
TEST_CASE("one_shot: a differing call is a mismatch on every rank, world 3") {
  for (int variant = 0; variant < 2; ++variant) {
    CAPTURE(variant);
    chorus::test::run_processes(
        3,
        [variant](int rank, chorus::Options o) {
          auto store = o.store;
          ShmComm c = ShmComm::create(o);
          check_all_reduce<float>(c, 1, 5, ReduceOp::sum, false, "(before)");
          std::vector<float> v(rank == 2 && variant == 0 ? 5 : 4, 1.0f);
          const ReduceOp op = rank == 2 && variant == 1 ? ReduceOp::max : ReduceOp::sum;
          auto e = expect_error(ErrorCode::mismatch, [&] { c.all_reduce(std::span<float>(v), op); },
                                "all_reduce that differs on rank 2");
          const std::string text = e.what();
          chorus::test::expect(text.find("collectives differ") != std::string::npos, "the error says: " + text);
          all_judged(*store, rank, 3, "test/judged/" + std::to_string(variant));
        },
        process_options());
  }
}

// Rank 1 calls broadcast where rank 0 calls a small all_reduce: no message of one reaches the
// other's wait, so the store's cross-check finds it (within seconds, not at the timeout).
TEST_CASE("one_shot: another collective on the peer is found through the store, world 2") {
  chorus::test::run_processes(
      2,
      [](int rank, chorus::Options o) {
        auto store = o.store;
        ShmComm c = ShmComm::create(o);
        std::vector<float> v(4, 1.0f);
        const auto t0 = Clock::now();
        expect_error(ErrorCode::mismatch,
                     [&] {
                       if (rank == 0)
                         c.all_reduce(std::span<float>(v), ReduceOp::sum);
                       else
                         c.broadcast(std::span<float>(v), 0);
                     },
                     "all_reduce against broadcast");
        chorus::test::expect(Clock::now() - t0 < 10s, "the mismatch was found within 10 s");
        all_judged(*store, rank, 2, "test/judged");
      },
      process_options());
}

// Rank 2 dies before its call: ranks 0 and 1, waiting in their mailboxes, fail with peer_failure
// well before the timeout (20 s here).
TEST_CASE("one_shot: rank killed while the others wait, world 3") {
  chorus::test::run_processes(
      3,
      [](int rank, chorus::Options o) {
        auto store = o.store;
        ShmComm c = ShmComm::create(o);
        check_all_reduce<float>(c, 1, 5, ReduceOp::sum, false, "(before)");
        if (rank == 2) {
          store->wait({"test/waiting/0", "test/waiting/1"}, 20s);
          std::raise(SIGKILL);
        }
        std::vector<float> v(4, 1.0f);
        chorus::Request r = c.all_reduce_async(std::span<float>(v), ReduceOp::sum);
        store->set("test/waiting/" + std::to_string(rank), "1");
        const auto t0 = Clock::now();
        expect_error(ErrorCode::peer_failure, [&] { r.wait(); }, "all_reduce with a killed rank");
        chorus::test::expect(Clock::now() - t0 < 10s, "the death was noticed within 10 s");
      },
      process_options({2}));
}

}  // namespace collective_test_one_shot
