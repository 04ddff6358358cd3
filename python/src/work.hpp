// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// ChorusWork: the c10d::Work of one operation of a ProcessGroupChorus.
//
// A Work holds the `launch` closure that hands its operation to chorus, the tensors the operation
// uses (kept alive until it is done), and what runs on success (copies from staging buffers into
// the caller's tensors). It completes, and its future with it, either when a blocking launch
// returns (complete()) or when the chorus requests it was given (attach()) have all completed;
// the first failure is its error.

#include <atomic>
#include <chrono>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "chorus/core/request.hpp"
#include "process_group.hpp"

namespace chorus_torch {

class ChorusWork final : public c10d::Work {
 public:
  /// launch(work, blocking): hands the operation to chorus. blocking: run it to the end on this
  /// thread and call complete(); else start it asynchronously and attach() its requests.
  using Launch = std::function<void(ChorusWork&, bool blocking)>;

  ChorusWork(ProcessGroupChorus::Impl* pg, int rank, c10d::OpType type, std::string what,
             std::vector<at::Tensor> outputs, int source = -1);

  /// Issues the work first if it is still queued (it then runs on this thread), drives its
  /// requests, and waits for completion.
  bool wait(std::chrono::milliseconds timeout) override;
  int sourceRank() const override { return source_; }
  /// The sender of a receive from any source, known once it has arrived: set by a then() step
  /// (before completion, so wait() sees it).
  void set_source(int source) { source_ = source; }
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

  /// Keeps tensors alive (and unchanged) until the operation is done.
  void keep(at::Tensor t) { keep_.push_back(std::move(t)); }
  /// Runs on success, before completion, in the reverse order of the calls: copies from staging
  /// buffers into the caller's tensors.
  void then(std::function<void()> f) { post_.push_back(std::move(f)); }

  /// Completes the work when every request has: the first failure is its error.
  void attach(std::vector<chorus::Request> reqs);
  /// The operation ran to the end (blocking launch).
  void complete() { finish_once(nullptr); }
  /// The operation failed.
  void fail_with(const std::exception& e) { finish_once(error(e.what())); }

  /// An error naming the rank and the operation.
  std::exception_ptr error(const std::string& what) const;

  Launch launch;
  /// Handed to chorus (or failed) already; set under the group's queue mutex, read without it by
  /// wait() (once true it stays true, and the group is not touched again).
  std::atomic<bool> issued{false};

 private:
  void arrive(std::exception_ptr e);
  void finish_once(std::exception_ptr e);

  ProcessGroupChorus::Impl*
      pg_;  ///< valid while issued is false (the group issues or fails all before it goes)
  std::string what_;
  std::vector<at::Tensor> outputs_;
  int source_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::vector<at::Tensor> keep_;
  std::vector<std::function<void()>> post_;
  std::mutex req_mu_;
  std::vector<chorus::Request> reqs_;
  std::atomic<int> pending_{0};
  std::exception_ptr first_error_;
  bool finished_ = false;
};

/// A contiguous tensor with the data of `t`; when `t` is not contiguous, a copy that is written
/// back into `t` (if `write_back`) when the work succeeds.
at::Tensor staged(ChorusWork& w, const at::Tensor& t, bool write_back);

}  // namespace chorus_torch
