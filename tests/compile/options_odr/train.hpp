// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// What a user's header that passes communicators around looks like: chorus/fwd.hpp is enough.

#include "chorus/fwd.hpp"

/// Defined in peer.cpp.
void train(chorus::Communicator<chorus::DefaultTransport>& comm);
