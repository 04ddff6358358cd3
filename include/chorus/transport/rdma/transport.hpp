#pragma once
/// rdma::Transport: links over RDMA (verbs, through the seam of verbs.hpp), one reliable-connected
/// queue pair per peer (link.hpp has the protocol).
///
/// Set-up: the provider is opened (provider.hpp: libibverbs on the chosen port, or the fake); one
/// completion queue with a completion channel serves every link. Per peer, a QP is created and its
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
#include "chorus/core/peer_info.hpp"
#include "chorus/detail/env.hpp"
#include "chorus/detail/log.hpp"
#include "chorus/transport/progress.hpp"
#include "chorus/transport/rdma/link.hpp"
#include "chorus/transport/rdma/provider.hpp"
#include "chorus/transport/shell.hpp"

namespace chorus::rdma {
namespace detail {

using Clock = std::chrono::steady_clock;

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

/// Memory the transport registers once: per link two slot arrays and two credit blocks.
class Slab {
 public:
  Slab(Verbs& v, std::size_t links, const ErrorContext& ctx) : v_(v) {
    per_link_ = 2 * Policy::kSlots * Policy::kSlotBytes + 2 * sizeof(CreditBlock);
    bytes_ = std::max<std::size_t>(1, links) * per_link_;
    mem_ = static_cast<std::byte*>(std::aligned_alloc(4096, (bytes_ + 4095) / 4096 * 4096));
    if (!mem_) throw Error(ErrorCode::system, ctx, "out of memory for the rdma slots");
    std::memset(mem_, 0, bytes_);
    int err = 0;
    mr_ = v_.reg_mr(mem_, bytes_, kLocalWrite | kRemoteWrite, err);
    if (!mr_) {
      std::free(mem_);
      throw Error(ErrorCode::system, ctx,
                  "registering the transport's " + std::to_string(bytes_) + " bytes of slots failed (" + std::strerror(err) +
                      (err == ENOMEM ? "; raise the locked-memory limit, ulimit -l" : "") + ")");
    }
  }
  Slab(const Slab&) = delete;
  Slab& operator=(const Slab&) = delete;
  ~Slab() {
    v_.dereg_mr(mr_);
    std::free(mem_);
  }
  Memory memory(std::size_t i) const {
    std::byte* base = mem_ + i * per_link_;
    Memory m;
    m.recv_slots = base;
    m.send_slots = base + Policy::kSlots * Policy::kSlotBytes;
    m.credits_in = new (base + 2 * Policy::kSlots * Policy::kSlotBytes) CreditBlock;
    m.credits_out = new (base + 2 * Policy::kSlots * Policy::kSlotBytes + sizeof(CreditBlock)) CreditBlock;
    m.lkey = mr_->lkey;
    return m;
  }
  std::uint32_t rkey() const { return mr_->rkey; }

 private:
  Verbs& v_;
  std::size_t per_link_ = 0;
  std::size_t bytes_ = 0;
  std::byte* mem_ = nullptr;
  Mr* mr_ = nullptr;
};

/// The provider, the CQ, the links and the progress thread of one transport; shared by the
/// thread and by the requests (weakly, as their Driver).
struct Engine final : chorus::detail::DrivenEngine<Engine> {
  static constexpr auto kSpin = std::chrono::microseconds(50);  ///< the background thread's spin
  static constexpr auto kPoll = std::chrono::milliseconds(100);  ///< the longest sleep (abort words)
  static constexpr auto kStarvedPoll = std::chrono::milliseconds(1);
  static constexpr int kBatch = 32;

  Hub hub;  ///< its mutex guards the links, the CQ and every verbs call
  std::unique_ptr<Verbs> verbs;
  std::unique_ptr<Slab> slab;
  std::unique_ptr<RegistrationCache> regs;
  Cq* cq = nullptr;
  std::vector<std::unique_ptr<Link>> links;  ///< by peer; null where there is none
  std::thread thread;
  int rank = -1;
  bool cq_broken = false;

