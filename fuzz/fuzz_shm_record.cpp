// SPDX-License-Identifier: BSD-3-Clause
// The shm transport's records (transport/shm/detail/segment.hpp): a ring whose counters and
// data the peer wrote (the segment is shared memory: a broken or hostile peer can put anything
// there), read with RingReader as a link drains it, each record checked with record_problem.
// Promises: the reader never reads outside the ring nor misaligned, and stops (nullptr, with a
// reason when something is wrong); a record it hands on lies inside the ring with its payload.
//
// Input: the reader's head (u64), the writer's tail (u64), then bytes written into the ring from
// head's position on (wrapping at its end); the rest of the ring is zeros.

#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <string>

#include "chorus/transport/shm/detail/segment.hpp"
#include "fuzz_input.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace chorus::shm;
  using namespace chorus::shm::detail;
  constexpr std::size_t cap = Policy::kRingBytes;
  // Aligned like a mapping; kept from run to run (only what a run wrote is cleared after it).
  static auto* ring = static_cast<std::byte*>(::operator new(cap, std::align_val_t(4096)));
  static bool zeroed = false;
  if (!zeroed) {
    std::memset(ring, 0, cap);
    zeroed = true;
  }
  chorus::fuzz::Input in(data, size);
  RingControl control;
  control.head.store(in.take<std::uint64_t>());
  control.tail.store(in.take<std::uint64_t>());
  const auto bytes = in.rest();
  const std::size_t start = control.head.load() % cap;
  const std::size_t n = std::min(bytes.size(), cap);
  for (std::size_t i = 0; i < n; ++i) ring[(start + i) % cap] = static_cast<std::byte>(bytes[i]);

  RingReader reader(&control, ring);
  std::string bad;
  std::size_t seen = 0;
  while (const Record* r = reader.peek(bad)) {
    const auto* at = reinterpret_cast<const std::byte*>(r);
    chorus::fuzz::check(at >= ring && at + record_bytes(r->payload) <= ring + cap, "record outside the ring");
    (void)record_problem(*r);
    const std::byte* p = RingReader::payload(r);
    std::uint8_t sum = 0;  // touch the payload, so that a read past the ring shows
    for (std::uint64_t i = 0; i < r->payload; ++i) sum = static_cast<std::uint8_t>(sum + static_cast<std::uint8_t>(p[i]));
    (void)sum;
    reader.pop(r);
    chorus::fuzz::check(++seen <= cap / kRecordAlign + 1, "the reader does not stop");
  }
  for (std::size_t i = 0; i < n; ++i) ring[(start + i) % cap] = std::byte{0};
  return 0;
}
