// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// Data-parallel SGD helpers (see docs/sgd.md):
///   - broadcast_parameters, average_gradients (parameters.hpp): the simple forms;
///   - GradientSynchronizer (synchronizer.hpp): bucketed all-reduces that overlap the backward
///     pass, optional float16/bfloat16 wire compression, no_sync() for gradient accumulation;
///   - DistributedSampler (sampler.hpp): each rank's shard of a dataset, per epoch;
///   - furthest, resume_step, lost_ranks (elastic.hpp): going on after shrink() and grow().
/// Light: only the core vocabulary, no transport; any Communicator<Transport> works with them.

#include "chorus/sgd/elastic.hpp"
#include "chorus/sgd/parameters.hpp"
#include "chorus/sgd/sampler.hpp"
#include "chorus/sgd/synchronizer.hpp"
