#pragma once
/// rdma::Link: one reliable-connected queue pair to one peer, over the verbs seam (verbs.hpp).
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
/// Registrations (registration.hpp): a large message's buffer is registered before the rts and on
/// the receive's match; from the cache when it is memory chorus owns (the executors' scratch),
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
/// message (registration.hpp: export_dmabuf, reg_dmabuf_mr) and released when it completes. A
/// receive into device memory that meets an eager message fails with mismatch and writes nothing.
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
#include "chorus/transport/rdma/registration.hpp"
#include "chorus/transport/rdma/verbs.hpp"
#include "chorus/transport/shell.hpp"

namespace chorus::rdma {

struct Policy {
  /// Receive slots per link (the credits a sender starts with) and their size.
  static constexpr std::uint32_t kSlots = 64;
  static constexpr std::size_t kSlotBytes = 8192;
  /// Credits are returned once this many slots were reposted (a quarter of them: a sender out of
  /// credits has kSlots unreturned, so its peer always owes enough to answer).
  static constexpr std::uint32_t kCreditBatch = kSlots / 4;
  /// Work requests per send queue (eager sends, control messages, write chunks, credit writes).
  static constexpr std::uint32_t kSendDepth = 256;
  /// The size of one RDMA write of a large message.
  static constexpr std::size_t kChunkBytes = std::size_t(1) << 20;
  static constexpr std::uint64_t kMaxMessageBytes = std::uint64_t(1) << 40;
  /// Large messages per link and direction that hold a registration at once: a program with
  /// thousands of large sends or receives outstanding registers this many, the others wait their
  /// turn, instead of running the device (or the locked-memory limit) out of registrations.
  static constexpr std::uint32_t kMaxRegistered = 32;
};

namespace detail {

using chorus::detail::Completions;
using chorus::detail::RequestState;
using ReqPtr = std::shared_ptr<RequestState>;

enum class MsgType : std::uint32_t { eager = 0x45414752, rts = 0x52545320, cts = 0x43545320 };
inline constexpr std::uint32_t kReject = 1;  ///< cts flag: the sizes differ

/// The header of every slot message (eager payload follows it).
struct Header {
  std::uint32_t type = 0;
  std::uint32_t flags = 0;
  std::uint64_t tag = 0;
  std::uint64_t size = 0;  ///< eager, rts: the message's; cts: the receive's
  std::uint32_t id = 0;    ///< rts, cts: the message id (the immediate of its last write)
  std::uint32_t rkey = 0;  ///< cts: the receive buffer's
  std::uint64_t addr = 0;  ///< cts: the receive buffer's
};
static_assert(sizeof(Header) == 40);

/// Written into by the peer (RDMA write): credits it returned and its abort. Each value comes with
/// its complement; a pair that does not match is a write in progress, read again later.
struct CreditBlock {
  std::uint64_t returned = 0;
  std::uint64_t returned_check = ~std::uint64_t(0);
  std::uint64_t aborted = 0;
  std::uint64_t aborted_check = ~std::uint64_t(0);
};

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

/// wr_id: kind in the top byte, the link's peer in the next two, the rest (slot, message id).
enum class WrKind : std::uint8_t { recv_slot = 1, send_slot, inline_msg, write, write_last, credit, abort };
inline std::uint64_t make_wr(WrKind k, int peer, std::uint64_t low) {
  return (std::uint64_t(k) << 56) | (std::uint64_t(std::uint16_t(peer)) << 40) | (low & ((std::uint64_t(1) << 40) - 1));
}
inline WrKind wr_kind(std::uint64_t w) { return static_cast<WrKind>(w >> 56); }
inline int wr_peer(std::uint64_t w) { return static_cast<int>((w >> 40) & 0xffff); }
inline std::uint64_t wr_low(std::uint64_t w) { return w & ((std::uint64_t(1) << 40) - 1); }

using chorus::detail::EagerArrival;
using chorus::detail::RecvOp;
struct RtsArrival {
  std::uint64_t size;
  std::uint32_t id;
};
using Arrival = std::variant<EagerArrival, RtsArrival>;

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

