// SPDX-License-Identifier: BSD-3-Clause
// ProcessGroupChorus::Impl and the group's lifetime: see group.hpp.

#include "group.hpp"

#include <stdexcept>
#include <utility>

#include <pybind11/pybind11.h>

#include "arguments.hpp"
#include "comm.hpp"
#include "store_adapter.hpp"

namespace chorus_torch {

ProcessGroupChorus::Impl::Impl(const c10::intrusive_ptr<c10d::Store>& store, int r, int n,
                               std::chrono::milliseconds timeout)
    : rank(r), size(n) {
  chorus::Options o = chorus::Options::from_env();
  o.rank = r;
  o.world_size = n;
  o.store = std::make_shared<C10dStore>(store);
  if (timeout.count() > 0) o.timeout = timeout;
  try {
    comm = std::make_unique<Comm>(Comm::create(std::move(o)));
  } catch (const std::exception& e) {
    fail(r, "init (rendezvous through the c10d store)", e.what());
  }
  dispatcher = std::thread([this] { dispatch_loop(); });
}

ProcessGroupChorus::Impl::~Impl() {
  // The dispatcher issues whatever is still queued, then stops; finalize() lets what was issued
  // finish (as gloo and NCCL finish queued work before they go), each call bounded by the group's
  // timeout, rather than aborting it under peers that are still in it. Its errors belong to the
  // Works (nobody waited for them); the communicator's destructor then aborts what is left.
  {
    std::lock_guard lk(queue_mu);
    stopping = true;
  }
  queue_cv.notify_all();
  dispatcher.join();
  try {
    comm->finalize();
  } catch (const std::exception&) {
  }
  // Nothing is queued now (the dispatcher drained it); a Work queued all the same never ran.
  std::deque<c10::intrusive_ptr<ChorusWork>> left;
  {
    std::lock_guard lk(queue_mu);
    for (auto& w : queue) w->issued = true;
    left.swap(queue);
  }
  for (auto& w : left) w->fail_with(std::runtime_error("the process group was destroyed before it ran"));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::Impl::enqueue(c10::intrusive_ptr<ChorusWork> w) {
  {
    std::lock_guard lk(queue_mu);
    queue.push_back(w);
  }
  queue_cv.notify_one();
  return w;
}

void ProcessGroupChorus::Impl::issue(ChorusWork& w, bool blocking) {
  try {
    w.launch(w, blocking);
  } catch (const std::exception& e) {
    w.fail_with(e);
  }
  w.launch = nullptr;  // drop the tensors it captured
}

void ProcessGroupChorus::Impl::drain(ChorusWork* target) {
  std::lock_guard il(issue_mu);
  for (;;) {
    c10::intrusive_ptr<ChorusWork> w;
    {
      std::lock_guard lk(queue_mu);
      if (queue.empty() || (target && target->issued)) return;
      w = queue.front();
      queue.pop_front();
      w->issued = true;
    }
    const bool mine = w.get() == target;
    issue(*w, mine);
    if (mine) return;
  }
}

void ProcessGroupChorus::Impl::dispatch_loop() {
  for (;;) {
    bool stop = false;
    {
      std::unique_lock lk(queue_mu);
      queue_cv.wait(lk, [&] { return stopping || !queue.empty(); });
      stop = stopping;
    }
    drain(nullptr);  // on stopping too: what was queued before the group went still runs
    if (stop) return;
  }
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::Impl::post_p2p(
    c10::intrusive_ptr<ChorusWork> w, const std::function<chorus::Request()>& post) {
  {
    std::lock_guard lk(queue_mu);
    w->issued = true;
  }
  try {
    chorus::Request r;
    {
      std::lock_guard lk(p2p_mu);
      r = post();
    }
    w->attach({r});
  } catch (const std::exception& e) {
    w->fail_with(e);
  }
  return w;
}

ProcessGroupChorus::ProcessGroupChorus(const Ptr<c10d::Store>& store, int rank, int size,
                                       std::chrono::milliseconds timeout)
    : ProcessGroup(rank, size), impl_(std::make_unique<Impl>(store, rank, size, timeout)) {}

// Destruction waits for the group's threads (the dispatcher, the communicator's worker and
// progress threads), and those may need the GIL: a thread that drops the last reference to a
// tensor whose Python object the program has already dropped (torch then keeps the object alive
// from C++) takes the GIL to free it. torch.distributed destroys a group from Python
// (destroy_process_group, or the last reference going), holding the GIL: waiting with it held
// would deadlock, so it is released for the wait. Not while the interpreter finalizes: a thread
// that takes the GIL then is ended by Python mid-destructor (a program that never called
// destroy_process_group; its groups go with the module globals).
ProcessGroupChorus::~ProcessGroupChorus() {
  if (Py_IsInitialized() && !_Py_IsFinalizing() && PyGILState_Check()) {
    pybind11::gil_scoped_release nogil;
    impl_.reset();
  } else {
    impl_.reset();
  }
}

}  // namespace chorus_torch
