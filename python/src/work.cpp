// SPDX-License-Identifier: BSD-3-Clause
// ChorusWork: see work.hpp.

#include "work.hpp"

#include <algorithm>
#include <optional>
#include <stdexcept>
#include <utility>

#include "arguments.hpp"
#include "comm.hpp"
#include "completions.hpp"
#include "group.hpp"

namespace chorus_torch {

ChorusWork::ChorusWork(std::weak_ptr<Comm> comm, std::weak_ptr<Completions> completions, int rank,
                       c10d::OpType type, std::string what, std::vector<at::Tensor> outputs, int source)
    : Work(rank, type, title_of(type), outputs),
      comm_(std::move(comm)),
      completions_(std::move(completions)),
      what_(std::move(what)),
      outputs_(std::move(outputs)),
      source_(source),
      future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {}

const char* ChorusWork::title_of(c10d::OpType type) {
  // As gloo names its operations ("gloo:all_reduce", "gloo:send", ...); the ones gloo lacks as
  // torch names them (NCCL's "nccl:_all_gather_base", ...). String literals: the profiler keeps
  // the pointer.
  using T = c10d::OpType;
  switch (type) {
    case T::BROADCAST: return "chorus:broadcast";
    case T::ALLREDUCE: return "chorus:all_reduce";
    case T::ALLREDUCE_COALESCED: return "chorus:all_reduce_coalesced";
    case T::REDUCE: return "chorus:reduce";
    case T::ALLGATHER: return "chorus:all_gather";
    case T::_ALLGATHER_BASE: return "chorus:_all_gather_base";
    case T::ALLGATHER_COALESCED: return "chorus:all_gather_coalesced";
    case T::GATHER: return "chorus:gather";
    case T::SCATTER: return "chorus:scatter";
    case T::REDUCE_SCATTER: return "chorus:reduce_scatter";
    case T::_REDUCE_SCATTER_BASE: return "chorus:_reduce_scatter_base";
    case T::ALLTOALL_BASE:
    case T::ALLTOALL: return "chorus:all_to_all";
    case T::SEND: return "chorus:send";
    case T::RECV: return "chorus:recv";
    case T::RECVANYSOURCE: return "chorus:recvAnySource";
    case T::BARRIER: return "chorus:barrier";
    case T::UNKNOWN: break;
  }
  return "chorus:unknown";
}

void ChorusWork::bound(std::chrono::milliseconds timeout) {
  if (timeout > std::chrono::milliseconds(0)) bound_ = timeout;  // kUnsetTimeout (-1): the group's
}

void ChorusWork::attach(std::vector<chorus::Request> reqs) {
  {
    std::lock_guard lk(req_mu_);
    reqs_ = reqs;
  }
  pending_.store(static_cast<int>(reqs.size()) + 1);
  c10::intrusive_ptr<ChorusWork> self = c10::intrusive_ptr<ChorusWork>::reclaim_copy(this);
  for (auto& r : reqs) {
    r.on_complete([self](std::exception_ptr e) {
      if (!e) return self->arrive(nullptr);
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& ex) {
        self->arrive(self->error(ex.what()));
      }
    });
  }
  arrive(nullptr);
}

std::exception_ptr ChorusWork::error(const std::string& what) const {
  return std::make_exception_ptr(std::runtime_error(prefix(rank_, what_) + what));
}

namespace {
/// True on a thread inside ChorusWork::wait: a work it finishes completes its future there.
thread_local bool t_waiting = false;
}  // namespace

bool ChorusWork::wait(std::chrono::milliseconds timeout) {
  struct Waiting {
    bool was = t_waiting;
    Waiting() { t_waiting = true; }
    ~Waiting() { t_waiting = was; }
  } waiting;
  const bool done = wait_for_work(timeout);
  // As gloo: the future is complete when wait() returns (its completion may have been handed
  // to a completion thread).
  if (done && !future_->completed()) future_->wait();
  return done;
}

