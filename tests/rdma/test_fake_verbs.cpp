// SPDX-License-Identifier: BSD-3-Clause
// The fake verbs provider itself (testing/fake_verbs.hpp): two QPs of one process connected to
// each other (the fake copies within a process as across processes), checked the way a NIC would
// check them: keys, bounds, access, receive lengths, missing receives, flushes, the completion
// channel, dma-buf registration, and the registration cache (transport/rdma/detail/registration.hpp) on
// top of it.
#include <doctest/doctest.h>

#include <poll.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "chorus/detail/owned_memory.hpp"
#include "chorus/registered_memory.hpp"
#include "chorus/testing/fake_verbs.hpp"
#include "chorus/testing/sim_runtime.hpp"
#include "chorus/transport/rdma/detail/registration.hpp"
#include "rdma/fabric.hpp"

namespace rdma_test_fake_verbs {

namespace {

using namespace chorus::rdma;

/// One provider, one CQ, two QPs a and b connected to each other.
struct Pair {
  chorus::test::FakeFabric fabric;
  std::unique_ptr<Verbs> v;
  Cq* cq = nullptr;
  Qp* a = nullptr;
  Qp* b = nullptr;

  Pair() {
    std::string why;
    v = open_fake(fabric.path(), why);
    REQUIRE_MESSAGE(v, why);
    cq = v->create_cq(64);
    a = v->create_qp(cq, cq, 16, 16, 64);
    b = v->create_qp(cq, cq, 16, 16, 64);
    QpAddress la = v->local_address(), lb = v->local_address();
    la.qpn = a->qp_num;
    lb.qpn = b->qp_num;
    REQUIRE(v->connect_qp(a, la, lb, {}) == 0);
    REQUIRE(v->connect_qp(b, lb, la, {}) == 0);
  }
  ~Pair() {
    v->destroy_qp(a);
    v->destroy_qp(b);
    v->destroy_cq(cq);
  }
  std::vector<Wc> poll(std::size_t want) {
    std::vector<Wc> got;
    Wc w[8];
    for (int tries = 0; got.size() < want && tries < 1000; ++tries) {
      const int n = v->poll_cq(cq, 8, w);
      REQUIRE(n >= 0);
      got.insert(got.end(), w, w + n);
    }
    return got;
  }
};

Mr* reg(Verbs& v, void* p, std::size_t n, int access) {
  int err = 0;
  Mr* m = v.reg_mr(p, n, access, err);
  REQUIRE_MESSAGE(m, "reg_mr: " << err);
  return m;
}

SendWr write_to(const Mr& src, const Mr& dst, std::size_t n, std::uint64_t offset = 0) {
  SendWr w;
  w.wr_id = 7;
  w.opcode = Opcode::rdma_write;
  w.sge = {reinterpret_cast<std::uintptr_t>(src.addr), static_cast<std::uint32_t>(n), src.lkey};
  w.remote_addr = reinterpret_cast<std::uintptr_t>(dst.addr) + offset;
  w.rkey = dst.rkey;
  return w;
}

}  // namespace

TEST_CASE("fake verbs: send into a posted receive and a write with immediate") {
  Pair p;
  std::vector<char> src(100, 'x'), dst(200, 0), target(64, 0);
  Mr* ms = reg(*p.v, src.data(), src.size(), kLocalWrite);
  Mr* md = reg(*p.v, dst.data(), dst.size(), kLocalWrite);
  Mr* mt = reg(*p.v, target.data(), target.size(), kLocalWrite | kRemoteWrite);
  RecvWr r;
  r.wr_id = 11;
  r.sge = {reinterpret_cast<std::uintptr_t>(dst.data()), 200, md->lkey};
  REQUIRE(p.v->post_recv(p.b, r) == 0);
  r.wr_id = 12;
  REQUIRE(p.v->post_recv(p.b, r) == 0);
  SendWr s;
  s.wr_id = 1;
  s.sge = {reinterpret_cast<std::uintptr_t>(src.data()), 100, ms->lkey};
  REQUIRE(p.v->post_send(p.a, s) == 0);
  SendWr w = write_to(*ms, *mt, 64);
  w.opcode = Opcode::rdma_write_imm;
  w.imm = 0xabcd;
  REQUIRE(p.v->post_send(p.a, w) == 0);
  const auto got = p.poll(4);
  REQUIRE(got.size() == 4);
  CHECK(got[0].wr_id == 11);
  CHECK(got[0].opcode == Opcode::recv);
  CHECK(got[0].byte_len == 100);
  CHECK(got[1].wr_id == 1);
  CHECK(got[2].wr_id == 12);
  CHECK(got[2].opcode == Opcode::recv_rdma_imm);
  CHECK(got[2].has_imm);
  CHECK(got[2].imm == 0xabcd);
  for (const auto& g : got) CHECK(g.status == WcStatus::success);
  CHECK(std::string(dst.data(), 100) == std::string(100, 'x'));
  CHECK(std::string(target.data(), 64) == std::string(64, 'x'));
  for (Mr* m : {ms, md, mt}) p.v->dereg_mr(m);
}

TEST_CASE("fake verbs: keys bounds and access are checked") {
  Pair p;
  std::vector<char> src(64, 'y'), target(64, 0), readonly(64, 0);
  Mr* ms = reg(*p.v, src.data(), src.size(), kLocalWrite);
  Mr* mt = reg(*p.v, target.data(), target.size(), kLocalWrite | kRemoteWrite);
  Mr* mr = reg(*p.v, readonly.data(), readonly.size(), kLocalWrite);
  SUBCASE("a wrong rkey") {
    SendWr w = write_to(*ms, *mt, 8);
    w.rkey = mt->rkey + 1000;
    REQUIRE(p.v->post_send(p.a, w) == 0);
  }
  SUBCASE("past the end of the region") { REQUIRE(p.v->post_send(p.a, write_to(*ms, *mt, 16, 56)) == 0); }
  SUBCASE("a region without remote write") { REQUIRE(p.v->post_send(p.a, write_to(*ms, *mr, 8)) == 0); }
  SUBCASE("a deregistered region") {
    const Mr copy = *mt;
    p.v->dereg_mr(mt);
    mt = nullptr;
    REQUIRE(p.v->post_send(p.a, write_to(*ms, copy, 8)) == 0);
  }
  const auto got = p.poll(1);
  REQUIRE(got.size() == 1);
  CHECK(got[0].status == WcStatus::rem_access_err);
  CHECK(target == std::vector<char>(64, 0));  // nothing written
  // The requester's QP is in ERROR now: the next work request is flushed.
  REQUIRE(p.v->post_send(p.a, write_to(*ms, *mr, 8)) == 0);
  const auto flushed = p.poll(1);
  REQUIRE(flushed.size() == 1);
  CHECK(flushed[0].status == WcStatus::wr_flush_err);
  for (Mr* m : {ms, mt, mr})
    if (m) p.v->dereg_mr(m);
}

TEST_CASE("fake verbs: a send longer than the receive and a send without one") {
  Pair p;
  std::vector<char> src(100, 'z'), dst(50, 0);
  Mr* ms = reg(*p.v, src.data(), src.size(), kLocalWrite);
  Mr* md = reg(*p.v, dst.data(), dst.size(), kLocalWrite);
  SendWr s;
  s.wr_id = 1;
  s.sge = {reinterpret_cast<std::uintptr_t>(src.data()), 100, ms->lkey};
  SUBCASE("too long") {
    RecvWr r;
    r.wr_id = 2;
    r.sge = {reinterpret_cast<std::uintptr_t>(dst.data()), 50, md->lkey};
    REQUIRE(p.v->post_recv(p.b, r) == 0);
    REQUIRE(p.v->post_send(p.a, s) == 0);
    const auto got = p.poll(2);
    REQUIRE(got.size() == 2);
    CHECK(got[0].status == WcStatus::loc_len_err);
    CHECK(got[1].status == WcStatus::rem_inv_req_err);
  }
  SUBCASE("no receive posted") {
    REQUIRE(p.v->post_send(p.a, s) == 0);
    const auto got = p.poll(1);
    REQUIRE(got.size() == 1);
    CHECK(got[0].status == WcStatus::rnr_retry_exc_err);
  }
  p.v->dereg_mr(ms);
  p.v->dereg_mr(md);
}

TEST_CASE("fake verbs: set_qp_error flushes the posted receives") {
  Pair p;
  std::vector<char> dst(64);
  Mr* md = reg(*p.v, dst.data(), dst.size(), kLocalWrite);
  for (std::uint64_t id : {21, 22}) {
    RecvWr r;
    r.wr_id = id;
    r.sge = {reinterpret_cast<std::uintptr_t>(dst.data()), 64, md->lkey};
    REQUIRE(p.v->post_recv(p.b, r) == 0);
  }
  REQUIRE(p.v->set_qp_error(p.b) == 0);
  const auto got = p.poll(2);
  REQUIRE(got.size() == 2);
  CHECK(got[0].wr_id == 21);
  CHECK(got[1].wr_id == 22);
  CHECK(got[0].status == WcStatus::wr_flush_err);
  p.v->dereg_mr(md);
}

TEST_CASE("fake verbs: an armed CQ makes its channel readable at the next completion") {
  Pair p;
  std::vector<char> src(8, 'c'), dst(8, 0);
  Mr* ms = reg(*p.v, src.data(), src.size(), kLocalWrite);
  Mr* md = reg(*p.v, dst.data(), dst.size(), kLocalWrite | kRemoteWrite);
  pollfd fd{p.v->channel_fd(p.cq), POLLIN, 0};
  CHECK(::poll(&fd, 1, 0) == 0);  // nothing yet
  REQUIRE(p.v->req_notify_cq(p.cq) == 0);
  REQUIRE(p.v->post_send(p.a, write_to(*ms, *md, 8)) == 0);
  CHECK(::poll(&fd, 1, 10000) == 1);
  p.v->drain_channel(p.cq);
  CHECK(::poll(&fd, 1, 0) == 0);
  CHECK(p.poll(1).size() == 1);
  p.v->dereg_mr(ms);
  p.v->dereg_mr(md);
}

TEST_CASE("registration cache: chorus-owned memory is registered once and forgotten when freed") {
  chorus::test::FakeFabric fabric;
  std::string why;
  auto v = open_fake(fabric.path(), why);
  REQUIRE_MESSAGE(v, why);
  RegistrationCache cache(*v);
  std::uint32_t key = 0;
  {
    chorus::detail::OwnedBuffer owned(1 << 20);
    int err = 0;
    Registration r1 = cache.get(owned.data() + 100, 1000, err);
    Registration r2 = cache.get(owned.data() + 5000, 1000, err);
    REQUIRE(r1);
    REQUIRE(r2);
    CHECK(r1.cached());
    CHECK(r1.lkey() == r2.lkey());  // one registration of the whole range
    CHECK(cache.bytes() == (1u << 20));
    key = r1.lkey();
  }  // the buffer is retired: the cache lets go of it
  CHECK(cache.bytes() == 0);
  std::vector<char> user(4096);
  int err = 0;
  std::uint32_t flight_key = 0;
  {
    Registration u1 = cache.get(user.data(), user.size(), err);
    Registration u2 = cache.get(user.data(), user.size(), err);  // the same range, both in flight
    Registration part = cache.get(user.data(), 100, err);        // inside it: a range of its own
    REQUIRE(u1);
    REQUIRE(u2);
    REQUIRE(part);
    CHECK_FALSE(u1.cached());  // a user's buffer: registered for the messages in flight over it
    CHECK(u1.lkey() == u2.lkey());
    CHECK(part.lkey() != u1.lkey());
    CHECK(u1.lkey() != key);
    flight_key = u1.lkey();
    u1 = Registration();
    Registration u3 = cache.get(user.data(), user.size(), err);  // u2 still holds it
    CHECK(u3.lkey() == flight_key);
  }
  Registration u4 = cache.get(user.data(), user.size(), err);  // every holder gone: a new one
  REQUIRE(u4);
  CHECK(u4.lkey() != flight_key);
}

TEST_CASE("registration cache: memory the user registered is registered once, past the cap, until released") {
  chorus::test::FakeFabric fabric;
  std::string why;
  auto v = open_fake(fabric.path(), why);
  REQUIRE_MESSAGE(v, why);
  // A cap of one page for chorus's own ranges; the user's count against none.
  struct CapGuard {
    CapGuard() { ::setenv("CHORUS_IB_REG_CACHE_BYTES", "4096", 1); }
    ~CapGuard() { ::unsetenv("CHORUS_IB_REG_CACHE_BYTES"); }
  } cap;
  RegistrationCache cache(*v);
  std::vector<char> user(4 * 4096);
  int err = 0;
  std::uint32_t key = 0;
  {
    chorus::RegisteredMemory reg(user);
    Registration r1 = cache.get(user.data() + 100, 1000, err);
    Registration r2 = cache.get(user.data() + 3 * 4096, 4096, err);
    REQUIRE(r1);
    REQUIRE(r2);
    CHECK(r1.cached());
    CHECK(r1.lkey() == r2.lkey());  // one registration of the whole range, four times the cap
    CHECK(cache.bytes() == 0);
    key = r1.lkey();
    // Two ranges of chorus's own: the second pushes the first out, never the user's.
    chorus::detail::OwnedBuffer a(4096), b(4096);
    const std::uint32_t ka = cache.get(a.data(), 16, err).lkey();
    CHECK(cache.get(b.data(), 16, err).cached());
    CHECK(cache.bytes() == 4096);
    CHECK(cache.get(a.data(), 16, err).lkey() != ka);  // a was dropped and registered again
    CHECK(cache.get(user.data(), 8, err).lkey() == key);
    reg.reset();  // released: the next message registers on its own
    Registration r3 = cache.get(user.data(), 8, err);
    REQUIRE(r3);
    CHECK_FALSE(r3.cached());
    CHECK(r3.lkey() != key);
    CHECK(r1.lkey() == key);  // the messages that held it keep it until they end
  }
  Registration u = cache.get(user.data(), user.size(), err);
  REQUIRE(u);
  CHECK_FALSE(u.cached());
}

TEST_CASE("fake verbs: a dma-buf registers its iova range after a size check, and the fault refuses it") {
  Pair p;
  CHECK(p.v->dmabuf_supported());
  // Two pages of a memfd mapped here: the second page is registered through the fd.
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  const int fd = ::memfd_create("chorus-test-dmabuf", MFD_CLOEXEC);
  REQUIRE(fd >= 0);
  REQUIRE(::ftruncate(fd, static_cast<off_t>(2 * page)) == 0);
  void* map = ::mmap(nullptr, 2 * page, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  REQUIRE(map != MAP_FAILED);
  auto* second = static_cast<char*>(map) + page;
  int err = 0;
  CHECK(p.v->reg_dmabuf_mr(page, page + 1, reinterpret_cast<std::uintptr_t>(second), fd, kLocalWrite | kRemoteWrite, err) ==
        nullptr);
  CHECK(err == EINVAL);  // past the end of the fd
  err = 0;
  CHECK(p.v->reg_dmabuf_mr(0, page, reinterpret_cast<std::uintptr_t>(second), -1, kLocalWrite | kRemoteWrite, err) == nullptr);
  CHECK(err == EINVAL);  // no fd
  Mr* dst = p.v->reg_dmabuf_mr(page, page, reinterpret_cast<std::uintptr_t>(second), fd, kLocalWrite | kRemoteWrite, err);
  REQUIRE_MESSAGE(dst, "reg_dmabuf_mr: " << err);
  ::close(fd);  // the registration holds the memory by itself
  std::vector<char> src(page, 'd');
  Mr* ms = reg(*p.v, src.data(), src.size(), kLocalWrite);
  SUBCASE("a write inside it lands") {
    REQUIRE(p.v->post_send(p.a, write_to(*ms, *dst, page)) == 0);
    const auto got = p.poll(1);
    REQUIRE(got.size() == 1);
    CHECK(got[0].status == WcStatus::success);
    CHECK(std::memcmp(second, src.data(), page) == 0);
  }
  SUBCASE("a write past its end is refused") {
    REQUIRE(p.v->post_send(p.a, write_to(*ms, *dst, 16, page - 8)) == 0);
    const auto got = p.poll(1);
    REQUIRE(got.size() == 1);
    CHECK(got[0].status == WcStatus::rem_access_err);
  }
  p.v->dereg_mr(ms);
  p.v->dereg_mr(dst);
  ::munmap(map, 2 * page);

  ::setenv("CHORUS_IB_FAKE_FAULT", "dmabuf_unsupported", 1);
  std::string why;
  auto refusing = open_fake(p.fabric.path(), why);
  ::unsetenv("CHORUS_IB_FAKE_FAULT");
  REQUIRE_MESSAGE(refusing, why);
  CHECK_FALSE(refusing->dmabuf_supported());
  err = 0;
  CHECK(refusing->reg_dmabuf_mr(0, 1, 0, 0, kLocalWrite, err) == nullptr);
  CHECK(err == EOPNOTSUPP);
}

TEST_CASE("registration cache: device memory is registered per message through the runtime's dma-buf") {
  Pair p;
  RegistrationCache regs(*p.v);
  chorus::device::SimRuntime rt;
  constexpr std::size_t kBytes = 3 * 4096 + 100;
  auto* d = static_cast<std::byte*>(rt.alloc_device(kBytes));
  std::string why;
  Registration a = regs.get_device(rt, d + 100, 5000, why);
  REQUIRE_MESSAGE(a, why);
  CHECK_FALSE(a.cached());
  Registration b = regs.get_device(rt, d + 100, 5000, why);
  REQUIRE_MESSAGE(b, why);
  CHECK(b.rkey() != a.rkey());  // never shared: one registration per message
  // An RDMA write through it lands in the device allocation.
  std::vector<char> src(5000, 'x');
  Mr* ms = reg(*p.v, src.data(), src.size(), kLocalWrite);
  Mr dst;
  dst.addr = d + 100;
  dst.rkey = a.rkey();
  REQUIRE(p.v->post_send(p.a, write_to(*ms, dst, src.size())) == 0);
  const auto got = p.poll(1);
  REQUIRE(got.size() == 1);
  CHECK(got[0].status == WcStatus::success);
  std::vector<char> back(src.size());
  rt.copy(back.data(), d + 100, back.size(), nullptr);
  rt.synchronize(chorus::device::Stream{});
  CHECK(back == src);
  // Memory that is not in a live device allocation is refused, saying why.
  std::vector<std::byte> host(64);
  CHECK_FALSE(regs.get_device(rt, host.data(), host.size(), why));
  CHECK(why.find("export_dmabuf") != std::string::npos);
  p.v->dereg_mr(ms);
  a = Registration();
  b = Registration();
  rt.free_device(d);
}

}  // namespace rdma_test_fake_verbs
