#pragma once
/// The fake verbs provider (rdma::Verbs, verbs.hpp) for tests: an RC-capable "NIC" shared by real
/// processes of one host through a fabric file (CHORUS_IB_FAKE=<path>), so the rdma transport runs
/// whole, across processes, where no RDMA device exists.
///
/// What it models: memory regions with keys (lkey == rkey, never reused in a fabric's life, so a
/// stale key is always caught), bounds and access rights; QPs with states (RESET, RTS, ERROR) and
/// receive queues; sends that consume the peer's oldest posted receive (length checked), RDMA
/// writes checked against the peer's registrations, writes with immediate that consume a receive;
/// completions on CQs of bounded capacity (an overrun breaks the CQ for good, as on a NIC, and
/// raises an asynchronous event); completion channels (an armed CQ wakes its owner through an
/// abstract unix datagram socket, a pollable fd like ibv_comp_channel's); a QP in ERROR flushes
/// its receives and later work requests with wr_flush_err; work to a dead process, or to a QP in
/// ERROR or gone, fails with retry_exc_err.
/// What it does not model: timing (a transfer completes inside post_send, copied with
/// process_vm_writev into the peer's memory), packet loss and retransmission, RNR retries (a send
/// that finds no posted receive fails at once with rnr_retry_exc_err: the transport never sends
/// without a credit), ordering between QPs, atomics, reads, more than one SGE.
///
/// The fabric file holds every table under one process-shared robust mutex (a process that dies
/// holding it does not block the others). Entries of dead processes are reclaimed.
///
/// Faults (CHORUS_IB_FAKE_FAULT of the process, read when the provider opens; comma-separated
/// `kind[@N]`, N counted from 1 among that kind's operations of this provider, default 1):
///   rem_access@N      the Nth RDMA write (with or without immediate) fails with rem_access_err
///   retry_exceeded@N  the Nth post_send fails with retry_exc_err, nothing moves
///   cq_overflow@N     the CQs this provider creates hold N completions
///   reg_enomem@N      the Nth reg_mr fails with ENOMEM
///   partial_poll      poll_cq returns at most one completion per call (legal, unusual)
///   qp_error@N        the QP of the Nth post_send goes to ERROR (flushing it and its receives)
///                     and a qp_fatal event is raised for it; its peer then sees retry_exc_err
///   dmabuf_unsupported  every reg_dmabuf_mr fails with EOPNOTSUPP, as on a device (or kernel
///                     driver) without dma-buf support
///
/// Device memory (reg_dmabuf_mr): the fake has no dma-buf importer; it checks with fstat that the
/// fd's size covers offset + length (EINVAL otherwise, and for an fd that is not open), then
/// registers [iova, iova + length) of the process as reg_mr registers host memory. That fits the
/// simulated device runtime (device/sim_runtime.hpp), whose device memory is memfd pages mapped at
/// the device address, which is the iova the transport passes.
/// An unknown kind fails open_fake, naming it.

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>

#include "chorus/detail/env.hpp"
#include "chorus/transport/rdma/verbs.hpp"

