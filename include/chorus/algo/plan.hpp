// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// The plan of one call: which algorithm runs it and in what slices, every choice in one place.
///
///   1. Device buffers where every peer's device memory is mapped (cuda_ipc): the direct
///      collectives through the IPC windows (algo/intranode/ipc.hpp): all_reduce one-shot or
///      two-shot by their model, the others their one direct form; unless an algorithm of the
///      staged path is forced.
///   2. all_reduce of host buffers small enough for the shm mailboxes of every peer: one-shot
///      (algo/intranode/one_shot.hpp); forced where it does not fit, an invalid_argument error.
///   3. Otherwise the cost model of the group's slowest link (algo/select.hpp), or what
///      CHORUS_ALGO / CHORUS_CHUNK_BYTES force.

#include <cstddef>
#include <string>

#include "chorus/algo/channel.hpp"
#include "chorus/algo/descriptor.hpp"
#include "chorus/algo/intranode/ipc.hpp"
#include "chorus/algo/intranode/one_shot.hpp"
#include "chorus/algo/select.hpp"
#include "chorus/core/concepts.hpp"
#include "chorus/core/cost_model.hpp"
#include "chorus/core/error.hpp"

namespace chorus::algo {

/// The model of a group's slowest link (by latency): per peer where the transport says which
/// model serves each (link_model, hybrid), else the transport's own T::kModel.
template <Transport T>
TransportModel group_model(T& t, const Group<T>& g) {
  if constexpr (TransportWithPeerModels<T>) {
    if (g.size() <= 1) return T::kModel;
    const int first = g.rank == 0 ? 1 : 0;
    TransportModel m = t.link_model(g.members[static_cast<std::size_t>(first)]);
    for (int i = first + 1; i < g.size(); ++i) {
      if (i == g.rank) continue;
      const TransportModel k = t.link_model(g.members[static_cast<std::size_t>(i)]);
      if (k.alpha > m.alpha) m = k;
    }
    return m;
  } else {
    return T::kModel;
  }
}

/// What a communicator knows of its group when it plans a call (fixed at its creation).
struct PlanInputs {
  int rank = 0;
  int size = 1;
  bool mailboxes = false;  ///< every peer has shm mailboxes (has_mailboxes)
  bool ipc = false;        ///< every peer's device memory is mapped (has_ipc), mailboxes too
  TransportModel model{};  ///< the group's slowest link (group_model)
  Overrides overrides;     ///< CHORUS_ALGO, CHORUS_CHUNK_BYTES
};

struct Plan {
  Choice choice{};
  bool direct = false;  ///< through the IPC windows (algo/intranode/ipc.hpp)
};

/// The plan of `desc` moving `bytes` per rank; `device` when its buffers are in device memory.
/// `slot_bytes()` gives the IPC windows' slot size (it makes the windows at the first direct call).
template <Transport T, class SlotBytes>
Plan plan(const CollectiveDesc& desc, std::size_t bytes, bool device, const PlanInputs& in, SlotBytes&& slot_bytes) {
  const int n = in.size;
  const Algorithm forced = in.overrides.algorithm;
  const bool direct_forced = forced == Algorithm::one_shot || forced == Algorithm::two_shot;
  Plan p;
  p.direct = device && in.ipc && n > 1 &&
             (forced == Algorithm::automatic || direct_forced || forcible_algorithms(desc.kind).empty());
  // all_reduce of host buffers through the shm mailboxes where it fits, unless another algorithm
  // is forced; forced, it must fit. (A forced two_shot where the direct path cannot run leaves the
  // choice to the model: it names an algorithm of device buffers only.)
  const bool one_shot_call = desc.kind == CollectiveKind::all_reduce && n > 1;
  const bool one_shot_fits = in.mailboxes && !device && bytes <= one_shot_max_bytes<T>();
  const bool one_shot_forced = forced == Algorithm::one_shot;
  if (one_shot_call && one_shot_forced && !one_shot_fits && !p.direct)
    throw Error(ErrorCode::invalid_argument, ErrorContext{in.rank, -1, describe(desc)},
                "CHORUS_ALGO=one_shot needs every peer on shm, a communicator made by init/create (not split) "
                "and at most " + std::to_string(one_shot_max_bytes<T>()) + " bytes of host memory (or device "
                "buffers over cuda_ipc); this call has " +
                std::to_string(bytes) + " bytes" + (in.mailboxes ? "" : " and no shm mailboxes to every peer"));
  if (p.direct) {
    check_forced(desc.kind, in.overrides);
    Algorithm a = Algorithm::ipc;
    if (desc.kind == CollectiveKind::all_reduce)
      a = direct_forced ? forced : ipc_all_reduce_algorithm(bytes, n, slot_bytes());
    p.choice = {a, slot_bytes()};
  } else if (one_shot_call && one_shot_fits && (one_shot_forced || forced == Algorithm::automatic)) {
    p.choice = {Algorithm::one_shot, 0};
  } else {
    p.choice = select(desc.kind, bytes, n, in.model, in.overrides);
  }
  return p;
}

}  // namespace chorus::algo
