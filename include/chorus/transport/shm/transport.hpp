#pragma once
/// shm::Transport: links between processes of one host through shared memory, one progress
/// thread per transport.
///
/// Set-up, per pair of ranks (lower rank `lo`, higher rank `hi`):
///   1. lo listens on an abstract unix socket named after the job nonce and its rank (no file
///      anywhere) and says so in the store; hi connects, and both check the other's credentials
///      (SO_PEERCRED: our user or root) and a hello carrying the job nonce and both ranks.
///   2. lo creates the link's segment as an anonymous memfd (memfd_create), maps it, and passes
///      the descriptor to hi over the socket (SCM_RIGHTS); hi maps it; both close the descriptor.
///      The segment never has a name, so there is nothing to unlink and nothing can be left in
///      /dev/shm, whether a process exits, throws or is killed at any point: the kernel frees the
///      memory when the last mapping goes. (A named shm_open segment leaks when its creator is
///      killed between creating and the peer's unlink; this avoids that window entirely.)
///   3. Each side probes cross-memory attach by reading a known word of the peer with
///      process_vm_readv; large messages then take one copy (see link.hpp).
/// The socket stays open for the life of the link: it carries doorbells (one byte, only when
/// the other side announced it sleeps) and its EOF tells of the peer's death at once, since the
/// kernel closes a killed process's sockets.
///
/// Progress (transport/progress.hpp): the thread that waits for a request drives the engine: it
/// drains the rings, writes what waits for room and runs the CMA pulls itself, spinning on
/// lock-free peeks at the rings for ProgressPolicy::spin(), then announces it sleeps (flags in
/// the rings, see detail/segment.hpp) and blocks in poll() on the link sockets and an eventfd
/// that isend/irecv and aborts kick. The engine's own thread does the same for work nobody waits
/// on, and parks while callers drive. poll's timeout only bounds the wait, it is not needed for
/// progress. So idle ranks cost no CPU, 8 ranks share 2 cores.

#include <sched.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <new>
#include <optional>
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
#include "chorus/transport/shell.hpp"
#include "chorus/transport/shm/link.hpp"

namespace chorus::shm {
namespace detail {

using chorus::detail::cpu_relax;

/// True when this process may read `pid`'s memory with process_vm_readv (read the probe word).
inline bool cma_works(std::uint64_t pid, std::uint64_t addr) {
  std::uint64_t v = 0;
  iovec local{&v, sizeof v};
  iovec remote{reinterpret_cast<void*>(static_cast<std::uintptr_t>(addr)), sizeof v};
  return ::process_vm_readv(static_cast<pid_t>(pid), &local, 1, &remote, 1, 0) == sizeof v && v == kCmaProbeValue;
}

/// CHORUS_SHM_CMA: 1 (default) uses cross-memory attach where the probe allows it, 0 never.
inline bool cma_wanted(const ErrorContext& ctx) {
  auto v = chorus::detail::env_string("CHORUS_SHM_CMA");
  if (!v) return true;
  if (*v != "0" && *v != "1") throw Error(ErrorCode::invalid_argument, ctx, "CHORUS_SHM_CMA='" + *v + "' is not 0 or 1");
  return *v == "1";
}

/// The links and the progress thread of one transport; shared by the thread, so a transport
/// destroyed on its own progress thread leaves the engine to the thread until it ends. Requests
/// hold it (weakly) as their Driver: whoever waits for one drives the engine.
struct Engine final : chorus::detail::DrivenEngine<Engine> {
  static constexpr auto kSpin = std::chrono::microseconds(50);  ///< the background thread's spin
  static constexpr auto kDeathCheck = std::chrono::milliseconds(20);
  static constexpr auto kPoll = std::chrono::milliseconds(500);

  Hub hub;
  std::vector<std::unique_ptr<Link>> links;  ///< by peer; null where there is no shm link
  std::thread thread;
  int rank = -1;
  /// More ranks on this host (this rank and its shm peers) than processors this process may run
  /// on: a waiter then gives its core away at once when nothing is there (the rank it waits for
  /// may need that core), instead of spinning a while first.
  bool oversubscribed = false;

