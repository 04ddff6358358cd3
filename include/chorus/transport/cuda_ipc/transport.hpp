// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// cuda_ipc::Transport: ranks of one host whose device memory can be mapped by each other
/// (the same device, or devices with peer access: cudaDeviceCanAccessPeer).
///
/// Its links are shm links (transport/shm), over a shm transport of its own (its store keys and
/// socket names apart from the shm candidate's), so host buffers and the staged device path move
/// exactly as over shm. What it adds is the fact that each pair may map the other's device
/// memory: a communicator whose every peer is reached over cuda_ipc runs its collectives on
/// device buffers through its peers' IPC windows (algo/intranode/window.hpp, algo/intranode/ipc.hpp):
/// direct reads and writes, a call's first step synchronised through the shm links' mailboxes and
/// its later ones through flags in the windows, instead of staging every byte through pinned host
/// memory twice.
///
/// Reachability (PeerInfo fact, local_fact): "ok:<runtime>:<device>:<access>" where <access> has
/// a '1' for each device this rank's device can map (itself included), or "no:<why>". A pair is
/// served when both are on one host (shm's test), both runtimes have the same name, and they use
/// the same device or each can access the other's. The device runtime is the process's default
/// (device::set_default_runtime, or chorus/cuda.hpp) when the communicator is created; a pair
/// that fails this falls to the next candidate (shm), and CHORUS_DEBUG=INFO names the transport
/// of every pair.

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "chorus/bootstrap/rendezvous.hpp"
#include "chorus/bootstrap/store.hpp"
#include "chorus/core/concepts.hpp"
#include "chorus/core/cost_model.hpp"
#include "chorus/transport/peer_info.hpp"
#include "chorus/device/default.hpp"
#include "chorus/transport/shm/transport.hpp"

namespace chorus::cuda_ipc {

/// A link to a peer whose device memory this rank can map: an shm link underneath.
class Link {
 public:
  Link(int peer, shm::Link* l) : peer_(peer), l_(l) {}
  int peer() const { return peer_; }
  Request isend(ConstBytes data, Tag tag) { return l_->isend(data, tag); }
  Request irecv(MutableBytes data, Tag tag) { return l_->irecv(data, tag); }
  std::weak_ptr<chorus::detail::Driver> irecv_any(MutableBytes data, Tag tag,
                                                  const std::shared_ptr<chorus::detail::RequestState>& req, int source) {
    return l_->irecv_any(data, tag, req, source);
  }
  /// The mailboxes (algo/intranode/one_shot.hpp, algo/intranode/ipc.hpp) and the rest of the shm link.
  shm::Link* shm_link() const { return l_; }
  /// The peer's IPC handles open here (algo/intranode/ipc.hpp reads this).
  static constexpr bool cuda_ipc() { return true; }

 private:
  int peer_;
  shm::Link* l_;
};

namespace detail {

/// The parsed fact of one rank (local_fact), or ok = false with `why`.
struct Fact {
  bool ok = false;
  std::string why;
  std::string runtime;
  int device = -1;
  std::string access;  ///< '1' at d: this rank's device can map device d's memory
};

inline Fact parse_fact(std::string_view f) {
  Fact r;
  if (f.substr(0, 3) == "no:") {
    r.why = std::string(f.substr(3));
    return r;
  }
  if (f.substr(0, 3) != "ok:") {
    r.why = f.empty() ? "published no device facts" : "unreadable device facts '" + std::string(f) + "'";
    return r;
  }
  f.remove_prefix(3);
  const auto a = f.find(':');
  const auto b = a == std::string_view::npos ? a : f.find(':', a + 1);
  if (b == std::string_view::npos) {
    r.why = "unreadable device facts";
    return r;
  }
  r.runtime = std::string(f.substr(0, a));
  r.device = std::stoi(std::string(f.substr(a + 1, b - a - 1)));
  r.access = std::string(f.substr(b + 1));
  r.ok = true;
  return r;
}

inline bool maps(const Fact& from, int device) {
  return device == from.device ||
         (device >= 0 && static_cast<std::size_t>(device) < from.access.size() && from.access[static_cast<std::size_t>(device)] == '1');
}

/// The shm transport's bootstrap: its own store prefix and a nonce of its own (the abstract
/// socket names derive from it), so it never meets the shm candidate's.
inline Bootstrap scoped(const Bootstrap& b) {
  Bootstrap s = b;
  s.store = std::make_shared<PrefixStore>("cuda_ipc/", b.store);
  s.nonce[0] ^= 0x5a;
  s.nonce[15] ^= 0xc3;
  return s;
}

}  // namespace detail

class Transport {
 public:
  static constexpr std::string_view kName = "cuda_ipc";
  /// Host messages ride shm links: the shm model. The direct collectives on device memory have
  /// their own (algo/intranode/ipc.hpp, kDirectReadModel).
  static constexpr TransportModel kModel = shm::Transport::kModel;