  Request isend(ConstBytes data, Tag tag) {
    auto req = chorus::detail::make_link_request(requests_, "send", tag, data.size);
    Completions done;
    Kick kick{hub_};
    std::lock_guard lk(hub_.mu);
    if (failed_) {
      done.fail(req, fail_code_, fail_why_);
    } else if (data.kind == MemoryKind::device && !hub_.device.runtime) {
      done.fail(req, ErrorCode::invalid_argument, kNoDeviceMemory);
    } else if (data.size <= kEagerBytes && data.kind == MemoryKind::host) {
      Out o{Out::message, {static_cast<std::uint32_t>(detail::MsgType::eager), 0, tag, data.size, 0, 0, 0}, data, req, 0, 0};
      // Straight out when nothing waits before it and a credit and queue room are there.
      const int e = queue_.empty() && room(true) ? post_message(o, done) : -1;
      if (e > 0) {
        fail(ErrorCode::system, std::string("ibv_post_send failed: ") + std::strerror(e), true, done);
      } else if (e < 0) {
        queue_.push_back(std::move(o));
        pump(done);
      }
    } else if (data.size > Policy::kMaxMessageBytes) {
      done.fail(req, ErrorCode::invalid_argument, "message of " + std::to_string(data.size) + " bytes is too large");
    } else {
      std::string why;
      Registration mr;
      // Registered now, so that registering overlaps the rts and cts, while under the cap;
      // else once the cts came (pump).
      if (send_regs_ < Policy::kMaxRegistered && !(mr = register_buffer(data.data, data.size, data.kind, why))) {
        // The message cannot go, and later ones on its tag must not overtake it: the link fails.
        done.fail(req, ErrorCode::system, why);
        fail(ErrorCode::system, why, true, done);
      } else {
        if (mr) ++send_regs_;
        const std::uint32_t id = next_id_++;
        sends_.emplace(id, PendingSend{data, req, std::move(mr), 0, 0, false});
        detail::Header h{static_cast<std::uint32_t>(detail::MsgType::rts), 0, tag, data.size, id, 0, 0};
        queue_.push_back(Out{Out::message, h, {}, nullptr, 0, 0});
        pump(done);
      }
    }
    kick.needed = !queue_.empty();
    return Request(req);
  }

