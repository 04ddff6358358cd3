// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// Helpers shared by the fuzz targets: a cursor over libFuzzer's input, and a check that stops
// the run (libFuzzer reports the abort as a crash and keeps the input) when a decoder breaks a
// promise it makes.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <type_traits>

namespace chorus::fuzz {

/// Reads fixed-size values and byte runs off the front of the input; past its end, zeros.
class Input {
 public:
  Input(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}

  template <class T>
  T take() {
    static_assert(std::is_trivially_copyable_v<T>);
    T v{};
    const std::size_t n = std::min(sizeof v, size_ - off_);
    if (n) std::memcpy(&v, data_ + off_, n);
    off_ += n;
    return v;
  }
  /// Up to n bytes (fewer at the end of the input).
  std::span<const std::uint8_t> bytes(std::size_t n) {
    n = std::min(n, size_ - off_);
    const std::span<const std::uint8_t> s(data_ + off_, n);
    off_ += n;
    return s;
  }
  std::span<const std::uint8_t> rest() { return bytes(size_ - off_); }
  std::size_t left() const { return size_ - off_; }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t off_ = 0;
};

/// Aborts with `what` unless `ok`: a broken promise of the decoder under test.
inline void check(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "fuzz check failed: %s\n", what);
  std::abort();
}

}  // namespace chorus::fuzz
