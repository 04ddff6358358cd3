// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// The transports hybrid::Transport (kName "auto") chooses from, in order of preference: for each
/// pair of ranks the first candidate whose can_connect(me, peer) holds serves the pair, at both
/// ends alike (both see the same two PeerInfo). Options::transport (CHORUS_TRANSPORT) names one
/// candidate to force it, or "auto" for the first that can.
///
/// Adding a transport takes its folder (transport/<kind>/, a type that models chorus::Transport
/// and has `static bool can_connect(const PeerInfo&, const PeerInfo&)`) and one line below.

#include <string>

#include "chorus/transport/cuda_ipc/transport.hpp"
#include "chorus/transport/rdma/transport.hpp"
#include "chorus/transport/shm/transport.hpp"
#include "chorus/transport/tcp/transport.hpp"

namespace chorus::registry {

template <class... Ts>
struct List {};

/// The candidates, most preferred first. The last must connect any pair.
using Candidates = List<
    cuda_ipc::Transport,  // processes of one host that can map each other's device memory
    shm::Transport,  // processes of one host
    rdma::Transport,  // hosts that share an RDMA fabric
    tcp::Transport  // any two ranks
    >;

}  // namespace chorus::registry
