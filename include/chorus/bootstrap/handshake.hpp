// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// Moved to chorus/detail/handshake.hpp, below both the store and the transports that use it.
/// This forwarding header stays for one release for programs that include it by this path.

#include "chorus/detail/handshake.hpp"
