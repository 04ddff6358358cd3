// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// One-shot all_reduce of small messages between processes of one host, through the mailboxes of
/// the shm links (transport/shm/detail/segment.hpp): every rank writes its input and its call's
/// descriptor into the mailbox of each of its links, then reads its peers' and reduces all of
/// them in rank order, so every rank computes the same bits. One step, no request, no matching,
/// no channel: what a latency-bound all_reduce costs is a copy per peer, a wait per peer and the
/// reduction (the idea of Open MPI's coll/sm and of the one-shot all-reduce of TensorRT-LLM and
/// vLLM, here over the links' own segments).
///
/// Used for all_reduce up to kMailboxBytes when every peer of the group is reached over shm and
/// the communicator owns its transport (split communicators share theirs and take the other
/// algorithms); CHORUS_ALGO=one_shot forces it, and is an error where it cannot run.
///
/// The two slots per direction are used in turn. A rank writes its k-th message on a link into
/// slot k % 2 only after its (k-1)-th call completed; that needed the peer's (k-1)-th message,
/// which the peer writes only after it read the k-2-th: the slot's previous content.
///
/// Mismatch: each message carries the caller's descriptor, and a differing one throws mismatch
/// naming both calls (the communicator then tells every rank). A peer that runs another
/// collective writes nothing here: the wait's stall check compares the calls through the store.
/// A peer's death breaks its link, which ends the wait with peer_failure; the timeout aborts the
/// transport and throws timeout, as every other wait does.

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "chorus/algo/channel.hpp"
#include "chorus/algo/common.hpp"
#include "chorus/algo/descriptor.hpp"
#include "chorus/core/error.hpp"
#include "chorus/core/request.hpp"
#include "chorus/algo/stamp.hpp"
#include "chorus/reduce/host.hpp"

