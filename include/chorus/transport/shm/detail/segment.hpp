// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// The shared-memory segment of one shm link and the two rings in it (one per direction).
///
/// Layout (offsets from the start of the segment; the segment is an anonymous memfd, see
/// transport.hpp for why it has no name):
/// | offset                  | what                                                            |
/// |-------------------------|-----------------------------------------------------------------|
/// | 0                       | RingControl of the ring low rank -> high rank                   |
/// | sizeof(RingControl)     | RingControl of the ring high rank -> low rank                   |
/// | kMailboxOffset          | two MailboxSlots low -> high, then two high -> low              |
/// | kDataOffset             | data of the ring low -> high (Policy::kRingBytes)               |
/// | kDataOffset + ring      | data of the ring high -> low                                    |
///
/// Each ring is single-producer single-consumer: the writer owns `tail`, the reader owns `head`
/// (both count bytes since the start, never wrap). Records are 64-byte aligned and never wrap
/// around the end of the data: a record that would is preceded by a pad record that fills the
/// rest. A record below `tail` is complete (the writer publishes tail after writing it), so a
/// ring stays readable after its writer died.
///
/// Sleeping: a reader that found its ring empty sets `reader_sleeping` before blocking; a writer
/// that published a record exchanges it back to 0 and, when it was set, rings the peer's
/// doorbell (one byte on the link's unix socket). The flag and the counters are seq_cst, so of
/// "reader sets flag, then re-reads tail" and "writer stores tail, then reads flag" at least one
/// sees the other: no lost wake-up. `writer_sleeping` is the same for a writer waiting for room.
///
/// Mailboxes: besides the ring, each direction has two fixed slots that the one-shot collectives
/// write and read in turn (algo/intranode/one_shot.hpp: a message per call and peer, no record, no
/// matching). The writer fills the slot, then stores its `stamp` (seq_cst), then takes the
/// reader's `reader_sleeping` flag of the ring of the same direction like a ring writer does, so
/// a reader that sleeps in the engine's wait is woken by the same doorbell.

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include <sys/mman.h>
#include <unistd.h>

#include "chorus/core/buffer.hpp"
#include "chorus/core/error.hpp"

