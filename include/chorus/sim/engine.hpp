// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// The discrete-event engine: N virtual ranks, each a fiber (boost::context::fiber) that runs
/// chorus's own algorithm code through a sim::Channel, in virtual time over the network model of
/// sim/network.hpp.
///
/// Scheduling. Each rank has a clock. A rank runs until it waits for an operation that is not
/// complete (or polls one while its clock is ahead of the engine's time, Request::test()); the
/// next runnable rank then runs, in the order they became runnable. When none is runnable the
/// earliest event fires (events are ordered by (time, sequence number)) and the engine's time
/// moves to it. A rank woken at time t continues at max(its clock, t). Nothing depends on the
/// host's clock or on addresses: a run is deterministic, the same inputs give the same times.
///
/// Messages. isend/irecv pair up per (sender, receiver, lane) in order, as the real links match
/// (the k-th send meets the k-th receive). Events of a message: ready (its sender's overhead
/// after posting) -> arrival at the receiver's rx queue -> delivered; a rendezvous one has a
/// request-to-send and a clear-to-send first (sim/network.hpp). An eager send completes at once
/// (its bytes are in the link's hands, as with tcp and shm); a rendezvous send when its data
/// has left the tx queue; a receive when its data is delivered.
///
/// Lean by design (4,096 ranks x thousands of messages each): events are plain structs in a
/// 4-ary heap (no std::function), messages come from a free list, an operation's request is
/// allocated from a pool and eager sends share one completed request.

#include <algorithm>
#include <boost/context/fiber.hpp>
#include <boost/context/stack_context.hpp>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <iterator>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include <sys/mman.h>
#include <cstring>

#include "chorus/algo/group.hpp"
#include "chorus/core/error.hpp"
#include "chorus/core/request.hpp"
#include "chorus/sim/network.hpp"

namespace chorus::sim {

class Engine;

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

/// The layout: H hosts of L ranks, rank r on host r / L.
struct Layout {
  int hosts = 1;
  int ranks_per_host = 1;
  int ranks() const { return hosts * ranks_per_host; }
  int host_of(int r) const { return r / ranks_per_host; }
};

/// The fibers' stacks: one mapping of N stacks back to back, with transparent huge pages where
/// the kernel gives them, so that switching among thousands of ranks does not miss the TLB on
/// every switch. No guard pages (they would split the huge pages): after each run the engine
/// measures how deep each stack went (the mapping starts zeroed) and fails the run when one came
/// within kMargin of its end. Stacks start kColor bytes apart beyond their size: with a stride of
/// a power of two, the hot top lines of every stack would share a few cache sets (at 4,096 ranks
/// of 32 KiB, 64 sets of the L3 for 4,096 lines each), and every fiber switch would miss.
class Stacks {
 public:
  static constexpr std::size_t kMargin = 4096;
  static constexpr std::size_t kColor = 5 * 64;  ///< an odd number of cache lines

  Stacks(int n, std::size_t bytes)
      : n_(static_cast<std::size_t>(n)), bytes_((bytes + 4095) / 4096 * 4096), stride_(bytes_ + kColor) {
    base_ = static_cast<std::byte*>(::mmap(nullptr, n_ * stride_, PROT_READ | PROT_WRITE,
                                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));
    if (base_ == MAP_FAILED)
      throw Error(ErrorCode::system, "sim: mapping " + std::to_string(n_) + " fiber stacks of " + std::to_string(bytes_) +
                                         " bytes failed: " + std::strerror(errno));
#ifdef MADV_HUGEPAGE
    (void)::madvise(base_, n_ * stride_, MADV_HUGEPAGE);
#endif
  }
  ~Stacks() { ::munmap(base_, n_ * stride_); }
  Stacks(const Stacks&) = delete;
  Stacks& operator=(const Stacks&) = delete;

  /// A stack allocator (boost::context's StackAllocator) handing out stack r.
  struct Slot {
    std::byte* low;
    std::size_t size;
    boost::context::stack_context allocate() {
      boost::context::stack_context sc;
      sc.size = size;
      sc.sp = low + size;
      return sc;
    }
    void deallocate(boost::context::stack_context&) noexcept {}
  };
  Slot stack(int r) { return Slot{base_ + static_cast<std::size_t>(r) * stride_, bytes_}; }