  Request irecv(MutableBytes data, Tag tag) {
    auto req = chorus::detail::make_link_request(requests_, "recv", tag, data.size);
    Completions done;
    Kick kick{hub_};
    std::lock_guard lk(hub_.mu);
    detail::RecvOp r{data, req, tag};
    if (data.kind == MemoryKind::device && !hub_.device.runtime) {
      done.fail(req, ErrorCode::invalid_argument, kNoDeviceMemory);
    } else if (matcher_.take_unexpected(tag, [&](detail::Arrival& a) { match(std::move(r), std::move(a), done); })) {
    } else if (failed_) {
      done.fail(req, fail_code_, fail_why_);
    } else {
      matcher_.add_posted(tag, std::move(r));
    }
    pump(done);
    kick.needed = !queue_.empty();
    return Request(req);
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
        chorus::detail::log(chorus::detail::LogLevel::warn, rank_, "rdma peer ", peer_,
                            ": a device buffer could not be exported, so it is staged: ", e.what());
        return false;
      }
      d.refused = &rt;
      d.told = false;
      return say_staged(d, std::string("the ") + std::string(rt.name()) + " runtime exports no dma-buf (" + e.what() + ")");
    }
    d.runtime = &rt;
    chorus::detail::log(chorus::detail::LogLevel::info, rank_, "rdma: device buffers above ", kEagerBytes,
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
  void on_completion(const Wc& wc, Completions& done) {
    const auto kind = detail::wr_kind(wc.wr_id);
    const auto low = detail::wr_low(wc.wr_id);
    // A signaled inline message also stands for the unsignaled ones before it (its low bits).
    if (kind == detail::WrKind::inline_msg)
      sq_used_ -= static_cast<std::uint32_t>(low);
    else if (kind != detail::WrKind::recv_slot)
      --sq_used_;
    if (wc.status != WcStatus::success) {
      if (kind == detail::WrKind::recv_slot && failed_) return;  // flushed after a failure
      return fail(ErrorCode::peer_failure,
                  std::string(kind == detail::WrKind::recv_slot ? "receive" : "send") + " work completion failed: " +
                      status_str(wc.status),
                  // A flush here means the QP went to ERROR on its own (after this side's
                  // fail() every completion is ignored): the peer must hear it too.
                  kind != detail::WrKind::abort, done);
    }
    // A message polled after this side failed (it was in the CQ before the QP went to ERROR) is
    // dropped: an rts kept as unexpected would let a later receive match it and wait for writes
    // that never come, instead of failing with the link.
    if (failed_) return;
    switch (kind) {
      case detail::WrKind::recv_slot: on_slot(static_cast<std::uint32_t>(low), wc, done); break;
      case detail::WrKind::send_slot: free_send_slots_.push_back(static_cast<std::uint32_t>(low)); break;
      case detail::WrKind::inline_msg: break;
      case detail::WrKind::write: break;
      case detail::WrKind::write_last: {
        auto it = sends_.find(static_cast<std::uint32_t>(low));
        if (it == sends_.end()) return protocol_error("completion of unknown message " + std::to_string(low), done);
        done.complete(it->second.req, it->second.data.size);
        release_send(it->second);
        sends_.erase(it);
        break;
      }
      case detail::WrKind::credit: credit_in_flight_ = false; break;
      case detail::WrKind::abort: break;
    }
  }

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
    chorus::detail::log(chorus::detail::LogLevel::info, rank_, "rdma link to peer ", peer_, " broken: ", why);
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
      chorus::detail::log(chorus::detail::LogLevel::info, rank_, "rdma: device buffers go through pinned host staging: ", why);
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
  bool pump(Completions& done) {
    bool moved = false;
    while (!failed_ && !queue_.empty()) {
      Out& o = queue_.front();
      PendingSend* s = nullptr;
      if (o.kind == Out::write) {
        auto it = sends_.find(o.id);
        if (it == sends_.end()) {  // failed meanwhile
          queue_.pop_front();
          continue;
        }
        s = &it->second;
      }
      if (!room(!s || o.offset + Policy::kChunkBytes >= s->data.size)) break;  // a message, or the last write
      if (s && !s->mr && !register_send(*s, done)) {
        if (failed_) return true;
        break;  // every registration is on writes under way: wait for one to complete
      }
      const int e = s ? post_write(o, *s) : post_message(o, done);
      if (e < 0) break;  // no send slot free: wait for a completion
      if (e > 0) {
        fail(ErrorCode::system, std::string("ibv_post_send failed: ") + std::strerror(e), true, done);
        return true;
      }
      moved = true;
      if (s && o.offset < s->data.size) continue;  // more chunks
      queue_.pop_front();
    }
    if (!failed_ && owed_ >= Policy::kCreditBatch && !credit_in_flight_ && sq_used_ < Policy::kSendDepth) {
      return_credits(done);
      moved = true;
    }
    return moved;
  }

  /// Registers a cleared send that holds no registration, taking one from a send whose writes have
  /// not started when kMaxRegistered are held. False when every one is on writes under way, or
  /// the device refused (the link failed).
  bool register_send(PendingSend& s, Completions& done) {
    if (send_regs_ >= Policy::kMaxRegistered)
      for (auto& [id, other] : sends_)
        if (other.mr && !other.writing) {
          release_send(other);
          break;
        }
    if (send_regs_ >= Policy::kMaxRegistered) return false;
    std::string why;
    s.mr = register_buffer(s.data.data, s.data.size, s.data.kind, why);
    if (!s.mr) {
      fail(ErrorCode::system, why, true, done);
      return false;
    }
    ++send_regs_;
    return true;
  }
  void release_send(PendingSend& s) {
    if (!s.mr) return;
    s.mr = Registration();
    --send_regs_;
  }

  /// Room on the send queue (one entry kept for a credit write), and a credit where the work
  /// request takes one of the peer's receive slots.
  bool room(bool takes_credit) const {
    return sq_used_ + 2 <= Policy::kSendDepth && (!takes_credit || used_ - returned_ < Policy::kSlots);
  }

  /// 0 posted, -1 no send slot, else an errno.
  int post_message(Out& o, Completions& done) {
    const std::size_t len = sizeof(detail::Header) + o.payload.size;
    SendWr wr;
    wr.opcode = Opcode::send;
    if (len <= max_inline_) {
      // Inline: the provider copies it at post time.
      std::memcpy(inline_buf_.data(), &o.h, sizeof o.h);
      if (o.payload.size) std::memcpy(inline_buf_.data() + sizeof o.h, o.payload.data, o.payload.size);
      // Unsignaled but every kSignalEvery-th: nothing waits for an inline message's completion,
      // and a completion costs the driver a CQ entry; the signaled one frees the queue slots of
      // the ones before it (an error completes any work request, signaled or not).
      const bool signal = unsignaled_ + 1 >= kSignalEvery;
      wr.signaled = signal;
      wr.wr_id = detail::make_wr(detail::WrKind::inline_msg, peer_, signal ? unsignaled_ + 1 : 0);
      wr.sge = {reinterpret_cast<std::uintptr_t>(inline_buf_.data()), static_cast<std::uint32_t>(len), 0};
      wr.inline_data = true;
      if (const int e = verbs_.post_send(qp_, wr); e != 0) return e;
      unsignaled_ = signal ? 0 : unsignaled_ + 1;
    } else {
      if (free_send_slots_.empty()) return -1;
      const std::uint32_t s = free_send_slots_.back();
      std::byte* p = send_slot(s);
      std::memcpy(p, &o.h, sizeof o.h);
      if (o.payload.size) std::memcpy(p + sizeof o.h, o.payload.data, o.payload.size);
      wr.wr_id = detail::make_wr(detail::WrKind::send_slot, peer_, s);
      wr.sge = {reinterpret_cast<std::uintptr_t>(p), static_cast<std::uint32_t>(len), mem_.lkey};
      if (const int e = verbs_.post_send(qp_, wr); e != 0) return e;
      free_send_slots_.pop_back();
    }
    ++sq_used_;
    ++used_;
    if (o.req) done.complete(std::move(o.req), o.payload.size);
    return 0;
  }

  /// Posts the next chunk of a large message (the last with immediate). 0 or an errno.
  int post_write(Out& o, PendingSend& s) {
    const std::uint64_t len = std::min<std::uint64_t>(Policy::kChunkBytes, s.data.size - o.offset);
    const bool last = o.offset + len == s.data.size;
    SendWr wr;
    wr.wr_id = detail::make_wr(last ? detail::WrKind::write_last : detail::WrKind::write, peer_, o.id);
    wr.opcode = last ? Opcode::rdma_write_imm : Opcode::rdma_write;
    wr.sge = {reinterpret_cast<std::uintptr_t>(s.data.data + o.offset), static_cast<std::uint32_t>(len), s.mr.lkey()};
    wr.imm = o.id;
    wr.remote_addr = s.remote_addr + o.offset;
    wr.rkey = s.rkey;
    if (const int e = verbs_.post_send(qp_, wr); e != 0) return e;
    ++sq_used_;
    if (last) ++used_;
    o.offset += len;
    s.writing = true;
    return 0;
  }

  /// The RDMA write of a value and its complement (at `src` in this side's credit block) to the
  /// same place in the peer's block.
  SendWr credit_block_write(detail::WrKind kind, const std::uint64_t* src, std::size_t offset) const {
    SendWr wr;
    wr.wr_id = detail::make_wr(kind, peer_, 0);
    wr.opcode = Opcode::rdma_write;
    wr.sge = {reinterpret_cast<std::uintptr_t>(src), 2 * sizeof(std::uint64_t), mem_.lkey};
    wr.inline_data = max_inline_ >= wr.sge.length;
    wr.remote_addr = remote_credits_ + offset;
    wr.rkey = remote_rkey_;
    return wr;
  }

  void return_credits(Completions& done) {
    auto& out = *mem_.credits_out;
    out.returned += owed_;
    out.returned_check = ~out.returned;
    owed_ = 0;
    const SendWr wr = credit_block_write(detail::WrKind::credit, &out.returned, offsetof(detail::CreditBlock, returned));
    if (const int e = verbs_.post_send(qp_, wr); e != 0)
      return fail(ErrorCode::system, std::string("ibv_post_send (credits) failed: ") + std::strerror(e), true, done);
    ++sq_used_;
    credit_in_flight_ = true;  // one at a time: the source words stay still until it completes
  }

  /// A receive slot was filled: by a message (header + payload), or by the immediate of a large
  /// message's last write.
  void on_slot(std::uint32_t slot, const Wc& wc, Completions& done) {
    if (wc.opcode == Opcode::recv_rdma_imm) {
      auto it = recvs_.find(wc.imm);
      if (it == recvs_.end()) return protocol_error("data for unknown message " + std::to_string(wc.imm), done);
      done.complete(it->second.recv.req, it->second.recv.dst.size);
      recvs_.erase(it);  // deregisters
      while (!deferred_.empty() && recvs_.size() < Policy::kMaxRegistered && !failed_) {
        DeferredRecv d = std::move(deferred_.front());
        deferred_.pop_front();
        register_recv(std::move(d.recv), d.id, done);
      }
    } else {
      detail::Header h;
      if (wc.byte_len < sizeof h) return protocol_error("short message (" + std::to_string(wc.byte_len) + " bytes)", done);
      std::memcpy(&h, recv_slot(slot), sizeof h);
      if (!on_message(h, recv_slot(slot) + sizeof h, wc.byte_len - sizeof h, done)) return;
    }
    if (failed_) return;
    try {
      repost(slot);
    } catch (const VerbsError& e) {
      return fail(ErrorCode::system, e.call + " failed: " + std::strerror(e.err), true, done);
    }
    ++owed_;
    pump(done);
  }

  /// False when the link broke.
  bool on_message(const detail::Header& h, const std::byte* payload, std::size_t bytes, Completions& done) {
    using detail::MsgType;
    switch (static_cast<MsgType>(h.type)) {
      case MsgType::eager: {
        if (bytes != h.size) {
          protocol_error("eager message of " + std::to_string(bytes) + " bytes says " + std::to_string(h.size), done);
          return false;
        }
        if (auto r = matcher_.take_posted(h.tag)) {
          deliver_eager(*r, payload, h.size, done);
          return true;
        }
        if (chorus::detail::over_buffered_cap(h.size)) {
          fail(ErrorCode::system, chorus::detail::buffered_cap_error(h.size), true, done);
          return false;
        }
        unexpected_bytes_ += h.size;
        matcher_.add_unexpected(h.tag, detail::EagerArrival{spare_.take(payload, h.size)});
        return true;
      }
      case MsgType::rts:
        if (auto r = matcher_.take_posted(h.tag))
          accept_rts(std::move(*r), h.size, h.id, done);
        else
          matcher_.add_unexpected(h.tag, detail::RtsArrival{h.size, h.id});
        return !failed_;
      case MsgType::cts: {
        auto it = sends_.find(h.id);
        if (it == sends_.end()) {
          protocol_error("clear-to-send for unknown message " + std::to_string(h.id), done);
          return false;
        }
        if (h.flags & detail::kReject) {
          done.fail(it->second.req, ErrorCode::mismatch, chorus::detail::size_mismatch(it->second.data.size, h.size));
          release_send(it->second);
          sends_.erase(it);
          return true;
        }
        it->second.remote_addr = h.addr;
        it->second.rkey = h.rkey;
        queue_.push_back(Out{Out::write, {}, {}, nullptr, h.id, 0});
        return true;
      }
    }
    protocol_error("unknown message type " + std::to_string(h.type), done);
    return false;
  }

  void deliver_eager(detail::RecvOp& r, const std::byte* src, std::size_t n, Completions& done) {
    if (r.dst.kind == MemoryKind::device) {
      // No eager copy targets device memory: the sender's buffer took the eager path (a message
      // of another size, or a sender that is no part of the same call). Nothing is written.
      done.fail(std::move(r.req), ErrorCode::mismatch,
                "an eager message of " + std::to_string(n) + " bytes met a receive of " + std::to_string(r.dst.size) +
                    " bytes into device memory, which takes rendezvous (rts/cts) messages only");
      return;
    }
    if (r.dst.size != n) {
      chorus::detail::write_prefix(r.dst, src, n);
      done.fail(std::move(r.req), ErrorCode::mismatch, chorus::detail::size_mismatch(n, r.dst.size));
      return;
    }
    if (n) std::memcpy(r.dst.data, src, n);
    done.complete(std::move(r.req), n);
  }

  /// A receive met its message (caller's thread or the driver).
  void match(detail::RecvOp r, detail::Arrival a, Completions& done) {
    if (auto* e = std::get_if<detail::EagerArrival>(&a)) {
      unexpected_bytes_ -= e->data.size();
      deliver_eager(r, e->data.data(), e->data.size(), done);
      spare_.give(std::move(e->data));
      return;
    }
    const auto& rts = std::get<detail::RtsArrival>(a);
    accept_rts(std::move(r), rts.size, rts.id, done);
  }

  /// A large message met its receive: register the buffer and clear the sender to write it, or
  /// reject a size mismatch on both sides.
  void accept_rts(detail::RecvOp r, std::uint64_t size, std::uint32_t id, Completions& done) {
    if (size != r.dst.size) {
      detail::Header h{static_cast<std::uint32_t>(detail::MsgType::cts), detail::kReject, 0, r.dst.size, id, 0, 0};
      done.fail(r.req, ErrorCode::mismatch, chorus::detail::size_mismatch(size, r.dst.size));
      queue_.push_back(Out{Out::message, h, {}, nullptr, 0, 0});
    } else if (recvs_.size() >= Policy::kMaxRegistered) {
      deferred_.push_back(DeferredRecv{std::move(r), id});  // its cts goes when an earlier receive completes
    } else {
      register_recv(std::move(r), id, done);
    }
  }
  /// Registers a matched receive's buffer and answers its cts with the address and rkey.
  void register_recv(detail::RecvOp r, std::uint32_t id, Completions& done) {
    std::string why;
    Registration mr = register_buffer(r.dst.data, r.dst.size, r.dst.kind, why);
    if (!mr) {
      done.fail(r.req, ErrorCode::system, why);
      // The sender waits for an answer: tell it, and everything else on this link, to stop.
      return fail(ErrorCode::peer_failure, "rank " + std::to_string(rank_) + " could not register a receive buffer", true,
                  done);
    }
    detail::Header h{static_cast<std::uint32_t>(detail::MsgType::cts), 0, 0, r.dst.size, id, mr.rkey(),
                     reinterpret_cast<std::uintptr_t>(r.dst.data)};
    if (!recvs_.emplace(id, ActiveRecv{std::move(r), std::move(mr)}).second)
      return protocol_error("duplicate message id " + std::to_string(id), done);
    queue_.push_back(Out{Out::message, h, {}, nullptr, 0, 0});
  }

  void protocol_error(const std::string& what, Completions& done) {
    chorus::detail::log(chorus::detail::LogLevel::warn, rank_, "rdma peer ", peer_, ": protocol error: ", what);
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
