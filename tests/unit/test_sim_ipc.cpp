// SPDX-License-Identifier: BSD-3-Clause
// device::SimRuntime's IPC handles (ipc_export / ipc_open / ipc_close) within one process: two
// runtimes stand for two processes (each opens only the other's handles). Both sides see each
// other's writes, copies and kernels work on opened memory, export is stable and keeps the
// contents, and every misuse fails with the CUDA call and error named. Across real processes:
// tests/device/test_device_ipc.cpp.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "chorus/testing/sim_runtime.hpp"
#include "support/spawn.hpp"

namespace unit_test_sim_ipc {

using chorus::DataType;
using chorus::ErrorCode;
using chorus::MemoryKind;
using chorus::ReduceOp;
using chorus::device::IpcHandle;
using chorus::device::SimRuntime;

namespace {
std::string error_of(auto&& f, ErrorCode code = ErrorCode::system) {
  return chorus::test::expect_error(code, f, "the call").what();
}
bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

std::vector<std::int32_t> read(SimRuntime& rt, const void* d, std::size_t n) {
  std::vector<std::int32_t> v(n);
  rt.copy(v.data(), d, n * 4, nullptr);
  rt.synchronize(static_cast<chorus::device::Stream>(nullptr));
  return v;
}
}  // namespace

TEST_CASE("sim ipc: an opened allocation is the exporter's memory, both ways, kernels included") {
  SimRuntime a, b;
  constexpr std::size_t n = 1031;  // not a whole page
  std::vector<std::int32_t> init(n);
  for (std::size_t i = 0; i < n; ++i) init[i] = static_cast<std::int32_t>(i * 7 - 300);
  auto* da = static_cast<std::int32_t*>(a.alloc_device(n * 4));
  a.copy(da, init.data(), n * 4, nullptr);
  a.synchronize(static_cast<chorus::device::Stream>(nullptr));

  const IpcHandle h = a.ipc_export(da);
  CHECK(a.ipc_export(da) == h);                  // stable
  CHECK(read(a, da, n) == init);                 // exporting kept the contents
  CHECK(a.kind_of(da) == MemoryKind::device);
  auto* db = static_cast<std::int32_t*>(b.ipc_open(h));
  CHECK(b.kind_of(db) == MemoryKind::device);
  CHECK(b.kind_of(db + n - 1) == MemoryKind::device);
  CHECK(read(b, db, n) == init);

  // b reduces its own buffer into the mapping (a kernel on opened memory); a sees the sum.
  std::vector<std::int32_t> ones(n, 1);
  auto* mine = static_cast<std::int32_t*>(b.alloc_device(n * 4));
  b.copy(mine, ones.data(), n * 4, nullptr);
  b.reduce(ReduceOp::sum, DataType::int32, db, db, mine, n, nullptr);
  b.synchronize(static_cast<chorus::device::Stream>(nullptr));
  std::vector<std::int32_t> want(n);
  for (std::size_t i = 0; i < n; ++i) want[i] = init[i] + 1;
  CHECK(read(a, da, n) == want);
  // a writes; b sees it.
  a.fill(da, 0, 4, nullptr);
  a.synchronize(static_cast<chorus::device::Stream>(nullptr));
  CHECK(read(b, db, 1)[0] == 0);

  // Past the end of the mapping is outside device memory, as on the exporter's side.
  const std::string past = error_of([&] {
    b.copy(ones.data(), db + n - 1, 8, nullptr);
    b.synchronize(static_cast<chorus::device::Stream>(nullptr));
  });
  CHECK(contains(past, "cudaMemcpyAsync"));

  b.ipc_close(db);
  CHECK(b.kind_of(db) == MemoryKind::host);
  b.free_device(mine);
  a.free_device(da);
}

TEST_CASE("sim ipc: misuse fails naming the call") {
  SimRuntime a, b;
  auto* d = static_cast<std::byte*>(a.alloc_device(100));
  CHECK(contains(error_of([&] { a.ipc_export(d + 4); }), "cudaIpcGetMemHandle: cudaErrorInvalidValue (1)"));
  const IpcHandle h = a.ipc_export(d);
  CHECK(contains(error_of([&] { a.ipc_open(h); }), "cudaIpcOpenMemHandle: cudaErrorInvalidValue (1)"));
  IpcHandle garbage;
  garbage.bytes.fill(std::byte{0x5a});
  CHECK(contains(error_of([&] { b.ipc_open(garbage); }), "not a handle of the simulated runtime"));

  void* p = b.ipc_open(h);
  CHECK(contains(error_of([&] { b.free_device(p); }), "ipc_close"));
  CHECK(contains(error_of([&] { b.ipc_export(p); }), "export it there"));
  CHECK(contains(error_of([&] { b.ipc_close(d); }), "cudaIpcCloseMemHandle"));
  b.ipc_close(p);
  CHECK(contains(error_of([&] { b.ipc_close(p); }), "cudaIpcCloseMemHandle"));

  // A freed allocation's handle no longer opens, even where a new export took its descriptor.
  a.free_device(d);
  CHECK(contains(error_of([&] { b.ipc_open(h); }), "is gone"));
  auto* d2 = a.alloc_device(100);
  const IpcHandle h2 = a.ipc_export(d2);
  CHECK_FALSE(h2 == h);
  CHECK(contains(error_of([&] { b.ipc_open(h); }), "is gone"));
  void* p2 = b.ipc_open(h2);
  b.ipc_close(p2);
  a.free_device(d2);

  CHECK(b.can_access_peer(0, 0));
  CHECK(contains(error_of([&] { b.can_access_peer(0, 1); }), "cudaDeviceCanAccessPeer"));
}

TEST_CASE("sim ipc: a mapping outlives the exporter's free and the exporter's runtime") {
  SimRuntime b;
  void* p = nullptr;
  {
    SimRuntime a;
    auto* d = static_cast<std::int32_t*>(a.alloc_device(4 * 10));
    std::vector<std::int32_t> v(10, 42);
    a.copy(d, v.data(), 40, nullptr);
    a.synchronize(static_cast<chorus::device::Stream>(nullptr));
    p = b.ipc_open(a.ipc_export(d));
    a.free_device(d);
  }
  CHECK(read(b, p, 10) == std::vector<std::int32_t>(10, 42));
  b.ipc_close(p);
}

}  // namespace unit_test_sim_ipc
