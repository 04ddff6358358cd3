// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// Persistent collectives, as MPI 4's MPI_Allreduce_init + MPI_Start (and UCC's and oneCCL's
/// cached operations): one collective on fixed buffers, checked once and started many times.
///
///   auto op = comm.all_reduce_init(grad, chorus::ReduceOp::sum);  // checks and plans; sends nothing
///   for (int step = 0; step < steps; ++step) {
///     fill(grad);
///     op.start();  // as comm.all_reduce_async(grad, sum): returns at once
///     op.wait();   // grad holds the sum
///   }
///   op.run();      // start() and wait() as one blocking call (on this thread when nothing is queued)
///
/// Every collective has its *_init (Communicator: all_reduce_init ... all_to_all_init,
/// barrier_init), and Communicator::persistent(Call) takes any chorus::Call.
///
/// The rules:
/// - Making one is local: the arguments are checked as the call checks them (sizes, root, op,
///   memory kind) and, for host buffers, the algorithm is chosen once (the cost model, or
///   CHORUS_ALGO as it was then); nothing is sent. A start is a collective like any other: every
///   rank starts its operations, and makes its other collectives, in one order. Each start takes
///   the next sequence number and carries the call's descriptor as a plain call does, so a rank
///   that starts another operation or calls another collective gets `mismatch`, on every rank.
/// - Between starts only the buffers' contents may change. Buffers, count, dtype, op and root are
///   the ones given at init; the buffers must stay valid while the operation may be started.
/// - One start at a time: start() or run() while the previous start has not completed (wait(),
///   a test() that returned true, or a failure) is invalid_argument. wait() with nothing started
///   returns at once. Destroying an operation does not stop a start in flight.
/// - What a start saves over the plain call, on host buffers: the argument checks, the memory-kind
///   lookup and the planning. It still takes the call lock, its sequence number and its place in
///   the call order, and records itself in the flight recorder. Device buffers: each start issues
///   the call as the plain call does (checked and planned again: the collective kernel and the
///   staged path decide per call).
/// - Inside a group (chorus/group.hpp) a start is recorded like the plain call and runs at group_end().
/// - An operation belongs to its communicator: moving the communicator is fine; starting after the
///   communicator was destroyed (or assigned over, as `comm = comm.shrink()` does) is
///   invalid_argument.

#include <cstdint>
#include <memory>
#include <optional>

#include "chorus/core/request.hpp"
#include "chorus/device/default.hpp"

namespace chorus {

template <class T>
class Communicator;
struct Call;

namespace detail {
template <class T>
struct PersistentState;  // impl/persistent.hpp
}  // namespace detail

/// A persistent collective (see above); made by Communicator's *_init methods and persistent(Call).
template <class T>
class Persistent {
 public:
  /// Not valid(): every call but valid() throws invalid_argument.
  Persistent() = default;
  Persistent(Persistent&&) noexcept = default;
  Persistent& operator=(Persistent&&) noexcept = default;
  Persistent(const Persistent&) = delete;
  Persistent& operator=(const Persistent&) = delete;

  bool valid() const noexcept { return p_ != nullptr; }
  /// Starts the call (as its *_async form): returns at once.
  void start();
  /// Starts the call on `stream` (device buffers; as the plain call's stream form).
  void start(device::Stream stream);
  /// Starts the call and waits for it (as its blocking form).
  void run();
  /// Waits for the latest start; throws its error (or timeout). Nothing started: returns at once.
  void wait();
  /// True once the latest start has completed (or nothing was started); throws its error.
  bool test();
  /// The latest start's request (empty before the first start and after a blocking run()).
  const Request& request() const noexcept { return req_; }
  /// Starts so far (run() counts as one).
  std::uint64_t starts() const noexcept { return starts_; }
  /// The call as given at init.
  const Call& call() const;

 private:
  friend class Communicator<T>;
  explicit Persistent(std::shared_ptr<detail::PersistentState<T>> p) : p_(std::move(p)) {}
  void begin(bool blocking, std::optional<device::Stream> stream);

  std::shared_ptr<detail::PersistentState<T>> p_;
  Request req_;
  std::uint64_t starts_ = 0;
};

}  // namespace chorus