namespace chorus::rdma {
namespace fake {

inline constexpr std::uint32_t kMagic = 0x46414b45;  // "FAKE"
inline constexpr std::size_t kMaxMrs = 4096;
inline constexpr std::size_t kMaxQps = 256;
inline constexpr std::size_t kMaxCqs = 64;
inline constexpr std::uint32_t kRecvDepth = 256;  ///< receives a QP can hold
inline constexpr std::uint32_t kCqMax = 2048;     ///< completions a CQ can hold
inline constexpr std::uint32_t kMaxInline = 256;

enum QpState : std::uint32_t { kReset = 0, kRts = 1, kError = 2 };

struct MrEntry {
  std::uint32_t key;
  std::int32_t pid;
  std::uint64_t addr;
  std::uint64_t length;
  std::int32_t access;
  std::uint32_t live;
};
struct RecvEntry {
  std::uint64_t wr_id;
  std::uint64_t addr;
  std::uint32_t length;
  std::uint32_t lkey;
};
struct QpEntry {
  std::uint32_t qpn;
  std::int32_t pid;
  std::uint32_t state;
  std::uint32_t remote_qpn;
  std::uint32_t send_cq;  ///< CQ ids
  std::uint32_t recv_cq;
  std::uint32_t rq_head;
  std::uint32_t rq_tail;
  std::uint32_t live;
  RecvEntry rq[kRecvDepth];
};
static_assert(std::is_trivially_copyable_v<Wc>);
struct CqEntry {
  std::uint32_t id;
  std::int32_t pid;
  std::uint32_t cap;
  std::uint32_t head;
  std::uint32_t tail;
  std::uint32_t overflow;
  std::uint32_t armed;
  std::uint32_t live;
  Wc ring[kCqMax];
};
struct Fabric {
  std::atomic<std::uint32_t> state;  ///< 0 new (zero-filled file), 1 being set up, 2 ready
  std::uint32_t magic;
  pthread_mutex_t lock;
  std::uint32_t next_key;
  std::uint32_t next_qpn;
  std::uint32_t next_cq;
  MrEntry mrs[kMaxMrs];
  QpEntry qps[kMaxQps];
  CqEntry cqs[kMaxCqs];
};

inline bool alive(std::int32_t pid) { return pid > 0 && (::kill(pid, 0) == 0 || errno != ESRCH); }

struct Faults {
  std::uint64_t rem_access = 0, retry_exceeded = 0, reg_enomem = 0, qp_error = 0;  ///< 0: none
  std::uint32_t cq_capacity = 0;                                                  ///< 0: as asked
  bool partial_poll = false;
  bool dmabuf_unsupported = false;
};

/// Parses CHORUS_IB_FAKE_FAULT; false with `why` on an unknown or malformed item.
inline bool parse_faults(std::string_view spec, Faults& f, std::string& why) {
  while (!spec.empty()) {
    const auto comma = spec.find(',');
    std::string_view item = spec.substr(0, comma);
    spec = comma == std::string_view::npos ? std::string_view{} : spec.substr(comma + 1);
    if (item.empty()) continue;
    std::uint64_t n = 1;
    std::string_view kind = item;
    if (const auto at = item.find('@'); at != std::string_view::npos) {
      kind = item.substr(0, at);
      const std::string num(item.substr(at + 1));
      char* end = nullptr;
      n = std::strtoull(num.c_str(), &end, 10);
      if (num.empty() || *end != '\0' || n == 0) {
        why = "CHORUS_IB_FAKE_FAULT: '" + std::string(item) + "' needs a positive count after @";
        return false;
      }
    }
    if (kind == "rem_access") f.rem_access = n;
    else if (kind == "retry_exceeded") f.retry_exceeded = n;
    else if (kind == "reg_enomem") f.reg_enomem = n;
    else if (kind == "qp_error") f.qp_error = n;
    else if (kind == "cq_overflow") f.cq_capacity = static_cast<std::uint32_t>(std::min<std::uint64_t>(n, kCqMax));
    else if (kind == "partial_poll") f.partial_poll = true;
    else if (kind == "dmabuf_unsupported") f.dmabuf_unsupported = true;
    else {
      why = "CHORUS_IB_FAKE_FAULT: unknown fault '" + std::string(kind) +
            "' (known: rem_access, retry_exceeded, cq_overflow, reg_enomem, partial_poll, qp_error, "
            "dmabuf_unsupported)";
      return false;
    }
  }
  return true;
}

/// The fabric's lock, robust: a holder that died leaves it consistent for the next.
class Lock {
 public:
  explicit Lock(Fabric* f) : f_(f) {
    if (::pthread_mutex_lock(&f_->lock) == EOWNERDEAD) ::pthread_mutex_consistent(&f_->lock);
  }
  ~Lock() { ::pthread_mutex_unlock(&f_->lock); }
  Lock(const Lock&) = delete;
  Lock& operator=(const Lock&) = delete;

 private:
  Fabric* f_;
};

struct FakeMr final : Mr {
  std::size_t index = 0;
};
struct FakeCq final : Cq {
  std::size_t index = 0;
  int fd = -1;  ///< the channel: an abstract datagram socket
  ~FakeCq() override {
    if (fd >= 0) ::close(fd);
  }
};
struct FakeQp final : Qp {
  std::size_t index = 0;
};

class FakeVerbs final : public Verbs {
 public:
  FakeVerbs(Fabric* f, std::size_t bytes, std::string path, Faults faults)
      : f_(f), bytes_(bytes), path_(std::move(path)), faults_(faults) {
    pid_ = static_cast<std::int32_t>(::getpid());
    hash_ = std::hash<std::string>{}(path_);
    port_.device = "fake0";
    port_.port = 1;
    port_.gid_index = 0;
    port_.link_layer = "Ethernet";
    port_.active_mtu = 5;
    port_.max_qp_wr = 4096;
    port_.max_cqe = kCqMax;
    port_.max_mr_size = std::uint64_t(1) << 40;
    async_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    notify_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  }
  ~FakeVerbs() override {
    if (async_ >= 0) ::close(async_);
    if (notify_ >= 0) ::close(notify_);
    ::munmap(f_, bytes_);
  }