  /// The deepest any stack has gone, in bytes (the lowest byte written, from the top).
  std::size_t high_water() const {
    std::size_t deepest = 0;
    for (std::size_t r = 0; r < n_; ++r) {
      const auto* low = reinterpret_cast<const std::uint64_t*>(base_ + r * stride_);
      std::size_t i = 0;
      const std::size_t words = bytes_ / 8;
      while (i < words && low[i] == 0) ++i;
      deepest = std::max(deepest, (words - i) * 8);
    }
    return deepest;
  }
  std::size_t bytes() const { return bytes_; }

 private:
  std::size_t n_, bytes_, stride_;
  std::byte* base_;
};

/// The cores of each pool (a host, or the machine where hosts share cores) as servers of compute:
/// each core keeps the intervals it is busy, and a piece of compute of d seconds that a rank
/// starts at its clock t takes the core that can fit [s, s + d) earliest, s >= t (a gap between
/// intervals booked earlier counts: ranks run in fiber order, not in virtual-time order, so a rank
/// behind another's clock still gets the core the other left free then). Deterministic: the same
/// order of requests gives the same intervals.
class CoreQueues {
 public:
  void clear() { pools_.clear(); }

  /// Books d seconds of compute on one of `cores` cores of `pool` from time t on; returns its end.
  double run(int pool, int cores, double t, double d) {
    if (!(d > 0)) return t;
    auto& p = pools_[pool];
    if (p.size() < static_cast<std::size_t>(cores)) p.resize(static_cast<std::size_t>(cores));
    std::size_t best = 0;
    double best_s = 0;
    for (std::size_t c = 0; c < p.size(); ++c) {
      const double s = fit(p[c], t, d);
      if (c == 0 || s < best_s) best = c, best_s = s;
    }
    p[best].emplace(best_s, best_s + d);
    return best_s + d;
  }

 private:
  using Busy = std::map<double, double>;  ///< start -> end, disjoint

  static double fit(const Busy& b, double t, double d) {
    auto it = b.upper_bound(t);
    double s = t;
    if (it != b.begin()) s = std::max(s, std::prev(it)->second);
    for (; it != b.end() && it->first < s + d; ++it) s = std::max(s, it->second);
    return s;
  }

  std::map<int, std::vector<Busy>> pools_;
};

class Engine {
 public:
  /// `stack_bytes`: each virtual rank's fiber stack (the algorithms went about 4 KiB deep at 64 ranks).
  Engine(const NetworkModel& model, Layout layout, std::size_t stack_bytes = 32 << 10)
      : m_(model.effective(layout.hosts, layout.ranks_per_host, 0)), base_(model), layout_(layout), stacks_(std::max(layout.ranks(), 1), stack_bytes) {
    m_.check();
    if (layout.hosts < 1 || layout.ranks_per_host < 1)
      throw Error(ErrorCode::invalid_argument, "sim: a layout needs at least one host of one rank");
    const auto n = static_cast<std::size_t>(layout.ranks());
    ranks_.resize(n);
    host_.resize(n);
    for (std::size_t r = 0; r < n; ++r) host_[r] = layout.host_of(static_cast<int>(r));
    intra_tx_.resize(n);
    intra_rx_.resize(n);
    const std::size_t nics = m_.nic_per_rank ? n : static_cast<std::size_t>(layout.hosts);
    nic_tx_.resize(nics);
    nic_rx_.resize(nics);
    done_send_ = std::allocate_shared<SimRequest>(PoolAlloc<SimRequest>(&pool_), -1, -1, "send", 0, 0);
    done_send_->complete(0);
    driver_ = std::make_shared<Poller>(*this);
  }
  /// Channels (and the requests their operations hold) go before their engine.
  ~Engine() = default;
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  /// The model as the current call sees it (NetworkModel::effective; the preset's is base_model()).
  const NetworkModel& model() const { return m_; }
  const NetworkModel& base_model() const { return base_; }
  /// Sets the memory tier and CPU sharing for a call of `bytes` per rank (sim::Executor does).
  void set_call_bytes(std::size_t bytes) {
    if (bytes != call_bytes_) m_ = base_.effective(layout_.hosts, layout_.ranks_per_host, call_bytes_ = bytes);
  }
  const Layout& layout() const { return layout_; }
  int size() const { return layout_.ranks(); }

