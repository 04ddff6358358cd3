// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// Communicator<T>'s group calls (chorus/group.hpp): group_start() opens a group on the calling
// thread; start() and the point-to-point calls record what that thread issues meanwhile
// (record_call, record_p2p) and hand back requests that group_end() completes. group_end():
//   1. the ranks compare their groups' signatures (one all_reduce of a few words, when the group
//      has collectives; an all_gather after it where they differ): a rank whose group differs gets
//      `mismatch` naming both groups, and nothing of the group runs anywhere;
//   2. the receives, then the sends, are posted (none waits for another, so any order the ranks
//      wrote them in completes);
//   3. the collectives run in the order recorded, small ones of one kind, dtype, op and root on
//      host buffers fused into one call per bucket (impl/group_items.hpp); calls on a stream are
//      issued on their streams as outside a group;
//   4. it waits for everything but the calls on a stream and throws the first error.
// Included at the bottom of impl/communicator.hpp, after impl/split.hpp (Internal).

#include <array>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "chorus/impl/group_items.hpp"
#include "chorus/impl/state.hpp"

namespace chorus {

template <class T>
void Communicator<T>::group_start() {
  State& st = live("group_start");
  if (st.grouping()) {
    ++st.group_depth;  // nested, as ncclGroupStart: the outermost group_end() runs the group
    return;
  }
  std::thread::id none{};
  if (!st.group_owner.compare_exchange_strong(none, std::this_thread::get_id()))
    throw Error(ErrorCode::invalid_argument, st.ctx(-1, "group_start"),
                "another thread has a group open on this communicator (one group at a time)");
  st.group_depth = 1;
  st.group_guard = std::make_shared<detail::GroupGuard>(std::this_thread::get_id());
}

template <class T>
bool Communicator<T>::in_group() const {
  return s_ && s_->grouping();
}

/// Closes the group on this thread and hands back what it recorded.
template <class T>
std::vector<detail::GroupItem> Communicator<T>::close_group(const char* op) {
  State& st = live(op);
  if (!st.grouping())
    throw Error(ErrorCode::invalid_argument, st.ctx(-1, op), "no group is open on this thread (group_start() first)");
  if (--st.group_depth > 0) return {};
  std::vector<detail::GroupItem> items = std::move(st.group_items);
  st.group_items.clear();
  st.group_guard->close();  // waits on the requests proceed from here on
  st.group_guard.reset();
  st.group_owner.store(std::thread::id{});
  return items;
}

template <class T>
void Communicator<T>::group_abandon() {
  if (!s_ || !s_->grouping()) return;
  s_->group_depth = 1;  // all the way out
  for (detail::GroupItem& it : close_group("group_abandon"))
    it.req->fail(ErrorCode::invalid_argument, "not run: its group was abandoned before group_end() (an exception left its scope)");
}

template <class T>
Request Communicator<T>::record_call(const Call& c, std::optional<device::Stream> stream) {
  State& st = *s_;
  detail::check_collective_args(c.kind, c.in, c.out, c.count, c.dtype, c.op, c.root, rank(), size());
  const algo::CollectiveDesc d = detail::desc_of(c);
  detail::GroupItem it;
  it.call = c;
  it.stream = stream;
  it.fusable = !stream && st.kind_of(c.in, c.out, d) == MemoryKind::host && detail::fusable_kind(c.kind) &&
               c.op != ReduceOp::premul_sum;  // each its own scalar
  // Named when it is read (an error): "all_reduce of 1024 bytes, call 3 of a group".
  const detail::LazyOp what{algo::to_string(c.kind).data(), st.group_items.size(), c.count * size_of(c.dtype),
                            [](const char* verb, std::uint64_t index, std::size_t bytes) {
                              return std::string(verb) + " of " + std::to_string(bytes) + " bytes, call " +
                                     std::to_string(index) + " of a group";
                            }};
  it.req = std::make_shared<detail::RequestState>(st.group.rank, -1, what, st.boot.options.timeout);
  it.req->set_driver(st.group_guard);
  Request r(it.req);
  st.group_items.push_back(std::move(it));
  return r;
}

template <class T>
Request Communicator<T>::record_p2p(bool send, const std::byte* data, std::size_t bytes, int peer, int tag) {
  State& st = *s_;
  detail::GroupItem it;
  it.kind = send ? detail::GroupItem::Kind::send : detail::GroupItem::Kind::recv;
  it.data = const_cast<std::byte*>(data);  // a receive's came in writable (irecv_bytes); a send's is only read
  it.bytes = bytes;
  it.peer = peer;
  it.tag = tag;
  // Named as the links name theirs, when it is read: "send tag 5 (1024 bytes)".
  it.req = std::make_shared<detail::RequestState>(
      st.group.rank, peer,
      detail::LazyOp{send ? "send" : "recv", st.group.context | static_cast<Tag>(tag), bytes, &detail::describe_op},
      st.boot.options.timeout);
  it.req->set_driver(st.group_guard);
  Request r(it.req);
  st.group_items.push_back(std::move(it));
  return r;
}

namespace detail {
/// Completes `to` as `from` ended (from's Request::on_complete).
inline void complete_as(RequestState& to, std::exception_ptr e, std::size_t bytes) {
  if (!e) return to.complete(bytes);
  try {
    std::rethrow_exception(e);
  } catch (const Error& x) {
    to.fail(x);
  } catch (const std::exception& x) {
    to.fail(ErrorCode::system, x.what());
  }
}
}  // namespace detail

template <class T>
void Communicator<T>::group_end() {
  // The guard outlives the group's calls (their completions hold it): a wait after group_end() for
  // a call it did not wait for (one on a stream) drives that call's engine through it.
  std::shared_ptr<detail::GroupGuard> guard = s_ && s_->grouping() ? s_->group_guard : nullptr;
  std::vector<detail::GroupItem> items = close_group("group_end");
  if (items.empty()) return;
  State& st = *s_;
  const int n = size(), me = rank();
  std::optional<Error> first;
  auto fail_all = [&](const Error& e) {
    for (detail::GroupItem& it : items) it.req->fail(e);
  };

  // 1. The groups' signatures, compared on every rank (so every rank finds a mismatch itself).
  detail::GroupSignature mine;
  for (const detail::GroupItem& it : items)
    if (it.kind == detail::GroupItem::Kind::collective) mine.add(it.call);
  if (mine.collectives > 0 && n > 1) {
    // One small all_reduce (max) of the words and their complements: everyone's max and min. Where
    // they differ, every rank sees it, and an all_gather then names the ranks and their groups.
    const auto words = mine.words();
    constexpr std::size_t W = detail::GroupSignature::kWords;
    std::array<std::uint64_t, 2 * W> range{};
    for (std::size_t i = 0; i < W; ++i) range[i] = words[i], range[W + i] = ~words[i];
    std::vector<std::uint64_t> all(W * static_cast<std::size_t>(n));
    try {
      Internal internal(st);
      all_reduce(range, ReduceOp::max);
      bool alike = true;
      for (std::size_t i = 0; i < W; ++i) alike = alike && range[i] == words[i] && ~range[W + i] == words[i];
      if (alike) all.clear();
      else all_gather(std::span<const std::uint64_t>(words), all);
    } catch (const Error& e) {
      fail_all(e);
      throw;
    }
    for (int r = 0; r < n && !all.empty(); ++r) {
      const auto theirs = detail::GroupSignature::from(all.data() + W * static_cast<std::size_t>(r));
      if (theirs == mine) continue;
      const Error e(ErrorCode::mismatch, st.ctx(r, "group_end"),
                    "the ranks' groups differ, so none of it ran: this rank's group has " + mine.describe() + ", rank " +
                        std::to_string(r) + "'s has " + theirs.describe());
      fail_all(e);
      throw e;
    }
  }

  // 2. Receives, then sends: posted at once, completed as the links move them.
  std::vector<std::pair<Request, detail::GroupItem*>> waits;
  auto chain = [&](Request r, detail::GroupItem& it, bool wait_here) {
    // A send or receive moves exactly its size (a receive of another size fails), a collective none.
    const std::size_t bytes = it.kind == detail::GroupItem::Kind::collective ? 0 : it.bytes;
    if (guard && r.state()) guard->forward(it.req.get(), r.state()->driver());
    r.on_complete([to = it.req, bytes, guard](std::exception_ptr e) { detail::complete_as(*to, e, bytes); });
    if (wait_here) waits.emplace_back(std::move(r), &it);
  };
  for (auto pass : {detail::GroupItem::Kind::recv, detail::GroupItem::Kind::send})
    for (detail::GroupItem& it : items) {
      if (it.kind != pass) continue;
      try {
        chain(pass == detail::GroupItem::Kind::recv ? irecv_bytes(MutableBytes{it.data, it.bytes}, it.peer, it.tag)
                                                    : isend_bytes(ConstBytes{it.data, it.bytes}, it.peer, it.tag),
              it, true);
      } catch (const Error& e) {
        it.req->fail(e);
        if (!first) first = e;
      }
    }

  // 3. The collectives: buckets of fusable ones (each issued where its first member was), the
  // others one by one, in the order recorded.
  struct Bucket {
    detail::FuseKey key;
    std::vector<detail::GroupItem*> members;
    std::size_t bytes = 0;
    bool open = true;
  };
  std::vector<Bucket> buckets;
  std::vector<std::pair<detail::GroupItem*, Bucket*>> units;  // a single call, or a bucket's first place
  buckets.reserve(items.size());
  for (detail::GroupItem& it : items) {
    if (it.kind != detail::GroupItem::Kind::collective) continue;
    const std::size_t b = detail::largest_buffer(it.call, n);
    if (!it.fusable || b > detail::kGroupFuseCallBytes) {
      units.emplace_back(&it, nullptr);
      continue;
    }
    Bucket* into = nullptr;
    for (Bucket& k : buckets)
      if (k.open && k.key == detail::fuse_key(it.call)) into = &k;
    if (into && into->bytes + b > detail::kGroupFuseBucketBytes) {  // full: a new bucket from here
      into->open = false;
      into = nullptr;
    }
    if (!into) {
      into = &buckets.emplace_back(Bucket{detail::fuse_key(it.call), {}, 0, true});
      units.emplace_back(nullptr, into);
    }
    into->members.push_back(&it);
    into->bytes += b;
  }
  for (auto [single, bucket] : units) {
    try {
      if (single) {
        chain(start(single->call, CallMode::async, single->stream), *single, !single->stream);
        continue;
      }
      if (bucket->members.size() == 1) {
        chain(start(bucket->members[0]->call, CallMode::async), *bucket->members[0], true);
        continue;
      }
      std::vector<const Call*> calls;
      for (detail::GroupItem* m : bucket->members) calls.push_back(&m->call);
      detail::FusedBucket fused(std::move(calls), n, me);
      (void)start(fused.pack(), CallMode::blocking);
      fused.unpack();
      for (detail::GroupItem* m : bucket->members) m->req->complete();
    } catch (const Error& e) {
      if (single) single->req->fail(e);
      else
        for (detail::GroupItem* m : bucket->members) m->req->fail(e);
      if (!first) first = e;
    }
  }

  // 4. Everything but the calls on a stream is done when group_end() returns: their requests
  // too (a request's callback runs after its waiters wake, so it may not have run yet; completing
  // twice is a no-op).
  for (auto& [r, it] : waits) {
    try {
      r.wait();
      it->req->complete(it->kind == detail::GroupItem::Kind::collective ? 0 : it->bytes);
    } catch (const Error& e) {
      it->req->fail(e);
      if (!first) first = e;
    }
  }
  if (first) throw *first;
}

}  // namespace chorus