  const PortInfo& port() const override { return port_; }
  QpAddress local_address() const override {
    QpAddress a;
    for (std::size_t i = 0; i < sizeof a.gid; ++i) a.gid[i] = static_cast<std::uint8_t>(hash_ >> ((i % 8) * 8));
    a.mtu = port_.active_mtu;
    return a;
  }

  Mr* reg_mr(void* addr, std::size_t length, int access, int& err) override {
    if (faults_.reg_enomem && ++regs_ == faults_.reg_enomem) {
      err = ENOMEM;
      return nullptr;
    }
    return add_mr(addr, length, access, err);
  }

  // --- device memory (dma-buf) -----------------------------------------------------------------
  Mr* reg_dmabuf_mr(std::uint64_t offset, std::size_t length, std::uint64_t iova, int fd, int access,
                    int& err) override {
    if (faults_.dmabuf_unsupported) {
      err = EOPNOTSUPP;
      return nullptr;
    }
    struct stat st {};
    if (fd < 0 || ::fstat(fd, &st) != 0 || st.st_size < 0 || offset > static_cast<std::uint64_t>(st.st_size) ||
        length > static_cast<std::uint64_t>(st.st_size) - offset) {
      err = EINVAL;
      return nullptr;
    }
    return add_mr(reinterpret_cast<void*>(static_cast<std::uintptr_t>(iova)), length, access, err);
  }
  // --- end of device memory (dma-buf) ----------------------------------------------------------

  void dereg_mr(Mr* mr) override {
    auto* r = static_cast<FakeMr*>(mr);
    {
      Lock lk(f_);
      MrEntry& m = f_->mrs[r->index];
      if (m.key == r->lkey && m.pid == pid_) m.live = 0;
    }
    delete r;
  }

  Cq* create_cq(int cqe) override {
    Lock lk(f_);
    for (std::size_t i = 0; i < kMaxCqs; ++i) {
      CqEntry& c = f_->cqs[i];
      if (c.live && alive(c.pid)) continue;
      auto cq = std::make_unique<FakeCq>();
      cq->index = i;
      c.id = f_->next_cq++;
      c.pid = pid_;
      c.cap = faults_.cq_capacity ? faults_.cq_capacity : static_cast<std::uint32_t>(std::clamp<int>(cqe, 1, kCqMax));
      c.head = c.tail = c.overflow = c.armed = 0;
      cq->fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      if (cq->fd < 0) throw VerbsError{"socket (fake completion channel)", errno};
      socklen_t len = 0;
      const sockaddr_un a = channel_address(c.id, len);
      if (::bind(cq->fd, reinterpret_cast<const sockaddr*>(&a), len) != 0)
        throw VerbsError{"bind (fake completion channel)", errno};
      c.live = 1;
      return cq.release();
    }
    throw VerbsError{"ibv_create_cq (the fake fabric's CQ table is full)", ENOMEM};
  }
  void destroy_cq(Cq* cq) override {
    auto* c = static_cast<FakeCq*>(cq);
    {
      Lock lk(f_);
      if (f_->cqs[c->index].pid == pid_) f_->cqs[c->index].live = 0;
    }
    delete c;
  }
  int poll_cq(Cq* cq, int n, Wc* out) override {
    auto* c = static_cast<FakeCq*>(cq);
    Lock lk(f_);
    CqEntry& e = f_->cqs[c->index];
    if (e.overflow) {
      if (!overflow_told_) {
        overflow_told_ = true;
        raise({AsyncKind::other, 0, "CQ error (overrun)"});
      }
      return -EOVERFLOW;
    }
    if (faults_.partial_poll) n = std::min(n, 1);
    int k = 0;
    while (k < n && e.head != e.tail) out[k++] = e.ring[e.head++ % kCqMax];
    return k;
  }
  int req_notify_cq(Cq* cq) override {
    Lock lk(f_);
    f_->cqs[static_cast<FakeCq*>(cq)->index].armed = 1;
    return 0;
  }
  int channel_fd(Cq* cq) const override { return static_cast<FakeCq*>(cq)->fd; }
  void drain_channel(Cq* cq) override {
    char b[64];
    while (::recv(static_cast<FakeCq*>(cq)->fd, b, sizeof b, MSG_DONTWAIT) > 0) {
    }
  }

