// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// ProcessGroupChorus::Impl: the communicator of a group and the queue that hands its operations
// to chorus in call order.
//
// How a collective runs. Each call makes a Work holding a `launch` closure and appends it to the
// group's queue; nothing is sent yet. Works leave the queue in call order, each "issued" once to
// the chorus communicator, under issue_mu (so chorus sees them in call order, which is what
// makes every rank agree):
//   - by the dispatcher thread, which issues whatever is queued as chorus *_async calls: they run
//     on the communicator's worker, in order, and complete the Work (and its future) from there;
//   - or by a thread that calls Work::wait() on a Work still queued: it issues the Works queued
//     before it (async) and then runs its own as a blocking chorus call on its own thread, which
//     chorus runs inline when nothing is in flight. A blocking dist.all_reduce thus costs no
//     thread hop.
// send and recv are posted to chorus at once (not queued), as gloo does, so that a blocking
// collective never holds back a receive another rank waits for.

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "chorus/core/request.hpp"
#include "process_group.hpp"
#include "work.hpp"

namespace chorus_torch {

class Comm;  // comm.hpp

struct ProcessGroupChorus::Impl {
  int rank;
  int size;
  std::unique_ptr<Comm> comm;

  std::mutex issue_mu;  ///< held while handing works to chorus: call order
  std::mutex p2p_mu;    ///< serialises posting sends and receives
  std::mutex queue_mu;
  std::condition_variable queue_cv;
  std::deque<c10::intrusive_ptr<ChorusWork>> queue;
  bool stopping = false;
  std::thread dispatcher;

  /// Meets the peers through `store` (a rendezvous) and starts the dispatcher.
  Impl(const c10::intrusive_ptr<c10d::Store>& store, int r, int n, std::chrono::milliseconds timeout);
  /// Issues whatever is still queued, stops the dispatcher, and waits for the communicator's
  /// pending calls (finalize(), each bounded by the timeout) before it goes. The caller must not
  /// hold the GIL (see ~ProcessGroupChorus).
  ~Impl();

  c10::intrusive_ptr<ChorusWork> make(c10d::OpType type, std::string what, std::vector<at::Tensor> outputs,
                                      int source = -1) {
    return c10::make_intrusive<ChorusWork>(this, rank, type, std::move(what), std::move(outputs), source);
  }

  /// Appends a work whose launch is set to the queue.
  c10::intrusive_ptr<c10d::Work> enqueue(c10::intrusive_ptr<ChorusWork> w);

  /// Issues queued works in call order: all of them (target null), or up to `target`, which then
  /// runs blocking on this thread. Returns at once if `target` was issued by someone else.
  void drain(ChorusWork* target);

  /// A point-to-point work, posted now.
  c10::intrusive_ptr<c10d::Work> post_p2p(c10::intrusive_ptr<ChorusWork> w,
                                          const std::function<chorus::Request()>& post);

 private:
  static void issue(ChorusWork& w, bool blocking);
  void dispatch_loop();
};

}  // namespace chorus_torch