  /// Fails every link (from any thread); with close, peers see their sockets close.
  void fail_all(ErrorCode code, const std::string& why, bool close = true) {
    Completions done;
    {
      std::lock_guard lk(hub.mu);
      for (auto& l : links)
        if (l) l->fail(code, why, close, done);
    }
    hub.kick();
  }

  // ---- what DrivenEngine needs (the token held, except for wake_background) ----

  /// Drains every ring, writes what waits for room, runs at most one pull; every kDeathCheck
  /// also looks at the sockets (doorbells, a peer's EOF). True when anything moved.
  bool pass() {
    bool busy = false;
    std::optional<Pull> pull;
    Link* pull_link = nullptr;
    {
      Completions done;
      std::lock_guard lk(hub.mu);
      hub.kicked.store(false);
      for (auto& l : links) {
        if (!l) continue;
        busy = l->progress(done) || busy;
        if (!pull_link)
          if ((pull = l->take_pull())) pull_link = l.get();
      }
    }  // completions run here, after the lock
    if (pull_link) {
      const int err = pull_link->run_pull(*pull);
      Completions done;
      std::lock_guard lk(hub.mu);
      pull_link->finish_pull(std::move(*pull), err, done);
      busy = true;
    }
    // A busy driver still notices a dead peer: every kDeathCheck, looked at every 64 passes (a
    // clock read costs about as much as a pass).
    if (++passes_ % 64 == 0) {
      const auto now = Clock::now();
      if (now - last_check_ > kDeathCheck) {
        last_check_ = now;
        check_sockets(0);
      }
    }
    return busy;
  }
  /// Spins on lock-free peeks for a moment; gives the core away when nothing shows up: with more
  /// threads than cores (8 ranks on 2 cores) a plain spin would keep the rank that has to answer
  /// from running.
  template <class Ready>
  void spin_wait(const Ready& ready) const {
    for (int i = oversubscribed ? 64 : 0; i < 64; ++i) {
      if (work_visible() || ready()) return;
      cpu_relax();
    }
    ::sched_yield();
  }
  /// Announces sleep in every ring, makes one more pass (whatever came before the announcement),
  /// and blocks in poll() until `until` unless that pass found work or `ready()` holds (a
  /// mailbox writer rings the doorbell when it sees the reader's sleep flag, like a ring writer).
  template <class Ready>
  void sleep_until(Clock::time_point until, const Ready& ready) {
    {
      Completions done;
      std::lock_guard lk(hub.mu);
      hub.sleeping.store(1);
      bool work = false;
      for (auto& l : links)
        if (l) l->set_sleeping(true);
      for (auto& l : links)
        if (l) work = l->progress(done) || l->has_pull() || work;
      if (work || hub.kicked.load() || stop.load() || ready()) {
        hub.sleeping.store(0);
        for (auto& l : links)
          if (l) l->set_sleeping(false);
        return;
      }
    }
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(until - Clock::now());
    check_sockets(static_cast<int>(std::clamp<std::int64_t>(left.count(), 0, kPoll.count())), /*with_wake=*/true);
    std::lock_guard lk(hub.mu);
    hub.sleeping.store(0);
    for (auto& l : links)
      if (l) l->set_sleeping(false);
  }
  void wake_background() { hub.kick(); }
  /// Room for every link and the eventfd in the poll lists, so the first sleep allocates nothing.
  void reserve_polls() {
    fds_.reserve(links.size() + 1);
    who_.reserve(links.size() + 1);
  }

  // ---- the background thread ----

  void run() { run_passes(kSpin, kPoll); }

 private:
  /// Lock-free: input in a ring, or a kick.
  bool work_visible() const {
    if (hub.kicked.load(std::memory_order_relaxed)) return true;
    for (auto& l : links)
      if (l && l->has_input()) return true;
    return false;
  }

