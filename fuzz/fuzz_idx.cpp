// SPDX-License-Identifier: BSD-3-Clause
// The IDX reader of the Fashion-MNIST example (examples/02_train_fashion_mnist/fashion_mnist.hpp,
// load_idx): an images file and a labels file, plain or gzip-compressed. Promises: a malformed,
// truncated or oversized file is a DatasetError, nothing else, and never a large allocation
// before the data is there; a dataset that loads is consistent, and writing it back as plain
// IDX gives the input bytes when the input was plain.
//
// Input: the images file's length (u16), the images file, the labels file (the rest). The files
// are memfds, opened by name through /proc/self/fd.

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <vector>

#include "../examples/02_train_fashion_mnist/fashion_mnist.hpp"
#include "fuzz_input.hpp"

namespace {

/// A memfd holding `bytes`; closed on destruction.
struct MemFile {
  explicit MemFile(std::span<const std::uint8_t> bytes) : fd(::memfd_create("idx", MFD_CLOEXEC)) {
    chorus::fuzz::check(fd >= 0, "memfd_create");
    std::size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t k = ::write(fd, bytes.data() + done, bytes.size() - done);
      chorus::fuzz::check(k > 0, "write to a memfd");
      done += static_cast<std::size_t>(k);
    }
  }
  ~MemFile() { ::close(fd); }
  std::string path() const { return "/proc/self/fd/" + std::to_string(fd); }
  int fd;
};

void put_be32(std::vector<std::uint8_t>& out, std::size_t v) {
  for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<std::uint8_t>(v >> s));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  chorus::fuzz::Input in(data, size);
  const auto images_bytes = in.bytes(in.take<std::uint16_t>());
  const auto labels_bytes = in.rest();
  const MemFile images(images_bytes), labels(labels_bytes);
  fmnist::Dataset d;
  try {
    d = fmnist::load_idx(images.path(), labels.path());
  } catch (const fmnist::DatasetError&) {
    return 0;
  }
  chorus::fuzz::check(d.rows > 0 && d.cols > 0 && d.pixels.size() == d.count * d.rows * d.cols, "pixels");
  chorus::fuzz::check(d.labels.size() == d.count, "labels");
  for (auto l : d.labels) chorus::fuzz::check(l < fmnist::kClasses, "label out of range");
  if (images_bytes.size() >= 2 && images_bytes[0] == 0x1f && images_bytes[1] == 0x8b) return 0;  // gzip
  std::vector<std::uint8_t> again;
  put_be32(again, 0x803);
  put_be32(again, d.count);
  put_be32(again, d.rows);
  put_be32(again, d.cols);
  again.insert(again.end(), d.pixels.begin(), d.pixels.end());
  chorus::fuzz::check(std::equal(again.begin(), again.end(), images_bytes.begin(), images_bytes.end()),
                      "images: encode(decode(x)) != x");
  return 0;
}
