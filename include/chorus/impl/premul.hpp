// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// premul_sum (ReduceOp::premul_sum, NCCL's ncclRedOpCreatePreMulSum): each rank's input is
// multiplied by its call's scalar (Call::scalar, one element of the dtype), rounded once, before
// the call moves anything; the call then runs as a sum (the reductions map premul_sum to Sum) and
// its descriptor keeps premul_sum, so a rank that calls sum where the others call premul_sum gets
// `mismatch`. Where the input goes:
//   all_reduce, and reduce at its root: into the output, which the call then reduces in place;
//   reduce elsewhere, and reduce_scatter: into scratch, which the request keeps (host buffers), or
//   device memory from alloc_device_async, which Communicator::issue frees with free_device_async
//   on the call's stream once the call is issued (stream-ordered: after the call is done with it).
// Host buffers take a host scalar (read when the call is issued); device buffers take a host or
// device scalar (the premul kernel reads a device one when the stream runs it).
// Included at the bottom of impl/communicator.hpp.

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "chorus/impl/state.hpp"
#include "chorus/reduce/host.hpp"

namespace chorus {

template <class T>
std::shared_ptr<std::vector<std::byte>> Communicator<T>::prescale(Call& call, MemoryKind kind,
                                                                  const device::Stream* stream,
                                                                  void** device_scratch) {
  State& st = *s_;
  const algo::CollectiveDesc d = detail::desc_of(call);
  auto fail = [&](ErrorCode code, const std::string& why) { return Error(code, st.ctx(-1, algo::describe(d)), why); };
  if (call.scalar == nullptr)
    throw fail(ErrorCode::invalid_argument,
               "premul_sum needs its scalar (Call::scalar: one element of " + std::string(to_string(call.dtype)) + ")");
  const bool scalar_on_device = st.runtime && st.runtime->kind_of(call.scalar) == MemoryKind::device;
  const bool root_out = call.kind == CallKind::all_reduce || (call.kind == CallKind::reduce && call.root == rank());
  // Elements scaled into scratch where the output cannot take them.
  const std::size_t n =
      call.kind == CallKind::reduce_scatter ? call.count * static_cast<std::size_t>(size()) : call.count;
  if (kind == MemoryKind::host && !stream) {
    if (scalar_on_device)
      throw fail(ErrorCode::invalid_argument, "premul_sum on host buffers takes its scalar in host memory; it is in device memory");
    if (root_out) {
      chorus::premul(call.dtype, call.out, call.in, call.count, call.scalar);
      call.in = call.out;
      return nullptr;
    }
    auto scaled = std::make_shared<std::vector<std::byte>>(n * size_of(call.dtype));
    chorus::premul(call.dtype, scaled->data(), call.in, n, call.scalar);
    call.in = scaled->data();
    return scaled;
  }
  const device::Stream s = stream ? *stream : device::Stream{};
  if (root_out) {
    st.runtime->premul(call.dtype, call.out, call.in, call.count, call.scalar, scalar_on_device, s);
    call.in = call.out;
    return nullptr;
  }
  void* scratch = st.runtime->alloc_device_async(n * size_of(call.dtype), s);
  try {
    st.runtime->premul(call.dtype, scratch, call.in, n, call.scalar, scalar_on_device, s);
  } catch (...) {
    st.runtime->free_device_async(scratch, s);
    throw;
  }
  call.in = scratch;
  *device_scratch = scratch;
  return nullptr;
}

}  // namespace chorus