  Qp* create_qp(Cq* send_cq, Cq* recv_cq, std::uint32_t, std::uint32_t, std::uint32_t max_inline) override {
    Lock lk(f_);
    for (std::size_t i = 0; i < kMaxQps; ++i) {
      QpEntry& q = f_->qps[i];
      if (q.live && alive(q.pid)) continue;
      q.qpn = f_->next_qpn++;
      q.pid = pid_;
      q.state = kReset;
      q.remote_qpn = 0;
      q.send_cq = f_->cqs[static_cast<FakeCq*>(send_cq)->index].id;
      q.recv_cq = f_->cqs[static_cast<FakeCq*>(recv_cq)->index].id;
      q.rq_head = q.rq_tail = 0;
      q.live = 1;
      auto* r = new FakeQp;
      r->qp_num = q.qpn;
      r->index = i;
      port_.max_inline_data = std::min(max_inline, kMaxInline);
      return r;
    }
    throw VerbsError{"ibv_create_qp (the fake fabric's QP table is full)", ENOMEM};
  }
  void destroy_qp(Qp* qp) override {
    auto* r = static_cast<FakeQp*>(qp);
    {
      Lock lk(f_);
      QpEntry& q = f_->qps[r->index];
      if (q.qpn == r->qp_num) q.live = 0;
    }
    delete r;
  }
  int connect_qp(Qp* qp, const QpAddress&, const QpAddress& remote, const QpTunables&) override {
    Lock lk(f_);
    QpEntry& q = own(qp);
    if (!find_qp(remote.qpn)) return EINVAL;
    q.remote_qpn = remote.qpn;
    q.state = kRts;
    return 0;
  }
  int set_qp_error(Qp* qp) override {
    Lock lk(f_);
    to_error(own(qp));
    return 0;
  }
  int post_recv(Qp* qp, const RecvWr& wr) override {
    Lock lk(f_);
    QpEntry& q = own(qp);
    if (q.state == kReset) return EINVAL;
    if (q.state == kError) return flush_one(q.recv_cq, wr.wr_id, Opcode::recv, q.qpn), 0;
    if (q.rq_tail - q.rq_head >= kRecvDepth) return ENOMEM;
    q.rq[q.rq_tail++ % kRecvDepth] = RecvEntry{wr.wr_id, wr.sge.addr, wr.sge.length, wr.sge.lkey};
    return 0;
  }
  int post_send(Qp* qp, const SendWr& wr) override {
    Lock lk(f_);
    QpEntry& q = own(qp);
    if (q.state == kReset) return EINVAL;
    ++posts_;
    if (faults_.qp_error && posts_ == faults_.qp_error && q.state != kError) {
      to_error(q);
      raise({AsyncKind::qp_fatal, q.qpn, "local work queue catastrophic error (QP fatal)"});
    }
    if (q.state == kError) return flush_one(q.send_cq, wr.wr_id, wr.opcode, q.qpn), 0;
    const bool writes = wr.opcode == Opcode::rdma_write || wr.opcode == Opcode::rdma_write_imm;
    if (writes) ++writes_;
    WcStatus st = WcStatus::success;
    if (faults_.retry_exceeded && posts_ == faults_.retry_exceeded) st = WcStatus::retry_exc_err;
    if (st == WcStatus::success && !wr.inline_data && wr.sge.length != 0 &&
        !covers(wr.sge.lkey, pid_, wr.sge.addr, wr.sge.length, 0))
      st = WcStatus::loc_prot_err;
    QpEntry* r = st == WcStatus::success ? find_qp(q.remote_qpn) : nullptr;
    if (st == WcStatus::success && (!r || r->state == kError || !alive(r->pid))) st = WcStatus::retry_exc_err;
    if (st == WcStatus::success && writes && faults_.rem_access && writes_ == faults_.rem_access)
      st = WcStatus::rem_access_err;
    if (st == WcStatus::success && writes && !covers(wr.rkey, r->pid, wr.remote_addr, wr.sge.length, kRemoteWrite))
      st = WcStatus::rem_access_err;
    RecvEntry recv{};
    const bool consumes = wr.opcode == Opcode::send || wr.opcode == Opcode::rdma_write_imm;
    if (st == WcStatus::success && consumes) {
      if (r->rq_head == r->rq_tail) {
        st = WcStatus::rnr_retry_exc_err;
      } else {
        recv = r->rq[r->rq_head % kRecvDepth];
        if (wr.opcode == Opcode::send && wr.sge.length > recv.length) {
          ++r->rq_head;
          push(r->recv_cq, Wc{recv.wr_id, WcStatus::loc_len_err, Opcode::recv, 0, 0, false, r->qpn});
          st = WcStatus::rem_inv_req_err;
        } else if (wr.opcode == Opcode::send && wr.sge.length != 0 &&
                   !covers(recv.lkey, r->pid, recv.addr, wr.sge.length, kLocalWrite)) {
          ++r->rq_head;
          push(r->recv_cq, Wc{recv.wr_id, WcStatus::loc_prot_err, Opcode::recv, 0, 0, false, r->qpn});
          st = WcStatus::rem_op_err;
        }
      }
    }
    if (st == WcStatus::success && wr.sge.length != 0) {
      const std::uint64_t dst = wr.opcode == Opcode::send ? recv.addr : wr.remote_addr;
      st = copy_to(r->pid, dst, wr.sge.addr, wr.sge.length);
    }
    if (st == WcStatus::success && consumes) {
      ++r->rq_head;
      push(r->recv_cq, Wc{recv.wr_id, WcStatus::success, wr.opcode == Opcode::send ? Opcode::recv : Opcode::recv_rdma_imm,
                          wr.opcode == Opcode::send ? wr.sge.length : 0, wr.imm, wr.opcode == Opcode::rdma_write_imm,
                          r->qpn});
    }
    if (st != WcStatus::success || wr.signaled)
      push(q.send_cq, Wc{wr.wr_id, st, wr.opcode, wr.sge.length, 0, false, q.qpn});
    if (st != WcStatus::success) to_error(q);
    return 0;
  }

