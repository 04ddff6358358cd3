// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// The simulator's messages and events (sim/engine.hpp runs them): a request of the simulator, a
/// message's state from its send to its delivery, the events of virtual time in their queue, the
/// unpaired sends or receives between two ranks, and the pool the requests come from.
///
/// Lean by design (4,096 ranks x thousands of messages each): events are plain structs in a
/// 4-ary heap (no std::function), messages come from a free list, an operation's request is
/// allocated from a pool and eager sends share one completed request.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include <sys/mman.h>

#include "chorus/core/error.hpp"
#include "chorus/core/request.hpp"

namespace chorus::sim {

/// A request of the simulator: chorus's RequestState (so that ChannelOp::req.test() works) with
/// the virtual time it completed at and the rank that waits for it.
struct SimRequest : detail::RequestState {
  SimRequest(int rank, int peer, const char* verb, std::size_t bytes, int lane_)
      : RequestState(rank, peer, detail::LazyOp{verb, static_cast<std::uint64_t>(lane_), bytes, &format},
                     std::chrono::milliseconds(0)),
        owner(rank),
        peer_rank(peer),
        lane(lane_),
        size(bytes) {}
  static std::string format(const char* verb, std::uint64_t lane, std::size_t bytes) {
    return std::string(verb) + " lane " + std::to_string(lane) + " (" + std::to_string(bytes) + " bytes)";
  }
  double t_done = 0;
  int owner, peer_rank, lane;
  std::size_t size;
};

/// The engine's own parts: sim::Engine names them as member types; nothing else uses them.
namespace internal {

enum class Ev : std::uint8_t { ready, rts, cts, arrive, deliver, wake };

struct Msg {
  int src = -1, dst = -1, lane = 0;
  std::size_t bytes = 0, recv_bytes = 0;
  bool rendezvous = false, has_send = false, has_recv = false, header = false;
  double posted_at = 0, delivered_at = 0, tx_start = 0, tx_end = 0;
  std::shared_ptr<SimRequest> send, recv;
  Msg* next = nullptr;  ///< the next of its Pair's queue
};

struct Event {
  double t;
  Msg* msg;
  int rank;
  Ev kind;
};

/// The events, earliest first by (time, sequence number): a 4-ary heap of 16-byte keys (the
/// time, and the sequence number above the index of the event's payload), the payloads apart.
/// Sift-downs compare keys only, which keeps the heap's walk in few cache lines.
class EventQueue {
 public:
  static constexpr int kSlotBits = 24;
  bool empty() const { return heap_.empty(); }
  double top_time() const { return heap_.front().t; }
  const Event& top() const { return slots_[heap_.front().seq_slot & ((1u << kSlotBits) - 1)]; }
  void clear() {
    heap_.clear();
    slots_.clear();
    free_.clear();
    seq_ = 0;
  }
  void push(const Event& e) {
    std::uint32_t slot;
    if (!free_.empty()) {
      slot = free_.back();
      free_.pop_back();
      slots_[slot] = e;
    } else {
      slot = static_cast<std::uint32_t>(slots_.size());
      if (slot >> kSlotBits) throw Error(ErrorCode::system, "sim: more than 2^24 events pending at once");
      slots_.push_back(e);
    }
    Key k{e.t, (seq_++ << kSlotBits) | slot};
    std::size_t i = heap_.size();
    heap_.push_back(k);
    while (i > 0) {
      const std::size_t parent = (i - 1) / 4;
      if (!less(k, heap_[parent])) break;
      heap_[i] = heap_[parent];
      i = parent;
    }
    heap_[i] = k;
  }
  Event pop() {
    const Key top = heap_[0];
    const Key last = heap_.back();
    heap_.pop_back();
    const std::size_t n = heap_.size();
    if (n > 0) {
      std::size_t i = 0;
      for (;;) {
        const std::size_t c = 4 * i + 1;
        if (c >= n) break;
        std::size_t m = c;
        const std::size_t end = std::min(c + 4, n);
        for (std::size_t j = c + 1; j < end; ++j)
          if (less(heap_[j], heap_[m])) m = j;
        if (!less(heap_[m], last)) break;
        heap_[i] = heap_[m];
        i = m;
      }
      heap_[i] = last;
    }
    const auto slot = static_cast<std::uint32_t>(top.seq_slot & ((1u << kSlotBits) - 1));
    free_.push_back(slot);
    return slots_[slot];
  }

