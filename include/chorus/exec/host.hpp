// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// HostExecutor: the executor of host memory. Copies are memmove, reductions the vectorised loops
/// of reduce/host.hpp, scratch two growable host buffers that shrink after a burst of large calls.
/// Everything completes before it returns.

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <vector>

#include "chorus/detail/owned_memory.hpp"
#include "chorus/exec/executor.hpp"
#include "chorus/reduce/host.hpp"

namespace chorus::exec {

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
        b->v.resize(std::max(b->window_max, kKeepBytes));
      }
      b->window_max = 0;
    }
  }
  /// Bytes held.
  std::size_t bytes() const { return slots_.v.size() + work_.v.size(); }

  static constexpr std::size_t kKeepBytes = std::size_t(4) << 20;
  static constexpr int kWindow = 16;

 private:
  struct Buffer {
    chorus::detail::OwnedBuffer v;  ///< announced to OwnedMemory: a transport may keep it registered
    std::size_t window_max = 0;  ///< the most a call needed since the last look
  };
  static std::byte* grow(Buffer& b, std::size_t n) {
    if (n > b.window_max) b.window_max = n;
    if (b.v.size() < n) b.v.resize(std::max(n, 2 * b.v.size()));  // geometric, as a vector grows
    return b.v.data();
  }
  Buffer slots_;
  Buffer work_;
  int calls_ = 0;
};

class HostExecutor final : public Executor {
 public:
  HostExecutor() : Executor(MemoryKind::host) {}

  void copy(std::byte* dst, const std::byte* src, std::size_t n) override {
    if (dst != src && n != 0) std::memmove(dst, src, n);
  }
  void reduce(ReduceOp op, DataType dt, std::byte* out, const std::byte* a, const std::byte* b,
              std::size_t count) override {
    if (out == a)
      chorus::reduce(op, dt, out, b, count);  // the in-place loop: one stream fewer to read
    else
      chorus::reduce(op, dt, out, a, b, count);
  }
  /// The pairwise chain, block by block: a block of out stays in cache across its n-1 steps. When
  /// out is an input after the second, the block's chain runs in a buffer (out must not be
  /// written before that input is read), then lands in out.
  void reduce_many(ReduceOp op, DataType dt, std::byte* out, const std::byte* const* srcs, int n,
                   std::size_t count) override {
    check_reduce_many_inputs(srcs, n, "reduce_many");
    const std::size_t size = size_of(dt);
    if (size == 0 || count == 0) {
      chorus::reduce(op, dt, out, srcs[0], srcs[1], 0);  // checks op and dt as reduce does, touches nothing
      return;
    }
    bool out_is_later_input = false;
    for (int k = 2; k < n; ++k) out_is_later_input = out_is_later_input || srcs[k] == out;
    alignas(64) std::byte buffer[kManyBlockBytes];
    const std::size_t step = kManyBlockBytes / size;
    for (std::size_t at = 0; at < count; at += step) {
      const std::size_t m = std::min(step, count - at);
      const std::size_t off = at * size;
      std::byte* acc = out_is_later_input ? buffer : out + off;
      reduce(op, dt, acc, srcs[0] + off, srcs[1] + off, m);
      for (int k = 2; k < n; ++k) reduce(op, dt, acc, acc, srcs[k] + off, m);
      if (out_is_later_input) std::memcpy(out + off, buffer, m * size);
    }
  }
  void finalize_avg(DataType dt, std::byte* data, std::size_t count, int ranks) override {
    chorus::finalize_avg(dt, data, count, ranks);
  }
  std::byte* slots(std::size_t n) override { return scratch_.get(n); }
  std::byte* work(std::size_t n) override { return scratch_.work(n); }

  /// Links read host memory directly: the staging calls are plain host memory and copies, for
  /// completeness (the algorithms never stage host buffers).
  std::byte* stage(std::size_t n) override {
    if (staging_.size() < n) staging_.resize(n);
    return staging_.data();
  }
  void download(std::byte* host, const std::byte* mine, std::size_t n) override { copy(host, mine, n); }
  void upload(std::byte* mine, const std::byte* host, std::size_t n) override { copy(mine, host, n); }

  void end_call() override { scratch_.end_call(); }
  std::size_t bytes() const override { return scratch_.bytes() + staging_.capacity(); }

 private:
  /// reduce_many's block: a multiple of every element size, small enough for the stack and L1.
  static constexpr std::size_t kManyBlockBytes = 8192;

  Scratch scratch_;
  std::vector<std::byte> staging_;
};

}  // namespace chorus::exec
