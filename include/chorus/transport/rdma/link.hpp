// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// rdma::Link: one reliable-connected queue pair to one peer, over the verbs seam
/// (detail/verbs.hpp).
///
/// Protocol. Every message that lands in the peer's memory by itself carries a Header:
/// * **eager** (payload up to Policy::kEagerBytes): header and payload are sent (ibv send, inline
///   below the QP's max_inline_data, else from a registered send slot) into one of the
///   Policy::kSlots receive slots the peer keeps posted. isend completes when it is posted: the
///   bytes were copied.
/// * **rts** (larger): the sender registers its buffer and announces the message (tag, size, id).
///   Once a receive matches it, the receiver registers the receive buffer and answers **cts** with
///   its address and rkey (or with the reject flag when the sizes differ: both sides then fail with
///   mismatch). The sender RDMA-writes the message straight into the receive buffer in chunks of
///   Policy::kChunkBytes, the last one with immediate data (the id): its arrival completes the
///   receive, its completion at the sender completes the send. Zero copies; the algorithms' slices
///   are separate messages, so a ring all_reduce reduces slice k while slice k+1 is written.
/// * **credits**: a message that consumes one of the peer's receive slots (eager, rts, cts, the
///   final write with immediate) takes a credit; the receiver reposts each slot once it has copied
///   it out and returns credits in batches by an RDMA write (no slot taken) of its running count,
///   with its complement so a torn read is never believed, into the sender's credit block. A
///   sender without credit (or send-queue room) queues, and the engine's next pass posts.
/// * **abort**: a link that fails with a reason the peer should hear writes the peer's abort word
///   (another RDMA write), so the peer fails too instead of waiting for its timeout.
/// Registrations (detail/registration.hpp): a large message's buffer is registered before the rts
/// and on the receive's match; from the cache when it is memory chorus owns (the host executor's scratch),
/// else for that message alone, deregistered when it completes or fails: no cached key can name
/// memory that was freed and reused. The transport's own slots and credit blocks are registered
/// once (transport.hpp). At most Policy::kMaxRegistered messages per direction hold one at a
/// time: a matched receive past the cap waits for an earlier one to complete before its cts goes;
/// a send past the cap announces itself unregistered and registers once cleared, taking the
/// registration of a send whose writes have not started if need be. So a registration waits only
/// for writes already under way, never for a receive the program has yet to post.
/// Device memory (dma-buf): a link whose NIC registers dma-bufs takes device buffers as they are
/// (device_memory(), which the call's channel asks before it stages a message). A device buffer
/// always takes the rts/cts path (no eager copy can target device memory), so the channel hands
/// over only messages above the eager size, and each side decides for its own buffer alone: a
/// message above the eager size is rts on the wire whatever memory it is in, so a rank that stages
/// (its NIC or runtime has no dma-buf) meets one that does not. Its registration is made per
/// message (detail/registration.hpp: export_dmabuf, reg_dmabuf_mr) and released when it
/// completes. A receive into device memory that meets an eager message fails with mismatch and
/// writes nothing.
///
/// Files: this one has the Link (its state and the short members), detail/wire.hpp what both ends
/// agree on, detail/link_send.hpp the way out, detail/link_receive.hpp the way in.
///
/// Threading: every member is guarded by the transport's mutex (Hub::mu), taken by isend/irecv on
/// the caller's thread and by whichever thread drives the engine (transport/progress.hpp).
/// Requests complete after that mutex is released (Completions).

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "chorus/core/concepts.hpp"
#include "chorus/detail/log.hpp"
#include "chorus/device/runtime.hpp"
#include "chorus/transport/matching.hpp"
#include "chorus/transport/rdma/detail/registration.hpp"
#include "chorus/transport/rdma/detail/verbs.hpp"
#include "chorus/transport/rdma/detail/wire.hpp"
#include "chorus/transport/shell.hpp"

namespace chorus::rdma {
namespace detail {

// --- device memory (dma-buf) -------------------------------------------------------------------
/// Device memory of one transport's links, guarded by Hub::mu: whether the NIC registers
/// dma-bufs (probed at set-up), and the device runtime whose buffers go zero-copy, bound by the
/// first Link::device_memory that exported one of its buffers.
struct DeviceAccess {
  bool nic = false;
  std::string device;                  ///< the NIC's name, for the log
  device::Runtime* runtime = nullptr;  ///< bound: its buffers go zero-copy
  device::Runtime* refused = nullptr;  ///< a runtime that exports no dma-buf: its buffers are staged
  bool told = false;                   ///< the path device buffers take was logged
  std::uint64_t registrations = 0;     ///< dma-buf registrations made for messages
};
// --- end of device memory (dma-buf) ------------------------------------------------------------

/// What the links of one transport share with its driver: the lock over every link, the CQ and
/// the verbs calls, the wake-up of a driver sleeping in poll(), and the device memory state.
struct Hub {
  std::mutex mu;
  DeviceAccess device;
  std::atomic<bool> sleeping{false};
  int wake = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);