namespace chorus::algo {

/// True when the transport can give every member of `g` a mailbox link.
template <Transport T>
bool has_mailboxes(const Group<T>& g) {
  if constexpr (LinkWithMailboxes<LinkOf<T>>) {
    for (int p = 0; p < g.size(); ++p)
      if (p != g.rank && g.transport->link(g.members[static_cast<std::size_t>(p)]).shm_link() == nullptr) return false;
    return g.size() > 1;
  } else {
    return false;
  }
}

/// The largest all_reduce (bytes) the one-shot algorithm takes.
template <Transport T>
constexpr std::size_t one_shot_max_bytes() {
  if constexpr (LinkWithMailboxes<LinkOf<T>>) {
    using Slot = std::remove_cvref_t<decltype(std::declval<T&>().link(0).shm_link()->mailbox_in(1))>;
    return sizeof(Slot::data);
  } else {
    return 0;
  }
}

/// The link with mailboxes to group rank p (has_mailboxes(g)).
template <Transport T>
auto& mailbox_link(Group<T>& g, int p) {
  return *g.transport->link(g.members[static_cast<std::size_t>(p)]).shm_link();
}

/// Step 1 of a mailbox exchange: for every peer, fill(payload) writes `bytes` bytes of data (at
/// most one_shot_max_bytes) into the next mailbox message of its link (the slot's payload(bytes):
/// its stamp's line for the smallest), which then carries `desc`
/// and is published. fill(data) returns nothing; it runs once per peer.
template <Transport T, class Fill>
void mailbox_post(Group<T>& g, const CollectiveDesc& desc, std::size_t bytes, const Fill& fill) {
  for (int p = 0; p < g.size(); ++p) {
    if (p == g.rank) continue;
    auto& l = mailbox_link(g, p);
    const std::uint32_t stamp = l.next_mailbox_stamp();
    auto& slot = l.mailbox_out(stamp);
    fill(slot.payload(bytes));
    mismatch::put_desc(slot.desc, desc);
    slot.bytes = static_cast<std::uint32_t>(bytes);
    slot.stamp.store(stamp, std::memory_order_seq_cst);
    l.mailbox_sent();
  }
}

/// Step 2: waits for every peer's message of this exchange and checks that it carries `desc` and
/// `bytes` (mismatch otherwise). `on_stall(desc)` runs every kStallCheck of a wait; `timeout`
/// bounds each wait (then the transport is aborted and timeout thrown); a broken link throws
/// its failure (peer_failure).
template <Transport T, class OnStall>
void mailbox_wait(Group<T>& g, const CollectiveDesc& desc, std::size_t bytes, std::chrono::milliseconds timeout,
                  const OnStall& on_stall) {
  using Clock = std::chrono::steady_clock;
  using MLink = std::remove_reference_t<decltype(mailbox_link(g, 0))>;
  struct Waiting {
    const std::atomic<std::uint32_t>* stamp;
    std::uint32_t want;
    const MLink* link;
    static bool ready(const void* c) {
      const auto* w = static_cast<const Waiting*>(c);
      return w->stamp->load(std::memory_order_acquire) == w->want || w->link->broken();
    }
  };
  for (int p = 0; p < g.size(); ++p) {
    if (p == g.rank) continue;
    MLink& l = mailbox_link(g, p);
    const std::uint32_t stamp = l.mailbox_stamp();
    const auto& slot = l.mailbox_in(stamp);
    const Waiting w{&slot.stamp, stamp, &l};
    if (!Waiting::ready(&w) && !l.await_mailbox(stamp)) {
      auto driver = l.driver().lock();
      auto now = Clock::now();
      const auto deadline = now + timeout;
      while (!Waiting::ready(&w)) {
        if (now >= deadline) {
          Error e(ErrorCode::timeout, ErrorContext{g.rank, p, describe(desc)},
                  "no mailbox message from rank " + std::to_string(p) + " within " + std::to_string(timeout.count()) +
                      " ms (CHORUS_TIMEOUT)");
          if (driver) driver->on_timeout(e);  // aborts the transport, as every timed-out wait does
          throw e;
        }
        if (!driver)
          throw Error(ErrorCode::peer_failure, ErrorContext{g.rank, p, describe(desc)}, "the transport is gone");
        driver->drive_until(&Waiting::ready, &w, std::min(deadline, now + Channel<T>::kStallCheck));
        if (Waiting::ready(&w)) break;
        on_stall(desc);
        now = Clock::now();
      }
    }
    if (slot.stamp.load(std::memory_order_acquire) != stamp) {  // the link broke
      const auto [code, why] = l.failure();
      throw Error(code, ErrorContext{g.rank, p, describe(desc)}, "the link to rank " + std::to_string(p) + " broke: " + why);
    }
    const CollectiveDesc theirs = mismatch::get_desc(slot.desc);
    if (!(theirs == desc))
      throw Error(ErrorCode::mismatch, ErrorContext{g.rank, p, describe(desc)}, describe_difference(g.rank, desc, p, theirs));
    if (slot.bytes != bytes)
      throw Error(ErrorCode::mismatch, ErrorContext{g.rank, p, describe(desc)},
                  "rank " + std::to_string(p) + " sent " + std::to_string(slot.bytes) + " bytes where rank " +
                      std::to_string(g.rank) + " sent " + std::to_string(bytes) + " in the same step of " + describe(desc) +
                      " (the ranks run different algorithms or memory kinds for this call)");
  }
}

/// The data of rank p's latest mailbox message (after mailbox_wait).
template <Transport T>
const std::byte* mailbox_data(Group<T>& g, int p) {
  auto& l = mailbox_link(g, p);
  const auto& slot = l.mailbox_in(l.mailbox_stamp());
  return slot.payload(slot.bytes);
}

/// The all_reduce of `a` over `g` (has_mailboxes(g), a.bytes(a.count) <= one_shot_max_bytes).
/// `on_stall(desc)` runs every kStallCheck of a wait; `timeout` bounds each wait.
template <Transport T, class OnStall>
void one_shot_all_reduce(Group<T>& g, const CollectiveDesc& desc, const Args& a, std::chrono::milliseconds timeout,
                         const OnStall& on_stall) {
  if constexpr (!LinkWithMailboxes<LinkOf<T>>) {
    throw Error(ErrorCode::unsupported, ErrorContext{g.rank, -1, describe(desc)}, "no mailboxes on this transport");
  } else {
    const int n = g.size();
    const std::size_t bytes = a.bytes(a.count);

    // 1. Write: the input and the descriptor into the mailbox of every link.
    const std::byte* mine = a.in;
    mailbox_post(g, desc, bytes, [&](std::byte* data) {
      a.x().copy(data, a.in, bytes);
      if (a.in == a.out) mine = data;  // in place: `out` is overwritten before this is read
    });

    // 2. Wait for every peer's message and check its descriptor.
    mailbox_wait(g, desc, bytes, timeout, on_stall);

    // 3. Reduce in rank order (the same bits on every rank).
    if (bytes == 0) return;
    auto src = [&](int q) -> const std::byte* { return q == g.rank ? mine : mailbox_data(g, q); };
    exec::Executor& x = a.x();
    x.reduce(a.op, a.dtype, a.out, src(0), src(1), a.count);
    for (int q = 2; q < n; ++q) x.reduce(a.op, a.dtype, a.out, a.out, src(q), a.count);
    if (a.op == ReduceOp::avg) x.finalize_avg(a.dtype, a.out, a.count, n);
  }
}

}  // namespace chorus::algo
