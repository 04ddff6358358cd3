// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// rdma::Transport: links over RDMA (verbs, through the seam of detail/verbs.hpp), one
/// reliable-connected queue pair per peer (link.hpp has the protocol).
///
/// Set-up: the provider is opened (detail/provider.hpp: libibverbs on the chosen port, or the
/// fake); one completion queue with a completion channel serves every link. Per peer, a QP is created and its
/// address (GID, LID, QPN, PSN, MTU) is published in the bootstrap store with the address and rkey
/// of the credit block the peer writes into; each side reads the peer's entry, brings its QP to
/// RTS, posts its receive slots and says it is ready; nobody sends before the peer is ready.
///
/// Progress (transport/progress.hpp): the thread that waits for a request polls the completion
/// queue itself, then arms it and sleeps in poll() on the completion channel, the asynchronous
/// event fd and the engine's eventfd. No thread hop on the hot path. The engine's own thread does
/// the same for work nobody waits on, and parks while callers drive.
///
/// Failure: an error completion, an asynchronous event (QP fatal, port down, device fatal) or a
/// peer's abort word fails that link, or every link, with peer_failure naming the peer and
/// ibv_wc_status_str's text; the QP goes to ERROR and the user buffers' registrations are
/// released. A peer that dies while nothing is posted to it is found by the timeout (RC has no
/// liveness of its own: a write to it fails after the retry count, CHORUS_IB_RETRY_CNT).

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "chorus/bootstrap/rendezvous.hpp"
#include "chorus/core/concepts.hpp"
#include "chorus/core/cost_model.hpp"
#include "chorus/transport/peer_info.hpp"
#include "chorus/detail/env.hpp"
#include "chorus/detail/log.hpp"
#include "chorus/transport/rdma/detail/engine.hpp"
#include "chorus/transport/rdma/detail/provider.hpp"
#include "chorus/transport/rdma/link.hpp"
#include "chorus/transport/shell.hpp"

