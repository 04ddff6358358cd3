// SPDX-License-Identifier: BSD-3-Clause
// The TcpStore client's reply parser (bootstrap/tcp_store.hpp): the reply header, then the
// payloads of add and check. Promises: malformed input is a chorus::Error (peer_failure),
// nothing else; a reply that parses re-encodes to the same bytes (encode_store_response), and
// an add reply decodes to the value that was encoded.

#include <algorithm>
#include <array>
#include <cstdint>
#include <span>
#include <string>

#include "chorus/bootstrap/tcp_store.hpp"
#include "fuzz_input.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace chorus::detail;
  const chorus::ErrorContext ctx{-1, -1, "fuzz"};
  chorus::fuzz::Input in(data, size);
  const auto hdr = in.take<std::array<std::uint8_t, kStoreResponseHeader>>();
  const auto rest = in.rest();
  const std::string payload(rest.begin(), rest.end());
  try {
    const StoreResponseHeader h = decode_store_response_header(hdr, ctx);
    chorus::fuzz::check(static_cast<std::uint8_t>(h.status) <= 2, "status out of range");
    if (h.len == payload.size()) {
      const auto again = encode_store_response(h.status, payload);
      chorus::fuzz::check(std::equal(again.begin(), again.begin() + kStoreResponseHeader, hdr.begin()),
                          "encode(decode(header)) != header");
    }
  } catch (const chorus::Error& e) {
    chorus::fuzz::check(e.code() == chorus::ErrorCode::peer_failure, "reply errors are peer_failure");
  }
  try {
    const std::int64_t v = decode_store_add_reply(payload, ctx);
    std::string enc(8, '\0');
    put_u64(reinterpret_cast<std::uint8_t*>(enc.data()), static_cast<std::uint64_t>(v));
    chorus::fuzz::check(enc == payload && decode_store_add_reply(enc, ctx) == v, "add reply round trip");
  } catch (const chorus::Error&) {
  }
  try {
    const bool all = decode_store_check_reply(payload, ctx);
    chorus::fuzz::check(all == (payload[0] != 0), "check reply");
  } catch (const chorus::Error&) {
  }
  return 0;
}
