// SPDX-License-Identifier: BSD-3-Clause
// The tcp link's frame headers (transport/tcp/link.hpp): the check the link makes of each 32-byte
// header it reads, before it looks at its own state. Promises: every header gets an answer,
// nothing is thrown; an accepted header has a known type and a size that type allows.

#include <cstdint>
#include <cstring>

#include "chorus/transport/tcp/link.hpp"
#include "fuzz_input.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace chorus::tcp;
  using detail::FrameType;
  chorus::fuzz::Input in(data, size);
  do {  // a stream of headers, as the link reads them (at least one, zero-padded)
    const auto h = in.take<detail::FrameHeader>();
    const std::string bad = detail::frame_header_problem(h);
    if (!bad.empty()) continue;
    const auto t = static_cast<FrameType>(h.type);
    chorus::fuzz::check(t == FrameType::eager || t == FrameType::rts || t == FrameType::cts || t == FrameType::data,
                        "accepted an unknown frame type");
    chorus::fuzz::check(t != FrameType::eager || h.size <= Policy::kEagerBytes, "accepted an oversized eager frame");
    chorus::fuzz::check(t != FrameType::rts || h.size <= Policy::kMaxMessageBytes, "accepted an oversized message");
  } while (in.left() > 0);
  return 0;
}
