// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// FileStore: a Store kept in one shared file (local disk for one host, NFS or another shared
/// file system for many), like torch.distributed's FileStore. init_method "file:///path".
///
/// Format: a header line "chorus-filestore-1\n", then append-only records, integers
/// little-endian: klen (u32), vlen (u64), key bytes, value bytes. The last record for a key wins.
/// Writers (set, add) append under an exclusive flock(); readers take a shared one and parse only
/// what is new since their last read. A torn record at the end (a writer that died mid-append) is
/// ignored by readers and cut off by the next writer. Files have no change notification, so get
/// and wait poll, backing off from 1 ms to 20 ms, bounded by their timeout. The file is created
/// with mode 0600: it holds the job nonce.
///
/// Use a fresh path per job: records from an earlier job in the same file would be read as this
/// job's (the rendezvous's per-rank generation counters would start where the old job stopped).

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "chorus/bootstrap/store.hpp"
#include "chorus/core/error.hpp"

namespace chorus {

class FileStore final : public Store {
 public:
  static constexpr std::string_view kHeader = "chorus-filestore-1\n";
  static constexpr std::size_t kMaxKeyBytes = 4096;
  static constexpr std::size_t kMaxValueBytes = std::size_t(64) << 20;

  /// Opens (creating when needed) the store file. `timeout` bounds taking the file lock and
  /// every call; get and wait take their own.
  FileStore(std::string path, std::chrono::milliseconds timeout) : path_(std::move(path)), timeout_(timeout) {
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (fd_ < 0) throw detail::system_error(ctx("open"), "open(" + path_ + ")");
    try {
      std::lock_guard lk(mu_);
      Lock l(*this, LOCK_EX, "open");
      if (file_size() == 0) {
        write_all(kHeader.data(), kHeader.size(), "open");
      } else {
        refresh();  // checks the header
      }
    } catch (...) {
      ::close(fd_);
      throw;
    }
  }
  FileStore(const FileStore&) = delete;
  FileStore& operator=(const FileStore&) = delete;
  ~FileStore() override { ::close(fd_); }

  const std::string& path() const { return path_; }

  void set(const std::string& key, const std::string& value) override {
    check_sizes(key, value.size(), "set");
    std::lock_guard lk(mu_);
    Lock l(*this, LOCK_EX, "set");
    refresh(true);
    append(key, value, "set");
  }

  std::string get(const std::string& key, Duration timeout) override {
    wait({key}, timeout);
    std::lock_guard lk(mu_);
    return cache_.at(key);
  }

