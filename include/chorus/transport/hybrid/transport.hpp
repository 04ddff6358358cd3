// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// hybrid::Transport (kName "auto"): picks a transport per peer, at construction, from the
/// candidates of transport/registry.hpp and Options::transport (CHORUS_TRANSPORT):
/// - "auto": each pair is served by the first candidate whose can_connect(me, peer) holds;
/// - a candidate's name: that candidate serves every pair, and a pair it cannot connect is an
///   invalid_argument error naming the peer and the candidates that could;
/// - anything else is unsupported here.
/// Options::transport_disable (CHORUS_TRANSPORT_DISABLE) takes candidates out of the "auto" choice:
/// a pair goes over the first candidate that can connect it and that neither of its ranks
/// disables (each rank publishes its list with its host), and a pair that none left can connect
/// is an invalid_argument error naming the peer and the variable; forcing a disabled candidate is
/// invalid_argument too.
///
/// can_connect reads the PeerInfo (transport/peer_info.hpp) that every rank publishes in the store at
/// construction, so both ends of each pair choose alike: its host, and the fact of each candidate
/// that has a static local_fact(ctx) (shm: its kernel and network namespace; rdma: the fabric it
/// can use). A candidate with a static why_not(me, peer) explains a forced pair it cannot connect.
/// Every rank builds its candidates in registry order, each over the peers it serves (the subset
/// constructor of the Transport concept): a rank waiting in one candidate's set-up only waits for
/// ranks in the same one.
///
/// link(peer) returns a small wrapper over the serving candidate's link (a variant of pointers:
/// one switch per message, no virtual call, no allocation); link_kind(peer) and link_model(peer)
/// say which candidate and its cost model.

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "chorus/bootstrap/rendezvous.hpp"
#include "chorus/bootstrap/store_gather.hpp"
#include "chorus/config.hpp"
#include "chorus/core/concepts.hpp"
#include "chorus/core/cost_model.hpp"
#include "chorus/detail/log.hpp"
#include "chorus/device/runtime.hpp"
#include "chorus/transport/peer_info.hpp"
#include "chorus/transport/registry.hpp"

namespace chorus::hybrid {
namespace detail {

/// A candidate that publishes a fact about this rank (cuda_ipc: its device; shm: its network
/// namespace; rdma: its NIC) for the others' can_connect:
/// `static std::string local_fact(const ErrorContext&)`.
template <class T>
concept PublishesFact = requires(const ErrorContext& ctx) {
  { T::local_fact(ctx) } -> std::convertible_to<std::string>;
};

/// A candidate that says why it cannot connect a pair: `static std::string why_not(a, b)`.
template <class T>
concept ExplainsRefusal = requires(const PeerInfo& a, const PeerInfo& b) {
  { T::why_not(a, b) } -> std::convertible_to<std::string>;
};

/// The type of the mailbox link (what shm_link() points to) of the first link type that has
/// one, or void. shm_link() is the name algo/intranode/one_shot.hpp reads; cuda_ipc's links give the shm
/// link under them, so every candidate with mailboxes gives the same type.
template <class... Ls>
struct FirstWithMailboxes {
  using type = void;
};
template <class L, class... Ls>
struct FirstWithMailboxes<L, Ls...> {
  using type = typename decltype([] {
    if constexpr (chorus::LinkWithMailboxes<L>)
      return std::type_identity<std::remove_pointer_t<decltype(std::declval<L&>().shm_link())>>{};
    else
      return std::type_identity<typename FirstWithMailboxes<Ls...>::type>{};
  }())::type;
};

}  // namespace detail

template <class List>
class BasicTransport;

/// The link to one peer: a pointer to the serving candidate's link.
template <class... Ts>
class BasicLink {
 public:
  using Ptr = std::variant<chorus::LinkOf<Ts>*...>;
  static constexpr std::array<std::string_view, sizeof...(Ts)> kNames{Ts::kName...};
  static constexpr std::array<TransportModel, sizeof...(Ts)> kModels{Ts::kModel...};

