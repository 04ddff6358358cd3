// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// The simulator's network model (docs/performance.md, "Simulated at scale"): what a message
/// costs between two virtual ranks, in virtual seconds. Parameters come from a JSON preset
/// (sim/presets/, parsed by sim/include/chorus/sim/preset.hpp); this header holds no parser.
///
/// Link classes
/// * inside a host (`intra`: shm, or a GPU interconnect): every rank has a port, a tx side and
///   an rx side, each a FIFO server of `intra.bandwidth` bytes/s;
/// * between hosts (`inter`): a NIC per host shared by the host's ranks, or one per rank (a rail:
///   `nic_per_rank`), full duplex: a tx queue and an rx queue, each a FIFO server of
///   `inter.bandwidth`.
/// A message of S bytes over a link of latency l and bandwidth B, cut-through:
///   tx start  = max(ready, tx free)                        tx free = tx end = tx start + S/B
///   rx start  = max(tx start + l, rx free)
///   delivered = max(rx start + S/B, tx end + l)           rx free = delivered
/// where `ready` is when the sender posted it plus its per-message CPU overhead (charged to the
/// sender's clock). An rx queue takes its messages in the order they would be delivered
/// uncontended (max(tx start + l + S/B, tx end + l)): their arrival order where sizes are equal;
/// this costs one event per message where nothing contends (sim/engine.hpp). The receiver's overhead is charged to its clock when it waits for the receive.
///
/// With `burst_bytes` (optional, 0 by default; the namespace hosts' tc tbf has 256 KiB), each
/// queue also holds a token bucket of that many bytes, refilled at the bandwidth while the queue
/// is idle and empty at the start of a call (the measurements run calls back to back): the bytes
/// it holds pass at once, the rest at the bandwidth. So on a link mostly idle, a message of up to
/// the burst crosses without waiting its S/B, and two that meet at a queue do not wait for each
/// other; on a busy link the bucket stays empty.
///
/// Eager and rendezvous: a message of at most `eager_bytes` leaves at once; a larger one sends a
/// request-to-send (one latency, plus the link's `handshake`: optional, 0 by default, what the
/// peers' noticing the request and its answer costs beyond the latencies), the receiver answers
/// once its receive is posted (one latency back), and only then does the data enter the tx
/// queue, as the tcp and shm links do. With
/// `control_queue_bytes` (optional) a request-to-send or clear-to-send between hosts leaves only
/// after the data its sender has already started to the same peer, at most that many bytes of
/// it: over TCP a control frame is bytes in the connection behind the data already in the socket's
/// buffer (the tcp link puts it ahead of the slices it has not yet written), so in an exchange of
/// 1 MiB messages the later rank's clear-to-send waits behind the earlier one's data, and the two
/// directions partly take turns. It costs the NIC no time of its own.
///
/// Compute: the executor's reductions cost bytes / `reduce_rate` of the rank's time, copies
/// bytes / `copy_rate` (sim/executor.hpp); a reduction in place (its output is its first input,
/// a op= b: recursive doubling's, the double tree's, the binomial reduce's) runs
/// `in_place_reduce_speedup` times faster (optional, default 1). Out of place, a reduction moves
/// its two inputs and its output, whose lines the stores must first fetch: four streams of memory
/// traffic against three in place (bench/micro/reduce_bench's in_place rows measure the two).
///
/// The host (NetworkModel::effective, applied per call by the engine; every default leaves the
/// figures above as they are):
/// * a memory tier: where a call's working set (its bytes per rank times the ranks that share
///   the memory) fits `cache_bytes`, copies and reductions run `cached_speedup` times faster
///   than their rates above, which are then the memory's, and intra-host transfers
///   `cached_intra_speedup` times faster;
/// * CPU sharing: with more ranks than `cores` (per host, or on the whole machine where
///   `hosts_share_cores`: namespace hosts on one machine), the ranks' CPU work (per-message
///   overheads, copies, reductions) is slowed by ranks / cores, and every message waits
///   `wake` more for its receiver to get a core;
/// * with `core_queues` (optional), copies and reductions are not slowed by ranks / cores but
///   queue for the `cores` cores instead (sim/executor.hpp, CoreQueues): a rank's compute takes
///   the first free core from its clock on, at the full rate, so that ranks that wait (a tree's
///   leaves while its inner nodes reduce) leave their core to the ranks that compute. Per-message
///   overheads and `wake` stay as above, unless `overhead_queues` (optional) queues the
///   overheads for the cores as well: a message costs its sender and its receiver `overhead` of
///   a core each, so a step in which every rank sends and receives (a ring's) takes ranks / cores
///   overheads, one in which a few do (a tree's upper levels) about one. A link class's
///   `cpu_share` (optional, 0 to 1, default 0) makes that share of its transfers CPU work too:
///   with core_queues, a message of S/B on the sender's tx queue, and again on the receiver's rx
///   queue, starts only once a core of that rank's pool has cpu_share x S/B free for it (shm's
///   copies into and out of the segment, loopback tcp's kernel copies into and out of the socket
///   run on the ranks' cores, while part of the time goes to memory the cores do not hold); with
///   a share of 1, 4 ranks exchanging at once on 2 cores take twice as long as 2 would.