  void wait(const std::vector<std::string>& keys, Duration timeout) override {
    const auto deadline = Clock::now() + timeout;
    auto pause = std::chrono::milliseconds(1);
    for (;;) {
      std::vector<std::string> missing;
      {
        std::lock_guard lk(mu_);
        {
          Lock l(*this, LOCK_SH, "wait");
          refresh();
        }
        for (const auto& k : keys)
          if (!cache_.count(k)) missing.push_back(k);
      }
      if (missing.empty()) return;
      const auto now = Clock::now();
      if (now >= deadline) {
        std::string names;
        for (const auto& k : missing) names += (names.empty() ? "'" : ", '") + k + "'";
        throw Error(ErrorCode::timeout, ctx("wait"),
                    (missing.size() == 1 ? "key " : "keys ") + names + " not set within " +
                        std::to_string(timeout.count()) + " ms");
      }
      std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - now));
      pause = std::min(pause * 2, std::chrono::milliseconds(20));
    }
  }

  std::int64_t add(const std::string& key, std::int64_t delta) override {
    check_sizes(key, 0, "add");
    std::lock_guard lk(mu_);
    Lock l(*this, LOCK_EX, "add");
    refresh(true);
    std::int64_t v = 0;
    if (auto it = cache_.find(key); it != cache_.end()) {
      const auto& t = it->second;
      auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
      if (ec != std::errc() || p != t.data() + t.size())
        throw Error(ErrorCode::invalid_argument, ctx("add"), "the value of '" + key + "' is not an integer");
    }
    std::int64_t r = 0;
    if (__builtin_add_overflow(v, delta, &r))
      throw Error(ErrorCode::invalid_argument, ctx("add"), "'" + key + "' would overflow");
    append(key, std::to_string(r), "add");
    return r;
  }

  bool check(const std::vector<std::string>& keys) override {
    std::lock_guard lk(mu_);
    {
      Lock l(*this, LOCK_SH, "check");
      refresh();
    }
    for (const auto& k : keys)
      if (!cache_.count(k)) return false;
    return true;
  }

 private:
  using Clock = std::chrono::steady_clock;

  /// flock() held for one call, taken with a bounded wait (holders keep it for microseconds, but
  /// a stopped process could hold it for ever).
  class Lock {
   public:
    Lock(FileStore& s, int mode, const char* op) : s_(s) {
      const auto deadline = Clock::now() + s.timeout_;
      auto pause = std::chrono::microseconds(100);
      while (::flock(s.fd_, mode | LOCK_NB) != 0) {
        if (errno == EINTR) continue;
        if (errno != EWOULDBLOCK) throw detail::system_error(s.ctx(op), "flock(" + s.path_ + ")");
        if (Clock::now() >= deadline)
          throw Error(ErrorCode::timeout, s.ctx(op),
                      "could not lock " + s.path_ + " within " + std::to_string(s.timeout_.count()) + " ms");
        std::this_thread::sleep_for(pause);
        pause = std::min(pause * 2, std::chrono::microseconds(10000));
      }
    }
    ~Lock() { ::flock(s_.fd_, LOCK_UN); }
    Lock(const Lock&) = delete;
    Lock& operator=(const Lock&) = delete;

   private:
    FileStore& s_;
  };

  ErrorContext ctx(const char* op) const { return ErrorContext{-1, -1, std::string("FileStore ") + op + " " + path_}; }

  void check_sizes(const std::string& key, std::size_t vlen, const char* op) const {
    if (key.size() > kMaxKeyBytes) throw Error(ErrorCode::invalid_argument, ctx(op), "key longer than 4 KiB");
    if (vlen > kMaxValueBytes) throw Error(ErrorCode::invalid_argument, ctx(op), "value larger than 64 MiB");
  }

  std::uint64_t file_size() const {
    struct stat st {};
    if (::fstat(fd_, &st) != 0) throw detail::system_error(ctx("stat"), "fstat(" + path_ + ")");
    return static_cast<std::uint64_t>(st.st_size);
  }

  void write_all(const char* p, std::size_t n, const char* op) {
    while (n > 0) {
      const ssize_t w = ::write(fd_, p, n);
      if (w < 0) {
        if (errno == EINTR) continue;
        throw detail::system_error(ctx(op), "write(" + path_ + ")");
      }
      p += w;
      n -= static_cast<std::size_t>(w);
    }
  }

  void append(const std::string& key, const std::string& value, const char* op) {
    std::string rec(12 + key.size() + value.size(), '\0');
    auto* b = reinterpret_cast<unsigned char*>(rec.data());
    for (int i = 0; i < 4; ++i) b[i] = static_cast<unsigned char>(key.size() >> (8 * i));
    for (int i = 0; i < 8; ++i) b[4 + i] = static_cast<unsigned char>(static_cast<std::uint64_t>(value.size()) >> (8 * i));
    std::memcpy(rec.data() + 12, key.data(), key.size());
    std::memcpy(rec.data() + 12 + key.size(), value.data(), value.size());
    write_all(rec.data(), rec.size(), op);  // O_APPEND, under the exclusive lock
    cache_[key] = value;
    offset_ += rec.size();
  }

  /// Reads the records appended since the last call. With `writer` (exclusive lock held), a torn
  /// tail is cut off so the next append starts on a record boundary.
  void refresh(bool writer = false) {
    const std::uint64_t size = file_size();
    if (size < offset_) throw Error(ErrorCode::invalid_argument, ctx("read"), "the file shrank: replaced or truncated?");
    if (size == offset_) return;
    std::string buf(size - offset_, '\0');
    std::size_t got = 0;
    while (got < buf.size()) {
      const ssize_t r = ::pread(fd_, buf.data() + got, buf.size() - got, static_cast<off_t>(offset_ + got));
      if (r < 0) {
        if (errno == EINTR) continue;
        throw detail::system_error(ctx("read"), "pread(" + path_ + ")");
      }
      if (r == 0) break;
      got += static_cast<std::size_t>(r);
    }
    buf.resize(got);
    std::size_t pos = 0;
    if (offset_ == 0) {
      if (buf.size() < kHeader.size()) {
        if (std::string_view(buf) != kHeader.substr(0, buf.size()))
          throw Error(ErrorCode::invalid_argument, ctx("read"), "not a chorus file store");
        return;  // header still being written
      }
      if (std::string_view(buf).substr(0, kHeader.size()) != kHeader)
        throw Error(ErrorCode::invalid_argument, ctx("read"), "not a chorus file store (wrong header)");
      pos = kHeader.size();
    }
    const auto* b = reinterpret_cast<const unsigned char*>(buf.data());
    while (buf.size() - pos >= 12) {
      std::uint64_t klen = 0, vlen = 0;
      for (int i = 0; i < 4; ++i) klen |= static_cast<std::uint64_t>(b[pos + i]) << (8 * i);
      for (int i = 0; i < 8; ++i) vlen |= static_cast<std::uint64_t>(b[pos + 4 + i]) << (8 * i);
      if (klen > kMaxKeyBytes || vlen > kMaxValueBytes)
        throw Error(ErrorCode::invalid_argument, ctx("read"),
                    "corrupt record at offset " + std::to_string(offset_ + pos));
      if (buf.size() - pos - 12 < klen + vlen) break;  // torn or still being written
      cache_[buf.substr(pos + 12, klen)] = buf.substr(pos + 12 + klen, vlen);
      pos += 12 + klen + vlen;
    }
    offset_ += pos;
    if (writer && offset_ < size) {
      if (::ftruncate(fd_, static_cast<off_t>(offset_)) != 0)
        throw detail::system_error(ctx("repair"), "ftruncate(" + path_ + ")");
    }
  }

  std::string path_;
  std::chrono::milliseconds timeout_;
  int fd_ = -1;
  std::mutex mu_;  ///< in-process lock, taken before the file lock
  std::uint64_t offset_ = 0;
  std::map<std::string, std::string> cache_;
};

}  // namespace chorus
