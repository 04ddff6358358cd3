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
/// Its pieces: sim/events.hpp (requests, messages, events and their queue) and sim/fibers.hpp
/// (the layout, the fibers' stacks, the cores, a rank's state), both included here.

#include <algorithm>
#include <boost/context/fiber.hpp>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "chorus/algo/group.hpp"
#include "chorus/core/error.hpp"
#include "chorus/core/request.hpp"
#include "chorus/sim/events.hpp"
#include "chorus/sim/fibers.hpp"
#include "chorus/sim/network.hpp"

namespace chorus::sim {

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
    if (!error_ && finished_ != n) error_ = std::make_exception_ptr(internal::deadlock_error(ranks_, now_));
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
  using Ev = internal::Ev;
  using Msg = internal::Msg;
  using Event = internal::Event;
  using Queue = internal::EventQueue;
  using Pair = internal::Pair;
  using Rank = internal::Rank;
  using Pool = internal::RequestPool;
  template <class T>
  using PoolAlloc = internal::PoolAlloc<T>;

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
    Pair* p = ranks_[static_cast<std::size_t>(dst)].pair(src, lane);
    if (p->head && p->sends != send) {
      Msg* m = p->head;
      p->head = m->next;
      if (!p->head) p->tail = nullptr;
      m->next = nullptr;
      return m;
    }
    Msg* m = msgs_.take();
    p->sends = send;
    (p->tail ? p->tail->next : p->head) = m;
    p->tail = m;
    return m;
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
    const double ahead = ranks_[static_cast<std::size_t>(to)].data_free_from(from, t);
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
      double& f = ranks_[static_cast<std::size_t>(m->dst)].pair(m->src, m->lane)->data_free;
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
    msgs_.give(m);
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
  internal::MsgSlabs msgs_;
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
