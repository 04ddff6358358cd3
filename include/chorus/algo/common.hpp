// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// What every algorithm receives: the call's buffers and parameters, and the executor that owns
/// their memory kind (exec/executor.hpp): it copies, reduces and keeps the scratch memory
/// (grown on demand, reused across calls: no allocation per step).

#include <cstddef>

#include "chorus/core/buffer.hpp"
#include "chorus/core/types.hpp"
#include "chorus/exec/executor.hpp"

namespace chorus::algo {

struct Args {
  const std::byte* in = nullptr;  ///< may equal out (in place)
  std::byte* out = nullptr;
  std::size_t count = 0;          ///< elements, as the collective defines its count
  DataType dtype = DataType::uint8;
  ReduceOp op = ReduceOp::sum;
  int root = 0;
  std::size_t slice_bytes = 256 << 10;  ///< pipeline granularity (CHORUS_CHUNK_BYTES)
  exec::Executor* exec = nullptr;       ///< of the buffers' memory kind

  exec::Executor& x() const { return *exec; }

  std::size_t elem() const { return size_of(dtype); }
  std::size_t bytes(std::size_t n) const { return n * elem(); }
};

inline ConstBytes cbytes(const std::byte* p, std::size_t n) { return {p, n}; }
inline MutableBytes mbytes(std::byte* p, std::size_t n) { return {p, n}; }

/// Elements per pipeline slice: at least 1.
inline std::size_t slice_elems(const Args& a) {
  const std::size_t e = a.slice_bytes / a.elem();
  return e == 0 ? 1 : e;
}

}  // namespace chorus::algo