  int async_fd() const override { return async_; }
  bool next_async_event(AsyncEvent& out) override {
    std::uint64_t v;
    [[maybe_unused]] auto k = ::read(async_, &v, sizeof v);
    std::lock_guard lk(events_mu_);
    if (events_.empty()) return false;
    out = std::move(events_.front());
    events_.pop_front();
    return true;
  }

 private:
  /// Enters [addr, addr + length) of this process in the fabric's registration table.
  Mr* add_mr(void* addr, std::size_t length, int access, int& err) {
    Lock lk(f_);
    for (std::size_t i = 0; i < kMaxMrs; ++i) {
      MrEntry& m = f_->mrs[i];
      if (m.live && alive(m.pid)) continue;
      m = MrEntry{f_->next_key++, pid_, reinterpret_cast<std::uintptr_t>(addr), length, access, 1};
      auto* r = new FakeMr;
      r->lkey = r->rkey = m.key;
      r->addr = addr;
      r->length = length;
      r->index = i;
      return r;
    }
    err = ENOMEM;
    return nullptr;
  }
  sockaddr_un channel_address(std::uint32_t cq_id, socklen_t& len) const {
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    const std::string name = "chorus-fakeib-" + std::to_string(hash_) + "-cq" + std::to_string(cq_id);
    std::memcpy(a.sun_path + 1, name.data(), std::min(name.size(), sizeof a.sun_path - 2));
    len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + std::min(name.size(), sizeof a.sun_path - 2));
    return a;
  }
  QpEntry& own(Qp* qp) { return f_->qps[static_cast<FakeQp*>(qp)->index]; }
  QpEntry* find_qp(std::uint32_t qpn) {
    for (auto& q : f_->qps)
      if (q.live && q.qpn == qpn) return &q;
    return nullptr;
  }
  CqEntry* find_cq(std::uint32_t id) {
    for (auto& c : f_->cqs)
      if (c.live && c.id == id) return &c;
    return nullptr;
  }
  /// A live registration `key` of process `pid` holds [addr, addr + n) with the `access` bits.
  bool covers(std::uint32_t key, std::int32_t pid, std::uint64_t addr, std::uint64_t n, int access) const {
    for (const auto& m : f_->mrs)
      if (m.live && m.key == key)
        return m.pid == pid && addr >= m.addr && addr + n <= m.addr + m.length && (m.access & access) == access;
    return false;
  }
  WcStatus copy_to(std::int32_t pid, std::uint64_t dst, std::uint64_t src, std::uint64_t n) const {
    if (pid == pid_) {
      std::memmove(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), n);
      return WcStatus::success;
    }
    std::uint64_t done = 0;
    while (done < n) {
      iovec local{reinterpret_cast<void*>(src + done), n - done};
      iovec remote{reinterpret_cast<void*>(dst + done), n - done};
      const ssize_t k = ::process_vm_writev(pid, &local, 1, &remote, 1, 0);
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) return errno == ESRCH ? WcStatus::retry_exc_err : WcStatus::rem_access_err;  // EPERM: no ptrace right
      done += static_cast<std::uint64_t>(k);
    }
    return WcStatus::success;
  }
  /// Adds a completion to CQ `id` and wakes its owner if it armed it; a full CQ overflows.
  void push(std::uint32_t id, const Wc& wc) {
    CqEntry* c = find_cq(id);
    if (!c || c->overflow) return;
    if (c->tail - c->head >= c->cap) {
      c->overflow = 1;
    } else {
      c->ring[c->tail++ % kCqMax] = wc;
    }
    if (c->armed) {
      c->armed = 0;
      socklen_t len = 0;
      const sockaddr_un a = channel_address(c->id, len);
      const char b = 1;
      [[maybe_unused]] auto k = ::sendto(notify_, &b, 1, MSG_DONTWAIT, reinterpret_cast<const sockaddr*>(&a), len);
    }
  }
  int flush_one(std::uint32_t cq, std::uint64_t wr_id, Opcode op, std::uint32_t qpn) {
    push(cq, Wc{wr_id, WcStatus::wr_flush_err, op, 0, 0, false, qpn});
    return 0;
  }
  void to_error(QpEntry& q) {
    if (q.state == kError) return;
    q.state = kError;
    while (q.rq_head != q.rq_tail) flush_one(q.recv_cq, q.rq[q.rq_head++ % kRecvDepth].wr_id, Opcode::recv, q.qpn);
  }
  void raise(AsyncEvent ev) {
    {
      std::lock_guard lk(events_mu_);
      events_.push_back(std::move(ev));
    }
    const std::uint64_t one = 1;
    [[maybe_unused]] auto k = ::write(async_, &one, sizeof one);
  }

  Fabric* f_;
  std::size_t bytes_;
  std::string path_;
  Faults faults_;
  std::int32_t pid_ = 0;
  std::size_t hash_ = 0;
  PortInfo port_;
  int async_ = -1;
  int notify_ = -1;
  std::uint64_t regs_ = 0, posts_ = 0, writes_ = 0;
  bool overflow_told_ = false;
  std::mutex events_mu_;
  std::deque<AsyncEvent> events_;
};

}  // namespace fake

