// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// The standby stores and the agreement of Communicator::shrink() (impl/shrink.hpp).
//
// A job's store lives in one process (rank 0's TcpStore, torchrun's agent): when that process or
// its host dies, the survivors cannot meet there again. So every rank of a communicator serves a
// small TcpStore of its own, its standby, on the address its links use (port 0), and every rank
// learns every standby's address at creation. After a failure the survivors meet at the standby
// of the lowest rank that every one of them can reach:
//
//   1. find the leader: probe (connect and handshake, about 1 s at most) the standbys of the
//      ranks below this one, all at once; the lowest that answers leads, or this rank when none
//      does. A refused connection is a dead process (its host answers, nothing listens); no
//      answer is an unreachable rank (dead host or cut link).
//   2. a follower checks that the leader leads ("leader" key; one that follows a lower rank
//      itself means this rank cannot reach the real leader: it is cut off, and fails), writes
//      "join/<rank>" and waits for "decision"; a leader that dies meanwhile (the connection
//      breaks) is counted gone and step 1 starts again without it.
//   3. the leader waits until every rank above it has joined or is gone (probed after 0.1 s,
//      then every 0.5 s: refused, or no answer within 1 s), bounded by Options::shrink_wait for ranks that are
//      alive and reachable but do not join; then it decides. The survivors must be a majority of
//      the ranks not known to be dead (a refused probe is proof of death; silence is not), so the
//      two sides of a cut network never both go on: the smaller one fails with peer_failure.
//
// Every survivor so goes on with the one set the leader wrote, or fails; a rank the decision left
// out fails ("left out"). The new communicator's rendezvous runs in the leader's standby, under
// the same prefix. Keys: "shrink/c<context>/s<seq>/..." where seq counts the shrinks of the
// group (a failed creation of the shrunk communicator moves every rank on to the next seq).
//
// With a store that no rank's death takes away (MemoryStore: ranks as threads; FileStore on a
// shared file system) there are no standby servers: the ranks meet in that store, the first to
// arrive coordinates and waits for the others (bounded by shrink_wait), and no quorum is needed
// (such stores serve one host or one process, where the network cannot split). The coordinator
// must outlive the agreement there.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "chorus/bootstrap/creation_notice.hpp"
#include "chorus/bootstrap/file_store.hpp"
#include "chorus/bootstrap/rendezvous.hpp"
#include "chorus/bootstrap/store.hpp"
#include "chorus/bootstrap/tcp_store.hpp"
#include "chorus/core/error.hpp"
#include "chorus/detail/asio.hpp"
#include "chorus/detail/handshake.hpp"
#include "chorus/detail/log.hpp"
#include "chorus/transport/tcp/detail/socket.hpp"

