// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// What an algorithm's channel knows of its group: the members (their ranks in the transport's
/// numbering), this rank, the context of its tags (the layout: core/tag.hpp); and a message in flight.

#include <vector>

#include "chorus/core/buffer.hpp"
#include "chorus/core/concepts.hpp"
#include "chorus/core/request.hpp"
#include "chorus/core/tag.hpp"

namespace chorus::algo {

/// The members of a (sub-)communicator and how to reach them.
template <Transport T>
struct Group {
  T* transport = nullptr;
  std::vector<int> members;  ///< group rank -> transport rank
  int rank = -1;             ///< this rank in the group
  Tag context = 0;           ///< high bits of every tag of this group
  /// Descriptors on (the default). Off only to measure what mismatch detection costs
  /// (CHORUS_BENCH_NO_DESCRIPTORS=1, documented in docs/environment.md).
  bool descriptors = true;
  int size() const { return static_cast<int>(members.size()); }
};

/// A message in flight, as a Channel hands it to an algorithm.
struct ChannelOp {
  Request req;
  int peer = -1;
  bool recv = false;
  int staged = -1;   ///< index of its stamped staging buffer (a stamped first message), or -1
  MutableBytes dst;  ///< what the link writes (for a stamped one: where the data goes once in)
  /// A receive into memory links cannot write (device memory): the data lands in host staging
  /// (dst) and is uploaded here once in.
  std::byte* upload_to = nullptr;
};

}  // namespace chorus::algo