  ~Engine() {
    links.clear();  // QPs first, then the CQ, the slots, the provider
    if (cq) verbs->destroy_cq(cq);
    slab.reset();
    regs.reset();
  }

  void kick() { hub.kick(); }

  /// Fails every link (from any thread); with tell, peers are told (their abort word).
  void fail_all(ErrorCode code, const std::string& why, bool tell = true) {
    {
      Completions done;
      std::lock_guard lk(hub.mu);
      for (auto& l : links)
        if (l) l->fail(code, why, tell, done);
    }
    kick();
  }

  // ---- what DrivenEngine needs (the token held, except for wake_background) ----

  /// Polls the CQ, hands each completion to its link, then lets every link read its credit
  /// block and post queued work. True when anything moved.
  bool pass() {
    Completions done;
    std::lock_guard lk(hub.mu);
    return pass_locked(done);
  }
  /// A short pause between two polls of the CQ (a poll is cheap: no system call); the core is
  /// given away only every 16th time, so a rank that shares it still runs.
  template <class Ready>
  void spin_wait(const Ready& ready) {
    for (int i = 0; i < 16; ++i) {
      if (ready()) return;
      chorus::detail::cpu_relax();
    }
    if (++spins_ % 16 == 0) ::sched_yield();
  }
  /// Arms the CQ, polls once more (a completion that came before the arming), then sleeps in
  /// poll() on the channel, the async fd and the eventfd.
  template <class Ready>
  void sleep_until(Clock::time_point until, const Ready& ready) {
    bool starved = false;
    {
      Completions done;
      std::lock_guard lk(hub.mu);
      hub.sleeping.store(true, std::memory_order_seq_cst);
      if (!cq_broken) (void)verbs->req_notify_cq(cq);
      const bool moved = pass_locked(done);
      for (auto& l : links)
        if (l && l->starved()) starved = true;
      if (moved || stop.load() || ready()) {
        hub.sleeping.store(false);
        return;
      }
    }
    auto left = std::chrono::ceil<std::chrono::milliseconds>(until - Clock::now());
    left = std::clamp(left, std::chrono::milliseconds(0), starved ? kStarvedPoll : kPoll);
    pollfd fds[3] = {{verbs->channel_fd(cq), POLLIN, 0}, {verbs->async_fd(), POLLIN, 0}, {hub.wake, POLLIN, 0}};
    const int k = ::poll(fds, 3, static_cast<int>(left.count()));
    hub.sleeping.store(false);
    if (k <= 0) return;
    std::lock_guard lk(hub.mu);
    if (fds[0].revents) verbs->drain_channel(cq);
    if (fds[2].revents) {
      std::uint64_t v;
      [[maybe_unused]] auto r = ::read(hub.wake, &v, sizeof v);
    }
    if (fds[1].revents) {
      Completions done;
      async_events(done);
    }
  }
  void wake_background() { kick(); }

  void run() { run_passes(kSpin, kPoll); }

 private:
  bool pass_locked(Completions& done) {
    bool moved = false;
    if (!cq_broken) {
      Wc wcs[kBatch];
      for (;;) {
        const int n = verbs->poll_cq(cq, kBatch, wcs);
        if (n < 0) {
          cq_broken = true;
          fail_locked(ErrorCode::peer_failure,
                      std::string("the completion queue failed (") + std::strerror(-n) + "; overrun?)", done);
          return true;
        }
        for (int i = 0; i < n; ++i) {
          const int peer = wr_peer(wcs[i].wr_id);
          if (peer >= 0 && static_cast<std::size_t>(peer) < links.size() && links[static_cast<std::size_t>(peer)])
            links[static_cast<std::size_t>(peer)]->on_completion(wcs[i], done);
        }
        if (n == 0) break;
        moved = true;
      }
    }
    for (auto& l : links)
      if (l) moved = l->progress(done) || moved;
    if (++passes_ % 256 == 0) async_events(done);
    return moved;
  }

  void fail_locked(ErrorCode code, const std::string& why, Completions& done) {
    for (auto& l : links)
      if (l) l->fail(code, why, true, done);
  }