namespace chorus::detail {

/// How a standby answered a probe.
enum class Reach { ok, dead, unreachable };

inline const char* reach_name(Reach r) {
  return r == Reach::ok ? "alive" : r == Reach::dead ? "dead" : "unreachable";
}

struct StandbyAddress {
  std::string host;
  std::uint16_t port = 0;
  std::string text() const { return host + ":" + std::to_string(port); }
  static StandbyAddress parse(const std::string& s) {
    const auto colon = s.rfind(':');
    if (colon == std::string::npos || colon == 0)
      throw Error(ErrorCode::mismatch, "malformed standby address '" + s + "' in the store");
    StandbyAddress a;
    a.host = s.substr(0, colon);
    a.port = static_cast<std::uint16_t>(std::stoi(s.substr(colon + 1)));
    return a;
  }
};

/// Connects to every target at once, each within `limit`: connected is alive and reachable, a
/// refused connection a dead process, no answer (SYN unanswered past a retransmission) an
/// unreachable one. Then completes the store handshake, so that the standby logs a client that
/// came and left, not a refused one.
inline std::vector<Reach> probe_all(const std::vector<StandbyAddress>& targets, const std::string& token,
                                    std::chrono::milliseconds limit) {
  std::vector<Reach> out(targets.size(), Reach::unreachable);
  if (targets.empty()) return out;
  asio::io_context io(1);
  std::vector<std::unique_ptr<asio_tcp::socket>> sockets;
  std::size_t left = targets.size();
  asio::steady_timer timer(io, limit);
  for (std::size_t i = 0; i < targets.size(); ++i) {
    sockets.push_back(std::make_unique<asio_tcp::socket>(io));
    asio::co_spawn(
        io,
        [&, i]() -> asio::awaitable<void> {
          asio_tcp::socket& s = *sockets[i];
          boost::system::error_code ec;
          const auto addr = asio::ip::make_address(targets[i].host, ec);
          if (!ec) co_await s.async_connect(asio_tcp::endpoint(addr, targets[i].port), asio::redirect_error(asio::use_awaitable, ec));
          if (ec) {
            out[i] = ec == asio::error::connection_refused ? Reach::dead : Reach::unreachable;
            co_return;
          }
          // The kernel accepted: the process holds its listening socket, and the network
          // carries. The handshake only lets the standby log a client that came and left.
          out[i] = Reach::ok;
          Hello hello;
          hello.kind = kHandshakeStore;
          try {
            co_await handshake_connect(s, hello, token);
          } catch (const std::exception&) {
          }
        },
        [&](std::exception_ptr) {
          if (--left == 0) timer.cancel();
        });
  }
  timer.async_wait([&](const boost::system::error_code& e) {
    if (e) return;
    for (auto& s : sockets) {
      boost::system::error_code ignored;
      s->close(ignored);
    }
  });
  io.run();
  return out;
}

/// A verdict of the agreement for this rank (left out, no quorum, cut off): final, not retried.
struct ShrinkVerdict : Error {
  ShrinkVerdict(const ErrorContext& ctx, const std::string& msg) : Error(ErrorCode::peer_failure, ctx, msg) {}
};

/// The store under every prefix (and creation watch) of `s`.
inline std::shared_ptr<Store> store_root(std::shared_ptr<Store> s) {
  for (;;) {
    if (auto* prefixed = dynamic_cast<const PrefixStore*>(s.get()))
      s = prefixed->base();
    else if (auto* watched = dynamic_cast<const WatchedStore*>(s.get()))
      s = watched->base();
    else
      return s;
  }
}

/// What the agreement decided.
struct Agreement {
  std::vector<int> members;        ///< ranks of the old group that form the new one, ascending
  int leader = -1;                 ///< who decided (old group rank)
  std::shared_ptr<Store> store;    ///< where the new communicator meets (prefixed)
  std::string summary;             ///< "leader 2; left out: 0 (dead), 1 (unreachable)"
};

/// One communicator's standby: its own TcpStore server (or the shared store), every rank's
/// standby address, and the previous communicator's standby (kept so that a late rank of the
/// previous shrink still finds the decision there).
class Standby {
 public:
  using Clock = std::chrono::steady_clock;

  /// True for stores no rank's death takes away (through prefixes): MemoryStore, FileStore.
  static bool shared_store(const std::shared_ptr<Store>& s) {
    const Store* p = store_root(s).get();
    return dynamic_cast<const MemoryStore*>(p) != nullptr || dynamic_cast<const FileStore*>(p) != nullptr;
  }

  /// This rank's standby: none to serve with a shared store; else a TcpStore server on the
  /// address the links listen on. address() is published by the caller.
  static std::shared_ptr<Standby> make(const Bootstrap& b) {
    auto s = std::make_shared<Standby>();
    s->rank_ = b.rank;
    s->token_ = b.options.job_token;
    s->timeout_ = b.options.timeout;
    if (shared_store(b.options.store)) {
      s->shared_ = b.store;
      return s;
    }
    const auto addr = tcp::detail::listen_address(b.options);
    s->server_ = std::make_shared<TcpStore>(addr.to_string(), 0, true, b.options.timeout, b.options.job_token);
    s->self_ = StandbyAddress{addr.to_string(), s->server_->port()};
    return s;
  }

  bool shared() const { return shared_ != nullptr; }
  /// The shared store without its prefixes (the one every communicator of the job reaches).
  std::shared_ptr<Store> shared_root() const { return store_root(shared_); }
  /// "host:port" of this rank's server ("" with a shared store).
  std::string address() const { return shared() ? std::string() : self_.text(); }
  /// Every rank's address, by transport rank (from the communicator's creation).
  void set_addresses(const std::vector<std::string>& texts) {
    addrs_.clear();
    for (const auto& t : texts) addrs_.push_back(t.empty() ? StandbyAddress{} : StandbyAddress::parse(t));
  }
  void keep_previous(std::shared_ptr<Standby> p) { previous_ = std::move(p); }
  /// Group rank `me` joins no shrink under `prefix` (its communicator was aborted): with a shared
  /// store its join key says so, and the coordinator leaves it out at once, not after shrink_wait.
  /// With standby servers a probe finds it alive, and it is left out after shrink_wait.
  void leave(const std::string& prefix, int me) {
    if (shared()) shared_->set(prefix + "join/" + std::to_string(me), kGone);
  }

