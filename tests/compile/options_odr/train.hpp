// SPDX-License-Identifier: BSD-3-Clause
// What a user's header that passes communicators around looks like: chorus/fwd.hpp is enough.
#pragma once

#include "chorus/fwd.hpp"

/// Defined in peer.cpp. Its parameter's type depends on CHORUS_WITH_RDMA, its spelling does not:
/// chorus::DefaultTransport, hybrid::Transport, lives in the options namespace (config.hpp).
int train(chorus::Communicator<chorus::DefaultTransport>* comm);
