// SPDX-License-Identifier: BSD-3-Clause
// The shm transport's hello (transport/shm/detail/socket.hpp): the raw 56-byte ShmHello a peer
// sends, as the accepting rank checks it (accepted_hello_rank) and the connecting rank checks
// the reply (hello_matches). Promises: any bytes get an answer, nothing is thrown and nothing is
// read out of range, whatever the ranks say; a rank that is accepted is a higher rank of this
// world that was expected and not connected yet.

#include <cstdint>
#include <cstring>
#include <vector>

#include "chorus/transport/shm/detail/socket.hpp"
#include "fuzz_input.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace chorus::shm::detail;
  chorus::fuzz::Input in(data, size);
  const auto h = in.take<ShmHello>();
  // This rank's view: its rank and world size (small, so that the fuzzer hits them), then which
  // ranks it expects and which have connected, one bit each.
  const int world = in.take<std::uint8_t>() % 65;
  const int rank = static_cast<int>(in.take<std::int8_t>());
  const chorus::JobNonce nonce = in.take<chorus::JobNonce>();
  std::vector<bool> expected(static_cast<std::size_t>(world)), connected(static_cast<std::size_t>(world));
  for (int p = 0; p < world; ++p) {
    const auto bits = in.take<std::uint8_t>();
    expected[static_cast<std::size_t>(p)] = (bits & 1) != 0;
    connected[static_cast<std::size_t>(p)] = (bits & 2) != 0;
  }

  const int p = accepted_hello_rank(h, nonce, rank, world, expected, connected);
  if (p >= 0) {
    chorus::fuzz::check(p == h.rank && p > rank && p < world, "accepted a rank out of range");
    const auto q = static_cast<std::size_t>(p);
    chorus::fuzz::check(expected[q] && !connected[q], "accepted an unexpected or connected rank");
    chorus::fuzz::check(hello_matches(h, nonce, p, rank, world), "accepted a hello of another job or rank");
  } else {
    chorus::fuzz::check(p == -1, "refusal is -1");
  }
  // The connecting side: the reply of the rank it connected to.
  if (hello_matches(h, nonce, h.rank, h.peer, h.world))
    chorus::fuzz::check(h.magic == kShmMagic && h.version == kShmVersion && h.nonce == nonce, "matched a stranger");
  return 0;
}