#include <algorithm>
#include <cstddef>
#include <string>

#include "chorus/core/cost_model.hpp"
#include "chorus/core/error.hpp"

namespace chorus::sim {

/// One class of link (inside a host or between hosts).
struct LinkClass {
  double latency = 1e-6;              ///< seconds, one way
  double bandwidth = 1e9;             ///< bytes/s of a port (intra) or a NIC (inter), each direction
  double overhead = 0;                ///< seconds of CPU per message, on the sender and on the receiver
  std::size_t eager_bytes = 64 << 10; ///< larger messages wait for a clear-to-send
  std::size_t slice_bytes = 256 << 10;///< the pipeline slice the cost model plans with (TransportModel::slice)
  double handshake = 0;               ///< seconds a rendezvous's handshake costs beyond its two latencies (the peers' wake-ups)
  double burst_bytes = 0;             ///< a token bucket per queue (a shaper's burst, as tc tbf's), empty at the start of a call; 0: none
  double cpu_share = 0;               ///< the share of a transfer's time that is CPU work of its sender and of its receiver (copies), 0 to 1
};

struct NetworkModel {
  std::string name;
  std::string source;  ///< where the figures come from
  LinkClass intra;
  LinkClass inter;
  bool nic_per_rank = false;  ///< a NIC per rank (rails) instead of one per host
  double control_queue_bytes = 0;  ///< between hosts: at most this much data of the same pair goes ahead of a control frame (0: none)
  double reduce_rate = 10e9;  ///< bytes of buffer reduced per second
  double copy_rate = 10e9;    ///< bytes copied per second
  double in_place_reduce_speedup = 1;  ///< a op= b against out = a op b: how much faster
  std::size_t cache_bytes = 0;   ///< a call whose working set fits runs at the cached rates (0: none)
  double cached_speedup = 1;     ///< cached rate / memory rate of copies and reductions
  double cached_intra_speedup = 1;  ///< the same of intra-host transfers
  double cores = 0;              ///< cores per host (or per machine, hosts_share_cores); 0: one per rank
  bool hosts_share_cores = false;///< every host's ranks share the same `cores` (and the same cache)
  double wake = 0;               ///< seconds a message waits for its receiver's core, with more ranks than cores
  bool core_queues = false;      ///< copies and reductions queue for the cores instead of a flat slowdown
  bool overhead_queues = false;  ///< with core_queues: per-message overheads queue for the cores too

  /// The ranks that share one pool of `cores` (a host's, or every rank with hosts_share_cores).
  double sharing(int hosts, int local) const { return static_cast<double>(hosts_share_cores ? hosts * local : local); }
  /// Whether copies and reductions of this layout queue for cores (sim::CoreQueues).
  bool queues_for_cores(int hosts, int local) const { return core_queues && cores > 0 && sharing(hosts, local) > cores; }

