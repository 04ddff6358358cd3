// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// shm::Link: two processes of one host, through a shared-memory segment (one ring per direction,
/// detail/segment.hpp) and a unix socket (doorbell and death notice, detail/socket.hpp).
///
/// Protocol (records in the ring towards the peer; see detail::Record):
/// * A message up to Policy::kEagerBytes is copied into the ring (`eager`) by isend itself when
///   there is room, so a small send costs one memcpy and, if the peer sleeps, one doorbell write.
/// * A larger one is announced (`rts`, with the address of the sender's buffer). The receiver,
///   once a receive matches it, pulls it with process_vm_readv (cross-memory attach: one copy,
///   straight into the posted buffer) and answers `fin`, which completes the send. Where CMA is
///   not allowed (the probe at connection fails, or CHORUS_SHM_CMA=0) it answers `cts` and the
///   sender streams the message through the ring in `data` records.
/// * Sizes must match: a receive of another size answers `fin` with the reject flag and both
///   sides fail with mismatch, as tcp does.
/// Unexpected eager messages are copied out of the ring (up to Policy::kMaxUnexpectedBytes per
/// link; past that the link stops draining and the sender waits for room).
///
/// Threading: every member is guarded by the transport's mutex (Hub::mu), taken by isend/irecv on
/// the caller's thread and by whichever thread drives the engine (a waiting caller, or the
/// background thread; see transport/progress.hpp). Requests are completed after that mutex is
/// released (Completions), since a completion may call back into the transport.
///
/// Files: this one has the Link (its state and the short members), detail/link_send.hpp the way
/// out, detail/link_receive.hpp the way in, detail/segment.hpp the rings and mailboxes.

#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "chorus/core/concepts.hpp"
#include "chorus/detail/log.hpp"
#include "chorus/transport/matching.hpp"
#include "chorus/transport/progress.hpp"
#include "chorus/transport/shell.hpp"
#include "chorus/transport/shm/detail/segment.hpp"
#include "chorus/transport/shm/detail/socket.hpp"

namespace chorus::shm {
namespace detail {

using chorus::detail::RequestState;
using ReqPtr = std::shared_ptr<RequestState>;

/// What the links of one transport share with its progress thread.
struct Hub {
  std::mutex mu;  ///< guards every link's state
  std::atomic<bool> kicked{false};
  std::atomic<int> sleeping{0};  ///< the progress thread blocks in poll()
  /// More ranks on this host than cores (set once at creation): a waiter gives its core away
  /// rather than spin (Link::await_mailbox, the engine's spin_wait).
  bool oversubscribed = false;
  Fd wake{::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)};

  /// Tells the progress thread there is work (a pull to run, sends queued, a receive unpaused).
  void kick() {
    kicked.store(true, std::memory_order_seq_cst);
    if (sleeping.load(std::memory_order_seq_cst) != 0 && sleeping.exchange(0) != 0) {
      const std::uint64_t one = 1;
      [[maybe_unused]] auto k = ::write(wake.get(), &one, sizeof one);
    }
  }
};

using chorus::detail::Completions;

using chorus::detail::EagerArrival;
using chorus::detail::RecvOp;
struct RtsArrival {
  std::uint64_t size;
  std::uint64_t id;
  std::uint64_t addr;
};
using Arrival = std::variant<EagerArrival, RtsArrival>;

/// A large message to pull from the peer's memory (progress thread, without the lock).
struct Pull {
  RecvOp recv;
  std::uint64_t id = 0;
  std::uint64_t addr = 0;
  std::uint64_t size = 0;
};

/// A record waiting for room in the ring; `stream` ones send `payload` in data records.
struct OutRecord {
  Record h;
  ConstBytes payload;
  ReqPtr req;  ///< completed once the whole payload is in the ring (eager, stream)
  bool stream = false;
  std::size_t offset = 0;
};

using chorus::detail::size_mismatch;

inline Record make_record(RecordType t, Tag tag, std::uint64_t size, std::uint64_t id = 0) {
  Record h;
  h.type = static_cast<std::uint32_t>(t);
  h.tag = tag;
  h.size = size;
  h.id = id;
  return h;
}

}  // namespace detail

class Link {
 public:
  /// `driver`: the transport's engine; waiters drive it, and a timeout aborts it.
  Link(int rank, int peer, detail::Hub& hub, std::chrono::milliseconds timeout, std::weak_ptr<chorus::detail::Driver> driver)
      : rank_(rank), peer_(peer), hub_(hub), requests_(rank, peer, timeout, std::move(driver)) {}
  Link(const Link&) = delete;
  Link& operator=(const Link&) = delete;