  /// Where processes knock to join the group whose rank 0 is transport rank `root` (grow):
  /// that rank's standby (its own server on that rank), or the shared store, under "chorus/grow/".
  std::shared_ptr<Store> grow_store(int root) const {
    if (shared()) return std::make_shared<PrefixStore>("chorus/grow/", shared_root());
    if (root == rank_) return std::make_shared<PrefixStore>("chorus/grow/", server_);
    const StandbyAddress& a = addrs_.at(static_cast<std::size_t>(root));
    return std::make_shared<PrefixStore>("chorus/grow/", std::make_shared<TcpStore>(a.host, a.port, false, timeout_, token_));
  }
  /// "tcp://host:port" of transport rank `root`'s standby ("" with a shared store).
  std::string join_address(int root) const {
    if (shared()) return {};
    const StandbyAddress& a = addrs_.at(static_cast<std::size_t>(root));
    return "tcp://" + (a.host.find(':') != std::string::npos ? "[" + a.host + "]" : a.host) + ":" + std::to_string(a.port);
  }

  /// The agreement of one shrink (see the top of this file). `members`: the old group's
  /// transport ranks by group rank; `me`: this rank in the group; `exclude`: group ranks left out
  /// on purpose; `prefix`: "shrink/c<context>/s<seq>/"; `wait`: Options::shrink_wait.
  Agreement agree(const std::vector<int>& members, int me, const std::set<int>& exclude, const std::string& prefix,
                  std::chrono::milliseconds wait, const ErrorContext& ctx) {
    return shared() ? agree_shared(static_cast<int>(members.size()), me, exclude, prefix, wait, ctx)
                    : agree_tcp(members, me, exclude, prefix, wait, ctx);
  }

 private:
  static constexpr std::chrono::milliseconds kProbe{1000};
  static constexpr const char* kGone = "gone";  ///< a join key's value: that rank will not join (leave())

  static std::string encode(const std::vector<int>& v) {
    std::string s;
    for (int x : v) {
      if (!s.empty()) s += ',';
      s += std::to_string(x);
    }
    return s;
  }
  static void append_item(std::string& list, const std::string& item) {
    if (!list.empty()) list += ", ";
    list += item;
  }
  static std::vector<int> decode(const std::string& s) {
    std::vector<int> v;
    std::istringstream in(s);
    std::string item;
    while (std::getline(in, item, ','))
      if (!item.empty()) v.push_back(std::stoi(item));
    return v;
  }

  /// The decision's text: "ok <members> | <summary>" or "fail <why>".
  static Agreement read_decision(const std::string& text, int me, int leader, std::shared_ptr<Store> store,
                                 const ErrorContext& ctx) {
    if (text.rfind("fail ", 0) == 0)
      throw ShrinkVerdict(ctx, "the shrink's leader (rank " + std::to_string(leader) + ") found no quorum: " + text.substr(5));
    const auto bar = text.find(" | ");
    if (text.rfind("ok ", 0) != 0 || bar == std::string::npos)
      throw Error(ErrorCode::mismatch, ctx, "malformed shrink decision '" + text + "'");
    Agreement a;
    a.members = decode(text.substr(3, bar - 3));
    a.summary = text.substr(bar + 3);
    a.leader = leader;
    a.store = std::move(store);
    if (std::find(a.members.begin(), a.members.end(), me) == a.members.end())
      throw ShrinkVerdict(ctx,
                  "this rank was left out of the shrunk communicator by the agreement (" + a.summary +
                      "): it did not join in time, or the leader could not reach it");
    return a;
  }