/// Opens (creating it if needed) the fake fabric at `fabric` as this process's device "fake0";
/// nullptr with `why` set when it cannot.
inline std::unique_ptr<Verbs> open_fake(const std::string& fabric, std::string& why) {
  using namespace fake;
  Faults faults;
  if (auto spec = chorus::detail::env_string("CHORUS_IB_FAKE_FAULT"))
    if (!parse_faults(*spec, faults, why)) return nullptr;
  const int fd = ::open(fabric.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    why = "cannot open the fake fabric " + fabric + ": " + std::strerror(errno);
    return nullptr;
  }
  const std::size_t bytes = (sizeof(Fabric) + 4095) / 4096 * 4096;
  struct stat st {};
  if (::fstat(fd, &st) != 0 || (static_cast<std::size_t>(st.st_size) < bytes && ::ftruncate(fd, static_cast<off_t>(bytes)) != 0)) {
    why = "cannot size the fake fabric " + fabric + ": " + std::strerror(errno);
    ::close(fd);
    return nullptr;
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) {
    why = "cannot map the fake fabric " + fabric + ": " + std::strerror(errno);
    return nullptr;
  }
  auto* f = static_cast<Fabric*>(p);
  std::uint32_t expected = 0;
  if (f->state.compare_exchange_strong(expected, 1)) {
    pthread_mutexattr_t a;
    ::pthread_mutexattr_init(&a);
    ::pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    ::pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    ::pthread_mutex_init(&f->lock, &a);
    ::pthread_mutexattr_destroy(&a);
    f->magic = kMagic;
    f->next_key = 0x1000;
    f->next_qpn = 0x100;
    f->next_cq = 1;
    f->state.store(2);
  } else {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (f->state.load() != 2 && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (f->state.load() != 2 || f->magic != kMagic) {
      ::munmap(p, bytes);
      why = "the fake fabric " + fabric + " was never set up (or is not one)";
      return nullptr;
    }
  }
  return std::make_unique<FakeVerbs>(f, bytes, fabric, faults);
}

}  // namespace chorus::rdma
