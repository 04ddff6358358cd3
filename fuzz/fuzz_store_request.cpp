// SPDX-License-Identifier: BSD-3-Clause
// The TcpStore server's request parser (bootstrap/tcp_store.hpp): a whole request frame from a
// client. Promises: a malformed, truncated or overlong frame is a chorus::Error, nothing else;
// a frame that parses is exactly what encode_store_request makes of the parsed request (one
// encoding per request), and decoding that again gives the same request.

#include <cstdint>
#include <span>

#include "chorus/bootstrap/tcp_store.hpp"
#include "fuzz_input.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace chorus::detail;
  const std::span<const std::uint8_t> frame(data, size);
  StoreRequest req;
  try {
    req = decode_store_request(frame);
  } catch (const chorus::Error&) {
    return 0;
  }
  chorus::fuzz::check(!req.keys.empty() || req.op == StoreOp::wait || req.op == StoreOp::check, "key count");
  chorus::fuzz::check(req.op == StoreOp::set || req.value.empty(), "a value on a request other than set");
  for (const auto& k : req.keys) chorus::fuzz::check(k.size() <= kStoreMaxKeyBytes, "key over the limit");
  const auto again = encode_store_request(req.op, req.keys, req.arg, req.value);
  chorus::fuzz::check(std::equal(again.begin(), again.end(), frame.begin(), frame.end()), "encode(decode(x)) != x");
  chorus::fuzz::check(decode_store_request(again) == req, "decode(encode(r)) != r");
  return 0;
}