  Hub() = default;
  Hub(const Hub&) = delete;
  Hub& operator=(const Hub&) = delete;
  ~Hub() {
    if (wake >= 0) ::close(wake);
  }
  /// Wakes a sleeping driver (work was queued that no completion will announce).
  void kick() {
    if (sleeping.load(std::memory_order_seq_cst)) {
      const std::uint64_t one = 1;
      [[maybe_unused]] auto k = ::write(wake, &one, sizeof one);
    }
  }
};

/// What the engine keeps for every link and the links read (registered memory and its keys).
struct Memory {
  std::byte* recv_slots = nullptr;  ///< kSlots * kSlotBytes, local write
  std::byte* send_slots = nullptr;  ///< kSlots * kSlotBytes
  CreditBlock* credits_in = nullptr;  ///< the peer writes here (remote write)
  CreditBlock* credits_out = nullptr;  ///< this side's values, the source of its writes
  std::uint32_t lkey = 0;
};

}  // namespace detail

using chorus::detail::Completions;

class Link {
 public:
  Link(int rank, int peer, detail::Hub& hub, Verbs& verbs, RegistrationCache& regs, detail::Memory mem,
       std::chrono::milliseconds timeout, std::weak_ptr<chorus::detail::Driver> driver)
      : rank_(rank), peer_(peer), hub_(hub), verbs_(verbs), regs_(regs), mem_(mem), requests_(rank, peer, timeout, std::move(driver)) {
    free_send_slots_.reserve(Policy::kSlots);
    for (std::uint32_t i = 0; i < Policy::kSlots; ++i) free_send_slots_.push_back(Policy::kSlots - 1 - i);
  }
  Link(const Link&) = delete;
  Link& operator=(const Link&) = delete;
  ~Link() {
    if (qp_) verbs_.destroy_qp(qp_);
    if (ctl_qp_) verbs_.destroy_qp(ctl_qp_);
  }

  int peer() const { return peer_; }
  std::size_t memory_bytes() const { return sizeof(*this) + 2 * Policy::kSlots * Policy::kSlotBytes + unexpected_bytes_; }

