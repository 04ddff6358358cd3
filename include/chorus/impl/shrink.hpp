// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// Communicator<T>::shrink (ULFM's MPIX_Comm_shrink, ncclCommShrink): included at the bottom of
// impl/communicator.hpp. The agreement is in impl/standby.hpp.

#include <algorithm>
#include <chrono>
#include <set>
#include <span>
#include <string>

#include "chorus/core/tag.hpp"
#include "chorus/detail/log.hpp"
#include "chorus/impl/standby.hpp"
#include "chorus/impl/state.hpp"

namespace chorus {

template <class T>
Communicator<T> Communicator<T>::shrink() {
  return shrink(std::span<const int>{});
}

template <class T>
Communicator<T> Communicator<T>::shrink(std::span<const int> exclude) {
  using Clock = std::chrono::steady_clock;
  State& st = live("shrink");
  st.outside_group("shrink");
  if (st.left_shrinks)
    throw Error(
        ErrorCode::invalid_argument, st.ctx(-1, "shrink"),
        "this communicator was aborted with abort(): it takes no part in a shrink (the others leave it out)");
  const int n = size(), me = rank();
  const auto started = Clock::now();
  std::set<int> out;
  for (int q : exclude) {
    if (q < 0 || q >= n)
      throw Error(ErrorCode::invalid_argument, st.ctx(q, "shrink"),
                  "exclude names rank " + std::to_string(q) + ", not a rank of this communicator of " + std::to_string(n));
    out.insert(q);
  }
  // This communicator ends here: its calls fail and its links close, so that a peer that has not
  // noticed the failure yet notices now.
  st.dumped.store(true);  // no flight recorder dump for this abort: a failure that led here made its own
  abort_with(Error(ErrorCode::aborted, st.ctx(-1, "shrink"), "the communicator is being shrunk"));
  if (out.count(me)) return Communicator(nullptr);
  const Options& old = st.boot.options;
  const auto wait = old.shrink_wait.count() > 0 ? old.shrink_wait : old.timeout;
  for (;;) {
    std::uint64_t seq = 0;
    {
      std::lock_guard lk(st.call_mu);
      seq = st.shrink_seq++;
    }
    const std::string prefix = st.shrink_prefix(seq);
    const ErrorContext ctx = st.ctx(-1, "shrink");
    detail::Agreement a = st.standby->agree(st.group.members, me, out, prefix, wait, ctx);
    Options o = old;
    o.rank = static_cast<int>(std::find(a.members.begin(), a.members.end(), me) - a.members.begin());
    o.world_size = static_cast<int>(a.members.size());
    o.store = a.store;
    // A member that dies before the new communicator is made must not hold the others for the
    // whole timeout: the creation's waits are bounded more tightly, and a failed one starts
    // another round.
    o.setup_timeout = std::min<std::chrono::milliseconds>(
        old.timeout, std::chrono::seconds(10) + std::chrono::milliseconds(5) * static_cast<int>(a.members.size()));
    try {
      Communicator c = create(std::move(o));
      c.s_->standby->keep_previous(st.standby);
      detail::log(detail::LogLevel::info, detail::LogSubsys::init, me, "shrink: ", n, " ranks -> ", a.members.size(),
                  " (", a.summary, "); this rank is now rank ", c.rank(), "; ",
                  std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - started).count(), " ms");
      return c;
    } catch (const Error& e) {
      if (e.code() != ErrorCode::peer_failure && e.code() != ErrorCode::timeout) throw;
      if (Clock::now() - started > old.timeout) throw;
      detail::log(detail::LogLevel::warn, detail::LogSubsys::init, me, "shrink: the shrunk communicator (", a.summary,
                  ") could not be made: ", e.what(), "; agreeing again");
    }
  }
}

}  // namespace chorus
