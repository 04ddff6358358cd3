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
};

}  // namespace chorus
