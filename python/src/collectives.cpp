// SPDX-License-Identifier: BSD-3-Clause
// ProcessGroupChorus's collectives (all_to_all apart, in all_to_all.cpp): each checks its
// arguments, makes its Work with the buffers chorus reads and writes (staging copies where the
// caller's tensors are not contiguous or not one flat buffer), and queues it (group.hpp).

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "arguments.hpp"
#include "group.hpp"
#include "launch.hpp"
#include "process_group.hpp"
#include "work.hpp"

namespace chorus_torch {

namespace {

using Kind = Collective::Kind;

std::size_t count_of(const at::Tensor& t) { return static_cast<std::size_t>(t.numel()); }

/// One flat buffer holding `ts` one after another (a copy; empty when `ts` is).
at::Tensor flatten(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> parts;
  for (const auto& t : ts) parts.push_back(t.reshape({-1}));
  return at::cat(parts);
}

/// `call`'s launch; with a PREMUL_SUM `factor` (premul_factor), its input is first scaled into a
/// tensor of its own, which the Work keeps: the caller's tensors are read, never scaled in place
/// (a reduce's non-root tensors stay as they are).
ChorusWork::Launch launch_or_premul(Comm& comm, ChorusWork& w, Collective call, const at::Tensor& factor) {
  if (!factor.defined()) return launch(comm, std::move(call));
  const at::Tensor src = call.in;
  call.in = at::empty_like(src);
  w.keep(call.in);
  return launch_premul(comm, std::move(call), src, factor);
}

/// The tensors of a coalesced call: at least one, each as check_tensor accepts, all of the dtype
/// of the first (as gloo requires).
void check_list(int rank, const std::string& op, const std::vector<at::Tensor>& ts) {
  if (ts.empty()) fail(rank, op, "expects at least one tensor");
  for (const auto& t : ts) check_same(rank, op, ts[0], t, false);
}

/// "OP (DTYPE, K tensors, N elements)".
std::string describe_list(const std::string& op, const std::vector<at::Tensor>& ts, int64_t n) {
  return op + " (" + dtype_name(ts[0].scalar_type()) + ", " + std::to_string(ts.size()) + " tensors, " +
         std::to_string(n) + " elements)";
}

}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::broadcast(std::vector<at::Tensor>& tensors,
                                                             const c10d::BroadcastOptions& opts) {
  const std::string op = "broadcast";
  check_single(rank_, op, tensors);
  check_root(rank_, size_, op, opts.rootRank, opts.rootTensor);
  const at::Tensor t = tensors[0];
  const Wire wire = wire_of(rank_, op, t.scalar_type());
  auto w = impl_->make(c10d::OpType::BROADCAST, describe(op, t), tensors);
  const at::Tensor buf = staged(*w, t, true);
  w->keep(buf);
  const int root = static_cast<int>(opts.rootRank);
  w->launch = launch(*impl_->comm, {.kind = Kind::broadcast, .out = buf, .count = count_of(buf),
                                    .dt = wire.dt, .root = root});
  w->bound(opts.timeout);
  return impl_->enqueue(w);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::allreduce(std::vector<at::Tensor>& tensors,
                                                             const c10d::AllreduceOptions& opts) {
  const std::string op = "allreduce";
  check_single(rank_, op, tensors);
  const at::Tensor t = tensors[0];
  const Wire wire = wire_of(rank_, op, t.scalar_type());
  const chorus::ReduceOp rop = op_of(rank_, op, opts.reduceOp, wire);
  auto w = impl_->make(c10d::OpType::ALLREDUCE, describe(op, t) + " " + name_of(opts.reduceOp.op_), tensors);
  const at::Tensor buf = staged(*w, t, true);
  w->keep(buf);
  const Collective call{.kind = Kind::all_reduce, .in = buf, .out = buf, .count = count_of(buf), .dt = wire.dt, .op = rop};
  w->launch = launch_or_premul(*impl_->comm, *w, call, premul_factor(rank_, op, opts.reduceOp, t));
  w->bound(opts.timeout);
  return impl_->enqueue(w);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::reduce(std::vector<at::Tensor>& tensors,
                                                          const c10d::ReduceOptions& opts) {
  const std::string op = "reduce";
  check_single(rank_, op, tensors);
  check_root(rank_, size_, op, opts.rootRank, opts.rootTensor);
  const at::Tensor t = tensors[0];
  const Wire wire = wire_of(rank_, op, t.scalar_type());
  const chorus::ReduceOp rop = op_of(rank_, op, opts.reduceOp, wire);
  const int root = static_cast<int>(opts.rootRank);
  auto w = impl_->make(c10d::OpType::REDUCE, describe(op, t) + " " + name_of(opts.reduceOp.op_), tensors);
  const at::Tensor in = staged(*w, t, rank_ == root);
  // The result lands on the root, in place; the other ranks' tensors stay as they are.
  const at::Tensor out = rank_ == root ? in : at::empty_like(in);
  w->keep(in);
  w->keep(out);
  const Collective call{.kind = Kind::reduce, .in = in, .out = out, .count = count_of(in), .dt = wire.dt, .op = rop,
                        .root = root};
  w->launch = launch_or_premul(*impl_->comm, *w, call, premul_factor(rank_, op, opts.reduceOp, t));
  w->bound(opts.timeout);
  return impl_->enqueue(w);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                   const c10d::AllgatherOptions& opts) {
  const std::string op = "_allgather_base";
  check_tensor(rank_, op, input);
  check_same(rank_, op, input, output, false);
  if (output.numel() != input.numel() * size_)
    fail(rank_, op, "output has " + std::to_string(output.numel()) + " elements, not size x input = " +
                        std::to_string(input.numel() * size_));
  const Wire wire = wire_of(rank_, op, input.scalar_type());
  auto w = impl_->make(c10d::OpType::_ALLGATHER_BASE, describe(op, input), {output});
  const at::Tensor in = staged(*w, input, false);
  const at::Tensor out = staged(*w, output, true);
  w->keep(in);
  w->keep(out);
  w->launch = launch(*impl_->comm,
                     {.kind = Kind::all_gather, .in = in, .out = out, .count = count_of(in), .dt = wire.dt});
  w->bound(opts.timeout);
  return impl_->enqueue(w);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                             std::vector<at::Tensor>& inputs,
                                                             const c10d::AllgatherOptions& opts) {
  const std::string op = "allgather";
  check_single(rank_, op, inputs);
  if (outputs.size() != 1 || static_cast<int>(outputs[0].size()) != size_)
    fail(rank_, op, "expects one list of " + std::to_string(size_) + " output tensors");
  const at::Tensor input = inputs[0];
  // Outputs of different sizes (rank p's output tensor holds what rank p contributes, this rank's
  // as many elements as its input): an all_gather_v.
  bool uneven = false;
  int64_t total = 0;
  for (const auto& o : outputs[0]) {
    check_same(rank_, op, input, o, false);
    uneven = uneven || o.numel() != input.numel();
    total += o.numel();
  }
  if (outputs[0][static_cast<std::size_t>(rank_)].numel() != input.numel())
    fail(rank_, op, "the output tensor of this rank has " + std::to_string(outputs[0][static_cast<std::size_t>(rank_)].numel()) +
                        " elements, the input " + std::to_string(input.numel()));
  const Wire wire = wire_of(rank_, op, input.scalar_type());
  auto w = impl_->make(c10d::OpType::ALLGATHER, describe(op, input), outputs[0]);
  const at::Tensor in = input.contiguous();
  const at::Tensor flat = at::empty({total}, input.options());
  w->keep(in);
  w->keep(flat);
  unpack(*w, flat, outputs[0]);
  if (uneven) {
    std::vector<int64_t> counts;
    for (const auto& o : outputs[0]) counts.push_back(o.numel());
    w->launch = launch_all_gather_v(*impl_->comm, in, flat, std::move(counts), wire.dt);
  } else {
    w->launch = launch(*impl_->comm,
                       {.kind = Kind::all_gather, .in = in, .out = flat, .count = count_of(in), .dt = wire.dt});
  }
  w->bound(opts.timeout);
  return impl_->enqueue(w);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                          std::vector<at::Tensor>& inputs,
                                                          const c10d::GatherOptions& opts) {
  const std::string op = "gather";
  check_single(rank_, op, inputs);
  check_root(rank_, size_, op, opts.rootRank);
  const int root = static_cast<int>(opts.rootRank);
  const at::Tensor input = inputs[0];
  std::vector<at::Tensor> outs;
  if (rank_ == root) {
    if (outputs.size() != 1 || static_cast<int>(outputs[0].size()) != size_)
      fail(rank_, op, "the root expects one list of " + std::to_string(size_) + " output tensors");
    outs = outputs[0];
    for (const auto& o : outs) check_same(rank_, op, input, o, true);
  } else if (!outputs.empty() && !outputs[0].empty()) {
    fail(rank_, op, "only the root takes output tensors");
  }
  const Wire wire = wire_of(rank_, op, input.scalar_type());
  auto w = impl_->make(c10d::OpType::GATHER, describe(op, input), outs);
  const at::Tensor in = input.contiguous();
  const at::Tensor flat = rank_ == root ? at::empty({input.numel() * size_}, input.options()) : at::Tensor();
  w->keep(in);
  if (rank_ == root) {
    w->keep(flat);
    unpack(*w, flat, outs);
  }
  w->launch = launch(*impl_->comm, {.kind = Kind::gather, .in = in, .out = flat, .count = count_of(in),
                                    .dt = wire.dt, .root = root});
  w->bound(opts.timeout);
  return impl_->enqueue(w);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::scatter(std::vector<at::Tensor>& outputs,
                                                           std::vector<std::vector<at::Tensor>>& inputs,
                                                           const c10d::ScatterOptions& opts) {
  const std::string op = "scatter";
  check_single(rank_, op, outputs);
  check_root(rank_, size_, op, opts.rootRank);
  const int root = static_cast<int>(opts.rootRank);
  const at::Tensor output = outputs[0];
  at::Tensor flat;
  if (rank_ == root) {
    if (inputs.size() != 1 || static_cast<int>(inputs[0].size()) != size_)
      fail(rank_, op, "the root expects one list of " + std::to_string(size_) + " input tensors");
    for (const auto& i : inputs[0]) check_same(rank_, op, output, i, true);
      flat = flatten(inputs[0]);
  } else if (!inputs.empty() && !inputs[0].empty()) {
    fail(rank_, op, "only the root takes input tensors");
  }
  const Wire wire = wire_of(rank_, op, output.scalar_type());
  auto w = impl_->make(c10d::OpType::SCATTER, describe(op, output), outputs);
  const at::Tensor out = staged(*w, output, true);
  w->keep(out);
  if (flat.defined()) w->keep(flat);
  w->launch = launch(*impl_->comm, {.kind = Kind::scatter, .in = flat, .out = out, .count = count_of(out),
                                    .dt = wire.dt, .root = root});
  w->bound(opts.timeout);
  return impl_->enqueue(w);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  return reduce_scatter_flat(output, input, opts, c10d::OpType::_REDUCE_SCATTER_BASE, "_reduce_scatter_base");
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::reduce_scatter_flat(at::Tensor& output, at::Tensor& input,
                                                                       const c10d::ReduceScatterOptions& opts,
                                                                       c10d::OpType type, const std::string& op) {
  check_tensor(rank_, op, output);
  check_same(rank_, op, output, input, false);
  if (input.numel() != output.numel() * size_)
    fail(rank_, op, "input has " + std::to_string(input.numel()) + " elements, not size x output = " +
                        std::to_string(output.numel() * size_));
  const Wire wire = wire_of(rank_, op, output.scalar_type());
  const chorus::ReduceOp rop = op_of(rank_, op, opts.reduceOp, wire);
  auto w = impl_->make(type, describe(op, output) + " " + name_of(opts.reduceOp.op_), {output});
  const at::Tensor in = input.contiguous();
  const at::Tensor out = staged(*w, output, true);
  w->keep(in);
  w->keep(out);
  const Collective call{.kind = Kind::reduce_scatter, .in = in, .out = out, .count = count_of(out), .dt = wire.dt,
                        .op = rop};
  w->launch = launch_or_premul(*impl_->comm, *w, call, premul_factor(rank_, op, opts.reduceOp, output));
  w->bound(opts.timeout);
  return impl_->enqueue(w);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  const std::string op = "reduce_scatter";
  check_single(rank_, op, outputs);
  if (inputs.size() != 1 || static_cast<int>(inputs[0].size()) != size_)
    fail(rank_, op, "expects one list of " + std::to_string(size_) + " input tensors");
  const at::Tensor output = outputs[0];
  // Inputs of different sizes (the one for rank p holds rank p's block, this rank's as many
  // elements as its output): a reduce_scatter_v.
  bool uneven = false;
  for (const auto& i : inputs[0]) {
    check_same(rank_, op, output, i, false);
    uneven = uneven || i.numel() != output.numel();
  }
  at::Tensor flat = flatten(inputs[0]);
  at::Tensor out = output;
  if (!uneven) return reduce_scatter_flat(out, flat, opts, c10d::OpType::REDUCE_SCATTER, op);
  if (inputs[0][static_cast<std::size_t>(rank_)].numel() != output.numel())
    fail(rank_, op, "the input tensor for this rank has " + std::to_string(inputs[0][static_cast<std::size_t>(rank_)].numel()) +
                        " elements, the output " + std::to_string(output.numel()));
  const Wire wire = wire_of(rank_, op, output.scalar_type());
  const chorus::ReduceOp rop = op_of(rank_, op, opts.reduceOp, wire);
  auto w = impl_->make(c10d::OpType::REDUCE_SCATTER, describe(op, output) + " " + name_of(opts.reduceOp.op_), {output});
  const at::Tensor o = staged(*w, output, true);
  w->keep(flat);
  w->keep(o);
  std::vector<int64_t> counts;
  for (const auto& i : inputs[0]) counts.push_back(i.numel());
  w->launch = launch_reduce_scatter_v(*impl_->comm, flat, o, std::move(counts), wire.dt, rop,
                                      premul_factor(rank_, op, opts.reduceOp, output));
  w->bound(opts.timeout);
  return impl_->enqueue(w);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::barrier(const c10d::BarrierOptions& opts) {
  auto w = impl_->make(c10d::OpType::BARRIER, "barrier", {});
  w->launch = launch(*impl_->comm, {.kind = Kind::barrier});
  w->bound(opts.timeout);
  return impl_->enqueue(w);
}

// The coalesced calls, as gloo does them: the tensors are packed into one flat buffer, which one
// chorus call carries, and unpacked when it succeeds. The results are those of one call per
// tensor: each element is reduced or gathered alone, whatever its neighbours.

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                       const c10d::AllreduceCoalescedOptions& opts) {
  const std::string op = "allreduce_coalesced";
  check_list(rank_, op, tensors);
  const Wire wire = wire_of(rank_, op, tensors[0].scalar_type());
  const chorus::ReduceOp rop = op_of(rank_, op, opts.reduceOp, wire);
  const at::Tensor flat = flatten(tensors);
  auto w = impl_->make(c10d::OpType::ALLREDUCE_COALESCED,
                       describe_list(op, tensors, flat.numel()) + " " + name_of(opts.reduceOp.op_), tensors);
  w->keep(flat);
  unpack(*w, flat, tensors);
  const Collective call{.kind = Kind::all_reduce, .in = flat, .out = flat, .count = count_of(flat), .dt = wire.dt,
                        .op = rop};
  w->launch = launch_or_premul(*impl_->comm, *w, call, premul_factor(rank_, op, opts.reduceOp, tensors[0]));
  w->bound(opts.timeout);
  return impl_->enqueue(w);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  const std::string op = "allgather_coalesced";
  check_list(rank_, op, inputs);
  // outputs[r][i] receives rank r's inputs[i].
  if (static_cast<int>(outputs.size()) != size_)
    fail(rank_, op, "expects " + std::to_string(size_) + " output lists (one per rank), not " +
                        std::to_string(outputs.size()));
  std::vector<at::Tensor> outs;
  for (const auto& list : outputs) {
    if (list.size() != inputs.size())
      fail(rank_, op, "each output list must hold " + std::to_string(inputs.size()) +
                          " tensors (one per input), not " + std::to_string(list.size()));
    for (std::size_t i = 0; i < list.size(); ++i) check_same(rank_, op, inputs[i], list[i], true);
    outs.insert(outs.end(), list.begin(), list.end());
  }
  const Wire wire = wire_of(rank_, op, inputs[0].scalar_type());
  const at::Tensor in = flatten(inputs);
  const at::Tensor flat = at::empty({in.numel() * size_}, in.options());
  auto w = impl_->make(c10d::OpType::ALLGATHER_COALESCED, describe_list(op, inputs, in.numel()), outs);
  w->keep(in);
  w->keep(flat);
  unpack(*w, flat, outs);
  w->launch = launch(*impl_->comm,
                     {.kind = Kind::all_gather, .in = in, .out = flat, .count = count_of(in), .dt = wire.dt});
  w->bound(opts.timeout);
  return impl_->enqueue(w);
}

}  // namespace chorus_torch
