// SPDX-License-Identifier: BSD-3-Clause
// The simulated runtime's dma-buf export (device::SimRuntime::export_dmabuf, for the rdma
// transport's device-memory registration): the fd the caller gets names the allocation's pages, at
// the offset it says, and stays valid on its own; ranges outside live device memory are refused.
#include "chorus/testing/sim_runtime.hpp"

#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <string>
#include <vector>

namespace device_test_dmabuf {

using chorus::device::SimRuntime;
using chorus::device::Stream;

TEST_CASE("sim runtime: export_dmabuf gives a dup of the allocation's memfd and the pointer's offset in it") {
  SimRuntime rt;
  constexpr std::size_t kBytes = 3 * 4096 + 17;
  auto* d = static_cast<std::byte*>(rt.alloc_device(kBytes));
  rt.fill(d, 0x3c, kBytes, nullptr);
  rt.synchronize(Stream{});

  const auto a = rt.export_dmabuf(d + 5000, 6000);
  const auto b = rt.export_dmabuf(d, kBytes);
  REQUIRE(a.fd >= 0);
  REQUIRE(b.fd >= 0);
  CHECK(a.fd != b.fd);  // each caller owns its own
  CHECK(a.offset == 5000);
  CHECK(b.offset == 0);
  struct stat st {};
  REQUIRE(::fstat(a.fd, &st) == 0);
  CHECK(static_cast<std::size_t>(st.st_size) >= a.offset + 6000);

  // The contents moved with the pages, and what goes through the fd is the device memory.
  unsigned char c = 0;
  REQUIRE(::pread(a.fd, &c, 1, static_cast<off_t>(a.offset)) == 1);
  CHECK(c == 0x3c);
  const unsigned char x = 0xa5;
  ::close(b.fd);  // the other one stays valid
  REQUIRE(::pwrite(a.fd, &x, 1, static_cast<off_t>(a.offset + 1)) == 1);
  std::vector<unsigned char> back(3);
  rt.copy(back.data(), d + 5000, back.size(), nullptr);
  rt.synchronize(Stream{});
  CHECK(back == std::vector<unsigned char>{0x3c, 0xa5, 0x3c});
  ::close(a.fd);
  rt.free_device(d);
}

TEST_CASE("sim runtime: export_dmabuf refuses memory that is not inside one live device allocation") {
  SimRuntime rt;
  auto* d = static_cast<std::byte*>(rt.alloc_device(4096));
  std::vector<std::byte> host(64);
  for (auto [p, n] : {std::pair<void*, std::size_t>{host.data(), host.size()}, {d + 4000, 200}}) {
    try {
      (void)rt.export_dmabuf(p, n);
      FAIL("export_dmabuf took a range outside device memory");
    } catch (const chorus::Error& e) {
      CHECK(e.code() == chorus::ErrorCode::system);
      CHECK(std::string(e.what()).find("cuMemGetHandleForAddressRange") != std::string::npos);
    }
  }
  rt.free_device(d);
  try {
    (void)rt.export_dmabuf(d, 16);
    FAIL("export_dmabuf took freed memory");
  } catch (const chorus::Error& e) {
    CHECK(e.code() == chorus::ErrorCode::system);
  }
}

}  // namespace device_test_dmabuf