  BasicLink(int peer, Ptr l, bool served) : peer_(peer), l_(l), served_(served) {}
  int peer() const { return peer_; }
  Request isend(ConstBytes data, Tag tag) {
    return std::visit([&](auto* l) { return l->isend(data, tag); }, l_);
  }
  Request irecv(MutableBytes data, Tag tag) {
    return std::visit([&](auto* l) { return l->irecv(data, tag); }, l_);
  }
  /// The serving candidate's entry of a receive from any source (core/concepts.hpp).
  std::weak_ptr<chorus::detail::Driver> irecv_any(MutableBytes data, Tag tag,
                                                  const std::shared_ptr<chorus::detail::RequestState>& req, int source)
    requires(chorus::LinkWithAnySource<chorus::LinkOf<Ts>> && ...)
  {
    return std::visit([&](auto* l) { return l->irecv_any(data, tag, req, source); }, l_);
  }
  std::string_view kind() const { return kNames[l_.index()]; }
  TransportModel model() const { return kModels[l_.index()]; }
  bool served() const { return served_; }

  /// The link with mailboxes, where the serving candidate has them (algo/intranode/one_shot.hpp), else null.
  using MailboxLink = typename detail::FirstWithMailboxes<chorus::LinkOf<Ts>...>::type;
  MailboxLink* shm_link() const
    requires(!std::is_void_v<MailboxLink>)
  {
    return std::visit(
        [](auto* l) -> MailboxLink* {
          if constexpr (chorus::LinkWithMailboxes<std::remove_pointer_t<decltype(l)>>)
            return l->shm_link();
          else
            return nullptr;
        },
        l_);
  }
  /// True where the serving candidate maps the peer's device memory (cuda_ipc; algo/intranode/ipc.hpp).
  bool cuda_ipc() const {
    return std::visit(
        [](auto* l) {
          if constexpr (chorus::LinkWithIpc<std::remove_pointer_t<decltype(l)>>)
            return static_cast<bool>(l->cuda_ipc());
          else
            return false;
        },
        l_);
  }
  /// True where the serving candidate takes this device buffer as it is (rdma with dma-buf
  /// registration; algo/channel.hpp), else false: the channel stages it.
  bool device_memory(device::Runtime& rt, const void* p, std::size_t bytes) {
    return std::visit(
        [&](auto* l) {
          if constexpr (chorus::LinkWithDeviceMemory<std::remove_pointer_t<decltype(l)>>)
            return static_cast<bool>(l->device_memory(rt, p, bytes));
          else
            return false;
        },
        l_);
  }

 private:
  int peer_;
  Ptr l_;
  bool served_;
};

template <class... Ts>
class BasicTransport<registry::List<Ts...>> {
 public:
  using Link = BasicLink<Ts...>;
  static constexpr std::string_view kName = "auto";
  /// The slowest candidate's (by latency): what a group of one assumes.
  static constexpr TransportModel kModel = [] {
    TransportModel m = Link::kModels[0];
    for (const auto& k : Link::kModels)
      if (k.alpha > m.alpha) m = k;
    return m;
  }();

