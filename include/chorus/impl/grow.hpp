// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// Communicator<T>::grow, join and join_address (ncclCommGrow): included at the bottom of
// impl/communicator.hpp.
//
// A joiner knocks at rank 0's standby store (impl/standby.hpp; the shared store where the ranks
// share one): ticket t = add("chorus/grow/knocks", 1), then it waits for "chorus/grow/ticket/<t>".
// At grow(), rank 0 admits every knock not yet admitted ("chorus/grow/admitted"), writes each
// ticket ("<rank> <size> <first ticket>") and broadcasts (first ticket, count) to the members;
// members and joiners then meet under "chorus/grow/t<first ticket>/comm/" in that store and
// create the new communicator there: members keep their ranks, joiners follow in ticket order.

#include <cstdint>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "chorus/bootstrap/init_method.hpp"  // parse_init_method
#include "chorus/bootstrap/rendezvous.hpp"
#include "chorus/bootstrap/tcp_store.hpp"
#include "chorus/detail/env.hpp"
#include "chorus/detail/log.hpp"
#include "chorus/impl/standby.hpp"
#include "chorus/impl/state.hpp"

namespace chorus {

template <class T>
std::optional<Communicator<T>> Communicator<T>::grow() {
  State& st = live("grow");
  st.outside_group("grow");
  const int n = size(), me = rank();
  std::shared_ptr<Store> store = st.standby->grow_store(st.group.members[0]);
  std::vector<std::int64_t> info{0, 0};  // first ticket, count
  if (me == 0) {
    const std::int64_t knocks = store->add("knocks", 0);
    const std::int64_t admitted = store->add("admitted", 0);
    info = {admitted + 1, knocks - admitted};
    if (info[1] > 0) {
      store->add("admitted", info[1]);
      for (std::int64_t i = 0; i < info[1]; ++i)
        store->set("ticket/" + std::to_string(info[0] + i),
                   std::to_string(n + i) + " " + std::to_string(n + info[1]) + " " + std::to_string(info[0]));
    }
  }
  {
    Internal internal(st);
    broadcast(info, 0);
  }
  if (info[1] == 0) return std::nullopt;
  Options o = st.boot.options;
  o.rank = me;
  o.world_size = n + static_cast<int>(info[1]);
  o.store = std::make_shared<PrefixStore>("t" + std::to_string(info[0]) + "/comm/", store);
  Communicator c = create(std::move(o));
  detail::log(detail::LogLevel::info, detail::LogSubsys::init, me, "grow: ", n, " ranks -> ", c.size(), " (", info[1],
              " joined)");
  return c;
}

template <class T>
std::string Communicator<T>::join_address() const {
  const State& st = live("join_address");
  return st.standby->join_address(st.group.members[0]);
}

template <class T>
Communicator<T> Communicator<T>::join(Options o) {
  o.apply_env();
  const ErrorContext ctx{-1, -1, "join"};
  std::shared_ptr<Store> base;
  if (o.store) {
    base = detail::store_root(o.store);
  } else {
    const auto m = detail::parse_init_method(o.init_method, GetEnv(&detail::env_string));
    if (m.kind != detail::InitMethod::Kind::tcp || !m.launcher_kvs.empty())
      throw Error(ErrorCode::invalid_argument, ctx,
                  "join takes the communicator's join_address() (tcp://host:port) as init_method, or the store its "
                  "ranks share as Options::store; got '" + o.init_method + "'");
    base = std::make_shared<TcpStore>(m.host, m.port, false, o.timeout, o.job_token);
  }
  auto store = std::make_shared<PrefixStore>("chorus/grow/", base);
  const std::int64_t ticket = store->add("knocks", 1);
  std::string text;
  try {
    text = store->get("ticket/" + std::to_string(ticket), o.timeout);
  } catch (const Error& e) {
    if (e.code() != ErrorCode::timeout) throw;
    throw Error(ErrorCode::timeout, ctx,
                "not admitted within " + std::to_string(o.timeout.count()) + " ms: the communicator's ranks did not call grow() (" +
                    e.what() + ")");
  }
  std::istringstream in(text);
  int rank = -1, size = -1;
  std::int64_t first = 0;
  if (!(in >> rank >> size >> first) || rank < 0 || rank >= size)
    throw Error(ErrorCode::mismatch, ctx, "malformed admission '" + text + "' in the store");
  o.rank = rank;
  o.world_size = size;
  o.store = std::make_shared<PrefixStore>("t" + std::to_string(first) + "/comm/", store);
  Communicator c = create(std::move(o));
  detail::log(detail::LogLevel::info, detail::LogSubsys::init, rank, "join: rank ", rank, " of ", size);
  return c;
}

}  // namespace chorus
