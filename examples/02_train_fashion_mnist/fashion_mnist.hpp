// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// Fashion-MNIST from the IDX files that Debian's dataset-fashion-mnist installs (gzip-compressed,
// read with zlib; plain files are read as they are too). Every header field and length is
// checked: a malformed, truncated or oversized file is a DatasetError naming the file and what is
// wrong, never a crash.
//
// IDX format (big-endian): magic 0x00000803 (unsigned bytes, 3 dimensions), then the count, rows
// and columns as 32-bit integers, then count*rows*cols pixels; labels: magic 0x00000801, count,
// then count bytes in [0, 9].

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

namespace fmnist {

/// Default location of Debian's dataset-fashion-mnist.
inline constexpr const char* kDefaultDir = "/usr/share/datasets/fashion-mnist";
inline constexpr int kClasses = 10;

struct DatasetError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Images (rows*cols bytes each, row-major, 0 = background) and their labels.
struct Dataset {
  std::size_t count = 0;
  std::size_t rows = 0, cols = 0;
  std::vector<std::uint8_t> pixels;  ///< count * rows * cols
  std::vector<std::uint8_t> labels;  ///< count
  std::size_t pixels_per_image() const { return rows * cols; }
  const std::uint8_t* image(std::size_t i) const { return pixels.data() + i * pixels_per_image(); }
};

namespace detail {

class GzFile {
 public:
  explicit GzFile(const std::string& path) : path_(path), f_(gzopen(path.c_str(), "rb")) {
    if (f_ == nullptr) throw DatasetError(path + ": cannot open: " + std::strerror(errno));
    gzbuffer(f_, 1 << 17);
  }
  GzFile(const GzFile&) = delete;
  GzFile& operator=(const GzFile&) = delete;
  ~GzFile() { gzclose(f_); }

  /// Reads exactly n bytes; throws naming `what` when the file ends early or is corrupt.
  void read(void* out, std::size_t n, const std::string& what) {
    if (const std::size_t got = read_some(static_cast<unsigned char*>(out), n, what); got < n) truncated(what, n, got);
  }
  /// The same into `out` (resized to n), which grows as the data arrives (1 MiB at a time): a
  /// header that announces more than the file holds fails where the file ends, without first
  /// allocating what it announced.
  void read(std::vector<std::uint8_t>& out, std::size_t n, const std::string& what) {
    constexpr std::size_t kStep = std::size_t{1} << 20;
    out.clear();
    while (out.size() < n) {
      const std::size_t done = out.size();
      out.resize(done + std::min(n - done, kStep));
      const std::size_t want = out.size() - done;
      if (const std::size_t got = read_some(out.data() + done, want, what); got < want) truncated(what, n, done + got);
    }
  }
  std::uint32_t read_be32(const std::string& what) {
    unsigned char b[4];
    read(b, 4, what);
    return (std::uint32_t(b[0]) << 24) | (std::uint32_t(b[1]) << 16) | (std::uint32_t(b[2]) << 8) | b[3];
  }
  /// Throws unless the file (its decompressed content) ends here.
  void expect_end() {
    unsigned char extra = 0;
    const int k = gzread(f_, &extra, 1);
    if (k < 0) throw DatasetError(path_ + ": " + error_text());
    if (k > 0) throw DatasetError(path_ + ": malformed: data continues after the last item the header announces");
  }

