// SPDX-License-Identifier: BSD-3-Clause
/// sim.host: the host in the network model (sim/network.hpp, NetworkModel::effective): the memory
/// tier, CPU sharing, the core queues (of compute, and of per-message overheads), the speed of
/// reductions in place, a rendezvous's handshake, a queue's token bucket and transfers that take a
/// core (LinkClass::cpu_share) change
/// simulated times as they say, and leave them alone
/// where they do not apply. Reads this machine's presets (the directory is the first argument), which use them.
/// Exit status 0 when every check passes, 1 otherwise (each failure printed).

#include <cmath>
#include <cstdio>
#include <string>

#include "chorus/sim/collective.hpp"
#include "chorus/sim/preset.hpp"

namespace {

int failures = 0;

void check(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "ok  " : "FAIL", what.c_str());
  if (!ok) ++failures;
}

namespace sim = chorus::sim;

/// All_reduce of `bytes` (float32) by `algorithm` on one host of `local` ranks: simulated microseconds.
double all_reduce_us(const sim::NetworkModel& m, int local, std::size_t bytes, chorus::algo::Algorithm algorithm) {
  const sim::Layout layout{1, local};
  sim::Engine engine(m, layout);
  sim::Arena arena(std::size_t(1) << 30);
  const auto kind = chorus::algo::CollectiveKind::all_reduce;
  const sim::Call call{kind, chorus::DataType::float32, chorus::ReduceOp::sum, bytes / 4, 0};
  const auto in = sim::plan_inputs(m, layout);
  return sim::simulate(engine, arena, call, sim::choice_for({algorithm}, kind, bytes, in)).seconds * 1e6;
}

/// Whether m.check() refuses the model, naming `what`.
bool refuses(const sim::NetworkModel& m, const std::string& what) {
  try {
    m.check();
  } catch (const chorus::Error& e) {
    return std::string(e.what()).find(what) != std::string::npos;
  }
  return false;
}

