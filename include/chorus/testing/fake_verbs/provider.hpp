// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// The fake verbs provider's device (testing/fake_verbs.hpp): FakeVerbs, the rdma::Verbs that one
/// process opens on a fake fabric (fabric.hpp has the shared tables, what is modelled and the
/// faults).

#include <errno.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <string>

#include "chorus/testing/fake_verbs/fabric.hpp"
#include "chorus/transport/rdma/detail/verbs.hpp"

namespace chorus::rdma {
namespace fake {

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

}  // namespace chorus::rdma