  Agreement agree_tcp(const std::vector<int>& members, int me, const std::set<int>& exclude, const std::string& prefix,
                      std::chrono::milliseconds wait, const ErrorContext& ctx) {
    const int n = static_cast<int>(members.size());
    std::vector<Reach> known(static_cast<std::size_t>(n), Reach::ok);  // what this rank holds of each
    auto addr = [&](int q) { return addrs_.at(static_cast<std::size_t>(members[static_cast<std::size_t>(q)])); };
    for (;;) {
      // 1. The leader: the lowest rank below this one that answers.
      std::vector<int> below;
      std::vector<StandbyAddress> targets;
      for (int q = 0; q < me; ++q)
        if (!exclude.count(q) && known[static_cast<std::size_t>(q)] == Reach::ok) {
          below.push_back(q);
          targets.push_back(addr(q));
        }
      const auto reach = probe_all(targets, token_, kProbe);
      int leader = me;
      for (std::size_t i = 0; i < below.size(); ++i) {
        if (reach[i] == Reach::ok) {
          leader = below[i];
          break;
        }
        known[static_cast<std::size_t>(below[i])] = reach[i];
      }
      if (leader == me) return lead(members, me, exclude, prefix, wait, known, ctx);
      // 2. Follow it, unless it dies meanwhile: a connection that fails or breaks.
      std::shared_ptr<TcpStore> client;
      try {
        client = std::make_shared<TcpStore>(addr(leader).host, addr(leader).port, false, kProbe * 3, token_);
      } catch (const Error& e) {
        gone(leader, e, known, ctx);
        continue;
      }
      const auto limit = wait + kProbe * 4 + std::chrono::seconds(10);
      std::string decision;
      try {
        const std::string says = client->get(prefix + "leader", limit);
        if (says != std::to_string(leader))
          throw ShrinkVerdict(ctx, "this rank cannot reach rank " + says + ", which leads the shrink for rank " +
                                       std::to_string(leader) + ": its network is cut off from the leader");
        client->set(prefix + "join/" + std::to_string(me), "1");
        decision = client->get(prefix + "decision", limit);
      } catch (const ShrinkVerdict&) {
        throw;
      } catch (const Error& e) {
        if (e.code() != ErrorCode::peer_failure) throw;
        gone(leader, e, known, ctx);
        continue;
      }
      return read_decision(decision, me, leader, std::make_shared<PrefixStore>(prefix + "comm/", client), ctx);
    }
  }

  static void gone(int leader, const Error& e, std::vector<Reach>& known, const ErrorContext& ctx) {
    log(LogLevel::warn, LogSubsys::init, ctx.rank, "shrink: the leader, rank ", leader, ", is gone (", e.what(),
        "); looking for the next");
    known[static_cast<std::size_t>(leader)] = Reach::unreachable;
  }