  /// Polls the link sockets (doorbells, EOF) for at most timeout_ms, plus the kick eventfd when
  /// sleeping.
  void check_sockets(int timeout_ms, bool with_wake = false) {
    fds_.clear();
    who_.clear();
    {
      std::lock_guard lk(hub.mu);
      if (with_wake) {
        fds_.push_back({hub.wake.get(), POLLIN, 0});
        who_.push_back(nullptr);
      }
      for (auto& l : links)
        if (l && l->poll_fd() >= 0) {
          fds_.push_back({l->poll_fd(), POLLIN, 0});
          who_.push_back(l.get());
        }
    }
    if (fds_.empty()) return;
    const int k = ::poll(fds_.data(), fds_.size(), timeout_ms);
    if (k <= 0) return;
    Completions done;
    std::lock_guard lk(hub.mu);
    for (std::size_t i = 0; i < fds_.size(); ++i) {
      if (!fds_[i].revents) continue;
      if (!who_[i]) {
        std::uint64_t v;
        [[maybe_unused]] auto r = ::read(hub.wake.get(), &v, sizeof v);
      } else {
        who_[i]->on_readable(done);
      }
    }
  }

  // Used by the token's holder only (reserved for every link at creation: reserve_polls()).
  std::vector<pollfd> fds_;
  std::vector<Link*> who_;
  Clock::time_point last_check_{};
  std::uint64_t passes_ = 0;  ///< passes made (the driver's, under the token)
};

}  // namespace detail

class Transport {
 public:
  static constexpr std::string_view kName = "shm";
  /// Processes of one host over shm: ~3 us per message with the waiting thread polling the ring
  /// (an 8-byte all_reduce step takes about 1 us with 2 ranks on 2 cores, 4-7 us with 4; 3 us puts
  /// the switch from recursive doubling to the ring at 32-64 KiB, where messages leave the ring for
  /// cross-memory pulls and the measured curves cross), ~5 GB/s one copy; slices of 256 KiB (a
  /// pull each: larger ones pipeline less, smaller ones pay a system call more often).
  static constexpr TransportModel kModel{3e-6, 1.0 / 5e9, 256 << 10};
  /// Ranks of one host (registry.hpp).
  static bool can_connect(const PeerInfo& me, const PeerInfo& peer) {
    return me.host == peer.host;
  }

  /// Links to every other rank (all must be on this host).
  explicit Transport(const Bootstrap& b) : Transport(b, std::vector<bool>(static_cast<std::size_t>(b.size), true)) {}
  /// Links to the ranks with peers[p] set (the others are reached another way); both ends of a
  /// pair must agree.
  Transport(const Bootstrap& b, std::vector<bool> peers);
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;
  ~Transport();

  int rank() const { return rank_; }
  int size() const { return size_; }
  Link& link(int peer) {
    return chorus::detail::checked_link(engine_->links, rank_, size_, peer, "shm link",
                                        "no link to this rank itself (send to self is not supported)",
                                        "no shm link to this peer");
  }
  /// Bytes the links hold (see Link::memory_bytes()).
  std::size_t memory_bytes() const {
    return chorus::detail::links_memory_bytes(*this, engine_->links);
  }
  /// True when messages from `peer` are pulled with cross-memory attach (else streamed).
  bool uses_cma(int peer) { return link(peer).cma(); }

  /// Fails every link with why's code. A mismatch is told to every rank by the communicator
  /// itself, so for it the sockets stay open; any other abort closes them (peers see EOF).
  void abort(const Error& why) {
    chorus::detail::abort_links(*engine_, why);
  }

 private:
  void connect(const Bootstrap& b, const std::vector<bool>& peers);