  /// Runs `body(rank)` on every rank from virtual time 0 until all return. Throws the first
  /// rank's error, or a deadlock error naming the ranks still waiting and for what.
  template <class Body>
  void run(Body&& body) {
    namespace ctx = boost::context;
    reset();
    const int n = size();
    for (int r = 0; r < n; ++r) {
      Rank& k = ranks_[static_cast<std::size_t>(r)];
      k.self = ctx::fiber(std::allocator_arg, stacks_.stack(r), [this, r, &body](ctx::fiber&& back) {
        Rank& me = ranks_[static_cast<std::size_t>(r)];
        me.back = std::move(back);
        try {
          body(r);
        } catch (const Error& e) {
          if (!error_) error_ = std::current_exception();
        } catch (const std::exception& e) {
          if (!error_) error_ = std::current_exception();
        }
        me.finished = true;
        ++finished_;
        return std::move(me.back);
      });
      runnable_.push_back(r);
    }
    while (!error_) {
      while (head_ < runnable_.size() && !error_) {
        const int r = runnable_[head_++];
        current_ = r;
        Rank& k = ranks_[static_cast<std::size_t>(r)];
        k.clock = std::max(k.clock, now_);
        k.self = std::move(k.self).resume();
        current_ = -1;
      }
      runnable_.clear();
      head_ = 0;
      if (error_ || queue_.empty()) break;
      const Event e = queue_.pop();
      // The next event's message, fetched while this one fires.
      if (!queue_.empty())
        if (const Msg* next = queue_.top().msg) __builtin_prefetch(next), __builtin_prefetch(reinterpret_cast<const char*>(next) + 64);
      now_ = e.t;
      fire(e);
    }
    if (!error_ && finished_ != n) error_ = std::make_exception_ptr(deadlock());
    high_water_ = stacks_.high_water();
    if (!error_ && high_water_ + Stacks::kMargin > stacks_.bytes())
      error_ = std::make_exception_ptr(Error(ErrorCode::system, "sim: a rank's fiber stack went " + std::to_string(high_water_) +
                                                                   " bytes deep, within 4 KiB of its " +
                                                                   std::to_string(stacks_.bytes()) + " (give more)"));
    // Fibers still suspended unwind when destroyed (a rank that failed leaves the others waiting).
    for (Rank& k : ranks_) k.self = {};
    queue_.clear();
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }

  /// Virtual time of the engine (the last event's), and a rank's own clock.
  double now() const { return now_; }
  double& clock(int r) { return ranks_[static_cast<std::size_t>(r)].clock; }
  const double& clock(int r) const { return ranks_[static_cast<std::size_t>(r)].clock; }
  bool finished(int r) const { return ranks_[static_cast<std::size_t>(r)].finished; }
  /// Events fired and messages sent in the last run.
  std::uint64_t events() const { return fired_; }
  /// The deepest a fiber stack has gone so far (bytes).
  std::size_t stack_high_water() const { return high_water_; }
  std::uint64_t messages() const { return messages_; }

  // ---- what sim::Channel calls, on the fiber of rank `me` ----------------------------------------

  bool same_host(int a, int b) const { return host_[static_cast<std::size_t>(a)] == host_[static_cast<std::size_t>(b)]; }
  const LinkClass& link(int a, int b) const { return same_host(a, b) ? m_.intra : m_.inter; }

  Request isend(int me, int peer, std::size_t bytes, int lane) {
    check_peer(me, peer, "send");
    ++messages_;
    const LinkClass& c = link(me, peer);
    overhead(me, c);
    Rank& k = ranks_[static_cast<std::size_t>(me)];
    Msg* m = pair_up(peer, me, lane, /*send=*/true);
    m->src = me;
    m->dst = peer;
    m->bytes = bytes;
    m->lane = lane;
    m->rendezvous = bytes > c.eager_bytes;
    m->has_send = true;
    Request r;
    if (m->rendezvous) {
      m->send = make_request(me, peer, "send", bytes, lane);
      r = Request(m->send);
    } else {
      r = Request(done_send_);
    }
    if (m->has_recv) check_sizes(*m);
    // An eager message on a tx queue of the sender's own (its shm port, or its NIC with a NIC per
    // rank) enters it now: only this rank posts there, in the order of its clock. A shared NIC
    // takes messages in the order of their ready times, an event.
    if (!m->rendezvous && (same_host(me, peer) || m_.nic_per_rank))
      start_data(m, k.clock);
    else
      schedule(k.clock, Ev::ready, m);
    return r;
  }

