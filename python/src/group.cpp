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
    comm = std::make_shared<Comm>(Comm::create(std::move(o)));
  } catch (const std::exception& e) {
    fail(r, "init (rendezvous through the c10d store)", e.what());
  }
}

ProcessGroupChorus::Impl::Impl(Impl& parent, const std::vector<int>& ranks, int r, int n)
    : rank(r), size(n) {
  try {
    comm = std::make_shared<Comm>(parent.comm->subset(ranks));
  } catch (const std::exception& e) {
    fail(r, "new_group (a subset of the default group's communicator)", e.what());
  }
}

ProcessGroupChorus::Impl::~Impl() {
  // finalize() lets what was issued finish (as gloo and NCCL finish queued work before they go),
  // each call bounded by the group's timeout, rather than aborting it under peers that are still
  // in it. Its errors belong to the Works (nobody waited for them); the communicator's destructor
  // then aborts what is left.
  try {
    comm->finalize();
  } catch (const std::exception&) {
  }
  // The futures of what finished go before the communicator (their callbacks may still call it).
  completions->stop();
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::Impl::enqueue(c10::intrusive_ptr<ChorusWork> w) {
  {
    std::lock_guard il(issue_mu);
    try {
      w->launch(*w);
    } catch (const std::exception& e) {
      w->fail_with(e);
    }
  }
  w->launch = nullptr;  // drop the tensors it captured (the Work keeps what the call uses)
  return w;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::Impl::post_p2p(
    c10::intrusive_ptr<ChorusWork> w, const std::function<chorus::Request()>& post) {
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

// The calls torch makes between the two come from the thread that called startCoalescing (the
// collectives are handed to chorus on the caller's thread: enqueue), so chorus records them in its
// group; a call that must wait for one of its own steps (PREMUL_SUM's barrier, the uneven lists)
// fails inside a group, its Work carrying the error. endCoalescing runs the group without the GIL
// (it waits for the group's calls, whose completions may need it) and raises its first error; the
// Works carry their own.
void ProcessGroupChorus::startCoalescing() {
  try {
    impl_->comm->group_start();
  } catch (const std::exception& e) {
    fail(impl_->rank, "start_coalescing", e.what());
  }
}

void ProcessGroupChorus::endCoalescing(std::vector<Ptr<Work>>&) {
  auto end = [&] {
    try {
      impl_->comm->group_end();
    } catch (const std::exception& e) {
      fail(impl_->rank, "end_coalescing", e.what());
    }
  };
  if (Py_IsInitialized() && PyGILState_Check()) {
    pybind11::gil_scoped_release nogil;
    end();
  } else {
    end();
  }
}

ProcessGroupChorus::ProcessGroupChorus(const Ptr<c10d::Store>& store, int rank, int size,
                                       std::chrono::milliseconds timeout)
    : ProcessGroup(rank, size), impl_(std::make_unique<Impl>(store, rank, size, timeout)) {}

ProcessGroupChorus::ProcessGroupChorus(ProcessGroupChorus& parent, const std::vector<int>& ranks, int rank, int size)
    : ProcessGroup(rank, size), impl_(std::make_unique<Impl>(*parent.impl_, ranks, rank, size)) {}

std::chrono::milliseconds ProcessGroupChorus::timeout() const { return impl_->comm->options().timeout; }

// Destruction waits for the group's threads (the communicator's worker and progress threads),
// and those may need the GIL: a thread that drops the last reference to a
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
