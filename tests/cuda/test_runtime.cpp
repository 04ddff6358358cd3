// SPDX-License-Identifier: BSD-3-Clause
#include "chorus/device/runtime.hpp"

#include <doctest/doctest.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "chorus/core/error.hpp"
#include "cuda/gpu_test.hpp"
#include "cuda_runtime_instance.hpp"

// device::CudaRuntime on a GPU, through the device::Runtime seam it implements (the runtime comes
// from the build's one nvcc translation unit, cmake/instances/cuda_runtime_instance.cu): devices,
// memory kinds, copies and fills, streams and events, reductions, wait_flag released by the host or
// timing out, the step flags (write_value and wait_value: released, timed out, aborted), dma-buf
// export, and the text of its errors.

namespace {

using chorus::MemoryKind;
using chorus::device::Event;
using chorus::device::Runtime;
using chorus::device::Stream;

/// A stream and two events, destroyed at scope exit.
struct StreamAndEvents {
  explicit StreamAndEvents(Runtime& rt, bool timing = false)
      : rt(rt), s(rt.create_stream()), start(rt.create_event(timing)), end(rt.create_event(timing)) {}
  ~StreamAndEvents() {
    rt.destroy_event(end);
    rt.destroy_event(start);
    rt.destroy_stream(s);
  }
  StreamAndEvents(const StreamAndEvents&) = delete;
  StreamAndEvents& operator=(const StreamAndEvents&) = delete;
  Runtime& rt;
  Stream s;
  Event start;
  Event end;
};

}  // namespace

TEST_CASE("runtime: devices") {
  auto owner = chorus::instances::make_cuda_runtime();
  Runtime& rt = *owner;
  CHECK(rt.name() == "cuda");
  REQUIRE(rt.device_count() > 0);
  rt.set_device(0);
  CHECK(rt.current_device() == 0);
}

TEST_CASE("runtime: memory kinds and allocations") {
  auto owner = chorus::instances::make_cuda_runtime();
  Runtime& rt = *owner;
  void* d = rt.alloc_device(1024);
  void* d0 = rt.alloc_device(0);
  void* d0b = rt.alloc_device(0);
  void* pinned = rt.alloc_pinned(256);
  void* managed = nullptr;
  chorus::test::gpu::cuda_require(cudaMallocManaged(&managed, 64), "cudaMallocManaged");
  std::vector<int> pageable(16);
  int on_stack = 0;
  CHECK(rt.kind_of(d) == MemoryKind::device);
  CHECK(rt.kind_of(static_cast<char*>(d) + 1000) == MemoryKind::device);
  CHECK(rt.kind_of(managed) == MemoryKind::device);
  CHECK(rt.kind_of(pinned) == MemoryKind::host);
  CHECK(rt.kind_of(pageable.data()) == MemoryKind::host);
  CHECK(rt.kind_of(&on_stack) == MemoryKind::host);
  CHECK(d0 != nullptr);
  CHECK(d0 != d0b);
  CHECK(rt.kind_of(d0) == MemoryKind::device);
  (void)cudaFree(managed);
  rt.free_pinned(pinned);
  rt.free_device(d0b);
  rt.free_device(d0);
  rt.free_device(d);
  rt.free_device(nullptr);
  rt.free_pinned(nullptr);
}

TEST_CASE("runtime: copies and fills between host, pinned and device memory, ordered by events") {
  auto owner = chorus::instances::make_cuda_runtime();
  Runtime& rt = *owner;
  constexpr std::size_t kBytes = (1 << 20) + 13;
  std::vector<unsigned char> src(kBytes);
  std::iota(src.begin(), src.end(), static_cast<unsigned char>(7));
  auto* dev = static_cast<unsigned char*>(rt.alloc_device(kBytes));
  auto* pinned = static_cast<unsigned char*>(rt.alloc_pinned(kBytes));
  StreamAndEvents one(rt);
  StreamAndEvents two(rt);

  // Stream one: host -> device, a fill of a middle range; stream two waits for it, then device ->
  // pinned. Without the wait the copy on two could run first.
  rt.copy(dev, src.data(), kBytes, one.s);
  rt.fill(dev + 100, 0xee, 1000, one.s);
  rt.record(one.end, one.s);
  rt.wait(two.s, one.end);
  rt.copy(pinned, dev, kBytes, two.s);
  rt.record(two.end, two.s);
  rt.synchronize(two.end);
  CHECK(rt.query(two.end));
  CHECK(rt.query(one.end));
  std::vector<unsigned char> want(src);
  std::memset(want.data() + 100, 0xee, 1000);
  CHECK(std::memcmp(pinned, want.data(), kBytes) == 0);

  // pinned -> host and a zero-byte copy.
  std::vector<unsigned char> back(kBytes);
  rt.copy(back.data(), pinned, kBytes, one.s);
  rt.copy(back.data(), pinned, 0, one.s);
  rt.synchronize(one.s);
  CHECK(back == want);
  rt.free_pinned(pinned);
  rt.free_device(dev);
}

