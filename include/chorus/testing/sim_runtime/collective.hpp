// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// device::SimRuntime (testing/sim_runtime.hpp): the collective kernel (device/collective.hpp).
/// Its blocks run on host threads, one each (the stream's worker runs block 0), so that a block
/// that spins on a peer's flag or LL line never keeps another block, of this rank or of a peer,
/// from running; the threads of one block run one after another (the body is written for that:
/// device/collective_body.hpp).

#include <memory>
#include <shared_mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "chorus/device/collective_body.hpp"
#include "chorus/testing/sim_runtime.hpp"

namespace chorus::device {

namespace detail {

/// How a block's threads run collective_block on the host: one after another.
struct SimBlockExec {
  unsigned index;
  template <class F>
  void single(F&& f) {
    f();
  }
  template <class F>
  void each(F&& f) {
    for (unsigned t = 0; t < kKernelThreads; ++t) f(t, kKernelThreads);
  }
};

/// Bytes of a.in and a.out the kernel of `a` touches (0: not used by this rank).
inline std::pair<std::size_t, std::size_t> collective_operand_bytes(const CollectiveLaunch& a) {
  const std::size_t N = a.count * size_of(a.dtype), all = N * static_cast<std::size_t>(a.ranks);
  switch (a.kind) {
    case KernelCollective::all_reduce:
    case KernelCollective::broadcast: return {N, N};
    case KernelCollective::reduce: return {N, a.rank == a.root ? N : 0};
    case KernelCollective::reduce_scatter: return {all, N};
    case KernelCollective::all_gather: return {N, all};
  }
  return {0, 0};
}

}  // namespace detail

CHORUS_DETAIL_SIM_INLINE unsigned SimRuntime::collective_blocks(int sharing) {
  const unsigned per = sharing > 0 ? kSimMultiprocessors / static_cast<unsigned>(sharing) : kSimMultiprocessors;
  return per < 1 ? 1 : per;
}

CHORUS_DETAIL_SIM_INLINE void SimRuntime::launch_collective(const CollectiveLaunch& a, Stream s) {
  const std::size_t es = size_of(a.dtype);
  std::string why;
  if (es == 0 || !is_valid_op(a.dtype, a.op)) why = "a DataType or ReduceOp the kernels lack";
  else if (a.ranks < 1 || a.ranks > kMaxKernelRanks || a.rank < 0 || a.rank >= a.ranks) why = "ranks or rank out of range";
  else if (a.blocks < 1 || a.blocks > kMaxKernelBlocks) why = "blocks out of range";
  else if (a.protocol == KernelProtocol::ll && a.count * es > kLLMaxBytes) why = "an LL message over kLLMaxBytes";
  else if (a.protocol == KernelProtocol::windowed && a.chunk == 0) why = "a windowed call with chunks of 0 elements";
  else if (a.ll_flag == 0 && a.protocol == KernelProtocol::ll) why = "an LL flag of 0";
  else if (a.abort == nullptr || a.result == nullptr || a.report == nullptr) why = "no abort word, result or report";
  if (!why.empty()) throw detail::cuda_error("cudaLaunchKernel", detail::kCudaInvalidValue, "collective kernel: " + why);
  Op op(OpKind::collective);
  op.op = a.op;
  op.dt = a.dtype;
  op.launch = std::make_shared<const CollectiveLaunch>(a);
  enqueue(s, "collective", std::move(op));
}

CHORUS_DETAIL_SIM_INLINE void SimRuntime::run_collective(StreamState& st, const Op& op, std::unique_lock<std::mutex>& lk) {
  const CollectiveLaunch& a = *op.launch;
  // Lock order: memory_rw_ before mu_; held shared while the kernel runs, so no free returns the
  // memory under it.
  lk.unlock();
  std::shared_lock rd(memory_rw_);
  lk.lock();
  const auto [in_bytes, out_bytes] = detail::collective_operand_bytes(a);
  std::string why;
  if (in_bytes != 0) why = check_device_range(a.in, in_bytes, "in");
  if (why.empty() && out_bytes != 0) why = check_device_range(a.out, out_bytes, "out");
  for (int q = 0; why.empty() && q < a.ranks; ++q)
    why = check_device_range(a.areas[q], area::kWindowOffset, "the area of rank " + std::to_string(q));
  if (why.empty() && pinned_allocation(a.abort) == nullptr) why = "the abort word is not pinned memory";
  if (why.empty() && pinned_allocation(a.report) == nullptr) why = "the report is not pinned memory";
  if (why.empty() && pinned_allocation(a.result) == nullptr) why = "the result is not pinned memory";
  if (!why.empty()) {
    st.error = StreamError{detail::kCudaIllegalAddress, detail::cuda_error_text("cudaLaunchKernel", detail::kCudaIllegalAddress, why)};
    return;
  }
  if (stopping_) return;
  const auto running = running_aborts_.insert(a.abort);
  lk.unlock();
  visit_reduce_kernel(a.op, a.dtype, [&]<class Op, class T>() {
    auto block = [&a](unsigned b) {
      kernel::BlockShared sh{};
      detail::SimBlockExec ex{b};
      kernel::collective_block<Op, T>(a, sh, ex);
    };
    std::vector<std::thread> others;
    others.reserve(a.blocks - 1);
    for (unsigned b = 1; b < a.blocks; ++b) others.emplace_back(block, b);
    block(0);
    for (auto& t : others) t.join();
  });
  rd.unlock();
  lk.lock();
  running_aborts_.erase(running);
}

}  // namespace chorus::device
