// SPDX-License-Identifier: BSD-3-Clause
// verbs_floor: what the RDMA device itself costs for 8-byte messages, with nothing but libibverbs
// between two processes: no library, busy polling, one RC QP. It runs in the Soft-RoCE guest
// beside chorus and perftest (scripts/rdma-guest.d/chorus.sh), so that chorus's 8-byte figures can
// be read against the device's floor for the same pattern in the same boot:
//   write-pingpong   RDMA write of a sequence number into the peer's memory, which the peer polls,
//                    then the answer the same way: ib_write_lat's pattern (half round trip)
//   send-exchange    both sides send at once (inline send, one in 16 signaled, receives kept
//                    posted) and wait for the other's message: sendrecv_perf -z 2's pattern
//   write-exchange   the same exchange by RDMA writes into polled memory
// Each pattern runs `reps` times `iters` iterations; the client prints one line per run:
//   verbs_floor <pattern> 8 B: <microseconds> us
// (half round trip for the ping-pong, per iteration for the exchanges).
//
// Usage: verbs_floor -p PORT [-d DEVICE] [-x GID_INDEX] [-n ITERS] [-r REPS] [SERVER_ADDRESS]
// Without an address it is the server: it listens on PORT of every local address (the guest
// runs both on 127.0.0.1). The QP addresses go over that TCP connection. Every wait is bounded: the process
// exits non-zero after 120 s (SIGALRM) instead of hanging on a peer that is gone.
// A diagnostic of the guest run, built by scripts/run-tests' rdma stage with the host's cc.
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define CHECK(x)                                                                 \
  do {                                                                           \
    if (!(x)) {                                                                  \
      fprintf(stderr, "verbs_floor: failed: %s (line %d)\n", #x, __LINE__);     \
      exit(1);                                                                   \
    }                                                                            \
  } while (0)

enum { kSlots = 64, kSlotBytes = 64, kSignalEvery = 16, kMsgBytes = 8 };

struct peer_addr {
  uint32_t qpn, psn;
  union ibv_gid gid;
  uint64_t flag_addr;
  uint32_t flag_rkey;
};

static struct ibv_qp* qp;
static struct ibv_cq* cq;
static struct ibv_mr* slots_mr;
static char slots[kSlots * kSlotBytes];
static volatile uint64_t flag[8];  // the peer's RDMA writes land in flag[0]
static uint64_t remote_flag;
static uint32_t remote_rkey;
static int unsignaled, sends_out, recvs_ready;
static uint64_t wseq, rseq;

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static void post_recv(int slot) {
  struct ibv_sge s = {(uintptr_t)(slots + kSlotBytes * slot), kSlotBytes, slots_mr->lkey};
  struct ibv_recv_wr w = {.wr_id = 100 + (uint64_t)slot, .sg_list = &s, .num_sge = 1}, *bad;
  CHECK(ibv_post_recv(qp, &w, &bad) == 0);
}

/// One poll of the CQ: send completions counted, each receive reposted and counted as ready.
static void poll_once(void) {
  struct ibv_wc wc[16];
  const int n = ibv_poll_cq(cq, 16, wc);
  CHECK(n >= 0);
  for (int i = 0; i < n; ++i) {
    if (wc[i].status != IBV_WC_SUCCESS) {
      fprintf(stderr, "verbs_floor: work completion failed: %s\n", ibv_wc_status_str(wc[i].status));
      exit(1);
    }
    if (wc[i].wr_id == 1) {
      --sends_out;
    } else {
      post_recv((int)(wc[i].wr_id - 100));
      ++recvs_ready;
    }
  }
}

/// An inline 8-byte send (opcode IBV_WR_SEND) or an RDMA write of the next sequence number into
/// the peer's flag; one in kSignalEvery asks for a completion.
static void post(int write) {
  static uint64_t value;
  value = write ? ++wseq : 0;  // the flag counts writes only
  struct ibv_sge s = {(uintptr_t)&value, kMsgBytes, 0};
  struct ibv_send_wr w = {.wr_id = 1, .sg_list = &s, .num_sge = 1, .opcode = write ? IBV_WR_RDMA_WRITE : IBV_WR_SEND,
                          .send_flags = IBV_SEND_INLINE}, *bad;
  if (write) {
    w.wr.rdma.remote_addr = remote_flag;
    w.wr.rdma.rkey = remote_rkey;
  }
  if (++unsignaled >= kSignalEvery) {
    w.send_flags |= IBV_SEND_SIGNALED;
    unsignaled = 0;
    ++sends_out;
  }
  CHECK(ibv_post_send(qp, &w, &bad) == 0);
  while (sends_out > 2) poll_once();  // the send queue never fills
}

/// Waits for the peer's next message: a receive, or its next sequence number in the flag.
static void wait_peer(int write) {
  if (write) {
    ++rseq;
    while (flag[0] < rseq) poll_once();
  } else {
    while (recvs_ready == 0) poll_once();
    --recvs_ready;
  }
}

static void sync_peer(int fd) {
  char c = 0;
  CHECK(write(fd, &c, 1) == 1);
  CHECK(read(fd, &c, 1) == 1);
}

int main(int argc, char** argv) {
  const char* dev_name = NULL;
  int port = 0, gid_index = 1, iters = 1000, reps = 3, opt;
  while ((opt = getopt(argc, argv, "p:d:x:n:r:")) != -1) {
    switch (opt) {
      case 'p': port = atoi(optarg); break;
      case 'd': dev_name = optarg; break;
      case 'x': gid_index = atoi(optarg); break;
      case 'n': iters = atoi(optarg); break;
      case 'r': reps = atoi(optarg); break;
      default:
        fprintf(stderr, "usage: verbs_floor -p PORT [-d DEVICE] [-x GID_INDEX] [-n ITERS] [-r REPS] [SERVER_ADDRESS]\n");
        return 2;
    }
  }
  CHECK(port > 0 && iters > 0 && reps > 0);
  const char* server = optind < argc ? argv[optind] : NULL;
  alarm(120);

  int ndev = 0;
  struct ibv_device** devs = ibv_get_device_list(&ndev);
  CHECK(devs && ndev > 0);
  struct ibv_device* dev = devs[0];
  for (int i = 0; dev_name && i < ndev; ++i)
    if (strcmp(ibv_get_device_name(devs[i]), dev_name) == 0) dev = devs[i];
  struct ibv_context* ctx = ibv_open_device(dev);
  CHECK(ctx);
  struct ibv_pd* pd = ibv_alloc_pd(ctx);
  CHECK(pd);
  slots_mr = ibv_reg_mr(pd, slots, sizeof slots, IBV_ACCESS_LOCAL_WRITE);
  CHECK(slots_mr);
  struct ibv_mr* flag_mr = ibv_reg_mr(pd, (void*)flag, sizeof flag, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  CHECK(flag_mr);
  cq = ibv_create_cq(ctx, 4 * kSlots, NULL, NULL, 0);
  CHECK(cq);
  struct ibv_qp_init_attr ia = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
                                .cap = {.max_send_wr = kSlots, .max_recv_wr = kSlots, .max_send_sge = 1,
                                        .max_recv_sge = 1, .max_inline_data = kSlotBytes}};
  qp = ibv_create_qp(pd, &ia);
  CHECK(qp);
  struct ibv_qp_attr init = {.qp_state = IBV_QPS_INIT, .port_num = 1, .qp_access_flags = IBV_ACCESS_REMOTE_WRITE};
  CHECK(ibv_modify_qp(qp, &init, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0);
  for (int i = 0; i < kSlots; ++i) post_recv(i);

  struct peer_addr me = {.qpn = qp->qp_num, .psn = 4242, .flag_addr = (uintptr_t)flag, .flag_rkey = flag_mr->rkey}, peer;
  CHECK(ibv_query_gid(ctx, 1, gid_index, &me.gid) == 0);
  int fd = -1;
  if (!server) {
    const int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    CHECK(l >= 0 && setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = htonl(INADDR_ANY)};
    CHECK(bind(l, (struct sockaddr*)&sa, sizeof sa) == 0 && listen(l, 1) == 0);
    fd = accept(l, NULL, NULL);
    CHECK(fd >= 0);
  } else {
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    CHECK(inet_pton(AF_INET, server, &sa.sin_addr) == 1);
    for (;;) {  // the server may not listen yet (bounded by the alarm)
      fd = socket(AF_INET, SOCK_STREAM, 0);
      CHECK(fd >= 0);
      if (connect(fd, (struct sockaddr*)&sa, sizeof sa) == 0) break;
      close(fd);
      usleep(100000);
    }
  }
  CHECK(write(fd, &me, sizeof me) == (ssize_t)sizeof me);
  CHECK(read(fd, &peer, sizeof peer) == (ssize_t)sizeof peer);
  remote_flag = peer.flag_addr;
  remote_rkey = peer.flag_rkey;

  struct ibv_qp_attr rtr = {.qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024, .dest_qp_num = peer.qpn,
                            .rq_psn = peer.psn, .max_dest_rd_atomic = 1, .min_rnr_timer = 12,
                            .ah_attr = {.is_global = 1, .port_num = 1,
                                        .grh = {.dgid = peer.gid, .sgid_index = (uint8_t)gid_index, .hop_limit = 1}}};
  CHECK(ibv_modify_qp(qp, &rtr, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                    IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) == 0);
  struct ibv_qp_attr rts = {.qp_state = IBV_QPS_RTS, .timeout = 20, .retry_cnt = 7, .rnr_retry = 7, .sq_psn = 4242,
                            .max_rd_atomic = 1};
  CHECK(ibv_modify_qp(qp, &rts, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                                    IBV_QP_MAX_QP_RD_ATOMIC) == 0);
  sync_peer(fd);  // both QPs are ready to receive

  static const struct {
    const char* name;
    int write, exchange;
  } patterns[] = {{"write-pingpong", 1, 0}, {"send-exchange", 0, 1}, {"write-exchange", 1, 1}};
  for (size_t p = 0; p < sizeof patterns / sizeof patterns[0]; ++p) {
    const int wr = patterns[p].write;
    for (int rep = 0; rep < reps; ++rep) {
      sync_peer(fd);
      const double t0 = now_us();
      for (int i = 0; i < iters; ++i) {
        if (patterns[p].exchange || server) {  // the client starts each ping-pong
          post(wr);
          wait_peer(wr);
        } else {
          wait_peer(wr);
          post(wr);
        }
      }
      const double t = now_us() - t0;
      if (server)
        printf("verbs_floor %s 8 B: %.2f us\n", patterns[p].name, patterns[p].exchange ? t / iters : t / iters / 2);
      fflush(stdout);
    }
  }
  sync_peer(fd);  // neither side tears its QP down while the other still polls
  ibv_destroy_qp(qp);
  ibv_destroy_cq(cq);
  ibv_dereg_mr(flag_mr);
  ibv_dereg_mr(slots_mr);
  ibv_dealloc_pd(pd);
  ibv_close_device(ctx);
  ibv_free_device_list(devs);
  close(fd);
  return 0;
}