  /// Links to every other rank.
  explicit BasicTransport(const Bootstrap& b)
      : BasicTransport(b, std::vector<bool>(static_cast<std::size_t>(b.size), true)) {}
  /// Links to the ranks with peers[p] set; both ends of a pair must agree.
  BasicTransport(const Bootstrap& b, std::vector<bool> peers);
  BasicTransport(const BasicTransport&) = delete;
  BasicTransport& operator=(const BasicTransport&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  Link& link(int peer) {
    if (peer < 0 || peer >= size_ || !links_[static_cast<std::size_t>(peer)].served())
      throw Error(ErrorCode::invalid_argument, ErrorContext{rank_, peer, "link"},
                  "no link to this peer (send to self is not supported)");
    return links_[static_cast<std::size_t>(peer)];
  }
  /// Bytes the candidates' links hold.
  std::size_t memory_bytes() const {
    std::size_t b = sizeof(*this) + links_.capacity() * sizeof(Link);
    std::apply([&](const auto&... t) { ((b += t ? t->memory_bytes() : 0), ...); }, owned_);
    return b;
  }
  /// The name of the candidate that serves `peer` (registry.hpp).
  std::string_view link_kind(int peer) { return link(peer).kind(); }
  /// Its cost model.
  TransportModel link_model(int peer) { return link(peer).model(); }

  void abort(const Error& why) {
    std::apply([&](auto&... t) { ((t ? t->abort(why) : void()), ...); }, owned_);
  }

 private:
  static constexpr std::size_t kCount = sizeof...(Ts);
  // Options::transport_disable is checked against Options::kTransportCandidates, so every
  // candidate must be named there.
  static_assert(((std::ranges::find(Options::kTransportCandidates, Ts::kName) != Options::kTransportCandidates.end()) && ...),
                "a transport of the registry is missing from Options::kTransportCandidates");

  int rank_;
  int size_;
  // Declared before links_, which point into them; destroyed after.
  std::tuple<std::unique_ptr<Ts>...> owned_;
  std::vector<Link> links_;
};

template <class... Ts>
BasicTransport<registry::List<Ts...>>::BasicTransport(const Bootstrap& b, std::vector<bool> peers)
    : rank_(b.rank), size_(b.size) {
  const std::string& mode = b.options.transport;
  const ErrorContext ctx{rank_, -1, "transport"};
  const auto& names = Link::kNames;
  // "auto, a and b": the registry's names
  auto listed = [&](std::string head, auto take, const char* last) {
    std::vector<std::string_view> v;
    for (std::size_t i = 0; i < kCount; ++i)
      if (take(i)) v.push_back(names[i]);
    for (std::size_t i = 0; i < v.size(); ++i)
      head += std::string(i + 1 == v.size() ? last : ", ") + std::string(v[i]);
    return head;
  };
  // A candidate's place in the registry; kCount for a name that is not one.
  auto index_of = [&](std::string_view name) {
    return static_cast<std::size_t>(std::find(names.begin(), names.end(), name) - names.begin());
  };
  std::size_t forced = kCount;  // none: auto
  if (mode != "auto") {
    forced = index_of(mode);
    if (forced == kCount)
      throw Error(ErrorCode::unsupported, ctx,
                  "transport '" + mode + "' is not available to this communicator (" +
                      listed("auto", [](std::size_t) { return true; }, " and ") + " are)");
  }
  // The candidates this rank disables, and the same as text (registry order) for the peers.
  std::array<bool, kCount> disabled{};
  std::string disabled_text;
  for (const auto& d : b.options.transport_disable) {
    const std::size_t i = index_of(d);
    if (i < kCount) disabled[i] = true;
    else if (std::ranges::find(Options::kTransportCandidates, d) == Options::kTransportCandidates.end())
      throw Error(ErrorCode::invalid_argument, ctx, "transport_disable: '" + d + "' is not one of cuda_ipc, shm, rdma, tcp");
  }
  for (std::size_t i = 0; i < kCount; ++i)
    if (disabled[i]) disabled_text += (disabled_text.empty() ? "" : ",") + std::string(names[i]);
  if (forced < kCount && disabled[forced])
    throw Error(ErrorCode::invalid_argument, ctx,
                "transport=" + mode + " (CHORUS_TRANSPORT) is also disabled (CHORUS_TRANSPORT_DISABLE=" + disabled_text +
                    "): force another transport, or leave " + mode + " out of the disabled ones");
  const auto n = static_cast<std::size_t>(size_);
  peers.resize(n, false);
  peers[static_cast<std::size_t>(rank_)] = false;
  // Exchange PeerInfo (every rank, so the decision is the same at both ends of each pair), as one
  // card per rank through store_all_gather (O(n) store requests in all): its disabled candidates,
  // its host, its transport (auto or the forced one), then the facts of the candidates that
  // publish one, in registry order.
  PeerInfo me{rank_, chorus::detail::host_id(ctx), {}};
  std::vector<std::string> card{disabled_text, me.host, mode};
  (
      [&] {
        if constexpr (detail::PublishesFact<Ts>) {
          me.facts.emplace_back(std::string(Ts::kName), Ts::local_fact(ctx));
          card.push_back(me.facts.back().second);
        }
      }(),
      ...);
  const std::vector<std::string> cards = store_all_gather(
      *b.store, "hybrid/card", rank_, size_, chorus::detail::encode_strings(card), b.options.setup_bound());
  // ": why" of the forced candidate k, where it says why it cannot connect a pair (why_not).
  auto why_not = [](std::size_t k, const PeerInfo& a, const PeerInfo& c) {
    std::string s;
    std::size_t i = 0;
    (
        [&] {
          if constexpr (detail::ExplainsRefusal<Ts>)
            if (i == k) s = ": " + Ts::why_not(a, c);
          ++i;
        }(),
        ...);
    return s;
  };
  std::vector<std::size_t> choice(n, kCount);
  for (int p = 0; p < size_; ++p) {
    if (!peers[static_cast<std::size_t>(p)]) continue;
    std::vector<std::string> theirs = chorus::detail::decode_strings(
        cards[static_cast<std::size_t>(p)], card.size(), "transport: rank " + std::to_string(p) + "'s card");
    const std::string& peer_disabled = theirs[0];
    PeerInfo peer{p, std::move(theirs[1]), {}};
    const std::string& peer_mode = theirs[2];
    for (std::size_t i = 0; i < me.facts.size(); ++i)
      peer.facts.emplace_back(me.facts[i].first, std::move(theirs[i + 3]));
    const std::array<bool, kCount> can{Ts::can_connect(me, peer)...};
    // What either end disables is out, so both ends choose alike.
    std::array<bool, kCount> out = disabled;
    for (const auto& d : chorus::detail::split_list(peer_disabled))
      if (const std::size_t i = index_of(d); i < kCount) out[i] = true;
    // A transport either end forces carries the pair, so both ends choose alike; two that differ,
    // or one that either end disables, fail at both ends.
    std::size_t pair_forced = forced;
    if (peer_mode != "auto") {
      const std::size_t f = index_of(peer_mode);
      if (f == kCount || (forced < kCount && forced != f))
        throw Error(ErrorCode::mismatch, ErrorContext{rank_, p, "transport"},
                    "transport=" + mode + " here but transport=" + peer_mode + " on rank " +
                        std::to_string(p) +
                        " (CHORUS_TRANSPORT): force the same transport on every rank, or none");
      pair_forced = f;
    }
    const std::string forced_how =
        pair_forced == forced ? std::string() : " (forced by rank " + std::to_string(p) + ")";
    std::size_t c = pair_forced;
    if (pair_forced == kCount) {
      c = 0;
      while (c < kCount && !(can[c] && !out[c])) ++c;
      if (c == kCount) {  // the registry's last candidate connects any pair, unless disabled
        std::string could;
        for (std::size_t i = 0; i < kCount; ++i)
          if (can[i]) could += (could.empty() ? "" : ", ") + std::string(names[i]);
        throw Error(ErrorCode::invalid_argument, ErrorContext{rank_, p, "transport"},
                    "no transport is left to connect rank " + std::to_string(rank_) + " and rank " + std::to_string(p) +
                        ": " + could + " could, but CHORUS_TRANSPORT_DISABLE leaves them out (rank " +
                        std::to_string(rank_) + ": '" + disabled_text + "', rank " + std::to_string(p) + ": '" +
                        peer_disabled + "')");
      }
    } else if (out[pair_forced]) {
      throw Error(ErrorCode::invalid_argument, ErrorContext{rank_, p, "transport"},
                  "transport=" + std::string(names[pair_forced]) + forced_how + " for the pair of rank " +
                      std::to_string(rank_) + " and rank " + std::to_string(p) +
                      ", but CHORUS_TRANSPORT_DISABLE leaves it out (rank " + std::to_string(rank_) + ": '" +
                      disabled_text + "', rank " + std::to_string(p) + ": '" + peer_disabled + "')");
    } else if (!can[pair_forced]) {
      throw Error(ErrorCode::invalid_argument, ErrorContext{rank_, p, "transport"},
                  "transport=" + std::string(names[pair_forced]) + forced_how + ", but rank " +
                      std::to_string(p) +
                      (peer.host != me.host ? " is on another host" : " cannot be reached over it") + " ('" +
                      peer.host + "', this rank: '" + me.host + "')" + why_not(pair_forced, me, peer) +
                      "; use transport=" +
                      listed(
                          "auto", [&](std::size_t i) { return can[i]; }, " or "));
    }
    choice[static_cast<std::size_t>(p)] = c;
  }
  // Every rank builds its candidates in registry order: a rank waiting in one candidate's set-up
  // only waits for ranks in the same one, so two never wait on each other.
  std::array<int, kCount> count{};
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    auto build = [&]<std::size_t K>(std::integral_constant<std::size_t, K>) {
      std::vector<bool> mask(n, false);
      for (std::size_t p = 0; p < n; ++p) mask[p] = choice[p] == K;
      count[K] = static_cast<int>(std::count(mask.begin(), mask.end(), true));
      if (count[K] > 0)
        std::get<K>(owned_) = std::make_unique<std::tuple_element_t<K, std::tuple<Ts...>>>(b, std::move(mask));
    };
    (build(std::integral_constant<std::size_t, I>{}), ...);
    links_.reserve(n);
    for (std::size_t p = 0; p < n; ++p) {
      typename Link::Ptr ptr{};
      ((choice[p] == I ? (void)(ptr = typename Link::Ptr(std::in_place_index<I>, &std::get<I>(owned_)->link(static_cast<int>(p))))
                       : void()),
       ...);
      links_.emplace_back(static_cast<int>(p), ptr, choice[p] != kCount);
    }
  }(std::index_sequence_for<Ts...>{});
  // "transport auto: 3 peers over a, 0 over b", in registry order
  std::string summary;
  for (std::size_t i = 0; i < kCount; ++i)
    summary += (i == 0 ? "" : ", ") + std::to_string(count[i]) + (i == 0 ? " peers over " : " over ") + std::string(names[i]);
  chorus::detail::log(chorus::detail::LogLevel::info, chorus::detail::LogSubsys::transport, rank_, "transport ", mode,
                      disabled_text.empty() ? std::string() : " without " + disabled_text, ": ", summary);
  if (chorus::detail::log_enabled(chorus::detail::LogLevel::info, chorus::detail::LogSubsys::transport))
    for (std::size_t p = 0; p < n; ++p)
      if (choice[p] != kCount)
        chorus::detail::log(chorus::detail::LogLevel::info, chorus::detail::LogSubsys::transport, rank_, "transport ", mode, ": rank ", rank_, " <-> rank ", p,
                            " over ", names[choice[p]]);
}

// What the candidates are depends on CHORUS_WITH_RDMA (config.hpp: CHORUS_OPTIONS_NAMESPACE).
inline namespace CHORUS_OPTIONS_NAMESPACE {

/// The transport over the registry's candidates (chorus::DefaultTransport). A class rather than an
/// alias, so that chorus/fwd.hpp can declare it and Communicator<Transport>'s symbols carry a short
/// name that says the options: chorus::hybrid::with_rdma::Transport.
class Transport : public BasicTransport<registry::Candidates> {
 public:
  using BasicTransport::BasicTransport;
};

}  // inline namespace CHORUS_OPTIONS_NAMESPACE

using Link = Transport::Link;

static_assert(chorus::Transport<Transport>);

}  // namespace chorus::hybrid
