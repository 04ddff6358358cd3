// SPDX-License-Identifier: BSD-3-Clause
// The collective descriptor (algo/descriptor.hpp, algo/stamp.hpp): the 40-byte stamp a peer
// puts in front of its first message or sends on its own, read with read_stamp, then compared
// and described as a mismatch would be. Promises: any bytes give a descriptor or nothing,
// nothing is thrown; describe() and describe_difference() name any values (out of range ones
// too); a stamp made of a descriptor reads back as that descriptor.

#include <cstdint>
#include <cstring>
#include <string>

#include "chorus/algo/stamp.hpp"
#include "fuzz_input.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace chorus::algo;
  using namespace chorus::mismatch;
  const auto* bytes = reinterpret_cast<const std::byte*>(data);
  const auto theirs = read_stamp(bytes, size);
  if (!theirs) return 0;
  chorus::fuzz::Input in(data + sizeof(Stamp), size - sizeof(Stamp));
  const auto mine = in.take<CollectiveDesc>();  // what this rank called
  const std::string text = describe_difference(0, mine, 1, *theirs);
  chorus::fuzz::check(text.find(describe(*theirs)) != std::string::npos, "the difference names their call");
  chorus::fuzz::check((mine == *theirs) == (std::memcmp(&mine, &*theirs, sizeof mine) == 0), "== is bytewise");
  Stamp s;
  s.desc = *theirs;
  std::byte again[sizeof s];
  std::memcpy(again, &s, sizeof s);
  const auto back = read_stamp(again, sizeof again);
  chorus::fuzz::check(back && *back == *theirs, "read_stamp(stamp(d)) != d");
  return 0;
}
