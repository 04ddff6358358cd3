// SPDX-License-Identifier: BSD-3-Clause
// Steady-state blocking collectives allocate nothing: this executable replaces the global
// operator new with one that counts, and each rank (a process of its own) checks that a run of
// blocking all_reduces of 8 B and of 1 MiB, over shm and over tcp, made no heap allocation in the
// whole process (the background threads included) once warmed up. CHORUS_TEST_ALLOC_TRACE=1
// prints a backtrace of every allocation it counts (symbolise with addr2line -f -C -e).
#include "chorus/chorus.hpp"
// The replaced operator delete frees with free(); g++ sees that inlined next to a new-expression
// and warns of a mismatch, which the replacement pair below makes a match.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

#include <doctest/doctest.h>

#include <execinfo.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <new>
#include <string>
#include <vector>

#include "support/spawn.hpp"

namespace alloc_test_alloc {
namespace {
std::atomic<long> g_allocations{0};
std::atomic<bool> g_trace{false};  ///< CHORUS_TEST_ALLOC_TRACE=1: a backtrace per counted allocation
thread_local bool t_in_trace = false;

void count() {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (!g_trace.load(std::memory_order_relaxed) || t_in_trace) return;
  t_in_trace = true;
  void* frames[32];
  const int n = ::backtrace(frames, 32);
  ::backtrace_symbols_fd(frames, n, 2);
  static const char sep[] = "----\n";
  [[maybe_unused]] auto k = ::write(2, sep, sizeof sep - 1);
  t_in_trace = false;
}
}  // namespace
}  // namespace alloc_test_alloc

// The replaced allocation functions (every form the library may call). Deallocation stays the
// default (free), which matches since allocation goes through malloc.
void* operator new(std::size_t n) {
  alloc_test_alloc::count();
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return ::operator new(n); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  alloc_test_alloc::count();
  return std::malloc(n ? n : 1);
}
void* operator new[](std::size_t n, const std::nothrow_t& t) noexcept { return ::operator new(n, t); }
void* operator new(std::size_t n, std::align_val_t a) {
  alloc_test_alloc::count();
  const std::size_t al = static_cast<std::size_t>(a);
  if (void* p = std::aligned_alloc(al, (n + al - 1) / al * al)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n, std::align_val_t a) { return ::operator new(n, a); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }

namespace alloc_test_alloc {
namespace {

using namespace std::chrono_literals;

/// Runs `calls` blocking all_reduces of `count` floats after `warmup` of them; returns the
/// allocations the process made during the measured ones.
template <class Comm>
long allocations_per_run(Comm& comm, std::size_t count, int warmup, int calls) {
  std::vector<float> in(count, 1.0f), out(count);
  for (int i = 0; i < warmup; ++i) comm.all_reduce(std::span<const float>(in), std::span<float>(out), chorus::ReduceOp::sum);
  comm.barrier();
  const char* trace = std::getenv("CHORUS_TEST_ALLOC_TRACE");
  const long before = g_allocations.load();
  g_trace.store(trace && std::string(trace) == "1");
  for (int i = 0; i < calls; ++i) comm.all_reduce(std::span<const float>(in), std::span<float>(out), chorus::ReduceOp::sum);
  g_trace.store(false);
  const long made = g_allocations.load() - before;
  comm.barrier();  // no rank leaves (its links closing) while another still counts
  chorus::test::expect(out[count - 1] == static_cast<float>(comm.size()), "all_reduce result");
  return made;
}

template <class Transport>
void check_no_allocation(int ranks) {
  chorus::test::ProcessOptions p;
  p.comm_timeout = 60s;
  p.timeout = 90s;
  chorus::test::run_processes(
      ranks,
      [](int rank, chorus::Options o) {
        auto comm = chorus::Communicator<Transport>::create(std::move(o));
        for (std::size_t count : {std::size_t(2), std::size_t(1) << 18}) {  // 8 B and 1 MiB
          const long made = allocations_per_run(comm, count, 50, 200);
          chorus::test::expect(made == 0, "rank " + std::to_string(rank) + ": " + std::to_string(made) +
                                              " heap allocations in 200 blocking all_reduces of " +
                                              std::to_string(count * 4) + " bytes over " +
                                              std::string(Transport::kName));
        }
      },
      p);
}

// tcp links of 4 streams (CHORUS_SOCKETS_PER_PEER): 4 MiB messages are striped over them, and
// the striped path allocates nothing either once warmed up.
TEST_CASE("blocking sendrecv of striped messages allocates nothing in steady state: tcp, 4 streams") {
  chorus::test::ProcessOptions p;
  p.comm_timeout = 60s;
  p.timeout = 90s;
  p.env = {{"CHORUS_SOCKETS_PER_PEER", "4"}};
  chorus::test::run_processes(
      2,
      [](int rank, chorus::Options o) {
        auto comm = chorus::Communicator<chorus::tcp::Transport>::create(std::move(o));
        std::vector<std::byte> out(4u << 20, std::byte{1}), in(4u << 20);
        auto exchange = [&] {
          auto r = comm.irecv(in, 1 - rank, 3);
          comm.send(out, 1 - rank, 3);
          r.wait();
        };
        // No barrier between the warm-up and the count: a barrier's requests, coming back to the
        // pool after its own, made the first measured receives take 2 new request blocks (seen
        // with 1 stream as well).
        for (int i = 0; i < 20; ++i) exchange();
        const char* trace = std::getenv("CHORUS_TEST_ALLOC_TRACE");
        const long before = g_allocations.load();
        g_trace.store(trace && std::string(trace) == "1");
        for (int i = 0; i < 50; ++i) exchange();
        g_trace.store(false);
        const long made = g_allocations.load() - before;
        comm.barrier();
        chorus::test::expect(made == 0, "rank " + std::to_string(rank) + ": " + std::to_string(made) +
                                            " heap allocations in 50 striped sendrecvs of 4 MiB");
      },
      p);
}

TEST_CASE("blocking all_reduce allocates nothing in steady state: shm, 2 ranks") {
  check_no_allocation<chorus::shm::Transport>(2);
}
TEST_CASE("blocking all_reduce allocates nothing in steady state: shm, 3 ranks") {
  check_no_allocation<chorus::shm::Transport>(3);
}
TEST_CASE("blocking all_reduce allocates nothing in steady state: tcp, 2 ranks") {
  check_no_allocation<chorus::tcp::Transport>(2);
}
TEST_CASE("blocking all_reduce allocates nothing in steady state: tcp, 3 ranks") {
  check_no_allocation<chorus::tcp::Transport>(3);
}

}  // namespace
}  // namespace alloc_test_alloc
