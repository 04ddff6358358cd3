// SPDX-License-Identifier: BSD-3-Clause
// ProcessGroupChorus's all_to_all (torch's all_to_all_single and list all_to_all): equal splits
// run as chorus's all_to_all; uneven ones, and the list form, as an all_to_all_v (launch.hpp).

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

/// The elements `t` sends to (or receives from) each rank, from torch's split sizes, which count
/// rows (the first dimension); an empty list means equal rows.
std::vector<int64_t> counts_of(int rank, int size, const std::string& op, const std::vector<int64_t>& splits,
                               const at::Tensor& t, const char* which) {
  const int64_t rows = t.dim() == 0 ? 1 : t.size(0);
  const int64_t row = rows == 0 ? 0 : t.numel() / rows;
  std::vector<int64_t> out(static_cast<std::size_t>(size));
  if (splits.empty()) {
    if (rows % size != 0)
      fail(rank, op,
           std::string(which) + " has " + std::to_string(rows) + " rows, not a multiple of the group size");
    for (auto& x : out) x = rows / size * row;
    return out;
  }
  if (static_cast<int>(splits.size()) != size)
    fail(rank, op,
         std::string(which) + " split sizes: " + std::to_string(splits.size()) + " entries for a group of " +
             std::to_string(size));
  int64_t sum = 0;
  for (int p = 0; p < size; ++p) {
    if (splits[p] < 0) fail(rank, op, std::string(which) + " split sizes must not be negative");
    sum += splits[p];
    out[p] = splits[p] * row;
  }
  if (sum != rows)
    fail(rank, op,
         std::string(which) + " split sizes add up to " + std::to_string(sum) + ", but the tensor has " +
             std::to_string(rows) + " rows");
  return out;
}

}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                                 std::vector<int64_t>& output_splits,
                                                                 std::vector<int64_t>& input_splits,
                                                                 const c10d::AllToAllOptions& opts) {
  const std::string op = "alltoall_base";
  check_tensor(rank_, op, input);
  check_same(rank_, op, input, output, false);
  const Wire wire = wire_of(rank_, op, input.scalar_type());
  auto w = impl_->make(c10d::OpType::ALLTOALL_BASE, describe(op, input), {output});
  const at::Tensor in = input.contiguous();
  const at::Tensor out = staged(*w, output, true);
  w->keep(in);
  w->keep(out);
  if (output_splits.empty() && input_splits.empty()) {
    if (in.numel() % size_ != 0 || out.numel() != in.numel())
      fail(rank_, op, "equal splits need input and output of the same size, a multiple of the group size (" +
                          std::to_string(in.numel()) + " and " + std::to_string(out.numel()) + " elements)");
    w->launch = launch(*impl_->comm, {.kind = Collective::Kind::all_to_all, .in = in, .out = out,
                                      .count = static_cast<std::size_t>(in.numel() / size_), .dt = wire.dt});
    w->bound(opts.timeout);
    return impl_->enqueue(w);
  }
  std::vector<int64_t> in_counts = counts_of(rank_, size_, op, input_splits, in, "input");
  std::vector<int64_t> out_counts = counts_of(rank_, size_, op, output_splits, out, "output");
  w->launch =
      launch_all_to_all_v(*impl_->comm, in, out, std::move(in_counts), std::move(out_counts), wire.dt);
  w->bound(opts.timeout);
  return impl_->enqueue(w);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::alltoall(std::vector<at::Tensor>& outputs,
                                                            std::vector<at::Tensor>& inputs,
                                                            const c10d::AllToAllOptions& opts) {
  const std::string op = "alltoall";
  if (static_cast<int>(inputs.size()) != size_ || static_cast<int>(outputs.size()) != size_)
    fail(rank_, op, "expects " + std::to_string(size_) + " input and output tensors");
  for (const auto& t : inputs) check_same(rank_, op, inputs[0], t, false);
  for (const auto& t : outputs) check_same(rank_, op, inputs[0], t, false);
  const Wire wire = wire_of(rank_, op, inputs[0].scalar_type());
  std::vector<int64_t> in_counts, out_counts;
  std::vector<at::Tensor> parts;
  int64_t out_total = 0;
  for (int p = 0; p < size_; ++p) {
    in_counts.push_back(inputs[p].numel());
    out_counts.push_back(outputs[p].numel());
    out_total += outputs[p].numel();
    parts.push_back(inputs[p].reshape({-1}));
  }
  auto w = impl_->make(c10d::OpType::ALLTOALL, describe(op, inputs[0]), outputs);
  const at::Tensor in = at::cat(parts);
  const at::Tensor out = at::empty({out_total}, inputs[0].options());
  w->keep(in);
  w->keep(out);
  unpack(*w, out, outputs);
  w->launch =
      launch_all_to_all_v(*impl_->comm, in, out, std::move(in_counts), std::move(out_counts), wire.dt);
  w->bound(opts.timeout);
  return impl_->enqueue(w);
}

}  // namespace chorus_torch
