// SPDX-License-Identifier: BSD-3-Clause
// ChorusWork: see work.hpp.

#include "work.hpp"

#include <stdexcept>
#include <utility>

#include "arguments.hpp"
#include "group.hpp"

namespace chorus_torch {

ChorusWork::ChorusWork(ProcessGroupChorus::Impl* pg, int rank, c10d::OpType type, std::string what,
                       std::vector<at::Tensor> outputs, int source)
    : Work(rank, type),
      pg_(pg),
      what_(std::move(what)),
      outputs_(std::move(outputs)),
      source_(source),
      future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {}

void ChorusWork::attach(std::vector<chorus::Request> reqs) {
  {
    std::lock_guard lk(req_mu_);
    reqs_ = reqs;
  }
  pending_.store(static_cast<int>(reqs.size()) + 1);
  c10::intrusive_ptr<ChorusWork> self = c10::intrusive_ptr<ChorusWork>::reclaim_copy(this);
  for (auto& r : reqs) {
    if (!r.state()) {
      arrive(nullptr);
      continue;
    }
    chorus::detail::RequestState* st = r.state().get();
    st->then([self, st] {
      std::string what;
      chorus::ErrorCode code{};
      self->arrive(st->failed(&code, &what) ? self->error(what) : nullptr);
    });
  }
  arrive(nullptr);
}

std::exception_ptr ChorusWork::error(const std::string& what) const {
  return std::make_exception_ptr(std::runtime_error(prefix(rank_, what_) + what));
}

bool ChorusWork::wait(std::chrono::milliseconds timeout) {
  if (!issued.load()) pg_->drain(this);
  std::vector<chorus::Request> reqs;
  {
    std::lock_guard lk(req_mu_);
    reqs = reqs_;
  }
  // Drive the requests on this thread (sends and receives make progress here) and surface a
  // timeout at once; completion itself arrives through attach()'s callbacks.
  for (auto& r : reqs) {
    if (!r.state()) continue;
    try {
      r.wait();
    } catch (const std::exception& e) {
      finish_once(error(e.what()));
    }
  }
  return Work::wait(timeout);
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

void ChorusWork::finish_once(std::exception_ptr e) {
  {
    std::lock_guard lk(req_mu_);
    if (finished_) return;
    finished_ = true;
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
  if (e)
    future_->setError(e);
  else
    future_->markCompleted(c10::IValue(outputs_));
}

at::Tensor staged(ChorusWork& w, const at::Tensor& t, bool write_back) {
  if (t.is_contiguous()) return t;
  at::Tensor c = t.contiguous();
  if (write_back) w.then([t, c]() mutable { t.copy_(c); });
  return c;
}

}  // namespace chorus_torch