  int peer() const { return peer_; }
  /// Bytes this link holds: itself, its mapped segment and the eager messages waiting for their
  /// receives (at most Policy::kMaxUnexpectedBytes: the ring is not read past it).
  std::size_t memory_bytes() const { return sizeof(*this) + detail::kSegmentBytes + unexpected_bytes_; }

  /// Sends `data` on `tag`: eager, or rts and a pull or a stream (detail/link_send.hpp).
  Request isend(ConstBytes data, Tag tag);
  /// Receives into `data` on `tag` (detail/link_receive.hpp).
  Request irecv(MutableBytes data, Tag tag);
  /// This link's entry of a receive from any source (Communicator::irecv_any_bytes): `req` is
  /// shared by an entry on every link of the communicator, and the first link with a message of
  /// `tag` claims it, naming `source` as its sender (core/request.hpp). Returns the engine that
  /// completes it: this transport's engine.
  std::weak_ptr<chorus::detail::Driver> irecv_any(MutableBytes data, Tag tag, const std::shared_ptr<chorus::detail::RequestState>& req,
                                                  int source) {
    start_recv(detail::RecvOp{data, req, tag, source});
    return driver();
  }

  // ---- set-up (before the progress thread starts) ----

  /// Takes the connected socket and the mapped segment; `dir` is the ring this side writes.
  void attach(detail::Fd sock, detail::Mapping map, int dir, std::uint64_t peer_pid, bool cma) {
    detail::set_nonblocking(sock.get());
    sock_ = std::move(sock);
    map_ = std::move(map);
    out_ = detail::RingWriter(map_.control(dir), map_.data(dir));
    in_ = detail::RingReader(map_.control(1 - dir), map_.data(1 - dir));
    dir_ = dir;
    peer_pid_ = static_cast<pid_t>(peer_pid);
    cma_ = cma;
  }
  bool cma() const { return cma_; }

  // ---- mailboxes (algo/intranode/one_shot.hpp; detail/segment.hpp) ----
  // One communicator uses them (the one that owns the transport), one call at a time, so these
  // need no lock: the slots are shared memory with their own ordering, the count is the caller's.

  Link* shm_link() { return this; }
  /// The stamp of this link's next mailbox message, the same on both sides (both count the
  /// messages of the calls they make together).
  std::uint32_t next_mailbox_stamp() {
    if (++mailbox_count_ == 0) ++mailbox_count_;  // 0 marks a slot never written
    return mailbox_count_;
  }
  /// The stamp of the latest mailbox message (what next_mailbox_stamp() last returned).
  std::uint32_t mailbox_stamp() const { return mailbox_count_; }
  /// The slot this side writes the message with `stamp` into, and the one it reads the peer's.
  detail::MailboxSlot& mailbox_out(std::uint32_t stamp) { return *map_.mailbox(dir_, stamp); }
  const detail::MailboxSlot& mailbox_in(std::uint32_t stamp) const { return *map_.mailbox(1 - dir_, stamp); }
  /// Looks at the peer's mailbox message `stamp` alone for a moment, true once it is there (or
  /// the link broke): a running peer writes its message within a microsecond or so, and this
  /// costs no clock read, no lock and no yield to the kernel, which the driver's passes do.
  /// False at once where the host has more ranks than cores (the peer may need this core).
  bool await_mailbox(std::uint32_t stamp) const {
    if (hub_.oversubscribed) return false;
    const auto& slot = mailbox_in(stamp);
    for (int i = 0; i < kMailboxSpins; ++i) {
      if (slot.stamp.load(std::memory_order_acquire) == stamp || broken()) return true;
      chorus::detail::cpu_relax();
    }
    return false;
  }
  static constexpr int kMailboxSpins = 256;
  /// After a slot's stamp is stored: rings the doorbell if the peer sleeps.
  void mailbox_sent() {
    if (out_.take_reader_sleeping()) ring_doorbell();
  }
  /// True once the link broke (lock-free; what() then says why).
  bool broken() const { return failed_.load(std::memory_order_acquire); }
  /// Why the link broke.
  std::pair<ErrorCode, std::string> failure() const {
    std::lock_guard lk(hub_.mu);
    return {fail_code_, fail_why_};
  }
  /// The engine whose waiters make this link's progress.
  const std::weak_ptr<chorus::detail::Driver>& driver() const { return requests_.driver(); }

  // ---- progress thread, Hub::mu held ----

