// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// shm::Transport: links between processes of one host through shared memory, driven by the
/// thread that waits (a background thread stands in for work nobody waits on; transport/progress.hpp).
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
#include "chorus/transport/peer_info.hpp"
#include "chorus/detail/env.hpp"
#include "chorus/detail/log.hpp"
#include "chorus/transport/shell.hpp"
#include "chorus/transport/shm/detail/engine.hpp"
#include "chorus/transport/shm/link.hpp"

namespace chorus::shm {
namespace detail {

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

}  // namespace detail

class Transport : public chorus::detail::EngineTransport<Transport, detail::Engine, Link> {
 public:
  static constexpr std::string_view kName = "shm";
  /// Processes of one host over shm: ~3 us per message with the waiting thread polling the ring
  /// (an 8-byte all_reduce step takes about 1 us with 2 ranks on 2 cores, 4-7 us with 4; 3 us puts
  /// the switch from recursive doubling to the ring at 32-64 KiB, where messages leave the ring for
  /// cross-memory pulls and the measured curves cross), ~5 GB/s one copy; slices of 256 KiB (a
  /// pull each: larger ones pipeline less, smaller ones pay a system call more often).
  static constexpr TransportModel kModel{3e-6, 1.0 / 5e9, 256 << 10};
  /// Where this rank's memory can be shared from (hybrid::Transport publishes it to the others):
  /// "<boot id>|<network namespace>", e.g. "...|net:[4026532281]". A segment travels as a memfd
  /// over an abstract unix socket, which only processes of one kernel and one network namespace
  /// reach; the mount namespace does not matter, since nothing has a name in the file system.
  static std::string local_fact(const ErrorContext&) {
    return chorus::detail::boot_id() + '|' + chorus::detail::read_link("/proc/self/ns/net");
  }
  /// Ranks of one host (PeerInfo::host) that reach each other's abstract sockets (local_fact).
  static bool can_connect(const PeerInfo& me, const PeerInfo& peer) { return why_not(me, peer).empty(); }
  /// Why the pair cannot share memory, "" when it can.
  static std::string why_not(const PeerInfo& me, const PeerInfo& peer) {
    if (me.host != peer.host) return "not on the same host";
    const std::string_view a = me.fact(kName), b = peer.fact(kName);
    if (a == b) return {};
    // Facts are "<boot id>|<network namespace>".
    const auto kernel = [](std::string_view f) { return std::string(f.substr(0, f.find('|'))); };
    const auto net = [](std::string_view f) { return std::string(f.substr(f.find('|') + 1)); };
    if (kernel(a) != kernel(b)) return "cannot share memory: different kernels (boot ids " + kernel(a) + " and " + kernel(b) + ")";
    return "cannot share memory: different network namespaces (" + net(a) + " and " + net(b) + ")";
  }

  /// Links to every other rank (all must be on this host).
  explicit Transport(const Bootstrap& b) : Transport(b, std::vector<bool>(static_cast<std::size_t>(b.size), true)) {}
  /// Links to the ranks with peers[p] set (the others are reached another way); both ends of a
  /// pair must agree. rank(), size(), link(peer), memory_bytes() and abort(why) are
  /// EngineTransport's (transport/shell.hpp).
  Transport(const Bootstrap& b, std::vector<bool> peers);

  /// True when messages from `peer` are pulled with cross-memory attach (else streamed).
  bool uses_cma(int peer) { return link(peer).cma(); }

 private:
  void connect(const Bootstrap& b, const std::vector<bool>& peers);
};

// ---- bodies ----

inline Transport::Transport(const Bootstrap& b, std::vector<bool> peers) : EngineTransport(b.rank, b.size, peers.size()) {
  if (!engine_->hub.wake)
    detail::throw_errno(ErrorContext{rank_, -1, "shm"}, "eventfd");
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
    engine_->hub.oversubscribed = local > ncpu;
  }
  start_progress_thread();
}

inline void Transport::connect(const Bootstrap& b, const std::vector<bool>& peers) {
  using detail::Clock;
  const auto deadline = Clock::now() + b.options.setup_bound();
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
      chorus::detail::log(chorus::detail::LogLevel::info, chorus::detail::LogSubsys::shm, rank_, "shm: cross-memory attach to peer ", peer,
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

  // Connect to every lower peer, once all of them listen (one store request); each answers with
  // the segment.
  std::vector<std::string> lower;
  for (int p = 0; p < rank_; ++p)
    if (peers[static_cast<std::size_t>(p)]) lower.push_back("shm/listening/" + std::to_string(p));
  if (!lower.empty()) b.store->wait(lower, remaining());
  for (int p = 0; p < rank_; ++p) {
    if (!peers[static_cast<std::size_t>(p)]) continue;
    const ErrorContext pctx{rank_, p, "shm connect"};
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
                  "no shm connection from ranks " + missing + " within " + std::to_string(b.options.setup_bound().count()) +
                      " ms (CHORUS_TIMEOUT)");
    }
    detail::Fd s(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!s) continue;
    auto refuse = [&](const std::string& why) {
      chorus::detail::log(chorus::detail::LogLevel::warn, chorus::detail::LogSubsys::shm, rank_, "shm: refused a connection: ", why);
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