  /// Sends `data` on `tag`: eager, or rts and RDMA writes (detail/link_send.hpp).
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
    return requests_.driver();
  }

  // --- device memory (dma-buf) -----------------------------------------------------------------
  /// True when this link takes `bytes` of `rt`'s device memory at `p` as it is (zero-copy): for a
  /// message above the eager size, where the NIC registers dma-bufs and `rt` exports them (the
  /// first ask with a runtime exports `p` once to find out). Else the caller stages the message
  /// through host memory. Says at INFO, once per transport, which path device buffers take.
  bool device_memory(device::Runtime& rt, const void* p, std::size_t bytes) {
    if (bytes <= kEagerBytes) return false;
    std::lock_guard lk(hub_.mu);
    auto& d = hub_.device;
    if (d.runtime == &rt) return true;
    if (!d.nic) return say_staged(d, d.device + " does not register dma-bufs");
    if (d.refused == &rt) return false;
    if (d.runtime) return say_staged(d, "another device runtime is bound to this transport");
    try {
      const auto x = rt.export_dmabuf(const_cast<void*>(p), bytes);
      ::close(x.fd);
    } catch (const Error& e) {
      if (e.code() != ErrorCode::unsupported) {
        chorus::detail::log(chorus::detail::LogLevel::warn, chorus::detail::LogSubsys::rdma, rank_, "rdma peer ", peer_,
                            ": a device buffer could not be exported, so it is staged: ", e.what());
        return false;
      }
      d.refused = &rt;
      d.told = false;
      return say_staged(d, std::string("the ") + std::string(rt.name()) + " runtime exports no dma-buf (" + e.what() + ")");
    }
    d.runtime = &rt;
    chorus::detail::log(chorus::detail::LogLevel::info, chorus::detail::LogSubsys::rdma, rank_, "rdma: device buffers above ", kEagerBytes,
                        " bytes go zero-copy (dma-buf registration on ", d.device, ", ", rt.name(), " runtime)");
    return true;
  }
  // --- end of device memory (dma-buf) ----------------------------------------------------------

  // ---- set-up (transport.hpp, before any traffic) ----

  Qp* qp() const { return qp_; }
  /// The second QP to the peer, which carries nothing but this side's abort: when the data QP
  /// breaks (an error completion moves it to ERROR, where nothing more goes out), the peer still
  /// hears why, instead of waiting for its timeout.
  Qp* control_qp() const { return ctl_qp_; }
  void set_qp(Qp* qp, Qp* control, std::uint32_t max_inline) {
    qp_ = qp;
    ctl_qp_ = control;
    max_inline_ = max_inline;
    inline_buf_.resize(max_inline);
  }
  /// Where the peer writes credits and aborts (its CreditBlock for this side), with its rkey.
  void set_remote_credits(std::uint64_t addr, std::uint32_t rkey) {
    remote_credits_ = addr;
    remote_rkey_ = rkey;
  }
  /// The address of this link's credit block, which the peer writes.
  std::uint64_t credits_address() const { return reinterpret_cast<std::uintptr_t>(mem_.credits_in); }
  /// Posts every receive slot (after the QP left RESET). Throws VerbsError.
  void post_slots() {
    for (std::uint32_t i = 0; i < Policy::kSlots; ++i) repost(i);
  }

  // ---- the driver (engine mutex held) ----

  /// A completion of this link's work request.
  void on_completion(const Wc& wc, Completions& done);

  /// Credits and aborts the peer wrote, credits owed, queued work. True when anything moved.
  bool progress(Completions& done) {
    if (failed_) return false;
    const auto& in = *mem_.credits_in;
    const std::uint64_t ab = std::atomic_ref<const std::uint64_t>(in.aborted).load(std::memory_order_acquire);
    if (ab != 0 && std::atomic_ref<const std::uint64_t>(in.aborted_check).load(std::memory_order_acquire) == ~ab) {
      fail(ErrorCode::peer_failure, "the peer aborted (it failed or was destroyed)", false, done);
      return true;
    }
    const std::uint64_t ret = std::atomic_ref<const std::uint64_t>(in.returned).load(std::memory_order_acquire);
    bool moved = false;
    if (ret != returned_ && std::atomic_ref<const std::uint64_t>(in.returned_check).load(std::memory_order_acquire) == ~ret &&
        ret > returned_ && ret <= used_) {
      returned_ = ret;
      moved = true;
    }
    return pump(done) || moved;
  }
  /// True when queued work waits for credits (the peer's credit write wakes nobody: the driver
  /// sleeps briefly then).
  bool starved() const { return !failed_ && !queue_.empty(); }

  /// Breaks the link: fails everything pending, deregisters the user buffers, moves the QP to
  /// ERROR; with `tell`, first writes the peer's abort word so it fails at once too. Idempotent.
  void fail(ErrorCode code, const std::string& why, bool tell, Completions& done) {
    if (failed_) return;
    if (tell && (qp_ || ctl_qp_) && remote_rkey_ != 0) {
      auto& out = *mem_.credits_out;
      out.aborted = 1;
      out.aborted_check = ~std::uint64_t(1);
      const SendWr wr = credit_block_write(detail::WrKind::abort, &out.aborted, offsetof(detail::CreditBlock, aborted));
      // Best effort: the peer may be gone. Over the control QP, which no error of the data QP
      // reaches; over the data QP where there is none.
      (void)verbs_.post_send(ctl_qp_ ? ctl_qp_ : qp_, wr);
    }
    failed_ = true;
    fail_code_ = code;
    fail_why_ = why + " (rdma link to rank " + std::to_string(peer_) + ")";
    chorus::detail::log(chorus::detail::LogLevel::info, chorus::detail::LogSubsys::rdma, rank_, "rdma link to peer ", peer_, " broken: ", why);
    if (qp_) (void)verbs_.set_qp_error(qp_);  // the control QP stays: the abort write is on it
    matcher_.drain_posted([&](detail::RecvOp& r) { done.fail(r.req, code, fail_why_); });
    matcher_.remove_unexpected_from([](detail::Arrival& a) { return std::holds_alternative<detail::RtsArrival>(a); });
    for (auto& [id, r] : recvs_) done.fail(r.recv.req, code, fail_why_);
    recvs_.clear();  // deregisters: nothing is written to these buffers any more
    for (auto& d : deferred_) done.fail(d.recv.req, code, fail_why_);
    deferred_.clear();
    for (auto& [id, s] : sends_) done.fail(s.req, code, fail_why_);
    sends_.clear();
    send_regs_ = 0;
    for (auto& o : queue_)
      if (o.req) done.fail(o.req, code, fail_why_);
    queue_.clear();
  }
  bool failed() const { return failed_; }
  std::pair<ErrorCode, std::string> failure() const { return {fail_code_, fail_why_}; }

 private:
  static constexpr std::size_t kEagerBytes = Policy::kSlotBytes - sizeof(detail::Header);
  static constexpr const char* kNoDeviceMemory =
      "a buffer in device memory, which this rdma transport does not take (no dma-buf registration: "
      "Link::device_memory said no); device buffers go through host staging";
  /// One inline message in this many asks for a completion (the others' queue slots are freed
  /// with it).
  static constexpr std::uint32_t kSignalEvery = 32;

  /// Kicks the driver, after the lock is released, when isend/irecv left work queued.
  struct Kick {
    detail::Hub& hub;
    bool needed = false;
    ~Kick() {
      if (needed) hub.kick();
    }
  };

  struct PendingSend {
    ConstBytes data;
    detail::ReqPtr req;
    Registration mr;
    std::uint64_t remote_addr = 0;  ///< from the cts
    std::uint32_t rkey = 0;
    bool writing = false;  ///< its first write was posted: its registration frees by itself
  };
  struct ActiveRecv {
    detail::RecvOp recv;
    Registration mr;
  };
  /// A receive matched to an rts while kMaxRegistered receives held registrations.
  struct DeferredRecv {
    detail::RecvOp recv;
    std::uint32_t id;
  };
  /// Work waiting for credits or send-queue room, in order.
  struct Out {
    enum Kind { message, write } kind;
    detail::Header h;      ///< message: its header
    ConstBytes payload;    ///< message: eager payload
    detail::ReqPtr req;    ///< message: completed once posted (eager)
    std::uint32_t id;      ///< write: the message
    std::uint64_t offset;  ///< write: the next chunk's
  };

  // --- device memory (dma-buf) -----------------------------------------------------------------
  /// The registration of a message's buffer: per message through a dma-buf for device memory (of
  /// the runtime device_memory bound), else from the cache; empty with `why` when it cannot be.
  Registration register_buffer(const std::byte* p, std::size_t n, MemoryKind kind, std::string& why) {
    if (kind == MemoryKind::device) {
      Registration r = regs_.get_device(*hub_.device.runtime, const_cast<std::byte*>(p), n, why);
      if (r) ++hub_.device.registrations;
      if (!r) why = "registering " + std::to_string(n) + " bytes of device memory with the RDMA device failed: " + why;
      return r;
    }
    int err = 0;
    Registration r = regs_.get(const_cast<std::byte*>(p), n, err);
    if (!r) why = registration_error(n, err);
    return r;
  }
  /// Logs, once per transport, why device buffers go through host staging; false.
  bool say_staged(detail::DeviceAccess& d, const std::string& why) {
    if (!d.told)
      chorus::detail::log(chorus::detail::LogLevel::info, chorus::detail::LogSubsys::rdma, rank_, "rdma: device buffers go through pinned host staging: ", why);
    d.told = true;
    return false;
  }
  // --- end of device memory (dma-buf) ----------------------------------------------------------

  std::string registration_error(std::size_t bytes, int err) const {
    return "registering " + std::to_string(bytes) + " bytes with the RDMA device failed (" + std::strerror(err) +
           (err == ENOMEM ? "; raise the locked-memory limit, ulimit -l" : "") + ")";
  }

  std::byte* recv_slot(std::uint32_t i) const { return mem_.recv_slots + std::size_t(i) * Policy::kSlotBytes; }
  std::byte* send_slot(std::uint32_t i) const { return mem_.send_slots + std::size_t(i) * Policy::kSlotBytes; }

  void repost(std::uint32_t slot) {
    RecvWr wr;
    wr.wr_id = detail::make_wr(detail::WrKind::recv_slot, peer_, slot);
    wr.sge = {reinterpret_cast<std::uintptr_t>(recv_slot(slot)), static_cast<std::uint32_t>(Policy::kSlotBytes), mem_.lkey};
    if (const int e = verbs_.post_recv(qp_, wr); e != 0) throw VerbsError{"ibv_post_recv", e};
  }

  /// Posts queued work while credits and send-queue room last; then returns owed credits. True
  /// when anything was posted.
  bool pump(Completions& done);

  /// Registers a cleared send that holds no registration, taking one from a send whose writes have
  /// not started when kMaxRegistered are held. False when every one is on writes under way, or
  /// the device refused (the link failed).
  bool register_send(PendingSend& s, Completions& done);
  void release_send(PendingSend& s);

  /// Room on the send queue (one entry kept for a credit write), and a credit where the work
  /// request takes one of the peer's receive slots.
  bool room(bool takes_credit) const {
    return sq_used_ + 2 <= Policy::kSendDepth && (!takes_credit || used_ - returned_ < Policy::kSlots);
  }

  /// 0 posted, -1 no send slot, else an errno.
  int post_message(Out& o, Completions& done);

  /// Posts the next chunk of a large message (the last with immediate). 0 or an errno.
  int post_write(Out& o, PendingSend& s);

  /// The RDMA write of a value and its complement (at `src` in this side's credit block) to the
  /// same place in the peer's block.
  SendWr credit_block_write(detail::WrKind kind, const std::uint64_t* src, std::size_t offset) const;

  void return_credits(Completions& done);

  /// A receive slot was filled: by a message (header + payload), or by the immediate of a large
  /// message's last write.
  void on_slot(std::uint32_t slot, const Wc& wc, Completions& done);

  /// False when the link broke.
  bool on_message(const detail::Header& h, const std::byte* payload, std::size_t bytes, Completions& done);

  void deliver_eager(detail::RecvOp& r, const std::byte* src, std::size_t n, Completions& done);

  /// Posts a receive, or matches it with what arrived (irecv, irecv_any).
  void start_recv(detail::RecvOp r);
  /// A receive met its message (caller's thread or the driver).
  void match(detail::RecvOp r, detail::Arrival a, Completions& done);

  /// A large message met its receive: register the buffer and clear the sender to write it, or
  /// reject a size mismatch on both sides.
  void accept_rts(detail::RecvOp r, std::uint64_t size, std::uint32_t id, Completions& done);
  /// Registers a matched receive's buffer and answers its cts with the address and rkey.
  void register_recv(detail::RecvOp r, std::uint32_t id, Completions& done);

  void protocol_error(const std::string& what, Completions& done) {
    chorus::detail::log(chorus::detail::LogLevel::warn, chorus::detail::LogSubsys::rdma, rank_, "rdma peer ", peer_, ": protocol error: ", what);
    fail(ErrorCode::peer_failure, "protocol error from peer: " + what, true, done);
  }

  int rank_;
  int peer_;
  detail::Hub& hub_;
  Verbs& verbs_;
  RegistrationCache& regs_;
  detail::Memory mem_;
  chorus::detail::RequestFactory requests_;
  Qp* qp_ = nullptr;
  Qp* ctl_qp_ = nullptr;
  std::uint32_t max_inline_ = 0;
  std::vector<std::byte> inline_buf_;  ///< an inline message is assembled here (max_inline_ bytes)
  std::uint64_t remote_credits_ = 0;
  std::uint32_t remote_rkey_ = 0;

  chorus::detail::TagMatcher<detail::RecvOp, detail::Arrival> matcher_;
  chorus::detail::SpareBuffers spare_;
  chorus::detail::IdMap<PendingSend> sends_;
  chorus::detail::IdMap<ActiveRecv> recvs_;
  std::deque<DeferredRecv> deferred_;
  std::uint32_t send_regs_ = 0;  ///< sends holding a registration (every receive in recvs_ holds one)
  std::deque<Out> queue_;
  std::vector<std::uint32_t> free_send_slots_;
  std::uint32_t next_id_ = 1;
  std::uint32_t sq_used_ = 0;     ///< work requests on the send queue
  std::uint32_t unsignaled_ = 0;  ///< inline messages posted since the last signaled one
  std::uint64_t used_ = 0;        ///< credits taken (slot messages sent)
  std::uint64_t returned_ = 0;    ///< credits the peer returned
  std::uint32_t owed_ = 0;        ///< slots reposted, not yet returned to the peer
  bool credit_in_flight_ = false;
  chorus::detail::ByteGauge unexpected_bytes_;
  bool failed_ = false;
  ErrorCode fail_code_ = ErrorCode::peer_failure;
  std::string fail_why_;
};

}  // namespace chorus::rdma

// The bodies of the way out and the way in.
#include "chorus/transport/rdma/detail/link_receive.hpp"
#include "chorus/transport/rdma/detail/link_send.hpp"
