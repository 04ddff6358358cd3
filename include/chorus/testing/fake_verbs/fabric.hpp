// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// The fake verbs provider (rdma::Verbs, transport/rdma/detail/verbs.hpp) for tests: an RC-capable "NIC" shared by real
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
/// simulated device runtime (testing/sim_runtime.hpp), whose device memory is memfd pages mapped at
/// the device address, which is the iova the transport passes.
/// An unknown kind fails open_fake, naming it.
///
/// This file: the fabric's shared tables, its lock and the faults; provider.hpp: the device one
/// process opens (FakeVerbs); testing/fake_verbs.hpp: open_fake and its registration.

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <type_traits>

#include "chorus/transport/rdma/detail/verbs.hpp"

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

}  // namespace fake
}  // namespace chorus::rdma
