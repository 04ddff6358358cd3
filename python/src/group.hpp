// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// ProcessGroupChorus::Impl: the communicator of a group, and how its operations reach it.
//
// How a collective runs. Each call makes a Work holding a `launch` closure and hands it to
// chorus at once, under issue_mu (so that chorus sees a group's calls in the order they were
// made, which is what makes every rank agree), as the *_async call of chorus::Call
// (chorus/call.hpp). chorus's own call queue then does the rest: the call runs on the
// communicator's worker, in order, and completes the Work (and its future) from there, or, when
// a thread waits for the Work before the worker has started it, on the waiting thread (chorus
// lets a waiter run its own call when its turn comes), so a blocking dist.all_reduce costs no
// thread hop. The group has no queue or thread of its own: measured against one (docs/torch.md,
// "How it works"), chorus's call queue serves as well.
// send and recv are posted to chorus at once as well, as gloo does, outside the call order of the
// collectives, so that a collective never holds back a receive another rank waits for.

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "chorus/core/request.hpp"
#include "completions.hpp"
#include "process_group.hpp"
#include "work.hpp"

namespace chorus_torch {

class Comm;  // comm.hpp

struct ProcessGroupChorus::Impl {
  int rank;
  int size;
  std::shared_ptr<Comm> comm;  ///< shared with the Works (weakly), which abort it on a per-call timeout
  /// Completes the Works' futures off chorus's thread (completions.hpp); the Works hold it weakly.
  std::shared_ptr<Completions> completions = std::make_shared<Completions>();

  std::mutex issue_mu;  ///< held while handing collectives to chorus: call order
  std::mutex p2p_mu;    ///< serialises posting sends and receives

  /// Meets the peers through `store` (a rendezvous).
  Impl(const c10::intrusive_ptr<c10d::Store>& store, int r, int n, std::chrono::milliseconds timeout);
  /// A subset of `parent`'s communicator (its links and timeout, no rendezvous).
  Impl(Impl& parent, const std::vector<int>& ranks, int r, int n);
  /// Waits for the communicator's pending calls (finalize(), each bounded by the timeout) before
  /// it goes. The caller must not hold the GIL (see ~ProcessGroupChorus).
  ~Impl();

  c10::intrusive_ptr<ChorusWork> make(c10d::OpType type, std::string what, std::vector<at::Tensor> outputs,
                                      int source = -1) {
    return c10::make_intrusive<ChorusWork>(comm, completions, rank, type, std::move(what), std::move(outputs), source);
  }

  /// Hands a work whose launch is set to chorus (its call queue), in call order; a launch that
  /// throws fails the work.
  c10::intrusive_ptr<c10d::Work> enqueue(c10::intrusive_ptr<ChorusWork> w);

  /// A point-to-point work, posted now.
  c10::intrusive_ptr<c10d::Work> post_p2p(c10::intrusive_ptr<ChorusWork> w,
                                          const std::function<chorus::Request()>& post);
};

}  // namespace chorus_torch
