// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// The one seam between the rdma transport and the verbs: every verbs call the transport makes goes
/// through rdma::Verbs, an interface over the small subset of libibverbs it uses (one opened
/// device port: protection domain, memory registration, completion queues with a completion
/// channel, reliable-connected queue pairs, asynchronous events). Two providers implement it:
/// - ibverbs.hpp: libibverbs itself (built when CHORUS_WITH_RDMA, i.e. the program links
///   chorus::rdma);
/// - chorus/testing/fake_verbs.hpp: an in-repo fake that moves bytes between real processes of
///   one host through a shared "fabric" file (CHORUS_IB_FAKE=<path>), checks keys, bounds, access
///   and QP states as a NIC does, and injects faults (CHORUS_IB_FAKE_FAULT), for the tests; only
///   programs that include it compile it (provider.hpp).
/// The types here mirror the verbs ones (same meaning, same status numbers), so the transport
/// reads like verbs code and the real provider is a thin translation.
///
/// Threading: a provider's calls may come from any thread, one at a time per queue (the transport
/// serialises them under its own lock); poll_cq and the channel calls come from the thread that
/// drives the transport.

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace chorus::rdma {

/// ibv_wc_status values (the same numbers as enum ibv_wc_status).
enum class WcStatus : int {
  success = 0,
  loc_len_err = 1,
  loc_qp_op_err = 2,
  loc_eec_op_err = 3,
  loc_prot_err = 4,
  wr_flush_err = 5,
  mw_bind_err = 6,
  bad_resp_err = 7,
  loc_access_err = 8,
  rem_inv_req_err = 9,
  rem_access_err = 10,
  rem_op_err = 11,
  retry_exc_err = 12,
  rnr_retry_exc_err = 13,
  loc_rdd_viol_err = 14,
  rem_inv_rd_req_err = 15,
  rem_abort_err = 16,
  inv_eecn_err = 17,
  inv_eec_state_err = 18,
  fatal_err = 19,
  resp_timeout_err = 20,
  general_err = 21,
};

/// ibv_wc_status_str's text for a status (the same strings libibverbs prints).
inline const char* status_str(WcStatus s) {
  switch (s) {
    case WcStatus::success: return "success";
    case WcStatus::loc_len_err: return "local length error";
    case WcStatus::loc_qp_op_err: return "local QP operation error";
    case WcStatus::loc_eec_op_err: return "local EE context operation error";
    case WcStatus::loc_prot_err: return "local protection error";
    case WcStatus::wr_flush_err: return "Work Request Flushed Error";
    case WcStatus::mw_bind_err: return "memory management operation error";
    case WcStatus::bad_resp_err: return "bad response error";
    case WcStatus::loc_access_err: return "local access error";
    case WcStatus::rem_inv_req_err: return "remote invalid request error";
    case WcStatus::rem_access_err: return "remote access error";
    case WcStatus::rem_op_err: return "remote operation error";
    case WcStatus::retry_exc_err: return "transport retry counter exceeded";
    case WcStatus::rnr_retry_exc_err: return "RNR retry counter exceeded";
    case WcStatus::loc_rdd_viol_err: return "local RDD violation error";
    case WcStatus::rem_inv_rd_req_err: return "remote invalid RD request";
    case WcStatus::rem_abort_err: return "aborted error";
    case WcStatus::inv_eecn_err: return "invalid EE context number";
    case WcStatus::inv_eec_state_err: return "invalid EE context state";
    case WcStatus::fatal_err: return "fatal error";
    case WcStatus::resp_timeout_err: return "response timeout error";
    case WcStatus::general_err: return "general error";
  }
  return "unknown";
}

/// Access flags of a registration (the IBV_ACCESS_* bits).
enum Access : int {
  kLocalWrite = 1,
  kRemoteWrite = 2,
  kRemoteRead = 4,
};

/// What a work request does / what a completion was.
enum class Opcode : std::uint8_t {
  send,            ///< send (consumes a posted receive at the peer)
  rdma_write,      ///< RDMA write, no completion at the peer
  rdma_write_imm,  ///< RDMA write with immediate (consumes a posted receive at the peer)
  recv,            ///< completion of a receive matched by a send
  recv_rdma_imm,   ///< completion of a receive consumed by an RDMA write with immediate
};

/// One scatter/gather element (a single one per work request is all the transport uses).
struct Sge {
  std::uint64_t addr = 0;
  std::uint32_t length = 0;
  std::uint32_t lkey = 0;
};

struct SendWr {
  std::uint64_t wr_id = 0;
  Opcode opcode = Opcode::send;
  Sge sge;
  bool signaled = true;      ///< a completion on the send CQ (IBV_SEND_SIGNALED)
  bool inline_data = false;  ///< the payload is copied at post time (IBV_SEND_INLINE); lkey unused
  std::uint32_t imm = 0;     ///< for rdma_write_imm (host order here; providers convert)
  std::uint64_t remote_addr = 0;
  std::uint32_t rkey = 0;
};

struct RecvWr {
  std::uint64_t wr_id = 0;
  Sge sge;
};

/// A work completion (the fields of ibv_wc the transport reads).
struct Wc {
  std::uint64_t wr_id = 0;
  WcStatus status = WcStatus::success;
  Opcode opcode = Opcode::send;
  std::uint32_t byte_len = 0;
  std::uint32_t imm = 0;
  bool has_imm = false;
  std::uint32_t qp_num = 0;
};

/// What one side of a connection publishes so the other can bring its QP to RTR: the RoCE/IB
/// address (GID, LID), the QP number and first packet sequence number, and the path MTU (the
/// IBV_MTU_* enum value; both sides use the smaller).
struct QpAddress {
  std::uint8_t gid[16] = {};
  std::uint16_t lid = 0;
  std::uint32_t qpn = 0;
  std::uint32_t psn = 0;
  std::uint32_t mtu = 0;
};

/// The device port in use, as chosen (CHORUS_IB_HCA, CHORUS_IB_GID_INDEX).
struct PortInfo {
  std::string device;      ///< "mlx5_0", "rxe0", "fake0"
  int port = 1;
  int gid_index = 0;
  std::string link_layer;  ///< "InfiniBand" or "Ethernet"
  std::uint32_t active_mtu = 0;       ///< IBV_MTU_* enum value
  std::uint32_t max_inline_data = 0;  ///< what a QP accepted at creation (0 before one exists)
  std::uint32_t max_qp_wr = 0;
  std::uint32_t max_cqe = 0;
  std::uint64_t max_mr_size = 0;
};

/// Retry and timeout of a connected QP (CHORUS_IB_TIMEOUT, CHORUS_IB_RETRY_CNT,
/// CHORUS_IB_RNR_RETRY; NCCL's defaults).
struct QpTunables {
  std::uint8_t timeout = 20;   ///< local ACK timeout: 4.096 us * 2^timeout
  std::uint8_t retry_cnt = 7;  ///< transport retries before retry_exc_err
  std::uint8_t rnr_retry = 7;  ///< receiver-not-ready retries (7: forever)
};

/// Asynchronous events (ibv_event_type subset).
enum class AsyncKind : std::uint8_t { qp_fatal, port_down, device_fatal, other };
struct AsyncEvent {
  AsyncKind kind = AsyncKind::other;
  std::uint32_t qp_num = 0;  ///< for qp_fatal
  std::string what;          ///< ibv_event_type_str's text
};

/// Opaque handles, owned by the provider, released by the matching destroy call.
struct Mr {
  std::uint32_t lkey = 0;
  std::uint32_t rkey = 0;
  void* addr = nullptr;
  std::size_t length = 0;
  virtual ~Mr() = default;
};
struct Cq {
  virtual ~Cq() = default;
};
struct Qp {
  std::uint32_t qp_num = 0;
  virtual ~Qp() = default;
};

/// Thrown by a provider for a verbs call that failed: `err` is the errno it returned.
struct VerbsError {
  std::string call;
  int err = 0;
};

/// One opened device port. Every call that can fail returns an errno value (0 on success) or
/// throws VerbsError from the creating calls, like the verbs it stands for.
class Verbs {
 public:
  virtual ~Verbs() = default;
  virtual const PortInfo& port() const = 0;
  /// This side's GID and LID (the QP-specific fields of a QpAddress are filled by the caller).
  virtual QpAddress local_address() const = 0;

  /// ibv_reg_mr on the device's protection domain; nullptr with `err` set on failure (ENOMEM
  /// when the NIC or the locked-memory limit refuses).
  virtual Mr* reg_mr(void* addr, std::size_t length, int access, int& err) = 0;
  virtual void dereg_mr(Mr* mr) = 0;

  // --- device memory (dma-buf) -----------------------------------------------------------------
  /// ibv_reg_dmabuf_mr on the device's protection domain: `length` bytes at `offset` of the
  /// dma-buf `fd` (device memory a GPU runtime exported, device::Runtime::export_dmabuf), which
  /// work requests address as [iova, iova + length). The caller keeps `fd`; the registration
  /// holds the memory by itself (the fd may be closed once this returns). nullptr with `err` set
  /// on failure (EOPNOTSUPP or EPROTONOSUPPORT: the device or its kernel driver has no dma-buf
  /// support at all). dereg_mr releases it, as it does a host registration.
  virtual Mr* reg_dmabuf_mr(std::uint64_t offset, std::size_t length, std::uint64_t iova, int fd, int access,
                            int& err) = 0;
  /// Whether this device registers dma-bufs: probed once, by a registration of fd -1 (which can
  /// only fail), and cached. EOPNOTSUPP or EPROTONOSUPPORT say no; any other errno (EBADF,
  /// EINVAL: the fd was looked at) says yes.
  bool dmabuf_supported() {
    if (dmabuf_ == DmabufProbe::unknown) {
      int err = 0;
      Mr* m = reg_dmabuf_mr(0, 4096, 0, -1, kLocalWrite, err);
      if (m) dereg_mr(m);
      dmabuf_ = m == nullptr && dmabuf_refused(err) ? DmabufProbe::no : DmabufProbe::yes;
    }
    return dmabuf_ == DmabufProbe::yes;
  }
  /// The errno values with which a device refuses dma-buf registration as such.
  static constexpr bool dmabuf_refused(int err) { return err == EOPNOTSUPP || err == EPROTONOSUPPORT; }
  // --- end of device memory (dma-buf) ----------------------------------------------------------

  /// A CQ of at least `cqe` entries with its own completion channel.
  virtual Cq* create_cq(int cqe) = 0;
  virtual void destroy_cq(Cq* cq) = 0;
  /// Up to n completions into out; the number taken, or a negative errno.
  virtual int poll_cq(Cq* cq, int n, Wc* out) = 0;
  /// Arms the CQ: the channel's fd becomes readable at its next completion (ibv_req_notify_cq).
  virtual int req_notify_cq(Cq* cq) = 0;
  /// The completion channel's fd (non-blocking), to poll() on.
  virtual int channel_fd(Cq* cq) const = 0;
  /// After the channel fd was readable: takes and acknowledges the events (ibv_get_cq_event +
  /// ibv_ack_cq_events); never blocks.
  virtual void drain_channel(Cq* cq) = 0;

  /// An RC QP on the given CQs, in RESET; max_send/max_recv work requests, max_inline bytes asked
  /// (the provider may grant less: port().max_inline_data says what it granted).
  virtual Qp* create_qp(Cq* send_cq, Cq* recv_cq, std::uint32_t max_send, std::uint32_t max_recv,
                        std::uint32_t max_inline) = 0;
  virtual void destroy_qp(Qp* qp) = 0;
  /// RESET -> INIT -> RTR -> RTS towards `remote` (local.psn is this side's first PSN).
  virtual int connect_qp(Qp* qp, const QpAddress& local, const QpAddress& remote, const QpTunables& t) = 0;
  /// Moves the QP to ERROR: outstanding work requests complete with wr_flush_err.
  virtual int set_qp_error(Qp* qp) = 0;
  virtual int post_send(Qp* qp, const SendWr& wr) = 0;
  virtual int post_recv(Qp* qp, const RecvWr& wr) = 0;

  /// The async event fd (non-blocking) and the next event, if any (ibv_get_async_event +
  /// ibv_ack_async_event).
  virtual int async_fd() const = 0;
  virtual bool next_async_event(AsyncEvent& out) = 0;

 private:
  enum class DmabufProbe : std::uint8_t { unknown, yes, no };
  DmabufProbe dmabuf_ = DmabufProbe::unknown;
};

}  // namespace chorus::rdma
