// SPDX-License-Identifier: BSD-3-Clause
// The connection handshake (detail/handshake.hpp): the server's check of HELLO, the client's
// checks of REPLY and FINAL. Promises: any bytes give a verdict (HELLO) or a HandshakeRefused,
// which is a chorus::Error (REPLY, FINAL), nothing else; a HELLO that passes re-encodes to the
// same bytes (encode_hello), and decode_hello(encode_hello(h)) == h.

#include <array>
#include <cstdint>

#include "chorus/detail/handshake.hpp"
#include "fuzz_input.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace chorus;
  using namespace chorus::detail;
  fuzz::Input in(data, size);
  const auto setup = in.take<std::uint8_t>();  // bit 0: we have a token; bit 1: we expect a link
  const bool have_token = (setup & 1) != 0;
  const std::uint8_t expected_kind = (setup & 2) ? kHandshakeLink : kHandshakeStore;
  const auto frame = in.take<std::array<std::uint8_t, kReplyBytes>>();
  const ErrorContext ctx{-1, -1, "fuzz"};

  // Server: HELLO.
  std::array<std::uint8_t, kHelloBytes> hello{};
  std::copy_n(frame.begin(), kHelloBytes, hello.begin());
  const HelloVerdict v = check_hello(hello, expected_kind, have_token);
  fuzz::check(v.refusal == HandshakeStatus::ok || !v.why.empty(), "a refusal says why");
  if (v.refusal == HandshakeStatus::ok) {
    fuzz::check(v.hello.kind == expected_kind && ((hello[7] & kFlagToken) != 0) == have_token, "accepted a bad hello");
    std::array<std::uint8_t, 16> cc{};
    std::copy_n(hello.begin() + 8, 16, cc.begin());
    fuzz::check(encode_hello(v.hello, hello[7], cc) == hello, "encode(decode(hello)) != hello");
    fuzz::check(decode_hello(encode_hello(v.hello, hello[7], cc)) == v.hello, "decode(encode(h)) != h");
  }

  // Client: REPLY, then FINAL.
  try {
    const ReplyInfo r = check_reply(frame, ctx);
    fuzz::check(frame[6] == 0, "accepted a refusal");
    fuzz::check(std::equal(r.challenge.begin(), r.challenge.end(), frame.begin() + 8), "challenge");
  } catch (const Error&) {
  }
  try {
    check_final(frame[0], ctx);
    fuzz::check(frame[0] == 0, "accepted a bad final status");
  } catch (const Error&) {
  }
  return 0;
}