  /// Asynchronous events: a fatal QP fails its link; a port or device going away fails them all.
  void async_events(Completions& done) {
    AsyncEvent ev;
    while (verbs->next_async_event(ev)) {
      chorus::detail::log(chorus::detail::LogLevel::warn, rank, "rdma: asynchronous event: ", ev.what);
      if (ev.kind == AsyncKind::qp_fatal) {
        for (auto& l : links)
          if (l && ((l->qp() && l->qp()->qp_num == ev.qp_num) || (l->control_qp() && l->control_qp()->qp_num == ev.qp_num)))
            l->fail(ErrorCode::peer_failure, "asynchronous event: " + ev.what, true, done);
      } else if (ev.kind == AsyncKind::port_down || ev.kind == AsyncKind::device_fatal) {
        fail_locked(ErrorCode::peer_failure, "asynchronous event: " + ev.what, done);
      }
    }
  }

  std::uint64_t passes_ = 0;
  std::uint64_t spins_ = 0;
};

}  // namespace detail

class Transport {
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
  Transport(const Bootstrap& b, std::vector<bool> peers);
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;
  ~Transport();

  int rank() const { return rank_; }
  int size() const { return size_; }
  Link& link(int peer) {
    return chorus::detail::checked_link(engine_->links, rank_, size_, peer, "rdma link",
                                        "no link to this rank itself (send to self is not supported)",
                                        "no rdma link to this peer");
  }
  std::size_t memory_bytes() const {
    return chorus::detail::links_memory_bytes(*this, engine_->links);
  }
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

  void abort(const Error& why) { chorus::detail::abort_links(*engine_, why); }

 private:
  void connect(const Bootstrap& b, const std::vector<bool>& peers);

  int rank_;
  int size_;
  std::shared_ptr<detail::Engine> engine_;
};

// ---- bodies ----

inline Transport::Transport(const Bootstrap& b, std::vector<bool> peers)
    : rank_(b.rank), size_(b.size), engine_(std::make_shared<detail::Engine>()) {
  const ErrorContext ctx{rank_, -1, "rdma"};
  if (peers.size() != static_cast<std::size_t>(size_))
    throw Error(ErrorCode::invalid_argument, ctx, "peer mask of the wrong size");
  (void)chorus::detail::buffered_cap();
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
  e.links.resize(static_cast<std::size_t>(size_));
  const std::weak_ptr<chorus::detail::Driver> weak_driver = engine_;
  std::size_t i = 0;
  for (int p = 0; p < size_; ++p)
    if (peers[static_cast<std::size_t>(p)])
      e.links[static_cast<std::size_t>(p)] =
          std::make_unique<Link>(rank_, p, e.hub, *e.verbs, *e.regs, e.slab->memory(i++), b.options.timeout, weak_driver);
  connect(b, peers);
  chorus::detail::log(chorus::detail::LogLevel::info, rank_, "rdma: ", n, " peers over ", port().device, ":", port().port,
                      " (", port().link_layer, ", GID index ", port().gid_index, "), dma-buf registration ",
                      e.hub.device.nic ? "supported" : "not supported");
  engine_->thread = std::thread([eng = engine_] {
    try {
      eng->run();
    } catch (const std::exception& ex) {
      chorus::detail::log(chorus::detail::LogLevel::warn, eng->rank, "rdma progress thread: ", ex.what());
      eng->fail_all(ErrorCode::system, std::string("rdma progress thread failed: ") + ex.what());
    }
  });
}

inline Transport::~Transport() {
  engine_->fail_all(ErrorCode::peer_failure, "the communicator was destroyed");
  engine_->stop.store(true);
  engine_->kick();
  engine_->token.unpark();
  if (!engine_->thread.joinable()) return;
  if (engine_->thread.get_id() == std::this_thread::get_id())
    engine_->thread.detach();
  else
    engine_->thread.join();
}

inline void Transport::connect(const Bootstrap& b, const std::vector<bool>& peers) {
  using detail::Clock;
  auto& e = *engine_;
  const auto deadline = Clock::now() + b.options.timeout;
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

}  // namespace chorus::rdma
