// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// inproc::Transport: ranks are threads of one process (tests, examples). Ranks find each other
/// through the job nonce: the first to arrive creates the World (one mailbox per ordered pair of
/// ranks), the others join it. Pass a shared MemoryStore in Options::store.

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "chorus/bootstrap/rendezvous.hpp"
#include "chorus/core/concepts.hpp"
#include "chorus/core/cost_model.hpp"
#include "chorus/detail/log.hpp"
#include "chorus/transport/inproc/link.hpp"
#include "chorus/transport/shell.hpp"

namespace chorus::inproc {
namespace detail {

class World {
 public:
  explicit World(int size) : size_(size), boxes_(static_cast<std::size_t>(size) * size) {}

  /// Messages from `src` to `dst`.
  Mailbox& box(int src, int dst) { return boxes_[static_cast<std::size_t>(dst) * size_ + src]; }
  int size() const { return size_; }

  /// Breaks every mailbox into and out of `rank`: pending receives and rendezvous sends fail with
  /// peer_failure; messages already copied stay receivable, as bytes already in a socket do.
  void break_rank(int rank, const std::string& why, ErrorCode code = ErrorCode::peer_failure) {
    // p's messages to rank first: nobody is left to receive them. Only then rank's messages to p
    // (what was copied stays receivable): failing those wakes p, and p must already find its
    // sends to rank refused.
    for (int p = 0; p < size_; ++p)
      if (p != rank) break_box(box(p, rank), "rank " + std::to_string(rank) + " " + why, /*keep_eager=*/false, code, rank, p, rank);
    for (int p = 0; p < size_; ++p)
      if (p != rank) break_box(box(rank, p), "peer " + std::to_string(rank) + " " + why, /*keep_eager=*/true, code, rank, rank, p);
  }

  /// Process-wide registry: the World of the job with this nonce, created by the first rank.
  static std::shared_ptr<World> join(const std::string& key, int size) {
    static std::mutex mu;
    static std::map<std::string, std::weak_ptr<World>> worlds;
    std::lock_guard lk(mu);
    for (auto it = worlds.begin(); it != worlds.end();) it = it->second.expired() ? worlds.erase(it) : std::next(it);
    auto& w = worlds[key];
    auto s = w.lock();
    if (!s) {
      s = std::make_shared<World>(size);
      w = s;
    }
    if (s->size() != size)
      throw Error(ErrorCode::mismatch, "inproc: ranks of one job disagree on the world size (" +
                                           std::to_string(s->size()) + " vs " + std::to_string(size) + ")");
    return s;
  }

 private:
  /// Breaks the mailbox of `src`'s messages to `dst`, because of `breaker`.
  static void break_box(Mailbox& b, const std::string& why, bool keep_eager, ErrorCode code, int breaker, int src, int dst) {
    Completions done;
    std::lock_guard lk(b.mu);
    if (b.broken) return;
    b.broken = true;
    b.broken_reason = why;
    b.broken_code = code;
    b.broken_by = breaker;
    b.matcher.drain_posted([&](RecvOp& r) { done.fail(r.req, b.code_for(dst), why); });
    // A rendezvous send points at its sender's buffer, which may be gone: fail it either way.
    b.matcher.remove_unexpected_if([&](Arrival& a) {
      if (auto* z = std::get_if<RendezvousArrival>(&a)) {
        done.fail(z->send_req, b.code_for(src), why);
        return true;
      }
      if (keep_eager) return false;
      if (auto* e = std::get_if<EagerArrival>(&a)) b.unexpected_bytes -= e->data.size();
      return true;
    });
  }

  int size_;
  std::vector<Mailbox> boxes_;
};

}  // namespace detail

class Transport {
 public:
  static constexpr std::string_view kName = "inproc";
  /// Threads of one process: a lock and one copy.
  static constexpr TransportModel kModel{2e-6, 1.0 / 8e9, 64 << 10};

  /// Links to every other rank (threads of this process).
  explicit Transport(const Bootstrap& b) : Transport(b, std::vector<bool>(static_cast<std::size_t>(b.size), true)) {}
  /// Links used only to the ranks with peers[p] set; both ends of a pair must agree. Waits for
  /// those ranks (and this one) to join.
  Transport(const Bootstrap& b, std::vector<bool> peers)
      : rank_(b.rank), size_(b.size), timeout_(b.options.timeout) {
    (void)chorus::detail::buffered_cap();  // a bad CHORUS_MAX_BUFFERED_BYTES fails here, not in a send
    std::string key(reinterpret_cast<const char*>(b.nonce.data()), b.nonce.size());
    world_ = detail::World::join(key, size_);
    std::weak_ptr<detail::World> weak = world_;
    const int rank = rank_;
    auto on_timeout = [weak, rank](const Error& e) {
      if (auto w = weak.lock()) w->break_rank(rank, std::string("aborted after a timeout: ") + e.what());
    };
    links_.reserve(size_);
    for (int p = 0; p < size_; ++p)
      links_.emplace_back(rank_, p, &world_->box(rank_, p), &world_->box(p, rank_), timeout_, on_timeout);
    // Every rank has joined before any rank uses its links, so abort and destruction apply to a
    // complete world.
    b.store->set("inproc/joined/" + std::to_string(rank_), "1");
    std::vector<std::string> keys;
    for (int p = 0; p < size_; ++p)
      if (p == rank_ || (static_cast<std::size_t>(p) < peers.size() && peers[static_cast<std::size_t>(p)]))
        keys.push_back("inproc/joined/" + std::to_string(p));
    b.store->wait(keys, timeout_);
  }
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;
  ~Transport() { world_->break_rank(rank_, "has left the communicator"); }

  int rank() const { return rank_; }
  int size() const { return size_; }
  Link& link(int peer) {
    chorus::detail::check_peer(rank_, size_, peer, "inproc link");
    return links_[static_cast<std::size_t>(peer)];
  }

  /// Bytes held for this rank: the eager copies its peers sent that wait for its receives (at
  /// most Policy::kMaxUnexpectedBytes per peer).
  std::size_t memory_bytes() const {
    std::size_t b = sizeof(*this) + links_.capacity() * sizeof(Link);
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      auto& box = world_->box(p, rank_);
      std::lock_guard lk(box.mu);
      b += box.unexpected_bytes;
    }
    return b;
  }

  void abort(const Error& why) { world_->break_rank(rank_, std::string("aborted: ") + why.what(), why.code()); }

 private:
  int rank_;
  int size_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<detail::World> world_;
  std::vector<Link> links_;
};

static_assert(chorus::Transport<Transport>);

}  // namespace chorus::inproc