namespace chorus::shm {

/// Sizes and thresholds of the shm transport.
struct Policy {
  /// Messages up to this size are copied through the ring (two copies, lowest latency); larger
  /// ones are pulled by the receiver straight from the sender's buffer (one copy, CMA).
  static constexpr std::size_t kEagerBytes = 32 * 1024;
  /// Data bytes of each ring (one per direction).
  static constexpr std::size_t kRingBytes = 1u << 20;
  /// Unexpected eager messages buffered per link before the link stops draining its ring.
  static constexpr std::size_t kMaxUnexpectedBytes = 64u << 20;
  /// A CMA pull is cut into pieces of this size; abort takes effect between pieces.
  static constexpr std::size_t kPullChunkBytes = 4u << 20;
  /// Without CMA, a large message streams through the ring in records of this payload.
  static constexpr std::size_t kStreamChunkBytes = 128 * 1024;
  static constexpr std::uint64_t kMaxMessageBytes = chorus::kMaxMessageBytes;
  /// Payload of a mailbox slot: the largest one-shot message (algo/intranode/one_shot.hpp).
  static constexpr std::size_t kMailboxBytes = 4096 - 64;
};

namespace detail {

static_assert(std::atomic<std::uint64_t>::is_always_lock_free, "rings need lock-free 64-bit atomics");
static_assert(std::atomic<std::uint32_t>::is_always_lock_free);

struct RingControl {
  alignas(64) std::atomic<std::uint64_t> tail{0};  ///< bytes written (writer)
  alignas(64) std::atomic<std::uint64_t> head{0};  ///< bytes consumed (reader)
  alignas(64) std::atomic<std::uint32_t> reader_sleeping{0};
  alignas(64) std::atomic<std::uint32_t> writer_sleeping{0};
  /// Set by the writer before it fails its sends (abort, destruction): a receiver that pulled a
  /// message from this writer's memory discards it, since the buffer may already be reused.
  alignas(64) std::atomic<std::uint32_t> writer_aborted{0};
};

enum class RecordType : std::uint32_t { pad = 1, eager = 2, rts = 3, fin = 4, cts = 5, data = 6 };
inline constexpr std::uint32_t kFinReject = 1;  ///< fin: the sizes differ; `size` is the receive's

/// | type  | fields                      | payload | meaning                                        |
/// |-------|-----------------------------|---------|------------------------------------------------|
/// | eager | tag, size                   | size B  | a small message                                |
/// | rts   | tag, size, id, addr         |         | a large message at addr in the sender          |
/// | fin   | id, flags, size             |         | the receiver pulled it (or rejected its size)  |
/// | cts   | id                          |         | no CMA: stream it through the ring             |
/// | data  | id, offset, payload         | payload | a piece of a streamed message                  |
/// | pad   |                             |         | skip to the start of the ring                  |
struct Record {
  std::uint32_t type = 0;
  std::uint32_t flags = 0;
  std::uint64_t tag = 0;
  std::uint64_t size = 0;
  std::uint64_t id = 0;
  std::uint64_t addr = 0;
  std::uint64_t offset = 0;
  std::uint64_t payload = 0;  ///< bytes following the header
};
static_assert(sizeof(Record) == 56);

/// What can be checked of a record from the peer without the link's state (the ids of fin, cts
/// and data records are checked against it by the link): a type the link handles, and sizes
/// the type allows. Empty when the record is fine, else what is wrong (the link then breaks).
/// A pad record is never handed on (RingReader::peek skips it), so it counts as unknown here.
inline std::string record_problem(const Record& h) {
  switch (static_cast<RecordType>(h.type)) {
    case RecordType::eager:
      if (h.payload != h.size || h.size > Policy::kEagerBytes)
        return "eager record of " + std::to_string(h.size) + " bytes";
      return {};
    case RecordType::rts:
      if (h.size > Policy::kMaxMessageBytes || h.payload != 0)
        return "announcement of a message of " + std::to_string(h.size) + " bytes";
      return {};
    case RecordType::fin:
    case RecordType::cts:
    case RecordType::data: return {};
    case RecordType::pad: break;
  }
  return "unknown record type " + std::to_string(h.type);
}

inline constexpr std::size_t kRecordAlign = 64;
inline constexpr std::size_t record_bytes(std::size_t payload) {
  return (sizeof(Record) + payload + kRecordAlign - 1) / kRecordAlign * kRecordAlign;
}
static_assert(record_bytes(Policy::kStreamChunkBytes) <= Policy::kRingBytes / 4);
static_assert(record_bytes(Policy::kEagerBytes) <= Policy::kRingBytes / 4);

/// One mailbox message: a stamp (the writer's count of mailbox messages on this link, from 1;
/// 0 is never used), the caller's 32-byte collective descriptor, the payload's size, the payload:
/// in the stamp's own cache line up to kMailboxInline bytes (the reader then misses on one line,
/// not two), else from the next line on.
struct MailboxSlot {
  static constexpr std::size_t kMailboxInline = 24;
  alignas(64) std::atomic<std::uint32_t> stamp{0};
  std::uint32_t bytes = 0;
  std::byte desc[32] = {};
  std::byte small[kMailboxInline] = {};
  alignas(64) std::byte data[Policy::kMailboxBytes];
  /// Where a payload of `n` bytes goes.
  std::byte* payload(std::size_t n) { return n <= kMailboxInline ? small : data; }
  const std::byte* payload(std::size_t n) const { return n <= kMailboxInline ? small : data; }
};
static_assert(offsetof(MailboxSlot, small) + MailboxSlot::kMailboxInline == 64, "the inline payload ends the stamp's line");
static_assert(sizeof(MailboxSlot) == 4096);

inline constexpr std::size_t kMailboxOffset = 4096;
inline constexpr std::size_t kDataOffset = kMailboxOffset + 4 * sizeof(MailboxSlot);
static_assert(2 * sizeof(RingControl) <= kMailboxOffset);
inline constexpr std::size_t kSegmentBytes = kDataOffset + 2 * Policy::kRingBytes;

/// The writing end of a ring (one thread at a time: the link's lock).
class RingWriter {
 public:
  RingWriter() = default;
  RingWriter(RingControl* c, std::byte* data) : c_(c), data_(data), tail_(c->tail.load()) {}

  /// Writes a record and its payload if there is room; false when the ring is too full.
  bool try_write(Record h, const std::byte* payload) {
    constexpr std::size_t cap = Policy::kRingBytes;
    const std::size_t len = record_bytes(h.payload);
    const std::size_t pos = tail_ % cap;
    const std::size_t to_end = cap - pos;
    const std::size_t need = len <= to_end ? len : to_end + len;
    const std::uint64_t head = c_->head.load(std::memory_order_acquire);
    if (cap - (tail_ - head) < need) return false;
    std::size_t at = pos;
    if (len > to_end) {
      Record pad;
      pad.type = static_cast<std::uint32_t>(RecordType::pad);
      std::memcpy(data_ + pos, &pad, sizeof pad);
      tail_ += to_end;
      at = 0;
    }
    std::memcpy(data_ + at, &h, sizeof h);
    if (h.payload) std::memcpy(data_ + at + sizeof h, payload, h.payload);
    tail_ += len;
    c_->tail.store(tail_, std::memory_order_seq_cst);
    return true;
  }
  /// True when the reader announced it sleeps (and clears that): ring its doorbell.
  bool take_reader_sleeping() {
    return c_->reader_sleeping.load(std::memory_order_seq_cst) != 0 && c_->reader_sleeping.exchange(0) != 0;
  }
  void set_sleeping(bool on) { c_->writer_sleeping.store(on ? 1 : 0, std::memory_order_seq_cst); }
  void mark_aborted() { c_->writer_aborted.store(1, std::memory_order_seq_cst); }