  Request irecv(int me, int peer, std::size_t bytes, int lane) {
    check_peer(me, peer, "recv");
    Msg* m = pair_up(me, peer, lane, /*send=*/false);
    m->recv = make_request(me, peer, "recv", bytes, lane);
    m->recv_bytes = bytes;
    m->has_recv = true;
    m->posted_at = ranks_[static_cast<std::size_t>(me)].clock;
    Request r(m->recv);
    if (m->has_send) check_sizes(*m);
    if (m->header) {
      if (m->rendezvous)
        schedule(control_leaves(me, m->src, m->posted_at) + link(m->src, me).latency, Ev::cts, m);
      else
        finish_recv(m, m->delivered_at);
    }
    return r;
  }

  /// Blocks rank `me` until `q` completes, then advances its clock to the completion.
  void wait(int me, SimRequest& q) {
    Rank& k = ranks_[static_cast<std::size_t>(me)];
    if (!q.done()) {
      k.waiting = &q;
      suspend(k);
    }
    k.clock = std::max(k.clock, q.t_done);
  }

  /// Charges `seconds` of compute to rank `me`.
  void charge(int me, double seconds) { ranks_[static_cast<std::size_t>(me)].clock += seconds; }
  /// Charges `seconds` of rank `me`'s CPU work: at once, or `queued` for a core of its pool (the
  /// host's, or the machine's where hosts share cores) from its clock on.
  void cpu(int me, double seconds, bool queued) {
    if (!queued) return charge(me, seconds);
    const double t = clock(me);
    charge(me, on_core(me, t, seconds) - t);
  }
  /// Whether this layout's copies and reductions queue for cores (NetworkModel::queues_for_cores).
  bool cores_queue() const { return cores_queue_; }
  /// Books `seconds` of rank `me`'s CPU work on a core of its pool from t on; returns its end.
  double on_core(int me, double t, double seconds) {
    const int pool = m_.hosts_share_cores ? 0 : layout_.host_of(me);
    return cores_.run(pool, std::max(1, static_cast<int>(m_.cores + 0.5)), t, seconds);
  }
  /// When a transfer of `d` seconds that `me` (its sender or its receiver) could start at t
  /// starts: at t, or, where part of its link class's transfers is CPU work (LinkClass::cpu_share)
  /// and the model queues CPU work for cores, once a core of `me`'s pool is free for that part.
  double transfer_start(int me, const LinkClass& c, double t, double d) {
    if (!(c.cpu_share > 0) || !cores_queue_) return t;
    const double work = c.cpu_share * d;
    return on_core(me, t, work) - work;
  }
  /// A message's CPU overhead on rank `me` (its sender, or its receiver once it waited): queued
  /// for a core where the model queues overheads (NetworkModel::overhead_queues).
  void overhead(int me, const LinkClass& c) { cpu(me, c.overhead, overheads_queue_); }

 private:
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
  class Queue {
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

  /// The operations in flight between a receiver and one sender on one lane, not yet paired:
  /// sends waiting for their receives, or receives for their sends (never both), oldest first,
  /// linked through Msg::next.
  struct Pair {
    int peer = -1, lane = 0;
    bool sends = false;  ///< what the queue holds
    double data_free = 0;  ///< when the data of its sender's messages started so far has left (control_queue_bytes)
    Msg *head = nullptr, *tail = nullptr;
  };

  /// A rank's state, in one cache-line-aligned block with its first kInlinePairs pairs (a ring
  /// has one per receiver): a message touches its sender's and its receiver's block, not
  /// separate allocations of each.
  static constexpr int kInlinePairs = 2;
  struct alignas(64) Rank {
    boost::context::fiber self, back;
    double clock = 0;
    SimRequest* waiting = nullptr;
    void* sp = nullptr;  ///< where its fiber stopped last (suspend's frame)
    bool finished = false;
    int npairs = 0;  ///< pairs in use: the inline ones first, then `more`
    Pair pairs[kInlinePairs];
    std::vector<Pair> more;
  };

  /// A free list for the engine's requests (allocate_shared: object and control block in one),
  /// carved from mappings of kChunk bytes, side by side (not among the heap's other blocks).
  /// Not huge pages: with the kernel's defrag=madvise their faults compact memory, which cost
  /// more system time than they saved (1,024 ranks, double tree of 512 MiB: 2.2-2.8 s system
  /// against 0.8 s).
  struct Pool {
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
    ~Pool() {
      for (void* c : chunks) ::munmap(c, kChunk);
    }
  };
  template <class T>
  struct PoolAlloc {
    using value_type = T;
    Pool* pool;
    explicit PoolAlloc(Pool* p) : pool(p) {}
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