  /// Throws invalid_argument naming the first parameter that is not usable.
  void check() const {
    auto bad = [&](const char* what) {
      throw Error(ErrorCode::invalid_argument, "network model '" + name + "': " + what);
    };
    for (const LinkClass* c : {&intra, &inter}) {
      const char* k = c == &intra ? "intra" : "inter";
      if (!(c->latency >= 0)) bad((std::string(k) + ".latency must be >= 0 seconds").c_str());
      if (!(c->bandwidth > 0)) bad((std::string(k) + ".bandwidth must be > 0 bytes/s").c_str());
      if (!(c->overhead >= 0)) bad((std::string(k) + ".overhead must be >= 0 seconds").c_str());
      if (c->slice_bytes == 0) bad((std::string(k) + ".slice_bytes must be > 0").c_str());
      if (!(c->burst_bytes >= 0)) bad((std::string(k) + ".burst_bytes must be >= 0").c_str());
      if (!(c->handshake >= 0)) bad((std::string(k) + ".handshake must be >= 0 seconds").c_str());
      if (!(c->cpu_share >= 0 && c->cpu_share <= 1)) bad((std::string(k) + ".cpu_share must be within 0 to 1").c_str());
    }
    if (!(reduce_rate > 0)) bad("reduce_rate must be > 0 bytes/s");
    if (!(copy_rate > 0)) bad("copy_rate must be > 0 bytes/s");
    if (!(cached_speedup > 0) || !(cached_intra_speedup > 0)) bad("cached speedups must be > 0");
    if (!(in_place_reduce_speedup > 0)) bad("in_place_reduce_speedup must be > 0");
    if (!(cores >= 0)) bad("cores must be >= 0 (0: a core per rank)");
    if (!(wake >= 0)) bad("wake must be >= 0 seconds");
    if (!(control_queue_bytes >= 0)) bad("control_queue_bytes must be >= 0");
  }

  /// The model as a call of `call_bytes` per rank sees it, on `hosts` hosts of `local` ranks:
  /// the memory tier and the CPU sharing above folded into the rates, overheads and latencies.
  NetworkModel effective(int hosts, int local, std::size_t call_bytes) const {
    NetworkModel m = *this;
    const double sharing = this->sharing(hosts, local);
    if (cache_bytes > 0 && static_cast<double>(call_bytes) * sharing <= static_cast<double>(cache_bytes)) {
      m.intra.bandwidth *= cached_intra_speedup;
      m.copy_rate *= cached_speedup;
      m.reduce_rate *= cached_speedup;
    }
    if (cores > 0 && sharing > cores) {
      const double slow = sharing / cores;
      for (LinkClass* c : {&m.intra, &m.inter}) {
        if (!(core_queues && overhead_queues)) c->overhead *= slow;
        c->latency += wake;
      }
      if (!core_queues) {
        m.copy_rate /= slow;
        m.reduce_rate /= slow;
      }
    }
    return m;
  }

  /// The cost model's view (algo/select.hpp): latency per message (the link's and both ends'
  /// overheads), seconds per byte, the slice.
  TransportModel intra_model() const {
    return {intra.latency + 2 * intra.overhead, 1.0 / intra.bandwidth, intra.slice_bytes};
  }
  /// Between hosts, beta is the host's network link as a whole (what algo/plan.hpp takes from
  /// CHORUS_NET_BANDWIDTH): one NIC, or `local` of them with a NIC per rank.
  TransportModel inter_model(int local) const {
    const double host_bw = inter.bandwidth * (nic_per_rank ? local : 1);
    return {inter.latency + 2 * inter.overhead, 1.0 / host_bw, inter.slice_bytes};
  }
};

/// A FIFO server of a bandwidth (one direction of a port or NIC): when it is free again.
struct Server {
  double free = 0;
  double tokens = 0;  ///< bytes in its token bucket at `free` (LinkClass::burst_bytes)

  /// Serves `bytes` from `start` (>= free) at `bandwidth`, with a token bucket of `burst` bytes
  /// (0: none) refilled at that rate while the server is idle: the bytes it holds pass at once.
  /// Returns how long the server is busy; `free` is left to the caller.
  double serve(double start, double bytes, double bandwidth, double burst) {
    if (!(burst > 0)) return bytes / bandwidth;
    const double avail = std::min(burst, tokens + (start - free) * bandwidth);
    const double used = std::min(avail, bytes);
    tokens = avail - used;
    return (bytes - used) / bandwidth;
  }
};

}  // namespace chorus::sim