  Agreement lead(const std::vector<int>& members, int me, const std::set<int>& exclude, const std::string& prefix,
                 std::chrono::milliseconds wait, std::vector<Reach>& known, const ErrorContext& ctx) {
    const int n = static_cast<int>(members.size());
    Store& store = *server_;
    store.set(prefix + "leader", std::to_string(me));
    const auto deadline = Clock::now() + wait;
    std::vector<bool> joined(static_cast<std::size_t>(n), false);
    joined[static_cast<std::size_t>(me)] = true;
    auto next_probe = Clock::now() + std::chrono::milliseconds(100);  // the joins that come at once first
    for (;;) {
      std::vector<int> pending;
      for (int q = me + 1; q < n; ++q) {
        const auto i = static_cast<std::size_t>(q);
        if (exclude.count(q) || joined[i] || known[i] != Reach::ok) continue;
        if (store.check({prefix + "join/" + std::to_string(q)})) {
          joined[i] = true;
          continue;
        }
        pending.push_back(q);
      }
      if (pending.empty() || Clock::now() >= deadline) break;
      if (Clock::now() >= next_probe) {
        std::vector<StandbyAddress> targets;
        for (int q : pending) targets.push_back(addrs_.at(static_cast<std::size_t>(members[static_cast<std::size_t>(q)])));
        const auto reach = probe_all(targets, token_, kProbe);
        for (std::size_t k = 0; k < pending.size(); ++k) {
          const auto i = static_cast<std::size_t>(pending[k]);
          if (reach[k] == Reach::dead) known[i] = Reach::dead;
          if (reach[k] == Reach::unreachable) known[i] = Reach::unreachable;
        }
        next_probe = Clock::now() + std::chrono::milliseconds(500);
        continue;
      }
      // Wait a little for the first pending rank's join (parked by the server: no polling).
      try {
        store.wait({prefix + "join/" + std::to_string(pending.front())}, std::chrono::milliseconds(100));
      } catch (const Error& e) {
        if (e.code() != ErrorCode::timeout) throw;
      }
    }
    // The joined may have died since they joined: a dead one left in would hold the others when
    // the new communicator is made. (Silence is not enough here: a slow answer is no proof.)
    {
      std::vector<int> others;
      std::vector<StandbyAddress> targets;
      for (int q = 0; q < n; ++q)
        if (q != me && joined[static_cast<std::size_t>(q)]) {
          others.push_back(q);
          targets.push_back(addrs_.at(static_cast<std::size_t>(members[static_cast<std::size_t>(q)])));
        }
      const auto reach = probe_all(targets, token_, kProbe);
      for (std::size_t k = 0; k < others.size(); ++k)
        if (reach[k] == Reach::dead) {
          joined[static_cast<std::size_t>(others[k])] = false;
          known[static_cast<std::size_t>(others[k])] = Reach::dead;
        }
    }
    std::vector<int> in;
    std::string left;
    int dead = 0;
    for (int q = 0; q < n; ++q) {
      const auto i = static_cast<std::size_t>(q);
      if (joined[i]) {
        in.push_back(q);
        continue;
      }
      if (known[i] == Reach::dead) ++dead;
      const char* why = exclude.count(q) ? "excluded" : known[i] == Reach::ok ? "did not join" : reach_name(known[i]);
      append_item(left, std::to_string(q) + " (" + why + ")");
    }
    const int voters = n - static_cast<int>(exclude.size()) - dead;
    const std::string summary = "leader " + std::to_string(me) + "; left out: " + (left.empty() ? "none" : left);
    if (2 * static_cast<int>(in.size()) <= voters) {
      const std::string why = std::to_string(in.size()) + " of the " + std::to_string(voters) +
                              " ranks not known to be dead joined, not a majority (" + summary +
                              "): the others may go on without them";
      store.set(prefix + "decision", "fail " + why);
      throw ShrinkVerdict(ctx, "the shrink found no quorum: " + why);
    }
    store.set(prefix + "decision", "ok " + encode(in) + " | " + summary);
    Agreement a;
    a.members = std::move(in);
    a.leader = me;
    a.summary = summary;
    a.store = std::make_shared<PrefixStore>(prefix + "comm/", server_);
    return a;
  }

  Agreement agree_shared(int n, int me, const std::set<int>& exclude, const std::string& prefix,
                         std::chrono::milliseconds wait, const ErrorContext& ctx) {
    Store& store = *shared_;
    const bool first = store.add(prefix + "arrivals", 1) == 1;
    store.set(prefix + "join/" + std::to_string(me), "1");
    auto comm_store = std::make_shared<PrefixStore>(prefix + "comm/", shared_);
    if (!first) return read_decision(store.get(prefix + "decision", wait + std::chrono::seconds(10)), me, -1, comm_store, ctx);
    const auto deadline = Clock::now() + wait;
    std::vector<int> in;
    std::string left;
    for (int q = 0; q < n; ++q) {
      if (exclude.count(q)) {
        append_item(left, std::to_string(q) + " (excluded)");
        continue;
      }
      const auto rest = std::max<Clock::duration>(deadline - Clock::now(), Clock::duration::zero());
      try {
        store.wait({prefix + "join/" + std::to_string(q)}, std::chrono::duration_cast<std::chrono::milliseconds>(rest));
        if (store.get(prefix + "join/" + std::to_string(q), std::chrono::milliseconds(1000)) == kGone) {
          append_item(left, std::to_string(q) + " (aborted)");
          continue;
        }
        in.push_back(q);
      } catch (const Error& e) {
        if (e.code() != ErrorCode::timeout) throw;
        append_item(left, std::to_string(q) + " (did not join)");
      }
    }
    const std::string summary = "coordinator " + std::to_string(me) + "; left out: " + (left.empty() ? "none" : left);
    store.set(prefix + "decision", "ok " + encode(in) + " | " + summary);
    return read_decision("ok " + encode(in) + " | " + summary, me, me, comm_store, ctx);
  }

  int rank_ = -1;
  std::string token_;
  std::chrono::milliseconds timeout_{0};
  std::shared_ptr<Store> shared_;      ///< the communicator's store, where it survives any rank
  std::shared_ptr<TcpStore> server_;   ///< this rank's standby (server and its own client)
  StandbyAddress self_;
  std::vector<StandbyAddress> addrs_;  ///< by transport rank
  std::shared_ptr<Standby> previous_;
};

}  // namespace chorus::detail