  /// Request::test() on a pending request polls: a rank whose clock is ahead of the engine's
  /// time lets the events up to its clock fire first, so what it sees complete is what would
  /// have completed by then.
  class Poller final : public detail::Driver {
   public:
    explicit Poller(Engine& e) : e_(e) {}
    void drive(const detail::RequestState&, Clock::time_point) override {}
    void drive_until(bool (*)(const void*), const void*, Clock::time_point) override {}
    void poll() override { e_.catch_up(); }
    void on_timeout(const Error&) override {}

   private:
    Engine& e_;
  };

  std::shared_ptr<SimRequest> make_request(int me, int peer, const char* verb, std::size_t bytes, int lane) {
    auto q = std::allocate_shared<SimRequest>(PoolAlloc<SimRequest>(&pool_), me, peer, verb, bytes, lane);
    q->set_driver(driver_);
    return q;
  }

  void reset() {
    cores_.clear();
    now_ = 0;
    fired_ = messages_ = 0;
    queue_.clear();
    finished_ = 0;
    current_ = -1;
    for (Rank& k : ranks_) {
      k.clock = 0, k.waiting = nullptr, k.sp = nullptr, k.finished = false;
      for (Pair& p : k.pairs) p = Pair{};
      k.npairs = 0;
      k.more.clear();
    }
    for (auto* v : {&intra_tx_, &intra_rx_, &nic_tx_, &nic_rx_})
      for (Server& s : *v) s = Server{};
  }

  // The checks inline to a comparison; their errors are built out of line (a frame with strings
  // in every isend would add cache lines to each rank's stack per message).
  void check_peer(int me, int peer, const char* op) const {
    if (peer < 0 || peer >= size() || peer == me) bad_peer(me, peer, op);
  }
  [[noreturn, gnu::noinline, gnu::cold]] void bad_peer(int me, int peer, const char* op) const {
    throw Error(ErrorCode::invalid_argument, ErrorContext{me, peer, op},
                "sim: peer " + std::to_string(peer) + " is not another rank of the " + std::to_string(size()));
  }
  void check_sizes(const Msg& m) const {
    if (m.bytes != m.recv_bytes) bad_sizes(m);
  }
  [[noreturn, gnu::noinline, gnu::cold]] static void bad_sizes(const Msg& m) {
    throw Error(ErrorCode::mismatch, ErrorContext{m.dst, m.src, "recv lane " + std::to_string(m.lane)},
                "sim: a message of " + std::to_string(m.bytes) + " bytes met a receive of " +
                    std::to_string(m.recv_bytes) + " bytes");
  }

  /// The message of the next send (send) or receive from `src` to `dst` on `lane`: the oldest
  /// unpaired one of the other side, or a new one.
  Msg* pair_up(int dst, int src, int lane, bool send) {
    Pair* p = find_pair(ranks_[static_cast<std::size_t>(dst)], src, lane);
    if (p->head && p->sends != send) {
      Msg* m = p->head;
      p->head = m->next;
      if (!p->head) p->tail = nullptr;
      m->next = nullptr;
      return m;
    }
    Msg* m = new_msg();
    p->sends = send;
    (p->tail ? p->tail->next : p->head) = m;
    p->tail = m;
    return m;
  }
  Pair* find_pair(Rank& k, int src, int lane) {
    const int inl = std::min(k.npairs, kInlinePairs);
    for (int i = 0; i < inl; ++i)
      if (k.pairs[i].peer == src && k.pairs[i].lane == lane) return &k.pairs[i];
    for (Pair& q : k.more)
      if (q.peer == src && q.lane == lane) return &q;
    Pair* p = k.npairs < kInlinePairs ? &k.pairs[k.npairs] : &k.more.emplace_back();
    ++k.npairs;
    p->peer = src;
    p->lane = lane;
    return p;
  }

  /// Messages come from slabs of kSlab and are reused (a free list, most recent first).
  static constexpr std::size_t kSlab = 4096;
  Msg* new_msg() {
    if (free_msgs_.empty()) {
      slabs_.push_back(std::make_unique<Msg[]>(kSlab));
      Msg* b = slabs_.back().get();
      for (std::size_t i = kSlab; i-- > 0;) free_msgs_.push_back(b + i);
    }
    Msg* m = free_msgs_.back();
    free_msgs_.pop_back();
    return m;
  }
  void free_msg(Msg* m) {
    *m = Msg{};
    free_msgs_.push_back(m);
  }

