#pragma once
/// The cost model of a group: its slowest link's, from the transport that serves each peer.

#include <cstddef>

#include "chorus/algo/channel.hpp"
#include "chorus/core/concepts.hpp"
#include "chorus/core/cost_model.hpp"

namespace chorus::detail {

/// The model of a group's slowest link (by latency): per peer where the transport says which
/// model serves each (link_model, hybrid), else the transport's own T::kModel.
template <Transport T>
TransportModel group_model(T& t, const algo::Group<T>& g) {
  if constexpr (requires(int p) { t.link_model(p); }) {
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

}  // namespace chorus::detail