 private:
  struct Key {
    double t;
    std::uint64_t seq_slot;
  };
  static bool less(const Key& a, const Key& b) { return a.t < b.t || (a.t == b.t && a.seq_slot < b.seq_slot); }
  std::vector<Key> heap_;
  std::vector<Event> slots_;
  std::vector<std::uint32_t> free_;
  std::uint64_t seq_ = 0;
};

/// Messages come from slabs of kSlab and are reused (a free list, most recent first).
class MsgSlabs {
 public:
  static constexpr std::size_t kSlab = 4096;
  Msg* take() {
    if (free_msgs_.empty()) {
      slabs_.push_back(std::make_unique<Msg[]>(kSlab));
      Msg* b = slabs_.back().get();
      for (std::size_t i = kSlab; i-- > 0;) free_msgs_.push_back(b + i);
    }
    Msg* m = free_msgs_.back();
    free_msgs_.pop_back();
    return m;
  }
  void give(Msg* m) {
    *m = Msg{};
    free_msgs_.push_back(m);
  }

 private:
  std::vector<Msg*> free_msgs_;
  std::vector<std::unique_ptr<Msg[]>> slabs_;  ///< every message made (they are reused)
};

/// The operations in flight between a receiver and one sender on one lane, not yet paired:
/// sends waiting for their receives, or receives for their sends (never both), oldest first,
/// linked through Msg::next.
struct Pair {
  int peer = -1, lane = 0;
  bool sends = false;  ///< what the queue holds
  double data_free = 0;  ///< when the data of its sender's messages started so far has left (control_queue_bytes)
  Msg *head = nullptr, *tail = nullptr;
};

/// A free list for the engine's requests (allocate_shared: object and control block in one),
/// carved from mappings of kChunk bytes, side by side (not among the heap's other blocks).
/// Not huge pages: with the kernel's defrag=madvise their faults compact memory, which cost
/// more system time than they saved (1,024 ranks, double tree of 512 MiB: 2.2-2.8 s system
/// against 0.8 s).
struct RequestPool {
  static constexpr std::size_t kChunk = std::size_t(2) << 20;
  std::vector<void*> free;
  std::vector<void*> chunks;
  std::size_t size = 0, carved = kChunk;  ///< block size; bytes used of the last chunk
  void* carve() {
    if (carved + size > kChunk) {
      void* c = ::mmap(nullptr, kChunk, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (c == MAP_FAILED) throw std::bad_alloc();
      chunks.push_back(c);
      carved = 0;
    }
    void* p = static_cast<std::byte*>(chunks.back()) + carved;
    carved += size;
    return p;
  }
  ~RequestPool() {
    for (void* c : chunks) ::munmap(c, kChunk);
  }
};
template <class T>
struct PoolAlloc {
  using value_type = T;
  RequestPool* pool;
  explicit PoolAlloc(RequestPool* p) : pool(p) {}
  template <class U>
  PoolAlloc(const PoolAlloc<U>& o) : pool(o.pool) {}
  static std::size_t rounded(std::size_t b) { return (b + alignof(std::max_align_t) - 1) / alignof(std::max_align_t) * alignof(std::max_align_t); }
  T* allocate(std::size_t n) {
    const std::size_t b = rounded(n * sizeof(T));
    if (pool->size == 0) pool->size = b;
    if (b != pool->size) return static_cast<T*>(::operator new(b));
    if (pool->free.empty()) return static_cast<T*>(pool->carve());
    void* p = pool->free.back();
    pool->free.pop_back();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, std::size_t n) {
    if (rounded(n * sizeof(T)) == pool->size) return pool->free.push_back(p);
    ::operator delete(p);
  }
  template <class U>
  bool operator==(const PoolAlloc<U>& o) const {
    return pool == o.pool;
  }
};

}  // namespace internal

}  // namespace chorus::sim