 private:
  /// Reads up to n bytes, fewer only where the file ends; throws on a read or zlib error.
  std::size_t read_some(unsigned char* p, std::size_t n, const std::string& what) {
    std::size_t done = 0;
    while (done < n) {
      const unsigned chunk = static_cast<unsigned>(std::min<std::size_t>(n - done, 1u << 30));
      const int k = gzread(f_, p + done, chunk);
      if (k < 0) throw DatasetError(path_ + ": " + what + ": " + error_text());
      if (k == 0) break;
      done += static_cast<std::size_t>(k);
    }
    return done;
  }
  [[noreturn]] void truncated(const std::string& what, std::size_t n, std::size_t done) {
    int code = 0;
    gzerror(f_, &code);
    throw DatasetError(path_ + ": truncated: " + what + " needs " + std::to_string(n) + " bytes, the file ends after " +
                       std::to_string(done) + (code != Z_OK ? " (" + error_text() + ")" : std::string()));
  }
  std::string error_text() {
    int code = 0;
    const char* msg = gzerror(f_, &code);
    return code == Z_ERRNO ? std::string(std::strerror(errno)) : std::string(msg ? msg : "zlib error");
  }
  std::string path_;
  gzFile f_;
};

}  // namespace detail

/// Reads an images file and its labels file; throws DatasetError on anything unexpected.
inline Dataset load_idx(const std::string& images_path, const std::string& labels_path) {
  Dataset d;
  {
    detail::GzFile f(images_path);
    const std::uint32_t magic = f.read_be32("the header");
    if (magic != 0x00000803u)
      throw DatasetError(images_path + ": malformed: magic number " + std::to_string(magic) +
                         ", expected 2051 (IDX, unsigned bytes, 3 dimensions)");
    d.count = f.read_be32("the header");
    d.rows = f.read_be32("the header");
    d.cols = f.read_be32("the header");
    if (d.rows == 0 || d.cols == 0 || d.rows > 4096 || d.cols > 4096)
      throw DatasetError(images_path + ": malformed: image size " + std::to_string(d.rows) + "x" + std::to_string(d.cols));
    if (d.count > (std::size_t{1} << 34) / d.pixels_per_image())
      throw DatasetError(images_path + ": malformed: " + std::to_string(d.count) + " images is implausibly many");
    f.read(d.pixels, d.count * d.pixels_per_image(), std::to_string(d.count) + " images");
    f.expect_end();
  }
  {
    detail::GzFile f(labels_path);
    const std::uint32_t magic = f.read_be32("the header");
    if (magic != 0x00000801u)
      throw DatasetError(labels_path + ": malformed: magic number " + std::to_string(magic) +
                         ", expected 2049 (IDX, unsigned bytes, 1 dimension)");
    const std::uint32_t n = f.read_be32("the header");
    if (n != d.count)
      throw DatasetError(labels_path + ": " + std::to_string(n) + " labels for " + std::to_string(d.count) + " images in " +
                         images_path);
    f.read(d.labels, n, std::to_string(n) + " labels");
    f.expect_end();
    for (std::size_t i = 0; i < n; ++i)
      if (d.labels[i] >= kClasses)
        throw DatasetError(labels_path + ": malformed: label " + std::to_string(d.labels[i]) + " of item " +
                           std::to_string(i) + " is not in [0, 9]");
  }
  return d;
}

/// The four file names of the dataset, under dir.
struct Files {
  std::string train_images, train_labels, test_images, test_labels;
};
inline Files files_in(const std::string& dir) {
  auto p = [&](const char* name) { return (std::filesystem::path(dir) / name).string(); };
  return {p("train-images-idx3-ubyte.gz"), p("train-labels-idx1-ubyte.gz"), p("t10k-images-idx3-ubyte.gz"),
          p("t10k-labels-idx1-ubyte.gz")};
}

/// Empty when all four files exist, else a message saying which is missing and how to get it.
inline std::string missing_files_message(const std::string& dir) {
  const Files f = files_in(dir);
  for (const std::string* p : {&f.train_images, &f.train_labels, &f.test_images, &f.test_labels}) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(*p, ec))
      return "Fashion-MNIST not found: " + *p + " does not exist.\n" +
             "Install Debian's dataset-fashion-mnist (apt-get install dataset-fashion-mnist, or scripts/install-deps), "
             "or point --data at a folder holding train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, "
             "t10k-images-idx3-ubyte.gz and t10k-labels-idx1-ubyte.gz.";
  }
  return {};
}

}  // namespace fmnist
