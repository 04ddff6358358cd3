// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// chorus::Call: one collective as plain data (its kind, buffers, count, dtype, op and root), and
/// run() / start() to issue it on any communicator. For code that decides the collective at run
/// time (a framework's backend, a replay of recorded calls, a queue of calls) and would otherwise
/// write the same switch over the typed methods itself.
///
///   chorus::Call c{.kind = chorus::CallKind::all_reduce, .in = x, .out = x, .count = n,
///                  .dtype = chorus::DataType::float32, .op = chorus::ReduceOp::sum};
///   chorus::run(comm, c);                          // blocking, as comm.all_reduce(x, x, n, ...)
///   chorus::Request r = chorus::start(comm, c);    // as comm.all_reduce_async(...)
///   r.wait();
///
/// Each is exactly the pointer-form method of its kind (same checks, same order with the other
/// calls, same errors). What a kind reads: broadcast uses `out` only (in place); barrier uses
/// nothing; `op` applies to all_reduce, reduce and reduce_scatter; `root` to broadcast, reduce,
/// gather and scatter (elsewhere both are ignored). `count` is in elements per rank as the
/// pointer-form method counts it. A kind that is not a collective (split, or a value outside the
/// enumeration) is invalid_argument naming the rank and the operation, as is a bad root.

#include <cstddef>
#include <string>

#include "chorus/algo/descriptor.hpp"
#include "chorus/communicator.hpp"
#include "chorus/core/error.hpp"
#include "chorus/core/request.hpp"
#include "chorus/core/types.hpp"

namespace chorus {

/// The collectives a Call can name (algo::CollectiveKind; `split` is not one).
using CallKind = algo::CollectiveKind;

struct Call {
  CallKind kind = CallKind::barrier;
  const void* in = nullptr;
  void* out = nullptr;
  std::size_t count = 0;
  DataType dtype = DataType::uint8;
  ReduceOp op = ReduceOp::sum;
  int root = -1;
};

namespace detail {

/// The one switch from a Call to the communicator's methods: the blocking method (returning an
/// empty request) or the *_async one.
template <class T>
Request issue_call(Communicator<T>& c, const Call& k, bool async) {
  const void* in = k.in;
  void* out = k.out;
  const std::size_t n = k.count;
  switch (k.kind) {
    case CallKind::broadcast:
      if (async) return c.broadcast_async(out, n, k.dtype, k.root);
      c.broadcast(out, n, k.dtype, k.root);
      return {};
    case CallKind::all_reduce:
      if (async) return c.all_reduce_async(in, out, n, k.dtype, k.op);
      c.all_reduce(in, out, n, k.dtype, k.op);
      return {};
    case CallKind::reduce:
      if (async) return c.reduce_async(in, out, n, k.dtype, k.op, k.root);
      c.reduce(in, out, n, k.dtype, k.op, k.root);
      return {};
    case CallKind::all_gather:
      if (async) return c.all_gather_async(in, out, n, k.dtype);
      c.all_gather(in, out, n, k.dtype);
      return {};
    case CallKind::gather:
      if (async) return c.gather_async(in, out, n, k.dtype, k.root);
      c.gather(in, out, n, k.dtype, k.root);
      return {};
    case CallKind::scatter:
      if (async) return c.scatter_async(in, out, n, k.dtype, k.root);
      c.scatter(in, out, n, k.dtype, k.root);
      return {};
    case CallKind::reduce_scatter:
      if (async) return c.reduce_scatter_async(in, out, n, k.dtype, k.op);
      c.reduce_scatter(in, out, n, k.dtype, k.op);
      return {};
    case CallKind::all_to_all:
      if (async) return c.all_to_all_async(in, out, n, k.dtype);
      c.all_to_all(in, out, n, k.dtype);
      return {};
    case CallKind::barrier:
      if (async) return c.barrier_async();
      c.barrier();
      return {};
    case CallKind::split:
      break;
  }
  throw Error(ErrorCode::invalid_argument, ErrorContext{c.rank(), -1, async ? "start(Call)" : "run(Call)"},
              "kind " + std::to_string(static_cast<unsigned>(k.kind)) +
                  " is not a collective a Call can name (broadcast ... barrier; not split)");
}

}  // namespace detail

/// Runs `call` on `comm` and returns when this rank's part is done (the blocking method of its
/// kind: on this thread when nothing else is queued).
template <class T>
void run(Communicator<T>& comm, const Call& call) {
  (void)detail::issue_call(comm, call, false);
}

/// Starts `call` on `comm` (the *_async method of its kind): it runs after every call issued
/// before it; the buffers must stay valid until the request completes.
template <class T>
Request start(Communicator<T>& comm, const Call& call) {
  return detail::issue_call(comm, call, true);
}

}  // namespace chorus
