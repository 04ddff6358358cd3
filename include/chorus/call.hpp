// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// chorus::Call: one collective as plain data (its kind, buffers, count, dtype, op and root;
/// declared in communicator.hpp), and run() / start() to issue it on any communicator through its
/// one entry, Communicator::start(call, mode). For code that decides the collective at run
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

#include "chorus/communicator.hpp"
#include "chorus/core/request.hpp"

namespace chorus {

/// Runs `call` on `comm` and returns when this rank's part is done (the blocking method of its
/// kind: on this thread when nothing else is queued).
template <class T>
void run(Communicator<T>& comm, const Call& call) {
  (void)comm.start(call, CallMode::blocking);
}

/// Starts `call` on `comm` (the *_async method of its kind): it runs after every call issued
/// before it; the buffers must stay valid until the request completes.
template <class T>
Request start(Communicator<T>& comm, const Call& call) {
  return comm.start(call, CallMode::async);
}

}  // namespace chorus
