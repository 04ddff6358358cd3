// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// ProcessGroupChorus: a c10d::ProcessGroup (torch 1.13) whose operations run on a chorus
/// communicator (Communicator<DefaultTransport>: shm between processes of one host, tcp across
/// hosts).
///
///   import chorus_torch                       # registers the backend "chorus"
///   dist.init_process_group("chorus", ...)    # any init_method; new_group works too
///
/// One communicator per process group, created by a rendezvous through the (prefixed) c10d store
/// that torch hands the backend. Collectives are queued in call order and run asynchronously on
/// the communicator's worker; their Work objects complete (and their futures) by themselves. A
/// Work that is waited for before anything started it runs on the waiting thread (no thread hop
/// on the latency path of a blocking call). send and recv are posted at once, as gloo does.
/// Errors (timeout, a dead peer, ranks calling different collectives) surface as exceptions
/// naming the rank and the operation; the timeout given to init_process_group bounds every wait,
/// and Work.wait(timeout) or an options object's `timeout` bounds one call (work.hpp).
///
/// The moving parts are c10d-version neutral except the base class and the Work type: for torch
/// 2.x the class would derive from c10d::Backend with the same overrides.
///
/// Where the parts are: group.hpp (the communicator, how calls reach it; the group's lifetime),
/// work.hpp (the Work objects), launch.hpp (how a collective is handed to chorus: chorus::Call),
/// collectives.cpp and all_to_all.cpp (the collectives), point_to_point.cpp (send, recv),
/// arguments.hpp (dtypes, reduce ops and argument checks), store_adapter.hpp (the c10d store as
/// chorus's Store), comm.hpp (the communicator type), module.cpp (the Python module).

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

namespace chorus_torch {

class ProcessGroupChorus final : public c10d::ProcessGroup {
 public:
  using Work = c10d::Work;
  template <class T>
  using Ptr = c10::intrusive_ptr<T>;

  ProcessGroupChorus(const Ptr<c10d::Store>& store, int rank, int size, std::chrono::milliseconds timeout);
  /// A group of `ranks` (ranks of `parent`, in this group's order) over the parent's links, and so
  /// with its timeout (chorus::Communicator::subset): new_group when the default group is chorus's.
  ProcessGroupChorus(ProcessGroupChorus& parent, const std::vector<int>& ranks, int rank, int size);
  /// The communicator's timeout (what a group sharing its links gets).
  std::chrono::milliseconds timeout() const;
  ~ProcessGroupChorus() override;

  const std::string getBackendName() const override { return "chorus"; }

  Ptr<Work> broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) override;
  Ptr<Work> allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) override;
  Ptr<Work> allreduce_coalesced(std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  Ptr<Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override;
  Ptr<Work> allgather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                      const c10d::AllgatherOptions& opts) override;
  Ptr<Work> _allgather_base(at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) override;
  Ptr<Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                const c10d::AllgatherOptions& opts) override;
  Ptr<Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                   const c10d::GatherOptions& opts) override;
  Ptr<Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                    const c10d::ScatterOptions& opts) override;
  Ptr<Work> reduce_scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                           const c10d::ReduceScatterOptions& opts) override;
  Ptr<Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                 const c10d::ReduceScatterOptions& opts) override;
  Ptr<Work> alltoall_base(at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_splits,
                          std::vector<int64_t>& input_splits, const c10d::AllToAllOptions& opts) override;
  Ptr<Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                     const c10d::AllToAllOptions& opts) override;
  Ptr<Work> barrier(const c10d::BarrierOptions& opts) override;
  Ptr<Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  Ptr<Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  Ptr<Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  /// torch's _coalescing_manager (batch_isend_irecv): the calls in between are one chorus group
  /// (chorus/group.hpp), run at its end: sends and receives posted together, small collectives fused.
  void startCoalescing() override;
  void endCoalescing(std::vector<Ptr<Work>>& reqs) override;

  struct Impl;

 private:
  /// reduce_scatter and _reduce_scatter_base: `input` holds size x `output`'s elements.
  Ptr<Work> reduce_scatter_flat(at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts,
                                c10d::OpType type, const std::string& op);

  std::unique_ptr<Impl> impl_;
};

}  // namespace chorus_torch
