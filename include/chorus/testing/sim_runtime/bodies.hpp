// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// The bodies of device::SimRuntime (testing/sim_runtime.hpp), one file per part of its model,
/// defined CHORUS_DETAIL_SIM_INLINE: inline in a header-only program (sim_runtime.hpp includes
/// this), and once, not inline, in the compiled part of a program built with
/// CHORUS_SEPARATE_COMPILATION (cmake/compiled/sim_runtime.cpp, chorus/src.hpp).

#include "chorus/testing/sim_runtime.hpp"

#include "chorus/testing/sim_runtime/faults.hpp"
#include "chorus/testing/sim_runtime/memory.hpp"
#include "chorus/testing/sim_runtime/ipc.hpp"
#include "chorus/testing/sim_runtime/streams.hpp"
#include "chorus/testing/sim_runtime/work.hpp"
#include "chorus/testing/sim_runtime/flags.hpp"
#include "chorus/testing/sim_runtime/collective.hpp"
