// SPDX-License-Identifier: BSD-3-Clause
// The launches of the collectives: see launch.hpp.

#include "launch.hpp"

#include <span>
#include <utility>

#include "arguments.hpp"
#include "comm.hpp"

namespace chorus_torch {

namespace {

void* data_or_null(const at::Tensor& t) { return t.defined() ? data_of(t) : nullptr; }

/// Runs `k` on `c`: to the end when `blocking` (returning an empty request), else as the *_async
/// call, whose request it returns.
chorus::Request run(Comm& c, const Collective& k, bool blocking) {
  using K = Collective::Kind;
  const void* in = data_or_null(k.in);
  void* out = data_or_null(k.out);
  const std::size_t n = k.count;
  switch (k.kind) {
    case K::broadcast:
      if (!blocking) return c.broadcast_async(out, n, k.dt, k.root);
      c.broadcast(out, n, k.dt, k.root);
      break;
    case K::all_reduce:
      if (!blocking) return c.all_reduce_async(in, out, n, k.dt, k.op);
      c.all_reduce(in, out, n, k.dt, k.op);
      break;
    case K::reduce:
      if (!blocking) return c.reduce_async(in, out, n, k.dt, k.op, k.root);
      c.reduce(in, out, n, k.dt, k.op, k.root);
      break;
    case K::all_gather:
      if (!blocking) return c.all_gather_async(in, out, n, k.dt);
      c.all_gather(in, out, n, k.dt);
      break;
    case K::gather:
      if (!blocking) return c.gather_async(in, out, n, k.dt, k.root);
      c.gather(in, out, n, k.dt, k.root);
      break;
    case K::scatter:
      if (!blocking) return c.scatter_async(in, out, n, k.dt, k.root);
      c.scatter(in, out, n, k.dt, k.root);
      break;
    case K::reduce_scatter:
      if (!blocking) return c.reduce_scatter_async(in, out, n, k.dt, k.op);
      c.reduce_scatter(in, out, n, k.dt, k.op);
      break;
    case K::all_to_all:
      if (!blocking) return c.all_to_all_async(in, out, n, k.dt);
      c.all_to_all(in, out, n, k.dt);
      break;
    case K::barrier:
      if (!blocking) return c.barrier_async();
      c.barrier();
      break;
  }
  return {};
}

}  // namespace

ChorusWork::Launch launch(Comm& comm, Collective call) {
  return [c = &comm, call = std::move(call)](ChorusWork& self, bool blocking) {
    if (blocking) {
      run(*c, call, true);
      self.complete();
    } else {
      self.attach({run(*c, call, false)});
    }
  };
}

ChorusWork::Launch launch_all_to_all_v(Comm& comm, at::Tensor in, at::Tensor out,
                                       std::vector<int64_t> in_counts, std::vector<int64_t> out_counts,
                                       chorus::DataType dt) {
  return [c = &comm, in = std::move(in), out = std::move(out), in_counts = std::move(in_counts),
          out_counts = std::move(out_counts), dt](ChorusWork& self, bool) {
    const std::vector<std::size_t> send(in_counts.begin(), in_counts.end());
    const std::vector<std::size_t> recv(out_counts.begin(), out_counts.end());
    c->barrier();
    chorus::all_to_all_v(*c, data_of(in), std::span<const std::size_t>(send), data_of(out),
                         std::span<const std::size_t>(recv), dt);
    self.complete();
  };
}

}  // namespace chorus_torch
