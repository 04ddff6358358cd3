#pragma once
/// hybrid::Transport (kName "auto"): picks a transport per peer, at run time, from
/// Options::transport (CHORUS_TRANSPORT):
/// | transport | same host | other host                                              |
/// |-----------|-----------|---------------------------------------------------------|
/// | auto      | shm       | tcp                                                     |
/// | shm       | shm       | invalid_argument naming the peer                         |
/// | tcp       | tcp       | tcp                                                     |
/// Anything else (rdma, cuda_ipc, inproc) is unsupported here.
///
/// "Same host" compares host ids that every rank publishes in the store at construction: the
/// kernel's boot id, the host name and the mount and network namespaces (shm needs the memfd
/// to be shareable and the abstract unix socket to be reachable, which the network namespace
/// decides). CHORUS_HOST_ID overrides it (tests that pretend to span hosts; containers whose
/// namespaces differ but which can still share memory would need more than that, see
/// docs/environment.md).
///
/// A communicator over it may mix both: link(peer) returns a small wrapper that dispatches to the
/// peer's shm or tcp link; link_kind(peer) says which.

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "chorus/bootstrap/rendezvous.hpp"
#include "chorus/core/concepts.hpp"
#include "chorus/detail/env.hpp"
#include "chorus/detail/log.hpp"
#include "chorus/transport/shm/transport.hpp"
#include "chorus/transport/tcp/transport.hpp"

namespace chorus::hybrid {
namespace detail {

inline std::string read_first_line(const char* path) {
  std::ifstream f(path);
  std::string s;
  std::getline(f, s);
  return s;
}

inline std::string read_link(const char* path) {
  char buf[256];
  const ssize_t k = ::readlink(path, buf, sizeof buf - 1);
  return k > 0 ? std::string(buf, static_cast<std::size_t>(k)) : std::string("?");
}

/// This process's host identity: ranks with equal ids can use shm between them.
inline std::string host_id(const ErrorContext& ctx) {
  if (auto v = chorus::detail::env_string("CHORUS_HOST_ID")) {
    if (v->empty()) throw Error(ErrorCode::invalid_argument, ctx, "CHORUS_HOST_ID is set but empty");
    return "id:" + *v;
  }
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  std::ostringstream os;
  os << read_first_line("/proc/sys/kernel/random/boot_id") << '|' << name << '|' << read_link("/proc/self/ns/mnt")
     << '|' << read_link("/proc/self/ns/net");
  return os.str();
}

}  // namespace detail

/// The link to one peer: its shm link or its tcp link.
class Link {
 public:
  Link(int peer, shm::Link* shm, tcp::Link* tcp) : peer_(peer), shm_(shm), tcp_(tcp) {}
  int peer() const { return peer_; }
  Request isend(ConstBytes data, Tag tag) { return shm_ ? shm_->isend(data, tag) : tcp_->isend(data, tag); }
  Request irecv(MutableBytes data, Tag tag) { return shm_ ? shm_->irecv(data, tag) : tcp_->irecv(data, tag); }
  std::string_view kind() const { return shm_ ? shm::Transport::kName : tcp::Transport::kName; }
  /// The shm link, where this peer is reached over shm (its mailboxes: algo/one_shot.hpp).
  shm::Link* shm_link() const { return shm_; }

 private:
  int peer_;
  shm::Link* shm_;
  tcp::Link* tcp_;
};

class Transport {
 public:
  static constexpr std::string_view kName = "auto";

  explicit Transport(const Bootstrap& b);
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  Link& link(int peer) {
    if (peer < 0 || peer >= size_ || peer == rank_)
      throw Error(ErrorCode::invalid_argument, ErrorContext{rank_, peer, "link"},
                  "no link to this peer (send to self is not supported)");
    return links_[static_cast<std::size_t>(peer)];
  }
  /// Bytes the shm and tcp links hold.
  std::size_t memory_bytes() const {
    return sizeof(*this) + links_.capacity() * sizeof(Link) + (shm_ ? shm_->memory_bytes() : 0) +
           (tcp_ ? tcp_->memory_bytes() : 0);
  }
  /// "shm" or "tcp": how this rank reaches `peer`.
  std::string_view link_kind(int peer) { return link(peer).kind(); }

  void abort(const Error& why) {
    if (shm_) shm_->abort(why);
    if (tcp_) tcp_->abort(why);
  }

 private:
  int rank_;
  int size_;
  // Declared before links_, which point into them; destroyed after.
  std::unique_ptr<shm::Transport> shm_;
  std::unique_ptr<tcp::Transport> tcp_;
  std::vector<Link> links_;
};

inline Transport::Transport(const Bootstrap& b) : rank_(b.rank), size_(b.size) {
  const std::string& mode = b.options.transport;
  const ErrorContext ctx{rank_, -1, "transport"};
  if (mode != "auto" && mode != "shm" && mode != "tcp")
    throw Error(ErrorCode::unsupported, ctx,
                "transport '" + mode + "' is not available to this communicator (auto, shm and tcp are)");
  const auto n = static_cast<std::size_t>(size_);
  std::vector<bool> on_shm(n, false), on_tcp(n, false);
  if (mode == "tcp") {
    on_tcp.assign(n, true);
  } else {
    // Exchange host ids (every rank, so the decision is the same at both ends of each pair).
    // One deadline for all peers: the whole exchange is bounded by the timeout, not each get.
    const auto deadline = std::chrono::steady_clock::now() + b.options.timeout;
    const std::string mine = detail::host_id(ctx);
    b.store->set("hybrid/host/" + std::to_string(rank_), mine);
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      const std::string theirs =
          b.store->get("hybrid/host/" + std::to_string(p), std::max(left, std::chrono::milliseconds(1)));
      const bool same = theirs == mine;
      if (!same && mode == "shm")
        throw Error(ErrorCode::invalid_argument, ErrorContext{rank_, p, "transport"},
                    "transport=shm, but rank " + std::to_string(p) + " is on another host ('" + theirs +
                        "', this rank: '" + mine + "'); use transport=auto or tcp");
      on_shm[static_cast<std::size_t>(p)] = same;
      on_tcp[static_cast<std::size_t>(p)] = !same;
    }
  }
  on_shm[static_cast<std::size_t>(rank_)] = on_tcp[static_cast<std::size_t>(rank_)] = false;
  auto any = [](const std::vector<bool>& v) { return std::find(v.begin(), v.end(), true) != v.end(); };
  // Every rank builds shm first, then tcp: a rank waiting in one phase only waits for ranks in
  // the same phase, so the two never wait on each other.
  if (any(on_shm)) shm_ = std::make_unique<shm::Transport>(b, on_shm);
  if (any(on_tcp)) tcp_ = std::make_unique<tcp::Transport>(b, on_tcp);
  links_.reserve(n);
  int shm_peers = 0;
  for (int p = 0; p < size_; ++p) {
    const auto i = static_cast<std::size_t>(p);
    links_.emplace_back(p, on_shm[i] ? &shm_->link(p) : nullptr, on_tcp[i] ? &tcp_->link(p) : nullptr);
    shm_peers += on_shm[i] ? 1 : 0;
  }
  chorus::detail::log(chorus::detail::LogLevel::info, rank_, "transport ", mode, ": ", shm_peers, " peers over shm, ",
                      size_ - 1 - shm_peers, " over tcp");
}

static_assert(chorus::Transport<Transport>);

}  // namespace chorus::hybrid
