// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// FlightRecorder: a communicator's last N collectives (sequence number, collective, count, dtype,
/// op, root, algorithm, state, times), kept at almost no cost so that a hang or a failure can be
/// explained after the fact: dumped on a timeout, an abort, a peer's failure and, when
/// CHORUS_DUMP_ON_SIGNAL=1, on SIGUSR1 (diag/dump.hpp).
///
/// Writers are the threads that run a communicator's calls (one call at a time, in call order)
/// and the thread that queues an async call; a dump may read from any thread. Each entry is a
/// handful of relaxed atomic words under a version counter (odd while written), so recording
/// takes no lock and a dump that races a writer retries instead of printing a torn entry.
/// Times come from CLOCK_MONOTONIC_COARSE (a few nanoseconds to read, the resolution of the
/// kernel's tick, 1-4 ms): enough to tell which call hangs and since when.

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <sstream>
#include <string>
#include <vector>

#include "chorus/algo/descriptor.hpp"
#include "chorus/algo/select.hpp"

namespace chorus::algo {

enum class CallState : std::uint8_t { queued, running, completed, failed };

constexpr std::string_view to_string(CallState s) noexcept {
  switch (s) {
    case CallState::queued: return "queued";
    case CallState::running: return "running";
    case CallState::completed: return "completed";
    case CallState::failed: return "failed";
  }
  return "unknown";
}

class FlightRecorder {
 public:
  /// One call as a dump sees it. Times are nanoseconds of the coarse monotonic clock; 0: not yet.
  struct Record {
    CollectiveDesc desc;
    Algorithm algorithm = Algorithm::automatic;
    CallState state = CallState::queued;
    std::int64_t queued_ns = 0;
    std::int64_t started_ns = 0;
    std::int64_t ended_ns = 0;
  };

  /// `entries` calls are kept (at least 1). `rank`, `members` (group rank -> job rank) and
  /// `context` name the communicator in a dump.
  FlightRecorder(std::size_t entries, int rank, std::vector<int> members, std::uint64_t context)
      : entries_(entries == 0 ? 1 : entries), rank_(rank), members_(std::move(members)), context_(context) {
    wall0_ = std::chrono::system_clock::now();
    mono0_ = now_ns();
  }

  std::size_t capacity() const { return entries_.size(); }
  /// Bytes this recorder holds (for memory_stats()).
  std::size_t bytes() const { return sizeof(*this) + entries_.size() * sizeof(Entry); }

  /// An async call was queued (in call order).
  void queued(const CollectiveDesc& d, Algorithm a) { write(d, a, CallState::queued, now_ns(), 0); }
  /// Call `d` starts running (queued before, or run at once by its caller).
  void started(const CollectiveDesc& d, Algorithm a) {
    const std::int64_t t = now_ns();
    Entry& e = slot(d.seq);
    const bool was_queued = e.w[kSeq].load(std::memory_order_relaxed) == d.seq + 1 &&
                            state_of(e.w[kPacked].load(std::memory_order_relaxed)) == CallState::queued;
    write(d, a, CallState::running, was_queued ? static_cast<std::int64_t>(e.w[kQueued].load(std::memory_order_relaxed)) : t, t);
    entered_.store(d.seq + 1, std::memory_order_relaxed);
  }
  /// Call `seq` ended. Nothing happens when its entry was already reused by a later call.
  void finished(std::uint64_t seq, bool ok) {
    Entry& e = slot(seq);
    if (e.w[kSeq].load(std::memory_order_relaxed) != seq + 1) return;
    const std::uint64_t v = begin_write(e);
    const std::uint64_t packed = e.w[kPacked].load(std::memory_order_relaxed);
    e.w[kPacked].store((packed & ~(0xffull << 32)) |
                           (std::uint64_t(ok ? CallState::completed : CallState::failed) << 32),
                       std::memory_order_relaxed);
    e.w[kEnded].store(static_cast<std::uint64_t>(now_ns()), std::memory_order_relaxed);
    e.version.store(v + 2, std::memory_order_release);
    if (ok && completed_.load(std::memory_order_relaxed) < seq + 1) completed_.store(seq + 1, std::memory_order_relaxed);
  }

  /// Calls that have started running (the highest sequence number + 1), and that completed.
  std::uint64_t entered() const { return entered_.load(std::memory_order_relaxed); }
  std::uint64_t completed() const { return completed_.load(std::memory_order_relaxed); }

  /// The kept calls, oldest first (an entry being rewritten while read is skipped after retries).
  std::vector<Record> snapshot() const {
    std::vector<Record> out;
    for (const Entry& e : entries_) {
      for (int attempt = 0; attempt < 8; ++attempt) {
        const std::uint64_t v0 = e.version.load(std::memory_order_acquire);
        if (v0 & 1) continue;
        std::uint64_t w[kWords];
        for (int i = 0; i < kWords; ++i) w[i] = e.w[i].load(std::memory_order_relaxed);
        std::atomic_thread_fence(std::memory_order_acquire);
        if (e.version.load(std::memory_order_relaxed) != v0) continue;
        if (w[kSeq] == 0) break;  // never used
        Record r;
        r.desc.seq = w[kSeq] - 1;
        r.desc.count = w[kCount];
        r.desc.kind = static_cast<CollectiveKind>(w[kPacked] & 0xff);
        r.desc.dtype = static_cast<DataType>((w[kPacked] >> 8) & 0xff);
        r.desc.op = static_cast<ReduceOp>((w[kPacked] >> 16) & 0xff);
        r.algorithm = static_cast<Algorithm>((w[kPacked] >> 24) & 0xff);
        r.state = state_of(w[kPacked]);
        r.desc.root = static_cast<std::int32_t>(static_cast<std::uint32_t>(w[kRoot]));
        r.queued_ns = static_cast<std::int64_t>(w[kQueued]);
        r.started_ns = static_cast<std::int64_t>(w[kStarted]);
        r.ended_ns = static_cast<std::int64_t>(w[kEnded]);
        out.push_back(r);
        break;
      }
    }
    std::sort(out.begin(), out.end(), [](const Record& a, const Record& b) { return a.desc.seq < b.desc.seq; });
    return out;
  }