  /// This rank's device facts (see the top of the file).
  static std::string local_fact(const ErrorContext&) {
    device::Runtime* rt = device::default_runtime();
    if (rt == nullptr)
      return "no:no device runtime in this process (include chorus/cuda.hpp from a .cu file, or "
             "device::set_default_runtime before the communicator is created)";
    try {
      const int count = rt->device_count();
      if (count == 0) return "no:no device";
      const int dev = rt->current_device();
      std::string access;
      for (int d = 0; d < count; ++d) access += d == dev || rt->can_access_peer(dev, d) ? '1' : '0';
      return "ok:" + std::string(rt->name()) + ":" + std::to_string(dev) + ":" + access;
    } catch (const Error& e) {
      return std::string("no:") + e.what();
    }
  }
  static bool can_connect(const PeerInfo& me, const PeerInfo& peer) { return why_not(me, peer).empty(); }
  /// Why the pair cannot be served, "" when it can.
  static std::string why_not(const PeerInfo& me, const PeerInfo& peer) {
    if (std::string why = shm::Transport::why_not(me, peer); !why.empty()) return why;
    const detail::Fact a = detail::parse_fact(me.fact(kName)), b = detail::parse_fact(peer.fact(kName));
    if (!a.ok) return "this rank cannot map device memory: " + a.why;
    if (!b.ok) return "rank " + std::to_string(peer.rank) + " cannot map device memory: " + b.why;
    if (a.runtime != b.runtime) return "the device runtimes differ (" + a.runtime + ", " + b.runtime + ")";
    if (!detail::maps(a, b.device) || !detail::maps(b, a.device))
      return "devices " + std::to_string(a.device) + " and " + std::to_string(b.device) + " have no peer access";
    return {};
  }

  /// Links to every other rank.
  explicit Transport(const Bootstrap& b) : Transport(b, std::vector<bool>(static_cast<std::size_t>(b.size), true)) {}
  /// Links to the ranks with peers[p] set; both ends of a pair must agree.
  Transport(const Bootstrap& b, std::vector<bool> peers) : shm_(detail::scoped(b), peers) {
    links_.resize(static_cast<std::size_t>(b.size));
    for (int p = 0; p < b.size; ++p)
      if (p != b.rank && peers[static_cast<std::size_t>(p)])
        links_[static_cast<std::size_t>(p)] = std::make_unique<Link>(p, &shm_.link(p));
  }
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  int rank() const { return shm_.rank(); }
  int size() const { return shm_.size(); }
  Link& link(int peer) {
    return chorus::detail::checked_link(links_, rank(), size(), peer, "cuda_ipc link",
                                        "no link to self (send to self is not supported)", "no cuda_ipc link to this peer");
  }
  std::size_t memory_bytes() const { return shm_.memory_bytes() + links_.capacity() * sizeof(links_[0]); }
  bool uses_cma(int peer) { return shm_.uses_cma(peer); }
  void abort(const Error& why) { shm_.abort(why); }

 private:
  shm::Transport shm_;
  std::vector<std::unique_ptr<Link>> links_;
};

static_assert(chorus::Transport<Transport>);

}  // namespace chorus::cuda_ipc
