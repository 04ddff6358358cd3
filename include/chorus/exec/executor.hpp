// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// The memory/execution layer under the algorithms: an executor per memory kind does everything
/// an algorithm would otherwise do to bytes itself (copy, reduce, avg's division, scratch memory)
/// and, for memory a link cannot read, moves data between it and host staging memory. Algorithms
/// in algo/ only name byte ranges and call these; they never touch bytes.
///
/// | executor                     | memory | copy / reduce                                    | completion            |
/// |------------------------------|--------|--------------------------------------------------|-----------------------|
/// | exec::HostExecutor (host.hpp)  | host   | memmove; the vectorised loops of reduce/host.hpp | when the call returns |
/// | exec::DeviceExecutor (device.hpp) | device | copies and reduce/cuda kernels on its stream | end_call() waits      |
///
/// Work on one executor is ordered: an operation sees the results of every earlier one (a device
/// executor issues all of its work on one stream). `download` is complete when it returns (a link
/// reads the staging memory next); `upload` and everything else only when later work or
/// end_call() needs it.

#include <cstddef>

#include "chorus/core/buffer.hpp"
#include "chorus/core/types.hpp"
#include "chorus/reduce/cuda/kernels.hpp"  // kMaxReduceInputs

namespace chorus::device {
class Runtime;
}  // namespace chorus::device

namespace chorus::exec {

class Executor {
 public:
  explicit Executor(MemoryKind kind) : kind_(kind) {}
  virtual ~Executor() = default;
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  /// The memory the call's buffers and this executor's scratch are in.
  MemoryKind kind() const noexcept { return kind_; }
  /// True when links cannot read or write that memory: every message goes through stage().
  bool staged() const noexcept { return kind_ != MemoryKind::host; }

  /// dst = src (n bytes), unless they are the same buffer; other overlaps are not allowed.
  virtual void copy(std::byte* dst, const std::byte* src, std::size_t n) = 0;
  /// out[i] = op(a[i], b[i]) for count elements (avg reduces as sum); out may be a or b.
  virtual void reduce(ReduceOp op, DataType dt, std::byte* out, const std::byte* a, const std::byte* b,
                      std::size_t count) = 0;
  /// out[i] = op(...op(op(srcs[0][i], srcs[1][i]), srcs[2][i])..., srcs[n-1][i]) for count elements:
  /// bitwise the n-1 chained reduce calls out = op(srcs[0], srcs[1]), out = op(out, srcs[2]), ...,
  /// in one pass where the executor can (avg reduces as sum). out may equal one of the inputs.
  /// `srcs` is read at the call. n outside 2 to kMaxReduceInputs throws Error(invalid_argument).
  virtual void reduce_many(ReduceOp op, DataType dt, std::byte* out, const std::byte* const* srcs, int n,
                           std::size_t count) = 0;
  /// avg's last step: data[i] /= ranks.
  virtual void finalize_avg(DataType dt, std::byte* data, std::size_t count, int ranks) = 0;

  /// Scratch in this executor's memory, two independent areas: `slots(n)` for what a step
  /// receives into, `work(n)` for a whole working copy of a buffer. At least n bytes each, valid
  /// until the next request for the same area.
  virtual std::byte* slots(std::size_t n) = 0;
  virtual std::byte* work(std::size_t n) = 0;

  /// Host memory a link can read and write, n bytes, valid until end_call() (staged executors).
  virtual std::byte* stage(std::size_t n) = 0;
  /// host = mine (n bytes), complete when it returns.
  virtual void download(std::byte* host, const std::byte* mine, std::size_t n) = 0;
  /// mine = host (n bytes), ordered before every later operation; `host` stays untouched until
  /// end_call().
  virtual void upload(std::byte* mine, const std::byte* host, std::size_t n) = 0;

  // --- memory links take as it is (device memory over rdma with dma-buf) ---------------------
  /// The device runtime of this executor's memory (null for host memory): a link that can take
  /// such memory directly (algo/channel.hpp asks it) registers it through this runtime.
  virtual device::Runtime* runtime() noexcept { return nullptr; }
  /// Blocks until every operation issued is complete: a link then reads and writes the call's
  /// memory itself, outside the executor's order.
  virtual void sync() {}
  // --- end of memory links take as it is -------------------------------------------------------

  /// After each call (ok or not): every operation issued is complete (so the call's output is
  /// final and its staging free), and scratch grown for a burst of large calls may shrink.
  virtual void end_call() = 0;
  /// Bytes held: scratch and staging.
  virtual std::size_t bytes() const = 0;

 private:
  MemoryKind kind_;
};

}  // namespace chorus::exec