namespace chorus::rdma {
namespace detail {

/// The QP tunables from CHORUS_IB_TIMEOUT (1-31), CHORUS_IB_RETRY_CNT (0-7), CHORUS_IB_RNR_RETRY (0-7).
inline QpTunables tunables() {
  QpTunables t;
  t.timeout = static_cast<std::uint8_t>(chorus::detail::env_int("CHORUS_IB_TIMEOUT", 1, 31).value_or(t.timeout));
  t.retry_cnt = static_cast<std::uint8_t>(chorus::detail::env_int("CHORUS_IB_RETRY_CNT", 0, 7).value_or(t.retry_cnt));
  t.rnr_retry = static_cast<std::uint8_t>(chorus::detail::env_int("CHORUS_IB_RNR_RETRY", 0, 7).value_or(t.rnr_retry));
  return t;
}

/// What a rank publishes for one peer: its QP's address and its credit block for that peer.
struct Endpoint {
  QpAddress qp;
  QpAddress control;  ///< the QP that carries only an abort (Link::control_qp)
  std::uint64_t credits_addr = 0;
  std::uint32_t credits_rkey = 0;
};
inline std::string encode(const Endpoint& e) {
  std::string s(2 * sizeof e, '0');
  const auto* p = reinterpret_cast<const unsigned char*>(&e);
  for (std::size_t i = 0; i < sizeof e; ++i) std::snprintf(&s[2 * i], 3, "%02x", p[i]);
  return s;
}
inline bool decode(const std::string& s, Endpoint& e) {
  if (s.size() != 2 * sizeof e) return false;
  auto* p = reinterpret_cast<unsigned char*>(&e);
  for (std::size_t i = 0; i < sizeof e; ++i) {
    unsigned v = 0;
    if (std::sscanf(s.c_str() + 2 * i, "%2x", &v) != 1) return false;
    p[i] = static_cast<unsigned char>(v);
  }
  return true;
}

}  // namespace detail

// Its provider depends on CHORUS_WITH_RDMA: named after it (config.hpp: CHORUS_OPTIONS_NAMESPACE).
inline namespace CHORUS_OPTIONS_NAMESPACE {

class Transport : public chorus::detail::EngineTransport<Transport, detail::Engine, Link> {
 public:
  static constexpr std::string_view kName = "rdma";
  /// An RC QP on an RDMA NIC: a few microseconds per message through the engine (a 100 Gb/s
  /// InfiniBand or RoCE link), about 10 GB/s, and slices of 1 MiB (one RDMA write each).
  static constexpr TransportModel kModel{5e-6, 1.0 / 10e9, std::size_t(1) << 20};

  /// What this rank tells the others (hybrid::Transport publishes it): "ok:<fabric>" or "no:<why>".
  static std::string local_fact(const ErrorContext&) { return local_fabric(); }
  /// Ranks that both opened a provider on the same fabric.
  static bool can_connect(const PeerInfo& me, const PeerInfo& peer) {
    const auto a = me.fact(kName);
    return a.starts_with("ok:") && a == peer.fact(kName);
  }
  static std::string why_not(const PeerInfo& me, const PeerInfo& peer) {
    for (const auto* p : {&me, &peer}) {
      const auto f = p->fact(kName);
      if (!f.starts_with("ok:"))
        return "rank " + std::to_string(p->rank) + " has no usable RDMA device (" + std::string(f.substr(std::min<std::size_t>(3, f.size()))) + ")";
    }
    return "the two ranks are on different RDMA fabrics ('" + std::string(me.fact(kName)) + "' and '" +
           std::string(peer.fact(kName)) + "')";
  }

  explicit Transport(const Bootstrap& b) : Transport(b, std::vector<bool>(static_cast<std::size_t>(b.size), true)) {}
  /// Links to the ranks with peers[p] set; both ends of a pair must agree. rank(), size(),
  /// link(peer), memory_bytes() and abort(why) are EngineTransport's (transport/shell.hpp).
  Transport(const Bootstrap& b, std::vector<bool> peers);

  /// The device port in use.
  const PortInfo& port() const { return engine_->verbs->port(); }

  // --- device memory (dma-buf) -----------------------------------------------------------------
  /// Device memory over this transport (link.hpp): whether the NIC registers dma-bufs, whether a
  /// device runtime's buffers go zero-copy (bound by the first call that asked), and how many
  /// dma-buf registrations messages have made.
  struct DeviceMemoryStats {
    bool nic = false;
    bool zero_copy = false;
    std::uint64_t registrations = 0;
  };
  DeviceMemoryStats device_memory_stats() const {
    std::lock_guard lk(engine_->hub.mu);
    const auto& d = engine_->hub.device;
    return {d.nic, d.runtime != nullptr, d.registrations};
  }
  // --- end of device memory (dma-buf) ----------------------------------------------------------

 private:
  void connect(const Bootstrap& b, const std::vector<bool>& peers);
};

// ---- bodies ----

inline Transport::Transport(const Bootstrap& b, std::vector<bool> peers)
    : EngineTransport(b.rank, b.size, peers.size()) {
  const ErrorContext ctx{rank_, -1, "rdma"};
  (void)detail::tunables();  // a bad CHORUS_IB_* fails here
  auto& e = *engine_;
  e.rank = rank_;
  if (e.hub.wake < 0) throw chorus::detail::system_error(ctx, "eventfd");
  std::string why;
  e.verbs = open_provider(why);
  if (!e.verbs) throw Error(ErrorCode::unsupported, ctx, "no RDMA device can be used: " + why);
  peers[static_cast<std::size_t>(rank_)] = false;
  const auto n = static_cast<std::size_t>(std::count(peers.begin(), peers.end(), true));
  try {
    e.slab = std::make_unique<detail::Slab>(*e.verbs, n, ctx);
    e.regs = std::make_unique<RegistrationCache>(*e.verbs);
    e.hub.device.nic = e.verbs->dmabuf_supported();
    e.hub.device.device = e.verbs->port().device;
    const int cqe = static_cast<int>(std::max<std::size_t>(1, n) * (Policy::kSlots + Policy::kSendDepth) + 16);
    e.cq = e.verbs->create_cq(cqe);
  } catch (const VerbsError& v) {
    throw Error(ErrorCode::system, ctx, v.call + " failed: " + std::strerror(v.err));
  }
  const std::weak_ptr<chorus::detail::Driver> weak_driver = engine_;
  std::size_t i = 0;
  for (int p = 0; p < size_; ++p)
    if (peers[static_cast<std::size_t>(p)])
      e.links[static_cast<std::size_t>(p)] =
          std::make_unique<Link>(rank_, p, e.hub, *e.verbs, *e.regs, e.slab->memory(i++), b.options.timeout, weak_driver);
  connect(b, peers);
  chorus::detail::log(chorus::detail::LogLevel::info, chorus::detail::LogSubsys::rdma, rank_, "rdma: ", n, " peers over ", port().device, ":", port().port,
                      " (", port().link_layer, ", GID index ", port().gid_index, "), dma-buf registration ",
                      e.hub.device.nic ? "supported" : "not supported");
  start_progress_thread();
}

inline void Transport::connect(const Bootstrap& b, const std::vector<bool>& peers) {
  using detail::Clock;
  auto& e = *engine_;
  const auto deadline = Clock::now() + b.options.setup_bound();
  auto remaining = [&] {
    return std::max(std::chrono::milliseconds(1),
                    std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
  };
  auto key = [](const char* what, int from, int to) {
    return std::string("rdma/") + what + "/" + std::to_string(from) + "/" + std::to_string(to);
  };
  const QpTunables tun = detail::tunables();
  std::random_device rd;
  // Create the QPs and publish this side's endpoint for each peer.
  std::vector<detail::Endpoint> mine(static_cast<std::size_t>(size_));
  for (int p = 0; p < size_; ++p) {
    if (!peers[static_cast<std::size_t>(p)]) continue;
    const ErrorContext pctx{rank_, p, "rdma connect"};
    auto& link = *e.links[static_cast<std::size_t>(p)];
    try {
      Qp* qp = e.verbs->create_qp(e.cq, e.cq, Policy::kSendDepth, Policy::kSlots, 256);
      const std::uint32_t max_inline = e.verbs->port().max_inline_data;  // what the data QP was granted
      Qp* control = nullptr;
      try {
        control = e.verbs->create_qp(e.cq, e.cq, 4, 1, 64);
      } catch (...) {
        e.verbs->destroy_qp(qp);
        throw;
      }
      link.set_qp(qp, control, max_inline);
    } catch (const VerbsError& v) {
      throw Error(ErrorCode::system, pctx, v.call + " failed: " + std::strerror(v.err));
    }
    auto& me = mine[static_cast<std::size_t>(p)];
    me.qp = e.verbs->local_address();
    me.qp.qpn = link.qp()->qp_num;
    me.qp.psn = rd() & 0xffffff;
    me.control = e.verbs->local_address();
    me.control.qpn = link.control_qp()->qp_num;
    me.control.psn = rd() & 0xffffff;
    me.credits_addr = link.credits_address();
    me.credits_rkey = e.slab->rkey();
    b.store->set(key("ep", rank_, p), detail::encode(me));
  }
  // Connect each QP to the peer's, post the receive slots, say so.
  for (int p = 0; p < size_; ++p) {
    if (!peers[static_cast<std::size_t>(p)]) continue;
    const ErrorContext pctx{rank_, p, "rdma connect"};
    auto& link = *e.links[static_cast<std::size_t>(p)];
    detail::Endpoint theirs;
    if (!detail::decode(b.store->get(key("ep", p, rank_), remaining()), theirs))
      throw Error(ErrorCode::peer_failure, pctx, "the peer published an endpoint that does not parse");
    int err = e.verbs->connect_qp(link.qp(), mine[static_cast<std::size_t>(p)].qp, theirs.qp, tun);
    if (err == 0) err = e.verbs->connect_qp(link.control_qp(), mine[static_cast<std::size_t>(p)].control, theirs.control, tun);
    if (err != 0)
      throw Error(ErrorCode::system, pctx,
                  std::string("bringing the queue pair to RTR/RTS failed (") + std::strerror(err) + ") on " +
                      port().device + " GID index " + std::to_string(port().gid_index) +
                      " (CHORUS_IB_HCA, CHORUS_IB_GID_INDEX choose them)");
    link.set_remote_credits(theirs.credits_addr, theirs.credits_rkey);
    try {
      link.post_slots();
    } catch (const VerbsError& v) {
      throw Error(ErrorCode::system, pctx, v.call + " failed: " + std::strerror(v.err));
    }
    b.store->set(key("ready", rank_, p), "1");
  }
  // Nobody sends before the peer's receive slots are posted.
  for (int p = 0; p < size_; ++p)
    if (peers[static_cast<std::size_t>(p)]) b.store->get(key("ready", p, rank_), remaining());
}

static_assert(chorus::Transport<Transport>);

}  // inline namespace CHORUS_OPTIONS_NAMESPACE
}  // namespace chorus::rdma