double ring_us(const sim::NetworkModel& m, int local, std::size_t bytes) {
  return all_reduce_us(m, local, bytes, chorus::algo::Algorithm::ring);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: sim_host_test PRESETS_DIR\n");
    return 2;
  }
  try {
    for (const char* p : {"this-machine-shm", "this-machine-tcp", "namespace-hosts-1gbit"}) {
      const sim::NetworkModel m = chorus::sim::load_preset(std::string(argv[1]) + "/" + p + ".json");
      check(m.cache_bytes > 0, std::string(p) + ": loads, with a cache tier of " + std::to_string(m.cache_bytes) + " bytes");
    }
    sim::NetworkModel plain;
    plain.name = "plain";
    plain.intra = {2e-6, 5e9, 0.5e-6, 32 << 10, 256 << 10};
    plain.reduce_rate = plain.copy_rate = 5e9;

    // Memory tier: 4 ranks x 1 MiB fits 4 MiB and runs faster; it does not fit 2 MiB.
    sim::NetworkModel tier = plain;
    tier.cache_bytes = 4 << 20;
    tier.cached_speedup = tier.cached_intra_speedup = 4;
    const double base_1m = ring_us(plain, 4, 1 << 20), fits = ring_us(tier, 4, 1 << 20);
    tier.cache_bytes = 2 << 20;
    const double spills = ring_us(tier, 4, 1 << 20);
    check(fits < 0.5 * base_1m, "1 MiB x 4 ranks in a 4 MiB cache: " + std::to_string(fits) + " us < half of " +
                                    std::to_string(base_1m) + " us without the tier");
    check(std::fabs(spills - base_1m) <= 1e-9 * base_1m,
          "1 MiB x 4 ranks, 2 MiB cache: " + std::to_string(spills) + " us, as without the tier");

    // CPU sharing: 4 ranks on 2 cores; a ring of 4 has 6 steps in a row, each waiting `wake`.
    sim::NetworkModel shared = plain;
    shared.cores = 2;
    shared.wake = 5e-6;
    const double base_8 = ring_us(plain, 4, 8), slow_8 = ring_us(shared, 4, 8);
    check(slow_8 >= base_8 + 6 * 5.0 - 1e-6, "8 B ring, 4 ranks on 2 cores: " + std::to_string(slow_8) + " us >= " +
                                                  std::to_string(base_8) + " us + 6 x 5 us");
    shared.cores = 4;
    const double own_8 = ring_us(shared, 4, 8);
    check(std::fabs(own_8 - base_8) <= 1e-9 * base_8, "8 B ring, 4 ranks on 4 cores: " + std::to_string(own_8) + " us, as " +
                                                          std::to_string(base_8) + " us without cores");

    // Core queues: a core serves one piece of compute at a time, the earliest gap that fits.
    sim::CoreQueues q;
    const double a = q.run(0, 1, 0, 1), b = q.run(0, 1, 0, 1), c = q.run(0, 1, 5, 1), d = q.run(0, 1, 2.5, 1);
    check(a == 1 && b == 2 && c == 6 && d == 3.5, "one core: [0,1) [1,2) [5,6), then a gap [2.5,3.5): ends " +
                                                      std::to_string(a) + " " + std::to_string(b) + " " +
                                                      std::to_string(c) + " " + std::to_string(d));
    const double t1 = q.run(1, 2, 0, 1), t2 = q.run(1, 2, 0, 1), t3 = q.run(1, 2, 0, 1);
    check(t1 == 1 && t2 == 1 && t3 == 2, "two cores, three pieces at 0: end at 1, 1, 2 (" + std::to_string(t3) + ")");

    // With reductions the bound (fast links and copies), 4 ranks on 2 cores: the double tree's leaves wait while
    // its inner nodes reduce, so queueing for cores beats a flat slowdown of 2; the ring's ranks
    // all compute at once, and the two agree within 10%.
    sim::NetworkModel busy = plain;
    busy.intra.bandwidth = busy.copy_rate = 1e12;
    busy.cores = 2;
    const auto tree = chorus::algo::Algorithm::tree;
    const double flat_tree = all_reduce_us(busy, 4, 64 << 20, tree), flat_ring = ring_us(busy, 4, 64 << 20);
    busy.core_queues = true;
    const double q_tree = all_reduce_us(busy, 4, 64 << 20, tree), q_ring = ring_us(busy, 4, 64 << 20);
    check(q_tree < 0.95 * flat_tree, "64 MiB double tree, 4 ranks on 2 cores: queued " + std::to_string(q_tree) +
                                         " us < 0.95 x flat " + std::to_string(flat_tree) + " us");
    check(std::fabs(q_ring - flat_ring) <= 0.1 * flat_ring,
          "64 MiB ring, 4 ranks on 2 cores: queued " + std::to_string(q_ring) + " us, flat " + std::to_string(flat_ring) + " us");
    busy.cores = 4;
    const double own_tree = all_reduce_us(busy, 4, 64 << 20, tree);
    busy.core_queues = false;
    const double own_flat = all_reduce_us(busy, 4, 64 << 20, tree);
    check(own_tree == own_flat, "4 ranks on 4 cores: queued " + std::to_string(own_tree) + " us, as without queues");

    // Overheads queued for the cores (overhead_queues), 8 ranks on 2 cores, 8 B, per-message
    // overheads the bound: at every ring step all 8 ranks send and receive, so the ring costs
    // about what the flat slowdown charges; a tree level keeps a few ranks busy while the others
    // wait, so the tree is faster queued than flat. On 8 cores nothing queues.
    sim::NetworkModel chatty = plain;
    chatty.intra.latency = 1e-6;
    chatty.intra.overhead = 10e-6;
    chatty.cores = 2;
    chatty.core_queues = true;
    auto all_reduce_8 = [&](const sim::NetworkModel& m, chorus::algo::Algorithm a) { return all_reduce_us(m, 8, 8, a); };
    const double oflat_ring = ring_us(chatty, 8, 8), oflat_tree = all_reduce_8(chatty, tree);
    chatty.overhead_queues = true;
    const double oq_ring = ring_us(chatty, 8, 8), oq_tree = all_reduce_8(chatty, tree);
    check(std::fabs(oq_ring - oflat_ring) <= 0.15 * oflat_ring, "8 B ring, 8 ranks on 2 cores: overheads queued " +
                                                                    std::to_string(oq_ring) + " us, flat " + std::to_string(oflat_ring) + " us");
    check(oq_tree < 0.8 * oflat_tree, "8 B double tree, 8 ranks on 2 cores: overheads queued " + std::to_string(oq_tree) +
                                          " us < 0.8 x flat " + std::to_string(oflat_tree) + " us");
    chatty.cores = 8;
    const double own_q = ring_us(chatty, 8, 8);
    chatty.overhead_queues = chatty.core_queues = false;
    check(own_q == ring_us(chatty, 8, 8), "8 ranks on 8 cores: overheads queued " + std::to_string(own_q) + " us, as without queues");

    // In-place reductions (in_place_reduce_speedup): recursive doubling reduces a op= b, so at
    // 2 ranks and 64 MiB (the reduction of the whole buffer after the exchange) a speedup of 2
    // takes half the reduction off it; the ring reduces out of place (out = in op slot) and does
    // not move.
    const auto rd = chorus::algo::Algorithm::recursive_doubling;
    const std::size_t big = std::size_t(64) << 20;
    const double rd_1 = all_reduce_us(plain, 2, big, rd), ring_1 = ring_us(plain, 2, big);
    sim::NetworkModel in_place = plain;
    in_place.in_place_reduce_speedup = 2;
    const double rd_2 = all_reduce_us(in_place, 2, big, rd), ring_2 = ring_us(in_place, 2, big);
    const double half_reduce = 0.5 * static_cast<double>(big) / plain.reduce_rate * 1e6;
    check(std::fabs((rd_1 - rd_2) - half_reduce) <= 0.01 * half_reduce,
          "64 MiB recursive doubling, 2 ranks: in place x2 " + std::to_string(rd_2) + " us, x1 " + std::to_string(rd_1) +
              " us, half a reduction (" + std::to_string(half_reduce) + " us) apart");
    check(ring_1 == ring_2, "64 MiB ring, 2 ranks: out of place, " + std::to_string(ring_2) + " us either way");
    in_place.in_place_reduce_speedup = 0;
    check(refuses(in_place, "in_place_reduce_speedup"), "in_place_reduce_speedup 0 is refused, naming it");

    // A rendezvous's handshake (LinkClass::handshake): recursive doubling at 2 ranks sends one
    // message each way; at 1 MiB (above the 32 KiB eager size) it costs the handshake once more,
    // at 8 B (eager) nothing.
    sim::NetworkModel shaking = plain;
    shaking.intra.handshake = 10e-6;
    const double hs_big = all_reduce_us(shaking, 2, 1 << 20, rd) - all_reduce_us(plain, 2, 1 << 20, rd);
    check(std::fabs(hs_big - 10) < 0.01, "1 MiB recursive doubling, 2 ranks: a 10 us handshake adds " + std::to_string(hs_big) + " us");
    check(all_reduce_us(shaking, 2, 8, rd) == all_reduce_us(plain, 2, 8, rd), "8 B recursive doubling: eager, no handshake");

    // A token bucket (LinkClass::burst_bytes) of 256 KiB at 1e8 B/s, empty at first: 1 ms idle
    // fills 100 KB, so 64 KiB then passes at once and the next 64 KiB waits for what the bucket
    // lacks, (65536 - 34464) / 1e8 s; without a bucket each takes 655.36 us.
    sim::Server bucket;
    const double first = bucket.serve(1e-3, 65536, 1e8, 256 << 10);
    bucket.free = 1e-3 + first;
    const double second = bucket.serve(bucket.free, 65536, 1e8, 256 << 10);
    check(first == 0 && std::fabs(second - (65536 - (100000 - 65536)) / 1e8) < 1e-12,
          "token bucket: 64 KiB after 1 ms idle at once (" + std::to_string(first * 1e6) + " us), the next in " +
              std::to_string(second * 1e6) + " us");
    sim::Server none;
    check(std::fabs(none.serve(1e-3, 65536, 1e8, 0) - 655.36e-6) < 1e-12, "no bucket: 64 KiB at the rate, 655.36 us");

    // Transfers on cores (LinkClass::cpu_share): 2 ranks on 1 core exchange 1 MiB at once
    // (recursive doubling). With no share, the two transfers overlap (one S/B); with a share of 1,
    // each message's send and receive take the core for S/B, four in a row: at least 4 S/B; with
    // a share of 1/2, at least 2 S/B. On 2 cores nothing queues and the share changes nothing.
    sim::NetworkModel copying = plain;
    copying.reduce_rate = copying.copy_rate = 1e12;
    copying.cores = 1;
    copying.core_queues = true;
    const double wire = static_cast<double>(1 << 20) / plain.intra.bandwidth * 1e6;
    const double apart = all_reduce_us(copying, 2, 1 << 20, rd);
    copying.intra.cpu_share = 1;
    const double whole = all_reduce_us(copying, 2, 1 << 20, rd);
    copying.intra.cpu_share = 0.5;
    const double half = all_reduce_us(copying, 2, 1 << 20, rd);
    check(whole >= 4 * wire && half >= 2 * wire && half < whole && apart < 1.1 * wire,
          "1 MiB exchange, 2 ranks on 1 core: share 1 " + std::to_string(whole) + " us >= 4 x " + std::to_string(wire) +
              " us, share 0.5 " + std::to_string(half) + " us >= 2 x, share 0 " + std::to_string(apart) + " us < 1.1 x");
    copying.cores = 2;
    const double two_cores = all_reduce_us(copying, 2, 1 << 20, rd);
    copying.intra.cpu_share = 0;
    check(two_cores == all_reduce_us(copying, 2, 1 << 20, rd),
          "2 ranks on 2 cores: a share of 0.5 " + std::to_string(two_cores) + " us, as none");
    copying.intra.cpu_share = 1.5;
    check(refuses(copying, "intra.cpu_share"), "a cpu_share of 1.5 is refused, naming 'intra.cpu_share'");

    // Calls back to back (sim::simulate's `calls`): a ring of 2 ranks ends each call on both
    // ranks at once, so a second call takes what the first did; across a token bucket the first
    // call's idle tail refills it, and the second call of a double tree is no slower than the first.
    {
      const sim::Layout two{1, 2};
      sim::Engine engine(plain, two);
      sim::Arena arena(std::size_t(1) << 26);
      const auto kind = chorus::algo::CollectiveKind::all_reduce;
      const sim::Call call{kind, chorus::DataType::float32, chorus::ReduceOp::sum, (1 << 20) / 4, 0};
      const auto choice = sim::choice_for({chorus::algo::Algorithm::ring}, kind, 1 << 20, sim::plan_inputs(plain, two));
      const double one = sim::simulate(engine, arena, call, choice).seconds;
      const double second = sim::simulate(engine, arena, call, choice, 2).seconds;
      check(std::fabs(second - one) <= 1e-9 * one, "1 MiB ring, 2 ranks: the second of two calls " + std::to_string(second * 1e6) +
                                                       " us, as one call " + std::to_string(one * 1e6) + " us");
      bool refused = false;
      try {
        sim::simulate(engine, arena, call, choice, 0);
      } catch (const chorus::Error&) {
        refused = true;
      }
      check(refused, "0 calls are refused");
    }
    {
      sim::NetworkModel shaped = plain;
      shaped.inter = {50e-6, 125e6, 10e-6, 64 << 10, 256 << 10};
      shaped.inter.burst_bytes = 256 << 10;
      const sim::Layout four{4, 1};
      sim::Engine engine(shaped, four);
      sim::Arena arena(std::size_t(1) << 26);
      const auto kind = chorus::algo::CollectiveKind::all_reduce;
      const sim::Call call{kind, chorus::DataType::float32, chorus::ReduceOp::sum, (64 << 10) / 4, 0};
      const auto choice = sim::choice_for({tree}, kind, 64 << 10, sim::plan_inputs(shaped, four));
      const double one = sim::simulate(engine, arena, call, choice).seconds;
      const double second = sim::simulate(engine, arena, call, choice, 2).seconds;
      check(second <= one, "64 KiB double tree, 4 hosts, 256 KiB buckets: the second of two calls " + std::to_string(second * 1e6) +
                               " us, no slower than one call " + std::to_string(one * 1e6) + " us");
    }

    shared.cores = -1;
    check(refuses(shared, "cores"), "cores -1 is refused, naming 'cores'");
    sim::NetworkModel bad_link = plain;
    bad_link.inter.handshake = -1;
    check(refuses(bad_link, "inter.handshake"), "a handshake of -1 s is refused, naming 'inter.handshake'");
  } catch (const std::exception& e) {
    std::printf("FAIL %s\n", e.what());
    return 1;
  }
  std::printf("%s\n", failures ? "sim.host: FAILED" : "sim.host: all checks passed");
  return failures ? 1 : 0;
}