  int rank_;
  int size_;
  std::shared_ptr<detail::Engine> engine_;
};

// ---- bodies ----

inline Transport::Transport(const Bootstrap& b, std::vector<bool> peers)
    : rank_(b.rank), size_(b.size), engine_(std::make_shared<detail::Engine>()) {
  if (peers.size() != static_cast<std::size_t>(size_))
    throw Error(ErrorCode::invalid_argument, ErrorContext{rank_, -1, "shm"}, "peer mask of the wrong size");
  (void)chorus::detail::buffered_cap();  // a bad CHORUS_MAX_BUFFERED_BYTES fails here, not in a link
  if (!engine_->hub.wake)
    detail::throw_errno(ErrorContext{rank_, -1, "shm"}, "eventfd");
  engine_->rank = rank_;
  engine_->links.resize(static_cast<std::size_t>(size_));
  const std::weak_ptr<chorus::detail::Driver> weak_driver = engine_;
  for (int p = 0; p < size_; ++p)
    if (p != rank_ && peers[static_cast<std::size_t>(p)])
      engine_->links[static_cast<std::size_t>(p)] =
          std::make_unique<Link>(rank_, p, engine_->hub, b.options.timeout, weak_driver);
  connect(b, peers);
  engine_->reserve_polls();
  {
    cpu_set_t cpus;
    CPU_ZERO(&cpus);
    const int ncpu = ::sched_getaffinity(0, sizeof cpus, &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
    const auto local = 1 + std::count(peers.begin(), peers.end(), true) - (peers[static_cast<std::size_t>(rank_)] ? 1 : 0);
    engine_->oversubscribed = local > ncpu;
  }
  engine_->thread = std::thread([eng = engine_] {
    try {
      eng->run();
    } catch (const std::exception& e) {
      chorus::detail::log(chorus::detail::LogLevel::warn, eng->rank, "shm progress thread: ", e.what());
      eng->fail_all(ErrorCode::system, std::string("shm progress thread failed: ") + e.what());
    }
  });
}

inline Transport::~Transport() {
  engine_->fail_all(ErrorCode::peer_failure, "the communicator was destroyed");
  engine_->stop.store(true);
  engine_->hub.kick();
  engine_->token.unpark();
  if (!engine_->thread.joinable()) return;
  if (engine_->thread.get_id() == std::this_thread::get_id())
    engine_->thread.detach();  // on the progress thread itself: it ends at its next loop
  else
    engine_->thread.join();
}

inline void Transport::connect(const Bootstrap& b, const std::vector<bool>& peers) {
  using detail::Clock;
  const auto deadline = Clock::now() + b.options.timeout;
  const ErrorContext ctx{rank_, -1, "shm connect"};
  const bool cma_on = detail::cma_wanted(ctx);
  auto remaining = [&] {
    return std::max(std::chrono::milliseconds(1),
                    std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
  };
  auto hello = [&](int peer) {
    detail::ShmHello h;
    h.nonce = b.nonce;
    h.rank = rank_;
    h.peer = peer;
    h.world = size_;
    h.pid = static_cast<std::uint64_t>(::getpid());
    h.probe_addr = reinterpret_cast<std::uintptr_t>(&detail::kCmaProbe);
    return h;
  };
  auto probe = [&](int peer, std::uint64_t pid, std::uint64_t addr) {
    const bool ok = cma_on && detail::cma_works(pid, addr);
    if (cma_on && !ok)
      chorus::detail::log(chorus::detail::LogLevel::info, rank_, "shm: cross-memory attach to peer ", peer,
                          " is not allowed here (", std::strerror(errno), "): large messages go through the ring");
    return ok;
  };

  int higher = 0;
  for (int p = rank_ + 1; p < size_; ++p) higher += peers[static_cast<std::size_t>(p)] ? 1 : 0;

  // Listen (when a higher rank will connect) and say so in the store.
  detail::Fd listener;
  if (higher > 0) {
    listener = detail::Fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!listener) detail::throw_errno(ctx, "socket(AF_UNIX)");
    socklen_t len = 0;
    const sockaddr_un addr = detail::listen_address(b.nonce, rank_, len);
    if (::bind(listener.get(), reinterpret_cast<const sockaddr*>(&addr), len) != 0)
      detail::throw_errno(ctx, "bind of the abstract unix socket");
    if (::listen(listener.get(), size_) != 0) detail::throw_errno(ctx, "listen");
    b.store->set("shm/listening/" + std::to_string(rank_), "1");
  }

  // Connect to every lower peer; it answers with the segment.
  for (int p = 0; p < rank_; ++p) {
    if (!peers[static_cast<std::size_t>(p)]) continue;
    const ErrorContext pctx{rank_, p, "shm connect"};
    b.store->get("shm/listening/" + std::to_string(p), remaining());
    detail::Fd s(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!s) detail::throw_errno(pctx, "socket(AF_UNIX)");
    socklen_t len = 0;
    const sockaddr_un addr = detail::listen_address(b.nonce, p, len);
    if (::connect(s.get(), reinterpret_cast<const sockaddr*>(&addr), len) != 0)
      detail::throw_errno(pctx, "connect to the peer's unix socket (is it on this host?)");
    std::uint64_t pid = 0;
    if (!detail::peer_is_trusted(s.get(), pid))
      throw Error(ErrorCode::peer_failure, pctx, "the process listening for rank " + std::to_string(p) +
                                                     " belongs to another user; refusing it");
    const detail::ShmHello mine = hello(p);
    detail::ShmHello theirs;
    int seg = -1;
    if (!detail::write_all(s.get(), &mine, sizeof mine, deadline) ||
        !detail::read_exact(s.get(), &theirs, sizeof theirs, deadline, &seg)) {
      if (seg >= 0) ::close(seg);
      throw Error(Clock::now() >= deadline ? ErrorCode::timeout : ErrorCode::peer_failure, pctx,
                  "no answer to the shm hello (the peer refused it or exited)");
    }
    detail::Fd segfd(seg);
    if (!detail::hello_matches(theirs, b.nonce, p, rank_, size_) || theirs.status != 0 || !segfd)
      throw Error(ErrorCode::peer_failure, pctx, "bad shm hello reply");
    detail::Mapping map(segfd.get(), pctx);
    segfd.reset();
    auto& link = *engine_->links[static_cast<std::size_t>(p)];
    link.attach(std::move(s), std::move(map), /*dir=*/1, pid, probe(p, pid, theirs.probe_addr));
  }

  // Accept every higher peer: check it, create the segment, send it over.
  std::vector<bool> connected(static_cast<std::size_t>(size_), false);
  while (higher > 0) {
    if (!detail::wait_fd(listener.get(), POLLIN, deadline)) {
      std::string missing;
      for (int p = rank_ + 1; p < size_; ++p)
        if (peers[static_cast<std::size_t>(p)] && !connected[static_cast<std::size_t>(p)])
          missing += (missing.empty() ? "" : ", ") + std::to_string(p);
      throw Error(ErrorCode::timeout, ctx,
                  "no shm connection from ranks " + missing + " within " + std::to_string(b.options.timeout.count()) +
                      " ms (CHORUS_TIMEOUT)");
    }
    detail::Fd s(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!s) continue;
    auto refuse = [&](const std::string& why) {
      chorus::detail::log(chorus::detail::LogLevel::warn, rank_, "shm: refused a connection: ", why);
    };
    std::uint64_t pid = 0;
    if (!detail::peer_is_trusted(s.get(), pid)) {
      refuse("it comes from another user");
      continue;
    }
    detail::ShmHello h;
    if (!detail::read_exact(s.get(), &h, sizeof h, std::min(deadline, Clock::now() + std::chrono::seconds(5)))) {
      refuse("no hello");
      continue;
    }
    const int p = detail::accepted_hello_rank(h, b.nonce, rank_, size_, peers, connected);
    if (p < 0) {
      refuse("its hello does not belong to this job and rank");
      continue;
    }
    const ErrorContext pctx{rank_, p, "shm connect"};
    detail::Fd segfd(::memfd_create("chorus-shm-link", MFD_CLOEXEC));
    if (!segfd) detail::throw_errno(pctx, "memfd_create");
    if (::ftruncate(segfd.get(), static_cast<off_t>(detail::kSegmentBytes)) != 0)
      detail::throw_errno(pctx, "ftruncate of the link segment");
    detail::Mapping map(segfd.get(), pctx);
    new (map.control(0)) detail::RingControl;
    new (map.control(1)) detail::RingControl;
    const detail::ShmHello reply = hello(p);
    if (!detail::write_all(s.get(), &reply, sizeof reply, deadline, segfd.get())) {
      refuse("it went away during the hello");
      continue;
    }
    segfd.reset();
    auto& link = *engine_->links[static_cast<std::size_t>(p)];
    link.attach(std::move(s), std::move(map), /*dir=*/0, pid, probe(p, pid, h.probe_addr));
    connected[static_cast<std::size_t>(p)] = true;
    --higher;
  }
  // The listening socket closes here: nothing listens for the rest of the job.
}

static_assert(chorus::Transport<Transport>);

}  // namespace chorus::shm
