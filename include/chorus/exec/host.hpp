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
  Scratch scratch_;
  std::vector<std::byte> staging_;
};

}  // namespace chorus::exec