  void schedule(double t, Ev kind, Msg* m, int rank = -1) { queue_.push(Event{t, m, rank, kind}); }

  Server& tx(int src, int dst) {
    if (same_host(src, dst)) return intra_tx_[static_cast<std::size_t>(src)];
    return nic_tx_[static_cast<std::size_t>(m_.nic_per_rank ? src : host_[static_cast<std::size_t>(src)])];
  }
  Server& rx(int src, int dst) {
    if (same_host(src, dst)) return intra_rx_[static_cast<std::size_t>(dst)];
    return nic_rx_[static_cast<std::size_t>(m_.nic_per_rank ? dst : host_[static_cast<std::size_t>(dst)])];
  }

  /// When a request-to-send or clear-to-send that `from` has ready at t leaves for `to`: at once,
  /// or, between hosts with NetworkModel::control_queue_bytes, once the data from `from` to `to`
  /// already on its way has left, at most that many bytes of it (it takes no time of the NIC).
  double control_leaves(int from, int to, double t) {
    if (!(m_.control_queue_bytes > 0) || same_host(from, to)) return t;
    double ahead = t;
    Rank& k = ranks_[static_cast<std::size_t>(to)];
    const int inl = std::min(k.npairs, kInlinePairs);
    for (int i = 0; i < inl; ++i)
      if (k.pairs[i].peer == from) ahead = std::max(ahead, k.pairs[i].data_free);
    for (const Pair& q : k.more)
      if (q.peer == from) ahead = std::max(ahead, q.data_free);
    return std::min(ahead, t + m_.control_queue_bytes / m_.inter.bandwidth);
  }

  /// The data enters the sender's tx queue now.
  void start_data(Msg* m, double ready) {
    const LinkClass& c = link(m->src, m->dst);
    Server& s = tx(m->src, m->dst);
    m->tx_start = std::max(ready, s.free);
    const double busy = s.serve(m->tx_start, static_cast<double>(m->bytes), c.bandwidth, c.burst_bytes);
    m->tx_start = transfer_start(m->src, c, m->tx_start, busy);
    m->tx_end = m->tx_start + busy;
    s.free = m->tx_end;
    if (m_.control_queue_bytes > 0 && !same_host(m->src, m->dst)) {
      double& f = find_pair(ranks_[static_cast<std::size_t>(m->dst)], m->src, m->lane)->data_free;
      f = std::max(f, m->tx_end);
    }
    if (m->rendezvous) complete(*m->send, m->tx_end);
    // Delivered at once if the receiver's rx queue is free on arrival; the arrive event checks
    // that (one event per message where nothing contends, two where the rx queue was busy).
    schedule(std::max(m->tx_start + c.latency + static_cast<double>(m->bytes) / c.bandwidth, m->tx_end + c.latency),
             Ev::arrive, m);
  }

  void fire(const Event& e) {
    ++fired_;
    Msg* m = e.msg;
    switch (e.kind) {
      case Ev::ready:
        if (m->rendezvous) {
          const LinkClass& c = link(m->src, m->dst);
          schedule(control_leaves(m->src, m->dst, now_) + c.latency + c.handshake, Ev::rts, m);
        } else {
          start_data(m, now_);
        }
        return;
      case Ev::rts:
        m->header = true;
        if (m->has_recv)
          schedule(control_leaves(m->dst, m->src, std::max(now_, m->posted_at)) + link(m->src, m->dst).latency, Ev::cts, m);
        return;
      case Ev::cts: start_data(m, now_); return;
      case Ev::arrive:
        if (arrive(m)) deliver(m);
        return;
      case Ev::deliver: deliver(m); return;
      case Ev::wake: return make_runnable(e.rank);
    }
  }

  /// now: the delivery had the receiver's rx queue been free. The queue serves messages in the
  /// order of these times (their arrival order, where sizes are equal). True when delivered now.
  bool arrive(Msg* m) {
    const LinkClass& c = link(m->src, m->dst);
    Server& s = rx(m->src, m->dst);
    double start = std::max(m->tx_start + c.latency, s.free);
    const double busy = s.serve(start, static_cast<double>(m->bytes), c.bandwidth, c.burst_bytes);
    start = transfer_start(m->dst, c, start, busy);
    const double delivered = std::max(start + busy, m->tx_end + c.latency);
    s.free = delivered;
    if (delivered <= now_) return true;
    schedule(delivered, Ev::deliver, m);
    return false;
  }