  /// Drains the incoming ring and writes what waits for room. True when anything moved.
  bool progress(detail::Completions& done) {
    if (failed_ || !map_.valid()) return false;
    bool moved = drain(done);
    if (!queue_.empty()) {
      const std::size_t before = queue_.size();
      const auto off = queue_.front().offset;
      pump(done);
      moved = moved || queue_.size() != before || (!queue_.empty() && queue_.front().offset != off);
    }
    return moved;
  }
  /// Something to read (lock-free: the progress thread's spin).
  bool has_input() const { return map_.valid() && !failed_ && !paused_ && !in_.empty(); }
  bool has_pull() const { return !pulls_.empty() && !pulling_; }

  /// Before blocking: ask the peer to ring the doorbell for input (and for room when needed).
  void set_sleeping(bool on) {
    if (failed_ || !map_.valid()) return;
    in_.set_sleeping(on);
    out_.set_sleeping(on && !queue_.empty());
  }
  /// The fd to poll while sleeping, or -1.
  int poll_fd() const { return failed_ ? -1 : sock_.get(); }

  /// The socket is readable: doorbell bytes, or EOF when the peer is gone.
  void on_readable(detail::Completions& done) {
    if (failed_) return;
    char buf[256];
    for (;;) {
      const ssize_t k = ::recv(sock_.get(), buf, sizeof buf, MSG_DONTWAIT);
      if (k > 0) continue;
      if (k < 0 && errno == EINTR) continue;
      if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      // EOF or a reset: the peer closed (exited, aborted, was killed). What it wrote is still in
      // the ring: keep it receivable, then break the link.
      drain(done);
      return fail(ErrorCode::peer_failure, "connection closed by the peer (it exited, aborted or was killed)", true, done);
    }
  }

  /// The next pull to run, if any (the progress thread runs it without the lock, then calls
  /// finish_pull).
  std::optional<detail::Pull> take_pull() {
    if (pulls_.empty() || pulling_ || failed_) return std::nullopt;
    detail::Pull p = std::move(pulls_.front());
    pulls_.pop_front();
    pulling_ = true;
    pull_cancel_.store(false);
    return p;
  }
  /// Copies a pull from the peer's memory (no lock held). Returns 0 or the errno that stopped it.
  int run_pull(const detail::Pull& p) const {
    std::size_t off = 0;
    while (off < p.size) {
      if (pull_cancel_.load(std::memory_order_relaxed)) return ECANCELED;
      const std::size_t len = std::min<std::size_t>(Policy::kPullChunkBytes, p.size - off);
      iovec local{p.recv.dst.data + off, len};
      iovec remote{reinterpret_cast<void*>(static_cast<std::uintptr_t>(p.addr + off)), len};
      const ssize_t k = ::process_vm_readv(peer_pid_, &local, 1, &remote, 1, 0);
      if (k < 0 && errno == EINTR) continue;
      if (k < 0) return errno;
      if (k == 0) return EFAULT;
      off += static_cast<std::size_t>(k);
    }
    return 0;
  }
  void finish_pull(detail::Pull p, int err, detail::Completions& done) {
    pulling_ = false;
    if (failed_) return done.fail(p.recv.req, fail_code_, fail_why_);
    if (err != 0) {
      const std::string why = std::string("cannot read the peer's buffer (process_vm_readv: ") + std::strerror(err) +
                              "): the peer is gone";
      done.fail(p.recv.req, ErrorCode::peer_failure, why);
      return fail(ErrorCode::peer_failure, why, true, done);
    }
    if (in_.writer_aborted())  // the sender gave up on it: its buffer may have been reused meanwhile
      return done.fail(p.recv.req, ErrorCode::peer_failure, "the peer aborted while its message was being read");
    done.complete(p.recv.req, p.size);
    enqueue(detail::make_record(detail::RecordType::fin, 0, p.size, p.id), done);
  }

  /// Breaks the link: fails everything pending with `code`; with `close`, shuts the socket down so
  /// the peer sees EOF at once (else its operations are only cancelled here: a collective
  /// mismatch reaches the peers as a message). Messages already received stay receivable.
  /// Idempotent.
  void fail(ErrorCode code, const std::string& why, bool close, detail::Completions& done) {
    if (failed_) return;
    failed_ = true;
    fail_code_ = code;
    fail_why_ = why;
    if (map_.valid()) out_.mark_aborted();
    if (close && sock_) ::shutdown(sock_.get(), SHUT_RDWR);
    chorus::detail::log(chorus::detail::LogLevel::info, chorus::detail::LogSubsys::shm, rank_, "shm link to peer ", peer_, " broken: ", why);
    matcher_.drain_posted([&](detail::RecvOp& r) { done.fail(r.req, code, why); });
    matcher_.remove_unexpected_from([](detail::Arrival& a) { return std::holds_alternative<detail::RtsArrival>(a); });
    for (auto& [id, a] : active_recv_) done.fail(a.recv.req, code, why);
    active_recv_.clear();
    for (auto& p : pulls_) done.fail(p.recv.req, code, why);
    pulls_.clear();
    if (pulling_) pull_cancel_.store(true);  // finish_pull fails it once the copy stopped
    for (auto& [id, s] : pending_sends_) done.fail(s.req, code, why);
    pending_sends_.clear();
    for (auto& o : queue_)
      if (o.req) done.fail(o.req, code, why);
    queue_.clear();
  }
  bool failed() const { return failed_; }

