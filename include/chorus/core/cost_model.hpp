// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// The cost of moving bytes over one kind of link, as the algorithm selection reads it
/// (algo/select.hpp): every transport states its own as `static constexpr TransportModel kModel`.

#include <cstddef>

namespace chorus {

/// Latency per message (seconds), time per byte (seconds) and pipeline slice (bytes) of a
/// transport.
struct TransportModel {
  double alpha;
  double beta;
  std::size_t slice;
  /// Time per byte to a rank of another host, where the host's network link rather than the
  /// transport's own speed bounds it (tcp: beta is loopback's); 0: beta. The cost model reads it
  /// unless CHORUS_NET_BANDWIDTH gives the rate of the hosts' links (algo/plan.hpp).
  double remote_beta = 0;
};

}  // namespace chorus
