// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// Communicator<T>::split (MPI_Comm_split) and subset (MPI_Comm_create_group), both through adopt():
// included at the bottom of impl/communicator.hpp.

#include <algorithm>
#include <mutex>
#include <span>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "chorus/algo/plan.hpp"
#include "chorus/core/tag.hpp"
#include "chorus/detail/fnv.hpp"
#include "chorus/impl/state.hpp"

namespace chorus {

/// Marks the calls of a scope as the library's own (State::internal_calls).
template <class T>
struct Communicator<T>::Internal {
  explicit Internal(State& s) : s_(s) { s_.internal_calls.fetch_add(1, std::memory_order_relaxed); }
  ~Internal() { s_.internal_calls.fetch_sub(1, std::memory_order_relaxed); }
  Internal(const Internal&) = delete;
  Internal& operator=(const Internal&) = delete;
  State& s_;
};

template <class T>
Communicator<T> Communicator<T>::split(int color, int key) {
  State& st = live("split");
  st.outside_group("split");
  if (color < 0 && color != kSplitNoColor)
    throw Error(ErrorCode::invalid_argument, st.ctx(-1, "split"),
                "color must be non-negative, or kSplitNoColor (" + std::to_string(kSplitNoColor) + ") for no group (got " +
                    std::to_string(color) + ")");
  // 1. Everyone learns everyone's (color, key) through an all-gather on this communicator.
  const int n = size();
  std::vector<std::int64_t> mine = {color, key}, all(2 * static_cast<std::size_t>(n));
  {
    Internal internal(st);  // the library's own call: no forced algorithm
    all_gather(mine, all);
  }
  if (color == kSplitNoColor) {  // in no group: nothing more to take part in
    ++st.split_seq;              // (the others' key names count this split too)
    return Communicator(nullptr);
  }
  // 2. My group: the ranks of my color, ordered by (key, rank); then adopt() makes it.
  std::vector<std::tuple<std::int64_t, int>> order;
  for (int r = 0; r < n; ++r)
    if (all[2 * r] == color) order.emplace_back(all[2 * r + 1], r);
  std::sort(order.begin(), order.end());
  std::vector<int> members;
  for (auto& [k, r] : order) members.push_back(r);
  const std::string key_name = "split/" + std::to_string(st.group.context >> detail::kContextShift) + "/" +
                               std::to_string(st.split_seq++) + "/" + std::to_string(color);
  return adopt(st, members, key_name);
}

/// The communicator of `parents` (ranks of `st`'s group, in the new order), sharing its links:
/// split's and subset's common part. `key_name`: the store key, alike on every member and unique
/// in the job, under which the first member publishes the new context id.
template <class T>
Communicator<T> Communicator<T>::adopt(State& st, const std::vector<int>& parents, const std::string& key_name) {
  auto sub = std::make_unique<State>();
  sub->boot = st.boot;
  sub->transport = st.transport;
  sub->standby = st.standby;
  sub->group.transport = st.transport.get();
  for (int r : parents) {
    if (r == st.group.rank) sub->group.rank = static_cast<int>(sub->group.members.size());
    sub->group.members.push_back(st.group.members[static_cast<std::size_t>(r)]);
  }
  sub->plan_inputs.rank = sub->group.rank;
  sub->plan_inputs.size = sub->group.size();
  sub->plan_inputs.model = algo::group_model(*sub->transport, sub->group);
  sub->plan_inputs.overrides = st.plan_inputs.overrides;
  sub->plan_inputs.hosts = st.plan_inputs.hosts.restrict(parents);
  sub->plan_inputs.links = st.plan_inputs.links;  // the parent's, alike on every rank (not this rank's own view)
  // The collective kernel where every member's device memory is reachable: threads of this process,
  // or a parent over cuda_ipc (its links, and its window size, serve the group).
  sub->kernel_in_process = algo::peers_in_process(sub->group);
  sub->ipc_slot_bytes = st.ipc_slot_bytes;
  sub->plan_inputs.kernel = sub->kernel_in_process || (st.plan_inputs.ipc && algo::has_ipc(sub->group));
  sub->group.descriptors = st.group.descriptors;
  // A context id unique in the job: the group's first member draws it from the store, the others
  // read it. Tags carry it, so the groups never see each other's messages.
  std::int64_t id = 0;
  if (sub->group.rank == 0) {
    id = st.boot.store->add("split/next_context", 1);
    st.boot.store->set(key_name, std::to_string(id));
  } else {
    id = std::stoll(st.boot.store->get(key_name, st.boot.options.timeout));
  }
  if (id <= 0 || id >= (1 << 16))
    throw Error(ErrorCode::unsupported, st.ctx(-1, "split"), "more than 65535 sub-communicators in one job");
  sub->group.context = static_cast<Tag>(id) << detail::kContextShift;
  sub->runtime = st.runtime;
  sub->make_recorder();
  sub->watch_for_errors();
  // Nobody uses the new group before everyone has posted its error watch.
  Communicator c(std::move(sub));
  {
    Internal internal(*c.s_);
    c.barrier();
  }
  return c;
}

template <class T>
Communicator<T> Communicator<T>::subset(std::span<const int> ranks) {
  State& st = live("subset");
  st.outside_group("subset");
  const int n = size();
  auto bad = [&](const std::string& why) { throw Error(ErrorCode::invalid_argument, st.ctx(-1, "subset"), why); };
  if (ranks.empty()) bad("the list of ranks is empty");
  std::vector<bool> seen(static_cast<std::size_t>(n));
  std::string list;
  for (int r : ranks) {
    if (r < 0 || r >= n) bad("rank " + std::to_string(r) + " is not a rank of this communicator of " + std::to_string(n));
    if (seen[static_cast<std::size_t>(r)]) bad("rank " + std::to_string(r) + " is in the list twice");
    seen[static_cast<std::size_t>(r)] = true;
    if (!list.empty()) list += ',';
    list += std::to_string(r);
  }
  if (!seen[static_cast<std::size_t>(rank())])
    bad("this rank is not in the list [" + list + "]: only the members call subset()");
  // The key: this list's own count of subsets, alike on its members (they make its subsets in one order).
  std::uint64_t k = 0;
  {
    std::lock_guard lk(st.subset_mu);
    k = st.subset_seq[list]++;
  }
  const std::uint64_t h = detail::fnv1a(detail::kFnvBasis, list);  // a short key for a long list
  const std::string key_name = "subset/" + std::to_string(st.group.context >> detail::kContextShift) + "/" +
                               std::to_string(ranks.size()) + "/" + std::to_string(h) + "/" + std::to_string(k);
  return adopt(st, std::vector<int>(ranks.begin(), ranks.end()), key_name);
}

}  // namespace chorus
