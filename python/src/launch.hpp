// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// How a queued Work hands its operation to chorus: the one launch closure of the collectives.
//
// A collective is described as plain data (Collective: chorus::Call's fields, with tensors for
// its buffers); launch() turns it into the Work's launch, which starts it through chorus's one
// type-erased entry point (chorus::start, chorus/call.hpp) and attaches its request to the Work.
// all_to_all, all_gather and reduce_scatter with per-rank counts have launches of their own: chorus
// runs them point to point (all_to_all_v.hpp, v_collectives.hpp), blocking, on the thread that
// issues them.

#include <cstddef>
#include <cstdint>
#include <vector>

#include <ATen/ATen.h>

#include "chorus/algo/descriptor.hpp"  // chorus::CallKind's enumeration, without the communicator
#include "chorus/core/types.hpp"
#include "work.hpp"

namespace chorus_torch {

class Comm;  // comm.hpp

/// One collective as chorus::Call describes it, with tensors rather than pointers, so that the
/// launch keeps them alive; their data is read when the collective is issued.
struct Collective {
  using Kind = chorus::algo::CollectiveKind;  ///< chorus::CallKind (call.hpp)

  Kind kind = Kind::barrier;
  at::Tensor in{};   ///< undefined where this rank sends nothing (scatter off the root); broadcast: unused
  at::Tensor out{};  ///< undefined where this rank receives nothing (gather off the root)
  std::size_t count = 0;  ///< elements per rank, as chorus counts them for `kind`
  chorus::DataType dt = chorus::DataType::uint8;
  chorus::ReduceOp op = chorus::ReduceOp::sum;  ///< all_reduce, reduce, reduce_scatter
  int root = -1;                                ///< broadcast, reduce, gather, scatter
};

/// The launch of `call` on `comm`: starts it (chorus::start) and attaches its request.
ChorusWork::Launch launch(Comm& comm, Collective call);

/// The launch of `call` with PREMUL_SUM (call.op is sum): fills call.in (a tensor of src's size
/// and dtype, which the Work keeps) with src * factor (premul_factor: a 0-dim tensor of the dtype),
/// then starts the sum. After a barrier, as launch_all_to_all_v: the scaling then reads src after
/// every collective issued before has written it.
ChorusWork::Launch launch_premul(Comm& comm, Collective call, at::Tensor src, at::Tensor factor);

/// The launch of an all_to_all with per-rank counts: `in_counts[p]` elements of `in` go to rank p,
/// `out_counts[p]` into `out` come from it, at the running offsets. chorus::all_to_all_v (point to
/// point, blocking on the thread that issues it) after a barrier. The barrier is a blocking
/// collective, so it runs after every collective issued before (it queues behind them on the
/// communicator's worker): their results are in the input before it is sent, and nothing still
/// writes the output.
ChorusWork::Launch launch_all_to_all_v(Comm& comm, at::Tensor in, at::Tensor out,
                                       std::vector<int64_t> in_counts, std::vector<int64_t> out_counts,
                                       chorus::DataType dt);

/// The launch of an all_gather with per-rank counts: this rank's `in` (counts[rank] elements), and
/// rank p's counts[p] elements into `out` at the running offsets. chorus::all_gather_v after a
/// barrier, as launch_all_to_all_v.
ChorusWork::Launch launch_all_gather_v(Comm& comm, at::Tensor in, at::Tensor out, std::vector<int64_t> counts,
                                       chorus::DataType dt);

/// The launch of a reduce_scatter with per-rank counts: `in` holds counts[p] elements for each rank
/// p, back to back; this rank's `out` receives its block reduced with `op`. chorus::reduce_scatter_v
/// after a barrier, as launch_all_to_all_v; with a defined `factor` (PREMUL_SUM), `in` (the
/// backend's own copy) is multiplied by it first.
ChorusWork::Launch launch_reduce_scatter_v(Comm& comm, at::Tensor in, at::Tensor out, std::vector<int64_t> counts,
                                           chorus::DataType dt, chorus::ReduceOp op, at::Tensor factor = {});

}  // namespace chorus_torch
