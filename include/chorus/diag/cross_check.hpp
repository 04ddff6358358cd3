// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// The stall cross-check: while a wait stalls, each rank publishes its recent collective
/// descriptors in the store and compares the current call with what the others published for
/// the same sequence number. It catches the mismatches in which no two ranks ever exchange a
/// message (both wait to receive, each from a different peer).

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "chorus/algo/descriptor.hpp"
#include "chorus/bootstrap/store.hpp"
#include "chorus/core/error.hpp"
#include "chorus/detail/log.hpp"

namespace chorus::mismatch {

/// Publishes `recent` under key_of(rank) (after `publish_progress()`), reads every other rank's,
/// and throws mismatch naming both ranks when one published a different call with mine.seq. A
/// stall may be the store's host gone too: each store call is bounded by `bound`, and a store
/// that does not answer only means no cross-check (logged once per process); the links then name
/// the lost peer.
template <class KeyOf, class Publish>
void cross_check(Store& store, const std::vector<algo::CollectiveDesc>& recent, const algo::CollectiveDesc& mine,
                 int rank, int size, const KeyOf& key_of, std::chrono::milliseconds bound, const Publish& publish_progress) {
  std::string blob;
  for (const auto& d : recent) blob.append(reinterpret_cast<const char*>(&d), sizeof(algo::CollectiveDesc));
  std::vector<std::string> published(static_cast<std::size_t>(size));
  try {
    publish_progress();
    store.set_within(key_of(rank), blob, bound);
    for (int p = 0; p < size; ++p)
      if (p != rank && store.check_within({key_of(p)}, bound))
        published[static_cast<std::size_t>(p)] = store.get(key_of(p), bound);
  } catch (const Error& e) {
    static std::atomic<bool> told{false};  // once per process: every later stall fails alike
    if (!told.exchange(true))
      chorus::detail::log(chorus::detail::LogLevel::warn, chorus::detail::LogSubsys::diag, rank, "stall cross-check skipped, store unreachable: ", e.what());
    return;
  }
  for (int p = 0; p < size; ++p) {
    const std::string& theirs = published[static_cast<std::size_t>(p)];
    for (std::size_t off = 0; off + sizeof(algo::CollectiveDesc) <= theirs.size(); off += sizeof(algo::CollectiveDesc)) {
      algo::CollectiveDesc d;
      std::memcpy(&d, theirs.data() + off, sizeof d);
      if (d.seq != mine.seq || d == mine) continue;
      throw Error(ErrorCode::mismatch, ErrorContext{rank, p, algo::describe(mine)},
                  algo::describe_difference(rank, mine, p, d));
    }
  }
}

}  // namespace chorus::mismatch
