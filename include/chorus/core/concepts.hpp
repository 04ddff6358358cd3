// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// The contracts between layers, as concepts, with their requirements in one place.
///
/// Link<L> — moves bytes between this rank and one peer, both ways at once.
/// | expression          | type    | contract                                                        |
/// |---------------------|---------|-----------------------------------------------------------------|
/// | l.peer()            | int     | the peer's rank                                                 |
/// | l.isend(bytes, tag) | Request | starts sending; the range must stay valid until completion      |
/// | l.irecv(bytes, tag) | Request | starts receiving exactly bytes.size bytes sent with that tag;   |
/// |                     |         | a message of another size fails it with mismatch, and when it   |
/// |                     |         | was small (eager) its first bytes that fit are written first    |
/// |                     |         | and its send completes (a large one's send fails as well)       |
/// Messages with the same tag are matched in posting order on both sides; different tags are
/// independent (a receive for tag B completes even if a message for tag A waits unmatched).
/// Progress (transport/progress.hpp): every Request a link returns names its engine as its
/// Driver, and the thread that waits for it (Request::wait(), test(), a blocking call) drives the
/// engine itself: it polls the links for a bounded spin (CHORUS_SPIN_US), then sleeps in one wait
/// that covers every link of the engine, until the request is done or its deadline passes. One
/// thread drives an engine at a time; the engine's background thread stands in only for work
/// nobody waits on and parks while callers drive. A request without a driver (inproc, whose
/// sender completes the receive itself) is waited for on its condition variable.
/// A broken link fails every pending and later operation on it with peer_failure.
///
/// Transport<T> — the links of one communicator, created from a Bootstrap.
/// | expression            | type           | contract                                           |
/// |-----------------------|----------------|----------------------------------------------------|
/// | T::kName              | string_view    | "inproc", "tcp", ...                               |
/// | T::kModel             | TransportModel | alpha, beta, slice of its links (core/cost_model)  |
/// | T(bootstrap)          |                | opens a link to every peer, bounded by the timeout |
/// | T(bootstrap, peers)   |                | the same, only to the ranks p with peers[p] set    |
/// |                       |                | (vector<bool>, size ranks); both ends of a pair    |
/// |                       |                | agree, and every rank builds the transports of a   |
/// |                       |                | hybrid in registry order (transport/registry.hpp)  |
/// | t.rank(), t.size()    | int            |                                                    |
/// | t.link(peer)          | Link&          | peer != rank                                       |
/// | t.abort(error)        | void           | fails everything pending and later, closes links   |
/// Destroying a transport never blocks beyond a short bounded shutdown.
/// A candidate of the registry (transport/registry.hpp) also has
/// `static bool can_connect(const PeerInfo& me, const PeerInfo& peer)` (transport/peer_info.hpp).
///
/// Optional capabilities, asked for by the layers above with `if constexpr (Concept<...>)`:
/// | concept                     | expression                    | contract                          |
/// |-----------------------------|-------------------------------|-----------------------------------|
/// | LinkWithMailboxes<L>        | l.shm_link()                  | the shm link with mailboxes to    |
/// |                             |                               | the peer (algo/intranode/         |
/// |                             |                               | one_shot.hpp), or null            |
/// | LinkWithIpc<L>              | l.cuda_ipc()                  | bool: this rank maps the peer's   |
/// |                             |                               | device memory (intranode/ipc.hpp) |
/// | LinkWithDeviceMemory<L>     | l.device_memory(rt, p, bytes) | bool: the link moves these device |
/// |                             |                               | bytes itself (rdma dma-buf)       |
/// | LinkWithAnySource<L>        | l.irecv_any(bytes, tag, req,  | posts the link's entry of a       |
/// |                             |   source)                     | receive from any source: req (set |
/// |                             |                               | _any_source) is shared by every   |
/// |                             |                               | link, the first with a message of |
/// |                             |                               | tag claims it (claim_source) and  |
/// |                             |                               | fills bytes; returns its engine's |
/// |                             |                               | weak_ptr<Driver> (empty: none)    |
/// | LinkInProcess<L>            | l.same_process(), l.broken(), | bool: the peer is a thread of     |
/// |                             | l.failure()                   | this process (device pointers     |
/// |                             |                               | pass as they are); bool: the link |
/// |                             |                               | has failed; (code, text): why     |
/// | TransportWithPeerModels<T>  | t.link_model(peer)            | the TransportModel of the link    |
/// |                             |                               | that serves the peer (hybrid)     |
/// | TransportWithMemoryBytes<T> | t.memory_bytes()              | bytes the transport holds         |

#include <concepts>
#include <cstddef>
#include <type_traits>
#include <utility>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "chorus/core/buffer.hpp"
#include "chorus/core/cost_model.hpp"
#include "chorus/core/error.hpp"
#include "chorus/core/request.hpp"
#include "chorus/core/tag.hpp"

namespace chorus {

/// What a transport is built from (bootstrap/rendezvous.hpp): named here, defined above this layer.
struct Bootstrap;

namespace device {
class Runtime;  // device/runtime.hpp
}

template <class L>
concept Link = requires(L& l, ConstBytes in, MutableBytes out, Tag tag) {
  { l.peer() } -> std::convertible_to<int>;
  { l.isend(in, tag) } -> std::same_as<Request>;
  { l.irecv(out, tag) } -> std::same_as<Request>;
};

template <class T>
concept Transport = std::constructible_from<T, const Bootstrap&> &&
                    std::constructible_from<T, const Bootstrap&, std::vector<bool>> &&
                    requires(T& t, const T& ct, int peer, const Error& e) {
                      { T::kName } -> std::convertible_to<std::string_view>;
                      { T::kModel } -> std::convertible_to<TransportModel>;
                      { ct.rank() } -> std::convertible_to<int>;
                      { ct.size() } -> std::convertible_to<int>;
                      { t.link(peer) } -> Link;
                      { t.abort(e) };
                    };

/// The link type of transport T.
template <class T>
using LinkOf = std::remove_reference_t<decltype(std::declval<T&>().link(0))>;

template <class L>
concept LinkWithMailboxes = requires(L& l) { l.shm_link(); };

template <class L>
concept LinkWithIpc = requires(L& l) {
  { l.cuda_ipc() } -> std::convertible_to<bool>;
};

template <class L>
concept LinkInProcess = requires(L& l) {
  { l.same_process() } -> std::convertible_to<bool>;
  { l.broken() } -> std::convertible_to<bool>;
  { l.failure() } -> std::convertible_to<std::pair<ErrorCode, std::string>>;
};

template <class L>
concept LinkWithDeviceMemory = requires(L& l, device::Runtime& rt, const std::byte* p, std::size_t bytes) {
  { l.device_memory(rt, p, bytes) } -> std::convertible_to<bool>;
};

template <class L>
concept LinkWithAnySource = requires(L& l, MutableBytes out, Tag tag, const std::shared_ptr<detail::RequestState>& req,
                                     int source) {
  { l.irecv_any(out, tag, req, source) } -> std::convertible_to<std::weak_ptr<detail::Driver>>;
};

template <class T>
concept TransportWithPeerModels = requires(T& t, int peer) {
  { t.link_model(peer) } -> std::convertible_to<TransportModel>;
};

template <class T>
concept TransportWithMemoryBytes = requires(const T& t) {
  { t.memory_bytes() } -> std::convertible_to<std::size_t>;
};

}  // namespace chorus
