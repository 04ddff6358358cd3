// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// Group calls, as NCCL's ncclGroupStart / ncclGroupEnd: the collectives and sends/receives a
/// thread issues on one communicator inside a group return at once and run together at the
/// group's end, which returns when they are done.
///
///   {
///     chorus::Group g(comm);                       // comm.group_start()
///     for (auto& b : buckets) comm.all_reduce_async(b, chorus::ReduceOp::sum);
///     comm.send(x, right);                         // blocking forms are recorded too
///     comm.recv(y, left);                          //   (any order: no deadlock)
///     g.end();                                     // comm.group_end(): runs them, throws the first error
///   }
///   comm.group([&] { comm.all_reduce(a, sum); comm.all_reduce(b, sum); });  // the same, as a call
///
/// The rules:
/// - A group belongs to the thread that opened it and to one communicator; other threads' calls,
///   and calls on other communicators, run as usual meanwhile. group_start() nests: the outermost
///   group_end() runs the group. Another thread's group_start() on the same communicator while one
///   is open is invalid_argument.
/// - Inside a group every call returns at once, the blocking forms too: their buffers are read and
///   written during group_end(), so they must stay valid and unchanged until it returns, and the
///   calls of one group must not depend on each other's results (as in NCCL). Waiting inside the
///   group for a request of its own calls is invalid_argument (it could only time out); another
///   thread's wait on one returns once group_end() has completed it.
/// - Every rank's group holds the same collectives in the same order (its sends and receives
///   differ by nature); the ranks compare their groups first (a signature of a few words, in one
///   small all_reduce per group that has collectives), and where one differs every rank gets `mismatch`
///   naming both groups, and none of the group runs. A group of sends and receives only needs no
///   other rank to take part.
/// - Sends and receives are posted together, receives first: any order the ranks wrote them in
///   completes. Collectives run in the order recorded; small ones on host buffers (each buffer at
///   most 256 KiB) of one kind, dtype, op and root (all_reduce, reduce, broadcast, all_gather,
///   reduce_scatter; barriers collapse into one) are fused into one call per 8 MiB: packed into
///   scratch, moved by one collective, unpacked. A fused reduction runs the algorithm its total
///   size selects, so floating-point sums may round differently than the calls one by one would
///   (as between any two algorithms); every rank still gets the same bits. Calls on a stream are
///   issued on their streams at group_end(), which does not wait for them.
/// - split, shrink, grow and the receives from any source are refused inside a group; the
///   v-collectives (chorus/v_collectives.hpp) wait for their own sends and receives, and so fail
///   inside one (invalid_argument).
/// - An exception that leaves a Group's scope (or comm.group's function) before end() abandons the
///   group: its requests fail, nothing of it is sent, and the other ranks' group then fails with
///   them (a timeout or `mismatch`).

#include <exception>

#include "chorus/communicator.hpp"

namespace chorus {

/// A group on `comm` for the lifetime of this object (or until end()): see above.
template <class T>
class Group {
 public:
  explicit Group(Communicator<T>& comm) : comm_(&comm), exceptions_(std::uncaught_exceptions()) { comm.group_start(); }
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;
  /// Runs the group (Communicator::group_end): returns when its calls are done; throws the first error.
  void end() {
    if (!comm_) return;
    Communicator<T>* c = comm_;
    comm_ = nullptr;
    c->group_end();
  }
  /// Ends the group when end() was not called: runs it, or abandons it while an exception unwinds
  /// the scope. A failure of a group run here is reported by its requests only.
  ~Group() {
    if (!comm_) return;
    if (std::uncaught_exceptions() > exceptions_) {
      comm_->group_abandon();
      return;
    }
    try {
      end();
    } catch (const std::exception&) {  // the requests of the group carry the error
    }
  }

 private:
  Communicator<T>* comm_;
  int exceptions_;
};

}  // namespace chorus