  void deliver(Msg* m) {
    m->delivered_at = now_;
    if (m->rendezvous) return finish_recv(m, now_);
    m->header = true;
    if (m->has_recv) finish_recv(m, now_);
  }

  void finish_recv(Msg* m, double t) {
    complete(*m->recv, t);
    free_msg(m);
  }

  void complete(SimRequest& q, double t) {
    // Its lines at once, rather than one miss after another as complete() walks them.
    for (std::size_t i = 0; i < sizeof(SimRequest); i += 64) __builtin_prefetch(reinterpret_cast<const char*>(&q) + i, 1);
    q.t_done = t;
    q.complete(q.size);
    if (q.owner < 0) return;
    Rank& k = ranks_[static_cast<std::size_t>(q.owner)];
    if (k.waiting == &q) {
      k.waiting = nullptr;
      make_runnable(q.owner);
    }
  }

  /// With thousands of ranks a rank's stack has left the cache by the time it runs again, and
  /// resuming it would miss on one line after another as it returns through its frames: the
  /// lines around where it stopped are fetched together, as soon as it is known to run.
  void make_runnable(int r) {
    const auto* sp = static_cast<const char*>(ranks_[static_cast<std::size_t>(r)].sp);
    if (sp)
      for (int i = -kPrefetchBelow; i < kPrefetchAbove; i += 64) __builtin_prefetch(sp + i, 1);
    runnable_.push_back(r);
  }
  static constexpr int kPrefetchBelow = 256, kPrefetchAbove = 1024;

  void suspend(Rank& k) {
    k.sp = __builtin_frame_address(0);
    k.back = std::move(k.back).resume();
  }

  void catch_up() {
    if (current_ < 0) return;
    Rank& k = ranks_[static_cast<std::size_t>(current_)];
    // Nothing fires before its clock: what it polls cannot change by waiting.
    if (k.clock <= now_ || queue_.empty() || queue_.top_time() >= k.clock) return;
    schedule(k.clock, Ev::wake, nullptr, current_);
    suspend(k);
  }

  Error deadlock() const {
    std::string s;
    int shown = 0, stuck = 0;
    for (int r = 0; r < size(); ++r) {
      const Rank& k = ranks_[static_cast<std::size_t>(r)];
      if (k.finished) continue;
      ++stuck;
      if (shown++ >= 8) continue;
      s += "; rank " + std::to_string(r);
      if (k.waiting)
        s += " waits for " + k.waiting->context().op + " from/to peer " + std::to_string(k.waiting->peer_rank);
      else
        s += " is not waiting for a message";
    }
    return Error(ErrorCode::timeout, "sim: no event left at virtual time " + std::to_string(now_) + " s while " +
                                         std::to_string(stuck) + " of " + std::to_string(size()) +
                                         " ranks have not finished" + s);
  }

  NetworkModel m_, base_;
  std::size_t call_bytes_ = 0;
  Layout layout_;
  bool cores_queue_ = base_.queues_for_cores(layout_.hosts, layout_.ranks_per_host);  ///< CPU work queues for cores (NetworkModel::core_queues)
  bool overheads_queue_ = base_.overhead_queues && cores_queue_;
  Stacks stacks_;
  std::vector<Rank> ranks_;
  std::vector<int> host_;  ///< per rank
  std::vector<Server> intra_tx_, intra_rx_, nic_tx_, nic_rx_;
  Queue queue_;
  std::vector<int> runnable_;
  std::size_t head_ = 0;
  std::vector<Msg*> free_msgs_;
  std::vector<std::unique_ptr<Msg[]>> slabs_;  ///< every message made (they are reused)
  Pool pool_;
  std::shared_ptr<SimRequest> done_send_;
  std::shared_ptr<Poller> driver_;
  double now_ = 0;
  std::uint64_t fired_ = 0, messages_ = 0;
  int finished_ = 0, current_ = -1;
  std::size_t high_water_ = 0;
  std::exception_ptr error_;
  CoreQueues cores_;  ///< the call's cores, where CPU work queues for them (NetworkModel::core_queues)
};

}  // namespace chorus::sim