bool ChorusWork::wait_for_work(std::chrono::milliseconds timeout) {
  // The earlier of the wait's own timeout and the call's bound, where either is set.
  const auto now = Clock::now();
  const bool by_wait = timeout > kNoTimeout;
  const bool by_bound = bound_.count() > 0;
  const bool wait_first = by_wait && (!by_bound || now + timeout <= created_ + bound_);
  std::optional<Clock::time_point> deadline;
  if (by_wait || by_bound) deadline = wait_first ? now + timeout : created_ + bound_;
  const auto expire = [&] {
    if (wait_first)
      time_out(timeout, "the timeout given to Work.wait()");
    else
      time_out(bound_, "the timeout of the call's options");
    return Work::wait(kNoTimeout);  // throws the work's error, unless it completed first
  };

  std::vector<chorus::Request> reqs;
  {
    std::lock_guard lk(req_mu_);
    reqs = reqs_;
  }
  // Drive the requests on this thread (sends and receives make progress here; a collective runs
  // here when its turn comes and the worker has not started it, unless the wait is bounded:
  // Request::wait_for leaves it to the worker) and surface a chorus timeout at once; completion
  // itself arrives through attach()'s callbacks.
  for (auto& r : reqs) {
    bool done = true;
    try {
      if (!deadline)
        r.wait();
      else
        done = r.wait_for(std::max(std::chrono::ceil<std::chrono::milliseconds>(*deadline - Clock::now()),
                                   std::chrono::milliseconds(0)));
    } catch (const std::exception& e) {
      finish_once(error(e.what()));
    }
    if (!done) return expire();
  }
  // Every request is done (or none was given): completion follows from their callbacks at once,
  // or from a blocking launch that another thread runs, which the deadline bounds too.
  if (deadline) {
    std::unique_lock lk(mutex_);
    if (!cv_.wait_until(lk, *deadline, [&] { return completed_; })) {
      lk.unlock();
      return expire();
    }
  }
  return Work::wait(kNoTimeout);
}

void ChorusWork::time_out(std::chrono::milliseconds after, const char* why) {
  // As chorus on its own timeout: no tensor of this group is written after the error is raised,
  // and its later calls fail (with `aborted`). Only where this error is the work's (it did not
  // complete meanwhile).
  // The abort comes first (the work's tensors are let go only once nothing writes them), and
  // fails the work's requests: this error is the one the work keeps.
  std::exception_ptr e = error("did not complete within " + std::to_string(after.count()) + " ms (" + why +
                               "); the group's communicator is aborted");
  {
    std::lock_guard lk(req_mu_);
    if (finished_) return;
    timed_out_ = e;
  }
  if (auto c = comm_.lock()) c->abort();
  finish_once(e);
}

void ChorusWork::arrive(std::exception_ptr e) {
  if (e) {
    std::lock_guard lk(req_mu_);
    if (!first_error_) first_error_ = e;
  }
  if (pending_.fetch_sub(1) != 1) return;
  std::exception_ptr err;
  {
    std::lock_guard lk(req_mu_);
    err = first_error_;
  }
  finish_once(err);
}

bool ChorusWork::finish_once(std::exception_ptr e) {
  {
    std::lock_guard lk(req_mu_);
    if (finished_) return false;
    finished_ = true;
    if (timed_out_) e = timed_out_;
  }
  if (!e) {
    try {
      // Innermost first: what launch() added (unpacking from the wire buffers) runs before
      // what the call added (copies into the caller's tensors).
      for (auto it = post_.rbegin(); it != post_.rend(); ++it) (*it)();
    } catch (const std::exception& ex) {
      e = error(ex.what());
    }
  }
  post_.clear();
  keep_.clear();
  finish(e);
  // The future's callbacks may start a collective and wait for it (PowerSGD): not on chorus's
  // thread, which finishes the works nobody waits for (completions.hpp). A thread in wait()
  // marks it itself (no thread hop for a blocking call).
  auto complete_future = [f = future_, e, v = c10::IValue(outputs_)]() mutable {
    if (e)
      f->setError(e);
    else
      f->markCompleted(std::move(v));
  };
  std::shared_ptr<Completions> c = t_waiting ? nullptr : completions_.lock();
  if (c)
    c->post(std::move(complete_future));
  else
    complete_future();
  return true;
}

at::Tensor staged(ChorusWork& w, const at::Tensor& t, bool write_back) {
  if (t.is_contiguous()) return t;
  at::Tensor c = t.contiguous();
  if (write_back) w.then([t, c]() mutable { t.copy_(c); });
  return c;
}

void unpack(ChorusWork& w, const at::Tensor& flat, std::vector<at::Tensor> outs) {
  w.then([flat, outs = std::move(outs)]() mutable {
    int64_t off = 0;
    for (auto& o : outs) {
      o.copy_(flat.narrow(0, off, o.numel()).view(o.sizes()));
      off += o.numel();
    }
  });
}

}  // namespace chorus_torch
