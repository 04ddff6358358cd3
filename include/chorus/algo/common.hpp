#pragma once
/// What every algorithm receives: the call's buffers and parameters, and the scratch memory the
/// communicator keeps for it (grown on demand, reused across calls: no allocation per step).

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <vector>

#include "chorus/core/buffer.hpp"
#include "chorus/core/types.hpp"

namespace chorus::algo {

struct Args {
  const std::byte* in = nullptr;  ///< may equal out (in place)
  std::byte* out = nullptr;
  std::size_t count = 0;          ///< elements, as the collective defines its count
  DataType dtype = DataType::uint8;
  ReduceOp op = ReduceOp::sum;
  int root = 0;
  std::size_t slice_bytes = 256 << 10;  ///< pipeline granularity (CHORUS_CHUNK_BYTES)

  std::size_t elem() const { return size_of(dtype); }
  std::size_t bytes(std::size_t n) const { return n * elem(); }
};

/// Per-communicator scratch, two independent areas: `get(n)` for the slots a step receives into,
/// `work(n)` for a whole working copy of a buffer. Each returns at least n bytes, valid until the
/// next call for the same area.
class Scratch {
 public:
  std::byte* get(std::size_t n) { return grow(slots_, n); }
  std::byte* work(std::size_t n) { return grow(work_, n); }

  /// After each call: scratch that grew for a burst of large calls is given back once kWindow
  /// calls in a row needed less than half of it, down to what they needed (never below
  /// kKeepBytes per buffer, so steady traffic never reallocates).
  void end_call() {
    if (++calls_ < kWindow) return;
    calls_ = 0;
    for (Buffer* b : {&slots_, &work_}) {
      if (b->v.size() > kKeepBytes && b->window_max < b->v.size() / 2) {
        std::vector<std::byte>(std::max(b->window_max, kKeepBytes)).swap(b->v);
      }
      b->window_max = 0;
    }
  }
  /// Bytes held.
  std::size_t bytes() const { return slots_.v.capacity() + work_.v.capacity(); }

  static constexpr std::size_t kKeepBytes = std::size_t(4) << 20;
  static constexpr int kWindow = 16;

 private:
  struct Buffer {
    std::vector<std::byte> v;
    std::size_t window_max = 0;  ///< the most a call needed since the last look
  };
  static std::byte* grow(Buffer& b, std::size_t n) {
    if (n > b.window_max) b.window_max = n;
    if (b.v.size() < n) b.v.resize(n);
    return b.v.data();
  }
  Buffer slots_;
  Buffer work_;
  int calls_ = 0;
};

inline ConstBytes cbytes(const std::byte* p, std::size_t n) { return {p, n}; }
inline MutableBytes mbytes(std::byte* p, std::size_t n) { return {p, n}; }

/// out = in, unless they are the same buffer.
inline void copy_if_distinct(std::byte* out, const std::byte* in, std::size_t n) {
  if (out != in && n != 0) std::memmove(out, in, n);
}

/// Elements per pipeline slice: at least 1.
inline std::size_t slice_elems(const Args& a) {
  const std::size_t e = a.slice_bytes / a.elem();
  return e == 0 ? 1 : e;
}

}  // namespace chorus::algo
