// SPDX-License-Identifier: BSD-3-Clause
// The launches of the collectives: see launch.hpp.

#include "launch.hpp"

#include <span>
#include <stdexcept>
#include <string>
#include <utility>

#include "arguments.hpp"
#include "chorus/call.hpp"
#include "comm.hpp"

namespace chorus_torch {

namespace {

void* data_or_null(const at::Tensor& t) { return t.defined() ? data_of(t) : nullptr; }

chorus::Call call_of(const Collective& k) {
  return {.kind = k.kind, .in = data_or_null(k.in), .out = data_or_null(k.out), .count = k.count,
          .dtype = k.dt, .op = k.op, .root = k.root};
}

/// The launches below wait for steps of their own (a barrier, point-to-point): inside a chorus
/// group (torch's _coalescing_manager) those would only run at its end, so they refuse.
void outside_group(Comm& c, const char* what) {
  if (c.in_group())
    throw std::runtime_error(std::string(what) +
                             " cannot run inside torch's _coalescing_manager (a chorus group): it waits for steps of "
                             "its own; call it outside the manager");
}

}  // namespace

ChorusWork::Launch launch(Comm& comm, Collective call) {
  return [c = &comm, call = std::move(call)](ChorusWork& self) { self.attach({chorus::start(*c, call_of(call))}); };
}

ChorusWork::Launch launch_premul(Comm& comm, Collective call, at::Tensor src, at::Tensor factor) {
  return [c = &comm, call = std::move(call), src = std::move(src), factor = std::move(factor)](ChorusWork& self) {
    outside_group(*c, "PREMUL_SUM");
    c->barrier();
    at::Tensor scaled = call.in;
    at::mul_out(scaled, src, factor);
    self.attach({chorus::start(*c, call_of(call))});
  };
}

ChorusWork::Launch launch_all_to_all_v(Comm& comm, at::Tensor in, at::Tensor out,
                                       std::vector<int64_t> in_counts, std::vector<int64_t> out_counts,
                                       chorus::DataType dt) {
  return [c = &comm, in = std::move(in), out = std::move(out), in_counts = std::move(in_counts),
          out_counts = std::move(out_counts), dt](ChorusWork& self) {
    outside_group(*c, "all_to_all with uneven splits");
    const std::vector<std::size_t> send(in_counts.begin(), in_counts.end());
    const std::vector<std::size_t> recv(out_counts.begin(), out_counts.end());
    c->barrier();
    chorus::all_to_all_v(*c, data_of(in), std::span<const std::size_t>(send), data_of(out),
                         std::span<const std::size_t>(recv), dt);
    self.complete();
  };
}

ChorusWork::Launch launch_all_gather_v(Comm& comm, at::Tensor in, at::Tensor out, std::vector<int64_t> counts,
                                       chorus::DataType dt) {
  return [c = &comm, in = std::move(in), out = std::move(out), counts = std::move(counts), dt](ChorusWork& self) {
    outside_group(*c, "all_gather of tensors of different sizes");
    const std::vector<std::size_t> n(counts.begin(), counts.end());
    c->barrier();
    chorus::all_gather_v(*c, data_of(in), n[static_cast<std::size_t>(c->rank())], data_of(out),
                         std::span<const std::size_t>(n), {}, dt);
    self.complete();
  };
}

ChorusWork::Launch launch_reduce_scatter_v(Comm& comm, at::Tensor in, at::Tensor out, std::vector<int64_t> counts,
                                           chorus::DataType dt, chorus::ReduceOp op, at::Tensor factor) {
  return [c = &comm, in = std::move(in), out = std::move(out), counts = std::move(counts), dt, op,
          factor = std::move(factor)](ChorusWork& self) mutable {
    outside_group(*c, "reduce_scatter of tensors of different sizes");
    const std::vector<std::size_t> n(counts.begin(), counts.end());
    c->barrier();
    if (factor.defined()) in.mul_(factor);
    chorus::reduce_scatter_v(*c, data_of(in), data_of(out), std::span<const std::size_t>(n), dt, op);
    self.complete();
  };
}

}  // namespace chorus_torch