 private:
  struct PendingSend {
    ConstBytes data;
    detail::ReqPtr req;
  };
  struct ActiveRecv {
    detail::RecvOp recv;
    std::size_t received = 0;
  };

  detail::ReqPtr make_request(const char* verb, Tag tag, std::size_t bytes) {
    return chorus::detail::make_link_request(requests_, verb, tag, bytes);
  }

  void ring_doorbell() {
    const char b = 1;
    // EAGAIN: the socket is full of doorbells the peer has not read yet, so it wakes anyway.
    [[maybe_unused]] auto k = ::send(sock_.get(), &b, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
  }

  void enqueue(detail::Record h, detail::Completions& done) { post({h, {}, nullptr}, done); }

  /// Writes `o` at once when nothing waits before it and the ring has room (no queue operation on
  /// the common path), else queues it behind the others. True when nothing is left queued.
  bool post(detail::OutRecord o, detail::Completions& done);

  /// Writes queued records while there is room; true when the queue is empty.
  bool pump(detail::Completions& done);

  /// Reads every complete record of the incoming ring. True when any was read.
  bool drain(detail::Completions& done);

  /// Handles one record; false when it must stay in the ring (paused) or the link broke.
  bool on_record(const detail::Record& h, detail::Completions& done);

  /// Posts a receive, or matches it with what arrived (irecv, irecv_any).
  void start_recv(detail::RecvOp r);
  /// A receive met its message (caller's thread or progress thread); true when the progress
  /// thread has work for it (a pull).
  bool match(detail::RecvOp r, detail::Arrival a, detail::Completions& done);

  /// A large message and its receive have met: pull it (CMA), or clear the sender to stream it,
  /// or reject a size mismatch on both sides.
  void accept_rts(detail::RecvOp r, std::uint64_t size, std::uint64_t id, std::uint64_t addr,
                  detail::Completions& done);

  void protocol_error(const std::string& what, detail::Completions& done) {
    chorus::detail::log(chorus::detail::LogLevel::warn, chorus::detail::LogSubsys::shm, rank_, "shm peer ", peer_, ": protocol error: ", what);
    fail(ErrorCode::peer_failure, "protocol error from peer: " + what, true, done);
  }

  int rank_;
  int peer_;
  detail::Hub& hub_;
  chorus::detail::RequestFactory requests_;  ///< pooled request states, naming the engine

  detail::Fd sock_;
  detail::Mapping map_;
  detail::RingWriter out_;
  detail::RingReader in_;
  pid_t peer_pid_ = 0;
  bool cma_ = false;
  int dir_ = 0;                        ///< the direction this side writes (0: it is the lower rank)
  std::uint32_t mailbox_count_ = 0;   ///< mailbox messages so far (next_mailbox_stamp)

  chorus::detail::TagMatcher<detail::RecvOp, detail::Arrival> matcher_;
  chorus::detail::SpareBuffers spare_;
  chorus::detail::IdMap<PendingSend> pending_sends_;
  chorus::detail::IdMap<ActiveRecv> active_recv_;
  boost::circular_buffer<detail::OutRecord> queue_;
  boost::circular_buffer<detail::Pull> pulls_;
  bool pulling_ = false;
  std::atomic<bool> pull_cancel_{false};
  std::uint64_t next_send_id_ = 1;
  chorus::detail::ByteGauge unexpected_bytes_;  ///< eager messages waiting for their receives
  std::atomic<bool> paused_{false};  ///< atomic: the progress thread's lock-free spin reads these
  std::atomic<bool> failed_{false};
  ErrorCode fail_code_ = ErrorCode::peer_failure;
  std::string fail_why_;
};

}  // namespace chorus::shm

// The bodies of the way out and the way in.
#include "chorus/transport/shm/detail/link_receive.hpp"
#include "chorus/transport/shm/detail/link_send.hpp"
