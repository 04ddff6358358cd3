// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// The libibverbs provider of rdma::Verbs (verbs.hpp): a thin translation of the seam's calls to
/// verbs, on one device port. Built when CHORUS_WITH_RDMA is defined (the program links
/// chorus::rdma, which links libibverbs).
///
/// The port is chosen as NCCL chooses it: CHORUS_IB_HCA ("mlx5_0", "mlx5_0:1", "rxe0") or else the
/// first device with an ACTIVE port; the GID index CHORUS_IB_GID_INDEX or else, on Ethernet (RoCE),
/// the first RoCE v2 GID of an IPv4 address (::ffff:a.b.c.d), else of an IPv6 one, and on
/// InfiniBand index 0 with the port's LID.

#if !defined(CHORUS_WITH_RDMA)
#error "chorus/transport/rdma/detail/ibverbs.hpp needs libibverbs: link the program with chorus::rdma"
#endif

#include <arpa/inet.h>
#include <fcntl.h>
#include <infiniband/verbs.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>

#include "chorus/detail/env.hpp"
#include "chorus/transport/rdma/detail/verbs.hpp"

namespace chorus::rdma {
namespace ib {

struct IbMr final : Mr {
  ibv_mr* mr = nullptr;
};
struct IbCq final : Cq {
  ibv_cq* cq = nullptr;
  ibv_comp_channel* channel = nullptr;
  unsigned unacked = 0;  ///< events taken, acknowledged in batches
};
struct IbQp final : Qp {
  ibv_qp* qp = nullptr;
};

inline void set_nonblocking(int fd) {
  const int fl = ::fcntl(fd, F_GETFL);
  if (fl >= 0) ::fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

inline bool is_ipv4_mapped(const ibv_gid& g) {
  static constexpr std::uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return std::memcmp(g.raw, prefix, sizeof prefix) == 0;
}
inline bool is_zero(const ibv_gid& g) {
  for (auto b : g.raw)
    if (b) return false;
  return true;
}

/// The GID index to use on an Ethernet port: the first RoCE v2 entry of an IPv4 address, else the
/// first RoCE v2 one, else -1.
inline int roce_v2_gid(ibv_context* ctx, int port, int table_len) {
  int v6 = -1;
  for (int i = 0; i < table_len; ++i) {
    ibv_gid_entry e{};
    if (ibv_query_gid_ex(ctx, static_cast<std::uint32_t>(port), static_cast<std::uint32_t>(i), &e, 0) != 0) continue;
    if (e.gid_type != IBV_GID_TYPE_ROCE_V2 || is_zero(e.gid)) continue;
    if (is_ipv4_mapped(e.gid)) return i;
    if (v6 < 0) v6 = i;
  }
  return v6;
}

inline const char* event_text(ibv_event_type t) { return ibv_event_type_str(t); }

class IbVerbs final : public Verbs {
 public:
  IbVerbs(ibv_context* ctx, int port, int gid_index, const ibv_port_attr& pa, const ibv_device_attr& da)
      : ctx_(ctx) {
    pd_ = ibv_alloc_pd(ctx_);
    if (!pd_) {
      const int e = errno;
      ibv_close_device(ctx_);
      throw VerbsError{"ibv_alloc_pd", e};
    }
    set_nonblocking(ctx_->async_fd);
    port_.device = ibv_get_device_name(ctx_->device);
    port_.port = port;
    port_.gid_index = gid_index;
    port_.link_layer = pa.link_layer == IBV_LINK_LAYER_ETHERNET ? "Ethernet" : "InfiniBand";
    port_.active_mtu = static_cast<std::uint32_t>(pa.active_mtu);
    port_.max_qp_wr = static_cast<std::uint32_t>(da.max_qp_wr);
    port_.max_cqe = static_cast<std::uint32_t>(da.max_cqe);
    port_.max_mr_size = da.max_mr_size;
    lid_ = pa.lid;
    if (ibv_query_gid(ctx_, static_cast<std::uint8_t>(port), gid_index, &gid_) != 0) std::memset(&gid_, 0, sizeof gid_);
  }
  ~IbVerbs() override {
    ibv_dealloc_pd(pd_);
    ibv_close_device(ctx_);
  }

  const PortInfo& port() const override { return port_; }
  QpAddress local_address() const override {
    QpAddress a;
    std::memcpy(a.gid, gid_.raw, sizeof a.gid);
    a.lid = lid_;
    a.mtu = port_.active_mtu;
    return a;
  }

  Mr* reg_mr(void* addr, std::size_t length, int access, int& err) override {
    ibv_mr* m = ibv_reg_mr(pd_, addr, length, access_flags(access));
    if (!m) {
      err = errno ? errno : ENOMEM;
      return nullptr;
    }
    return wrap(m, addr, length);
  }
  void dereg_mr(Mr* mr) override {
    auto* r = static_cast<IbMr*>(mr);
    ibv_dereg_mr(r->mr);
    delete r;
  }

  // --- device memory (dma-buf) -----------------------------------------------------------------
  Mr* reg_dmabuf_mr(std::uint64_t offset, std::size_t length, std::uint64_t iova, int fd, int access,
                    int& err) override {
    ibv_mr* m = ibv_reg_dmabuf_mr(pd_, offset, length, iova, fd, access_flags(access));
    if (!m) {
      err = errno ? errno : EINVAL;
      return nullptr;
    }
    return wrap(m, reinterpret_cast<void*>(static_cast<std::uintptr_t>(iova)), length);
  }
  // --- end of device memory (dma-buf) ----------------------------------------------------------

  Cq* create_cq(int cqe) override {
    auto c = std::make_unique<IbCq>();
    c->channel = ibv_create_comp_channel(ctx_);
    if (!c->channel) throw VerbsError{"ibv_create_comp_channel", errno};
    set_nonblocking(c->channel->fd);
    c->cq = ibv_create_cq(ctx_, std::min<int>(cqe, static_cast<int>(port_.max_cqe)), nullptr, c->channel, 0);
    if (!c->cq) {
      const int e = errno;
      ibv_destroy_comp_channel(c->channel);
      throw VerbsError{"ibv_create_cq", e};
    }
    return c.release();
  }
  void destroy_cq(Cq* cq) override {
    auto* c = static_cast<IbCq*>(cq);
    if (c->unacked) ibv_ack_cq_events(c->cq, c->unacked);
    ibv_destroy_cq(c->cq);
    ibv_destroy_comp_channel(c->channel);
    delete c;
  }
  int poll_cq(Cq* cq, int n, Wc* out) override {
    ibv_wc wc[32];
    const int k = ibv_poll_cq(static_cast<IbCq*>(cq)->cq, std::min(n, 32), wc);
    if (k < 0) return -EIO;
    for (int i = 0; i < k; ++i) {
      Wc& w = out[i];
      w.wr_id = wc[i].wr_id;
      w.status = static_cast<WcStatus>(wc[i].status);
      switch (wc[i].opcode) {
        case IBV_WC_SEND: w.opcode = Opcode::send; break;
        case IBV_WC_RDMA_WRITE: w.opcode = Opcode::rdma_write; break;
        case IBV_WC_RECV: w.opcode = Opcode::recv; break;
        case IBV_WC_RECV_RDMA_WITH_IMM: w.opcode = Opcode::recv_rdma_imm; break;
        default: w.opcode = Opcode::send; break;  // an error completion's opcode is undefined
      }
      w.byte_len = wc[i].byte_len;
      w.has_imm = (wc[i].wc_flags & IBV_WC_WITH_IMM) != 0;
      w.imm = w.has_imm ? ntohl(wc[i].imm_data) : 0;
      w.qp_num = wc[i].qp_num;
    }
    return k;
  }
  int req_notify_cq(Cq* cq) override { return ibv_req_notify_cq(static_cast<IbCq*>(cq)->cq, 0); }
  int channel_fd(Cq* cq) const override { return static_cast<IbCq*>(cq)->channel->fd; }
  void drain_channel(Cq* cq) override {
    auto* c = static_cast<IbCq*>(cq);
    ibv_cq* ev_cq = nullptr;
    void* ev_ctx = nullptr;
    while (ibv_get_cq_event(c->channel, &ev_cq, &ev_ctx) == 0) ++c->unacked;
    if (c->unacked >= 64) {
      ibv_ack_cq_events(c->cq, c->unacked);
      c->unacked = 0;
    }
  }

  Qp* create_qp(Cq* send_cq, Cq* recv_cq, std::uint32_t max_send, std::uint32_t max_recv, std::uint32_t max_inline) override {
    ibv_qp_init_attr a{};
    a.send_cq = static_cast<IbCq*>(send_cq)->cq;
    a.recv_cq = static_cast<IbCq*>(recv_cq)->cq;
    a.qp_type = IBV_QPT_RC;
    a.cap.max_send_wr = max_send;
    a.cap.max_recv_wr = max_recv;
    a.cap.max_send_sge = 1;
    a.cap.max_recv_sge = 1;
    a.cap.max_inline_data = max_inline;
    ibv_qp* q = ibv_create_qp(pd_, &a);
    if (!q && max_inline > 0) {  // a device without inline data (or less of it)
      a.cap.max_inline_data = 0;
      q = ibv_create_qp(pd_, &a);
    }
    if (!q) throw VerbsError{"ibv_create_qp", errno};
    port_.max_inline_data = a.cap.max_inline_data;
    auto* r = new IbQp;
    r->qp = q;
    r->qp_num = q->qp_num;
    return r;
  }
  void destroy_qp(Qp* qp) override {
    auto* r = static_cast<IbQp*>(qp);
    ibv_destroy_qp(r->qp);
    delete r;
  }
  int connect_qp(Qp* qp, const QpAddress& local, const QpAddress& remote, const QpTunables& t) override {
    ibv_qp* q = static_cast<IbQp*>(qp)->qp;
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.pkey_index = 0;
    a.port_num = static_cast<std::uint8_t>(port_.port);
    a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE;
    if (int e = ibv_modify_qp(q, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS); e != 0) return e;

    a = {};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = static_cast<ibv_mtu>(std::min(local.mtu, remote.mtu));
    a.dest_qp_num = remote.qpn;
    a.rq_psn = remote.psn;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 12;
    a.ah_attr.port_num = static_cast<std::uint8_t>(port_.port);
    if (port_.link_layer == "Ethernet") {
      a.ah_attr.is_global = 1;
      std::memcpy(a.ah_attr.grh.dgid.raw, remote.gid, sizeof remote.gid);
      a.ah_attr.grh.sgid_index = static_cast<std::uint8_t>(port_.gid_index);
      a.ah_attr.grh.hop_limit = 255;
    } else {
      a.ah_attr.dlid = remote.lid;
    }
    if (int e = ibv_modify_qp(q, &a,
                              IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
        e != 0)
      return e;

    a = {};
    a.qp_state = IBV_QPS_RTS;
    a.timeout = t.timeout;
    a.retry_cnt = t.retry_cnt;
    a.rnr_retry = t.rnr_retry;
    a.sq_psn = local.psn;
    a.max_rd_atomic = 1;
    return ibv_modify_qp(q, &a,
                         IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                             IBV_QP_MAX_QP_RD_ATOMIC);
  }
  int set_qp_error(Qp* qp) override {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_ERR;
    return ibv_modify_qp(static_cast<IbQp*>(qp)->qp, &a, IBV_QP_STATE);
  }
  int post_send(Qp* qp, const SendWr& wr) override {
    ibv_sge sge{wr.sge.addr, wr.sge.length, wr.sge.lkey};
    ibv_send_wr w{};
    ibv_send_wr* bad = nullptr;
    w.wr_id = wr.wr_id;
    w.sg_list = &sge;
    w.num_sge = wr.sge.length ? 1 : 0;
    switch (wr.opcode) {
      case Opcode::send: w.opcode = IBV_WR_SEND; break;
      case Opcode::rdma_write: w.opcode = IBV_WR_RDMA_WRITE; break;
      case Opcode::rdma_write_imm: w.opcode = IBV_WR_RDMA_WRITE_WITH_IMM; break;
      default: return EINVAL;
    }
    if (wr.opcode == Opcode::rdma_write_imm) w.imm_data = htonl(wr.imm);
    w.send_flags = (wr.signaled ? IBV_SEND_SIGNALED : 0) | (wr.inline_data ? IBV_SEND_INLINE : 0);
    w.wr.rdma.remote_addr = wr.remote_addr;
    w.wr.rdma.rkey = wr.rkey;
    return ibv_post_send(static_cast<IbQp*>(qp)->qp, &w, &bad);
  }
  int post_recv(Qp* qp, const RecvWr& wr) override {
    ibv_sge sge{wr.sge.addr, wr.sge.length, wr.sge.lkey};
    ibv_recv_wr w{};
    ibv_recv_wr* bad = nullptr;
    w.wr_id = wr.wr_id;
    w.sg_list = &sge;
    w.num_sge = 1;
    return ibv_post_recv(static_cast<IbQp*>(qp)->qp, &w, &bad);
  }

  int async_fd() const override { return ctx_->async_fd; }
  bool next_async_event(AsyncEvent& out) override {
    ibv_async_event ev;
    if (ibv_get_async_event(ctx_, &ev) != 0) return false;
    out.what = event_text(ev.event_type);
    out.qp_num = 0;
    switch (ev.event_type) {
      case IBV_EVENT_QP_FATAL:
      case IBV_EVENT_QP_REQ_ERR:
      case IBV_EVENT_QP_ACCESS_ERR:
        out.kind = AsyncKind::qp_fatal;
        out.qp_num = ev.element.qp ? ev.element.qp->qp_num : 0;
        break;
      case IBV_EVENT_PORT_ERR: out.kind = AsyncKind::port_down; break;
      case IBV_EVENT_DEVICE_FATAL: out.kind = AsyncKind::device_fatal; break;
      default: out.kind = AsyncKind::other; break;
    }
    ibv_ack_async_event(&ev);
    return true;
  }

 private:
  static int access_flags(int access) {
    int flags = 0;
    if (access & kLocalWrite) flags |= IBV_ACCESS_LOCAL_WRITE;
    if (access & kRemoteWrite) flags |= IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE;
    if (access & kRemoteRead) flags |= IBV_ACCESS_REMOTE_READ;
    return flags;
  }
  static Mr* wrap(ibv_mr* m, void* addr, std::size_t length) {
    auto* r = new IbMr;
    r->mr = m;
    r->lkey = m->lkey;
    r->rkey = m->rkey;
    r->addr = addr;
    r->length = length;
    return r;
  }

  ibv_context* ctx_;
  ibv_pd* pd_ = nullptr;
  PortInfo port_;
  ibv_gid gid_{};
  std::uint16_t lid_ = 0;
};

/// Opens `dev`'s port (port 0: the first active one); nullptr with `why` when it cannot be used.
inline std::unique_ptr<Verbs> open_port(ibv_device* dev, int want_port, std::optional<int> gid_index, std::string& why) {
  const std::string name = ibv_get_device_name(dev);
  ibv_context* ctx = ibv_open_device(dev);
  if (!ctx) {
    why = name + ": ibv_open_device failed (" + std::strerror(errno) + ")";
    return nullptr;
  }
  ibv_device_attr da{};
  if (ibv_query_device(ctx, &da) != 0) {
    why = name + ": ibv_query_device failed";
    ibv_close_device(ctx);
    return nullptr;
  }
  for (int p = 1; p <= da.phys_port_cnt; ++p) {
    if (want_port != 0 && p != want_port) continue;
    ibv_port_attr pa{};
    if (ibv_query_port(ctx, static_cast<std::uint8_t>(p), &pa) != 0) continue;
    if (pa.state != IBV_PORT_ACTIVE) {
      why = name + ":" + std::to_string(p) + " is not active";
      continue;
    }
    int gid = 0;
    if (gid_index) {
      gid = *gid_index;
    } else if (pa.link_layer == IBV_LINK_LAYER_ETHERNET) {
      gid = roce_v2_gid(ctx, p, pa.gid_tbl_len);
      if (gid < 0) {
        why = name + ":" + std::to_string(p) + " has no RoCE v2 GID (set CHORUS_IB_GID_INDEX)";
        continue;
      }
    }
    try {
      return std::make_unique<IbVerbs>(ctx, p, gid, pa, da);
    } catch (const VerbsError& e) {
      why = name + ": " + e.call + " failed (" + std::strerror(e.err) + ")";
      return nullptr;  // IbVerbs closed the device
    }
  }
  if (why.empty()) why = name + " has no usable port";
  ibv_close_device(ctx);
  return nullptr;
}

}  // namespace ib

/// Opens the device port chosen as NCCL does (the file comment); nullptr with `why` set, naming
/// the devices seen and why each was not used, when none can be.
inline std::unique_ptr<Verbs> open_ibverbs(std::string& why) {
  std::string hca;
  int want_port = 0;
  if (auto v = chorus::detail::env_string("CHORUS_IB_HCA")) {
    hca = *v;
    if (const auto colon = hca.find(':'); colon != std::string::npos) {
      want_port = std::atoi(hca.c_str() + colon + 1);
      hca.resize(colon);
    }
  }
  std::optional<int> gid_index;
  if (auto g = chorus::detail::env_int("CHORUS_IB_GID_INDEX", 0, 1023)) gid_index = static_cast<int>(*g);
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (!list) {
    why = std::string("no RDMA devices (ibv_get_device_list: ") + std::strerror(errno) + ")";
    return nullptr;
  }
  std::string seen;
  std::unique_ptr<Verbs> v;
  for (int i = 0; i < n && !v; ++i) {
    const std::string name = ibv_get_device_name(list[i]);
    if (!hca.empty() && name != hca) continue;
    std::string reason;
    v = ib::open_port(list[i], want_port, gid_index, reason);
    if (!v) seen += (seen.empty() ? "" : "; ") + reason;
  }
  ibv_free_device_list(list);
  if (v) return v;
  if (n == 0)
    why = "no RDMA devices";
  else if (!hca.empty() && seen.empty())
    why = "no device named '" + hca + "' (CHORUS_IB_HCA)";
  else
    why = seen;
  return nullptr;
}

}  // namespace chorus::rdma