TEST_CASE("runtime: after load_kernels, a reduction's first launch runs while a wait_flag holds another stream") {
  // Without load_kernels, CUDA's lazy loading loads a kernel at its first launch, and that load may
  // wait for the whole device, here for the wait_flag kernel, which waits for this thread: the
  // launch would return only once the flag timed out (10 s), after which `held` is past its end.
  // A communicator calls load_kernels before its first call on device buffers. This is the first
  // test of the file to launch a reduction (doctest runs them in file order), and no later
  // one reduces int8 with bxor.
  auto owner = chorus::instances::make_cuda_runtime();
  Runtime& rt = *owner;
  rt.load_kernels();
  rt.load_kernels();  // again: at once
  auto* flag = static_cast<std::uint32_t*>(rt.alloc_pinned(sizeof(std::uint32_t)));
  *flag = 0;
  constexpr std::size_t kCount = 4099;
  auto* d = static_cast<std::int8_t*>(rt.alloc_device(kCount));
  std::vector<std::int8_t> host(kCount);
  for (std::size_t i = 0; i < kCount; ++i) host[i] = static_cast<std::int8_t>(i * 7);
  StreamAndEvents held(rt), work(rt);
  rt.copy(d, host.data(), kCount, work.s);
  rt.synchronize(work.s);
  rt.wait_flag(held.s, flag, 10'000'000'000ull);
  rt.record(held.end, held.s);
  const void* srcs[3] = {d, d, d};
  rt.reduce_many(chorus::ReduceOp::bxor, chorus::DataType::int8, d, srcs, 3, kCount, work.s);  // x ^ x ^ x = x
  rt.record(work.end, work.s);
  rt.synchronize(work.end);
  CHECK_FALSE(rt.query(held.end));  // still held: the reduction did not wait for the flag
  std::atomic_ref<std::uint32_t>(*flag).store(1, std::memory_order_release);
  rt.synchronize(held.end);
  std::vector<std::int8_t> got(kCount);
  auto* got_p = static_cast<std::int8_t*>(rt.alloc_pinned(kCount));
  rt.copy(got_p, d, kCount, work.s);
  rt.synchronize(work.s);
  std::memcpy(got.data(), got_p, kCount);
  CHECK(got == host);
  rt.free_pinned(got_p);
  rt.free_device(d);
  rt.free_pinned(flag);
}

TEST_CASE("runtime: reduce and finalize_avg through the runtime") {
  auto owner = chorus::instances::make_cuda_runtime();
  Runtime& rt = *owner;
  constexpr std::size_t kCount = 1001;
  std::vector<float> a(kCount), b(kCount);
  for (std::size_t i = 0; i < kCount; ++i) {
    a[i] = static_cast<float>(i);
    b[i] = 3.0f * static_cast<float>(i) + 1.0f;
  }
  auto* da = static_cast<float*>(rt.alloc_device(kCount * sizeof(float)));
  auto* db = static_cast<float*>(rt.alloc_device(kCount * sizeof(float)));
  StreamAndEvents se(rt);
  rt.copy(da, a.data(), kCount * sizeof(float), se.s);
  rt.copy(db, b.data(), kCount * sizeof(float), se.s);
  rt.reduce(chorus::ReduceOp::avg, chorus::DataType::float32, da, da, db, kCount, se.s);
  rt.finalize_avg(chorus::DataType::float32, da, kCount, 2, se.s);
  std::vector<float> got(kCount);
  rt.copy(got.data(), da, kCount * sizeof(float), se.s);
  rt.synchronize(se.s);
  for (std::size_t i = 0; i < kCount; ++i) {
    CAPTURE(i);
    REQUIRE(got[i] == 2.0f * static_cast<float>(i) + 0.5f);  // exact in float
  }
  CHECK_THROWS_AS(rt.reduce(chorus::ReduceOp::bxor, chorus::DataType::float32, da, da, db, kCount, se.s),
                  chorus::Error);
  rt.free_device(db);
  rt.free_device(da);
}

TEST_CASE("runtime: wait_flag holds the stream until the host sets the flag") {
  auto owner = chorus::instances::make_cuda_runtime();
  Runtime& rt = *owner;
  auto* flag = static_cast<std::uint32_t*>(rt.alloc_pinned(sizeof(std::uint32_t)));
  auto* payload = static_cast<std::uint32_t*>(rt.alloc_pinned(sizeof(std::uint32_t)));
  *flag = 0;
  *payload = 0;
  auto* dev = static_cast<std::uint32_t*>(rt.alloc_device(sizeof(std::uint32_t)));
  StreamAndEvents se(rt);
  rt.fill(dev, 0, sizeof(std::uint32_t), se.s);
  rt.wait_flag(se.s, flag, 60'000'000'000ull);  // 60 s: far past this test
  rt.copy(dev, payload, sizeof(std::uint32_t), se.s);  // must see the payload written before the flag
  rt.record(se.end, se.s);
  // The kernel cannot finish before the flag is set (nor time out within the test), so the event
  // is not reached, however long this thread took to get here.
  CHECK_FALSE(rt.query(se.end));
  *payload = 0xc0ffee;
  std::atomic_ref<std::uint32_t>(*flag).store(1, std::memory_order_release);
  rt.synchronize(se.end);
  CHECK(rt.query(se.end));
  std::uint32_t got = 0;
  rt.copy(&got, dev, sizeof got, se.s);
  rt.synchronize(se.s);
  CHECK(got == 0xc0ffeeu);
  rt.free_device(dev);
  rt.free_pinned(payload);
  rt.free_pinned(flag);
}

TEST_CASE("runtime: wait_flag gives up after its timeout; elapsed_ms measures it") {
  auto owner = chorus::instances::make_cuda_runtime();
  Runtime& rt = *owner;
  auto* flag = static_cast<std::uint32_t*>(rt.alloc_pinned(sizeof(std::uint32_t)));
  *flag = 0;
  StreamAndEvents se(rt, /*timing=*/true);
  rt.record(se.start, se.s);
  rt.wait_flag(se.s, flag, 20'000'000ull);  // 20 ms, never released
  rt.record(se.end, se.s);
  rt.synchronize(se.end);
  const float ms = rt.elapsed_ms(se.start, se.end);
  CHECK(ms >= 19.0f);   // the device clock's resolution is about a microsecond
  CHECK(ms < 10000.0f);
  rt.free_pinned(flag);
}

TEST_CASE("runtime: wait_value holds a stream until another stream's write_value, which follows its work") {
  auto owner = chorus::instances::make_cuda_runtime();
  Runtime& rt = *owner;
  // The wait_flag below is launched while the wait_value spins: loaded lazily at that launch, it
  // would wait for the device, that is for the wait_value (until its timeout). On an H200 it did.
  rt.load_kernels();
  auto* word = static_cast<std::uint64_t*>(rt.alloc_device(64));
  auto* data = static_cast<std::uint32_t*>(rt.alloc_device(sizeof(std::uint32_t)));
  auto* gate = static_cast<std::uint32_t*>(rt.alloc_pinned(sizeof(std::uint32_t)));
  auto* abort = static_cast<std::uint32_t*>(rt.alloc_pinned(sizeof(std::uint32_t)));
  *gate = 0;
  *abort = 0;
  StreamAndEvents producer(rt), consumer(rt);
  rt.fill(word, 0, 64, producer.s);
  rt.synchronize(producer.s);
  // Both host ends pinned, not on the stack: a copy to or from pageable memory returns only once
  // done, so it would hold this thread until the wait it is queued behind ended (at its timeout,
  // since this thread is what releases it). On an H200 the copy into `got` on the stack did so.
  auto* value_p = static_cast<std::uint32_t*>(rt.alloc_pinned(sizeof(std::uint32_t)));
  *value_p = 0x5eed;
  const std::uint32_t value = *value_p;
  auto* got_p = static_cast<std::uint32_t*>(rt.alloc_pinned(sizeof(std::uint32_t)));
  *got_p = 0;
  rt.wait_value(consumer.s, word, 2, abort, 7, 60'000'000'000ull);
  rt.copy(got_p, data, sizeof *got_p, consumer.s);
  rt.record(consumer.end, consumer.s);
  rt.wait_flag(producer.s, gate, 60'000'000'000ull);
  rt.copy(data, value_p, sizeof value, producer.s);
  rt.write_value(producer.s, word, 1);  // below the value waited for
  CHECK_FALSE(rt.query(consumer.end));
  std::atomic_ref<std::uint32_t>(*gate).store(1, std::memory_order_release);
  rt.synchronize(producer.s);
  CHECK_FALSE(rt.query(consumer.end));
  rt.write_value(producer.s, word, 2);
  rt.synchronize(consumer.end);
  CHECK(*got_p == value);
  CHECK(*abort == 0u);
  rt.free_pinned(got_p);
  rt.free_pinned(value_p);
  rt.free_pinned(abort);
  rt.free_pinned(gate);
  rt.free_device(data);
  rt.free_device(word);
}

TEST_CASE("runtime: wait_value gives up after its timeout, storing on_timeout, and at once when aborted") {
  auto owner = chorus::instances::make_cuda_runtime();
  Runtime& rt = *owner;
  auto* word = static_cast<std::uint64_t*>(rt.alloc_device(64));
  auto* abort = static_cast<std::uint32_t*>(rt.alloc_pinned(sizeof(std::uint32_t)));
  *abort = 0;
  StreamAndEvents se(rt, /*timing=*/true);
  rt.fill(word, 0, 64, se.s);
  rt.record(se.start, se.s);
  rt.wait_value(se.s, word, 1, abort, 7, 20'000'000ull);  // 20 ms, never written
  rt.record(se.end, se.s);
  rt.synchronize(se.end);
  CHECK(rt.elapsed_ms(se.start, se.end) >= 19.0f);
  CHECK(std::atomic_ref<std::uint32_t>(*abort).load() == 7u);
  rt.wait_value(se.s, word, 1, abort, 9, 60'000'000'000ull);  // gives up at once: the word is set
  rt.synchronize(se.s);
  CHECK(std::atomic_ref<std::uint32_t>(*abort).load() == 7u);
  std::atomic_ref<std::uint32_t>(*abort).store(0);
  rt.wait_value(se.s, word, 1, abort, 9, 60'000'000'000ull);
  rt.record(se.end, se.s);
  CHECK_FALSE(rt.query(se.end));
  std::atomic_ref<std::uint32_t>(*abort).store(0xffffffffu, std::memory_order_release);
  rt.synchronize(se.end);
  CHECK(std::atomic_ref<std::uint32_t>(*abort).load() == 0xffffffffu);
  rt.free_pinned(abort);
  rt.free_device(word);
}

TEST_CASE("runtime: errors name the call and the CUDA error") {
  auto owner = chorus::instances::make_cuda_runtime();
  Runtime& rt = *owner;
  try {
    rt.set_device(rt.device_count() + 1000);
    FAIL("set_device of a device that does not exist did not throw");
  } catch (const chorus::Error& e) {
    CHECK(e.code() == chorus::ErrorCode::system);
    const std::string what = e.what();
    CHECK(what.find("cudaSetDevice: cudaErrorInvalidDevice (101)") != std::string::npos);
  }
  StreamAndEvents se(rt);  // timing disabled: elapsed_ms is an error
  rt.record(se.start, se.s);
  rt.record(se.end, se.s);
  rt.synchronize(se.end);
  CHECK_THROWS_AS(rt.elapsed_ms(se.start, se.end), chorus::Error);
}

TEST_CASE("runtime: export_dmabuf covers the allocation that holds the range, or says the device has none") {
  auto owner = chorus::instances::make_cuda_runtime();
  Runtime& rt = *owner;
  constexpr std::size_t kBytes = (1 << 20) + 100;  // not a multiple of the page size
  auto* d = static_cast<unsigned char*>(rt.alloc_device(kBytes));
  const long page = ::sysconf(_SC_PAGESIZE);
  try {
    const auto e = rt.export_dmabuf(d + 4096, kBytes - 4096);
    REQUIRE(e.fd >= 0);
    const off_t size = ::lseek(e.fd, 0, SEEK_END);  // a dma-buf's size, from lseek
    std::printf("export_dmabuf: fd %d, offset %llu, dma-buf of %lld bytes\n", e.fd,
                static_cast<unsigned long long>(e.offset), static_cast<long long>(size));
    CHECK(e.offset >= 4096u);
    CHECK((e.offset - 4096) % static_cast<std::uint64_t>(page) == 0);  // the allocation starts on a page
    if (size >= 0) CHECK(static_cast<std::uint64_t>(size) >= e.offset + (kBytes - 4096));
    ::close(e.fd);
  } catch (const chorus::Error& e) {
    // Only a device that says so may refuse (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED is 0, e.g. the
    // proprietary kernel module): printed, so that the log shows the export did not run.
    std::printf("export_dmabuf: %s\n", e.what());
    CHECK(e.code() == chorus::ErrorCode::unsupported);
    CHECK(std::string(e.what()).find("DMA_BUF_SUPPORTED") != std::string::npos);
  }
  // A range past the end of its allocation is an error, whatever the device supports.
  CHECK_THROWS_AS(rt.export_dmabuf(d + kBytes - 8, 64), chorus::Error);
  rt.free_device(d);
}
