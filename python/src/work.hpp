// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// ChorusWork: the c10d::Work of one operation of a ProcessGroupChorus.
//
// A Work holds the `launch` closure that hands its operation to chorus, the tensors the operation
// uses (kept alive until it is done), and what runs on success (copies from staging buffers into
// the caller's tensors). It completes, and its future with it, either when a blocking launch
// (all_to_all with per-rank counts) returns (complete()) or when the chorus requests it was given
// (attach()) have all completed;
// the first failure is its error. Only chorus's public API is used (Request::on_complete,
// wait_for).
//
// Timeouts: the group's timeout bounds every chorus call (chorus's own). A shorter bound per
// call, Work.wait(timeout) or the `timeout` of the call's options (bound()), is kept here: when it
// passes first, the Work fails with a timeout naming the rank, the operation and which bound it
// was, and the group's communicator is aborted (as chorus does on its own timeout: no tensor is
// written after the error is raised; the group's later calls fail).
//
// Profiling: each Work is constructed with a profiling title, "chorus:<op>" (as gloo's
// "gloo:all_reduce"), so torch.profiler shows a range per operation from its call to its
// completion.

#include <atomic>
#include <chrono>
#include <exception>
#include <memory>
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

class Comm;         // comm.hpp
class Completions;  // completions.hpp

class ChorusWork final : public c10d::Work {
 public:
  /// launch(work): hands the operation to chorus: starts it and attach()es its requests, or runs
  /// it to the end and calls complete().
  using Launch = std::function<void(ChorusWork&)>;

  using Clock = std::chrono::steady_clock;

  /// `completions` marks the future completed (its callbacks run there, not on chorus's thread).
  ChorusWork(std::weak_ptr<Comm> comm, std::weak_ptr<Completions> completions, int rank, c10d::OpType type,
             std::string what, std::vector<at::Tensor> outputs, int source = -1);

  /// Drives the work's requests (a collective chorus has not started yet runs on this thread,
  /// unless a timeout bounds the wait) and waits for completion: at most `timeout` when it is not
  /// kNoTimeout (0), and no later than the call's own bound (bound()).
  bool wait(std::chrono::milliseconds timeout) override;
  /// The `timeout` of the call's options: when set (not kUnsetTimeout), the call fails if it has
  /// not completed within it, counted from now (checked by wait(); the group's timeout bounds it
  /// where nobody waits).
  void bound(std::chrono::milliseconds timeout);
  /// "chorus:all_reduce", ...: the profiling title of a Work of `type`.
  static const char* title_of(c10d::OpType type);
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

 private:
  /// wait() but for the future: the work itself complete (or its error thrown).
  bool wait_for_work(std::chrono::milliseconds timeout);
  void arrive(std::exception_ptr e);
  /// Completes the work with `e` (null: success) unless it is complete already; true if it was not.
  bool finish_once(std::exception_ptr e);
  /// The bound `why` passed before completion: fails the work and aborts the communicator (unless
  /// the work completed meanwhile).
  void time_out(std::chrono::milliseconds after, const char* why);

  std::weak_ptr<Comm> comm_;  ///< aborted when a per-call timeout passes
  std::weak_ptr<Completions> completions_;  ///< gone: the future completes on the finishing thread
  std::string what_;
  std::vector<at::Tensor> outputs_;
  Clock::time_point created_ = Clock::now();
  std::chrono::milliseconds bound_{0};  ///< the options' timeout; 0: none
  int source_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::vector<at::Tensor> keep_;
  std::vector<std::function<void()>> post_;
  std::mutex req_mu_;
  std::vector<chorus::Request> reqs_;
  std::atomic<int> pending_{0};
  std::exception_ptr first_error_;
  bool finished_ = false;
  std::exception_ptr timed_out_;  ///< set by time_out(): the work's error, whatever arrives meanwhile
};

/// A contiguous tensor with the data of `t`; when `t` is not contiguous, a copy that is written
/// back into `t` (if `write_back`) when the work succeeds.
at::Tensor staged(ChorusWork& w, const at::Tensor& t, bool write_back);

/// When `w` succeeds, copies `flat` into `outs`, one after another (each as many elements as it
/// holds, in its own shape and strides).
void unpack(ChorusWork& w, const at::Tensor& flat, std::vector<at::Tensor> outs);

}  // namespace chorus_torch
