// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// Communicator<T>'s point-to-point calls: send, recv and recv from any source, straight onto the
// links (no executor, no plan). Included by impl/communicator.hpp.

#include <memory>
#include <string>

#include "chorus/impl/state.hpp"

namespace chorus {

template <class T>
Request Communicator<T>::isend_bytes(ConstBytes data, int peer, int tag) {
  (void)live("send");
  detail::check_p2p_args(rank(), size(), peer, tag, "send");
  s_->refuse_device(data.data, data.size, peer, "send");
  if (s_->grouping()) return record_p2p(true, data.data, data.size, peer, tag);  // posted at group_end()
  return s_->transport->link(s_->group.members[peer]).isend(data, s_->group.context | static_cast<Tag>(tag));
}

template <class T>
Request Communicator<T>::irecv_bytes(MutableBytes data, int peer, int tag) {
  (void)live("recv");
  detail::check_p2p_args(rank(), size(), peer, tag, "recv");
  s_->refuse_device(data.data, data.size, peer, "recv");
  if (s_->grouping()) return record_p2p(false, data.data, data.size, peer, tag);
  return s_->transport->link(s_->group.members[peer]).irecv(data, s_->group.context | static_cast<Tag>(tag));
}

/// One request shared by an entry on every link (core/request.hpp, "a receive from any source").
template <class T>
Request Communicator<T>::irecv_any_bytes(MutableBytes data, int tag) {
  static constexpr const char* kVerb = "recv from any source";
  State& s = live(kVerb);
  s.outside_group(kVerb);
  if (tag < 0)
    throw Error(ErrorCode::invalid_argument, s.ctx(-1, std::string(kVerb) + " tag " + std::to_string(tag)),
                "tags must be non-negative");
  if (size() < 2)
    throw Error(ErrorCode::invalid_argument, s.ctx(-1, kVerb),
                "this communicator has 1 rank: there is no other rank to receive from");
  s.refuse_device(data.data, data.size, -1, kVerb);
  if constexpr (!LinkWithAnySource<LinkOf<T>>) {
    throw Error(ErrorCode::unsupported, s.ctx(-1, kVerb),
                std::string("the ") + std::string(T::kName) + " transport cannot receive from any source: pass the peer");
  } else {
    const Tag link_tag = s.group.context | static_cast<Tag>(tag);
    auto req = std::make_shared<detail::RequestState>(
        rank(), -1, detail::LazyOp{kVerb, link_tag, data.size, &detail::describe_op}, s.boot.options.timeout);
    req->set_any_source(size() - 1);
    // A timeout aborts the transport, as the engine does for every other request; withdrawing the
    // receive first keeps the links from taking it meanwhile.
    std::weak_ptr<T> transport = s.transport;
    req->set_on_timeout([transport, st = req.get()](const Error& e) {
      st->withdraw_source();
      if (auto t = transport.lock()) t->abort(Error(ErrorCode::peer_failure, std::string("aborted after a timeout: ") + e.what()));
    });
    // The waiter drives the links' engine where they share one (tcp, shm, rdma); where they do
    // not (the default transport's mix), the engines' background threads complete it.
    std::weak_ptr<detail::Driver> driver;
    bool first = true, one_engine = true;
    for (int g = 0; g < size(); ++g) {
      if (g == rank()) continue;
      auto d = s.transport->link(s.group.members[static_cast<std::size_t>(g)]).irecv_any(data, link_tag, req, g);
      if (first) driver = d;
      else if (driver.owner_before(d) || d.owner_before(driver)) one_engine = false;
      first = false;
    }
    if (one_engine) req->set_driver(std::move(driver));
    return Request(std::move(req));
  }
}

}  // namespace chorus