  /// The dump: a header naming the communicator and `reason`, then one line per kept call.
  std::string dump(std::string_view reason) const {
    const std::int64_t now = now_ns();
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    std::ostringstream os;
    os << "chorus flight recorder: rank " << rank_ << " of " << members_.size() << " (job ranks";
    for (std::size_t i = 0; i < members_.size(); ++i) os << (i ? "," : " ") << members_[i];
    os << "), context " << context_ << ", host " << host << ", pid " << ::getpid() << ", at " << wall(now) << "; "
       << reason << "\n";
    os << "  calls entered " << entered() << ", completed " << completed() << "; the last " << capacity() << " kept:\n";
    for (const Record& r : snapshot()) {
      os << "  #" << r.desc.seq << ' ' << to_string(r.desc.kind);
      if (r.desc.kind != CollectiveKind::barrier) {
        os << ' ' << to_string(r.desc.dtype);
        if (r.desc.kind == CollectiveKind::all_reduce || r.desc.kind == CollectiveKind::reduce ||
            r.desc.kind == CollectiveKind::reduce_scatter)
          os << ' ' << to_string(r.desc.op);
        os << " count " << r.desc.count;
      }
      if (r.desc.root >= 0) os << " root " << r.desc.root;
      os << " algorithm " << to_string(r.algorithm) << ": " << to_string(r.state) << ", queued " << wall(r.queued_ns);
      if (r.started_ns) os << ", started +" << ms(r.started_ns - r.queued_ns);
      if (r.ended_ns) os << ", ran " << ms(r.ended_ns - r.started_ns);
      else if (r.started_ns) os << ", running for " << ms(now - r.started_ns);
      else os << ", waiting for " << ms(now - r.queued_ns);
      os << '\n';
    }
    return os.str();
  }

  int rank() const { return rank_; }
  std::uint64_t context() const { return context_; }

  static std::int64_t now_ns() {
    timespec ts{};
    ::clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return std::int64_t(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
  }

 private:
  enum Word { kSeq, kCount, kPacked, kRoot, kQueued, kStarted, kEnded, kWords };
  struct Entry {
    std::atomic<std::uint64_t> version{0};
    std::atomic<std::uint64_t> w[kWords] = {};  ///< kSeq holds seq + 1 (0: never used)
  };

  static CallState state_of(std::uint64_t packed) { return static_cast<CallState>((packed >> 32) & 0xff); }

  Entry& slot(std::uint64_t seq) { return entries_[seq % entries_.size()]; }

  /// Marks `e` as being written (odd version) and returns the version before. Plain loads and
  /// stores, no locked instruction: calls are recorded one at a time (a queued call's entry and
  /// the running call's are different entries unless more than capacity() calls are queued, when
  /// a dump may skip the torn entry).
  static std::uint64_t begin_write(Entry& e) {
    const std::uint64_t v = e.version.load(std::memory_order_relaxed) | 1;
    e.version.store(v, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    return v - 1;
  }

  void write(const CollectiveDesc& d, Algorithm a, CallState st, std::int64_t queued, std::int64_t started) {
    Entry& e = slot(d.seq);
    const std::uint64_t v = begin_write(e);
    e.w[kSeq].store(d.seq + 1, std::memory_order_relaxed);
    e.w[kCount].store(d.count, std::memory_order_relaxed);
    e.w[kPacked].store(std::uint64_t(static_cast<std::uint8_t>(d.kind)) | std::uint64_t(static_cast<std::uint8_t>(d.dtype)) << 8 |
                           std::uint64_t(static_cast<std::uint8_t>(d.op)) << 16 |
                           std::uint64_t(static_cast<std::uint8_t>(a)) << 24 | std::uint64_t(st) << 32,
                       std::memory_order_relaxed);
    e.w[kRoot].store(static_cast<std::uint32_t>(d.root), std::memory_order_relaxed);
    e.w[kQueued].store(static_cast<std::uint64_t>(queued), std::memory_order_relaxed);
    e.w[kStarted].store(static_cast<std::uint64_t>(started), std::memory_order_relaxed);
    e.w[kEnded].store(0, std::memory_order_relaxed);
    e.version.store(v + 2, std::memory_order_release);
  }

  /// "2026-11-23 18:30:01.123" (UTC) for a coarse monotonic time.
  std::string wall(std::int64_t mono_ns) const {
    const auto t = wall0_ + std::chrono::duration_cast<std::chrono::system_clock::duration>(std::chrono::nanoseconds(mono_ns - mono0_));
    const std::time_t secs = std::chrono::system_clock::to_time_t(t);
    const auto millis = std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count() % 1000;
    std::tm tm{};
    ::gmtime_r(&secs, &tm);
    char buf[96];
    std::snprintf(buf, sizeof buf, "%04d-%02d-%02d %02d:%02d:%02d.%03d", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                  tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(millis));
    return buf;
  }
  static std::string ms(std::int64_t ns) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f ms", static_cast<double>(ns) / 1e6);
    return buf;
  }

  std::vector<Entry> entries_;
  int rank_;
  std::vector<int> members_;
  std::uint64_t context_;
  std::chrono::system_clock::time_point wall0_;
  std::int64_t mono0_ = 0;
  std::atomic<std::uint64_t> entered_{0};
  std::atomic<std::uint64_t> completed_{0};
};

}  // namespace chorus::algo