 private:
  RingControl* c_ = nullptr;
  std::byte* data_ = nullptr;
  std::uint64_t tail_ = 0;
};

/// The reading end of a ring (one thread at a time: the link's lock).
class RingReader {
 public:
  RingReader() = default;
  RingReader(RingControl* c, const std::byte* data) : c_(c), data_(data), head_(c->head.load()) {}

  /// The oldest record, or nullptr when the ring is empty. Checks what the writer put there:
  /// `bad` gets a reason for a record that cannot be right.
  const Record* peek(std::string& bad) {
    constexpr std::size_t cap = Policy::kRingBytes;
    for (;;) {
      const std::uint64_t tail = c_->tail.load(std::memory_order_acquire);
      if (tail == head_) return nullptr;
      // head_ too: its first value comes from the segment, which the peer may have written.
      if (tail - head_ > cap || (tail - head_) % kRecordAlign != 0 || head_ % kRecordAlign != 0) {
        bad = "ring counters out of range";
        return nullptr;
      }
      const std::size_t pos = head_ % cap;
      const auto* r = reinterpret_cast<const Record*>(data_ + pos);
      if (r->type == static_cast<std::uint32_t>(RecordType::pad)) {
        head_ += cap - pos;
        c_->head.store(head_, std::memory_order_seq_cst);
        continue;
      }
      if (r->payload > cap / 4 || record_bytes(r->payload) > tail - head_ || record_bytes(r->payload) > cap - pos) {
        bad = "record of " + std::to_string(r->payload) + " payload bytes does not fit the ring";
        return nullptr;
      }
      return r;
    }
  }
  static const std::byte* payload(const Record* r) { return reinterpret_cast<const std::byte*>(r + 1); }
  void pop(const Record* r) {
    head_ += record_bytes(r->payload);
    c_->head.store(head_, std::memory_order_seq_cst);
  }
  bool empty() const { return c_->tail.load(std::memory_order_seq_cst) == head_; }
  void set_sleeping(bool on) { c_->reader_sleeping.store(on ? 1 : 0, std::memory_order_seq_cst); }
  /// True when the writer announced it waits for room (and clears that): ring its doorbell.
  bool take_writer_sleeping() {
    return c_->writer_sleeping.load(std::memory_order_seq_cst) != 0 && c_->writer_sleeping.exchange(0) != 0;
  }
  bool writer_aborted() const { return c_->writer_aborted.load(std::memory_order_seq_cst) != 0; }

 private:
  RingControl* c_ = nullptr;
  const std::byte* data_ = nullptr;
  std::uint64_t head_ = 0;
};

/// A mapping of one segment; unmapped on destruction.
class Mapping {
 public:
  Mapping() = default;
  /// Maps kSegmentBytes of `fd` shared, read-write; `ctx` names the link in an error.
  /// MAP_POPULATE faults every page in now, at connection time: otherwise the first lap of each
  /// ring takes a page fault every 4 KiB of messages on both sides (2 x 256 per ring), which
  /// made a link's first ~10^4 small messages measurably slower than the rest.
  Mapping(int fd, const ErrorContext& ctx) {
    void* p = ::mmap(nullptr, kSegmentBytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (p == MAP_FAILED)
      throw Error(ErrorCode::system, ctx, std::string("mmap of a link segment failed: ") + std::strerror(errno));
    base_ = static_cast<std::byte*>(p);
  }
  Mapping(Mapping&& o) noexcept : base_(o.base_) { o.base_ = nullptr; }
  Mapping& operator=(Mapping&& o) noexcept {
    if (this != &o) {
      reset();
      base_ = o.base_;
      o.base_ = nullptr;
    }
    return *this;
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() { reset(); }

  /// The control block of the ring from the low rank (dir 0) or from the high rank (dir 1).
  RingControl* control(int dir) const { return reinterpret_cast<RingControl*>(base_) + dir; }
  std::byte* data(int dir) const { return base_ + kDataOffset + static_cast<std::size_t>(dir) * Policy::kRingBytes; }
  /// Mailbox slot `k` (0 or 1) of direction `dir`.
  MailboxSlot* mailbox(int dir, unsigned k) const {
    return reinterpret_cast<MailboxSlot*>(base_ + kMailboxOffset) + static_cast<std::size_t>(dir) * 2 + (k & 1u);
  }
  bool valid() const { return base_ != nullptr; }

 private:
  void reset() {
    if (base_) ::munmap(base_, kSegmentBytes);
    base_ = nullptr;
  }
  std::byte* base_ = nullptr;
};

}  // namespace detail
}  // namespace chorus::shm
