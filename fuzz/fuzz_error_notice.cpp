// SPDX-License-Identifier: BSD-3-Clause
// The error notice (diag/herald.hpp, mismatch::ErrorNotice): the 1024 bytes a rank that
// found a mismatch sends to every other, received into the struct as they come and turned into
// an Error by the receiver. Promises: message() never reads past the struct, whatever `length`
// says; the Error made of a notice carries its text whatever the code; of() and message()
// round-trip any text that fits, and cut a longer one to the notice's size.

#include <cstdint>
#include <cstring>
#include <string>

#include "chorus/communicator.hpp"
#include "fuzz_input.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using chorus::mismatch::ErrorNotice;
  chorus::fuzz::Input in(data, size);
  const auto notice = in.take<ErrorNotice>();
  const std::string text = notice.message();
  chorus::fuzz::check(text.size() == std::min<std::size_t>(notice.length, sizeof notice.text), "message length");
  const auto e = chorus::Error::from_text(static_cast<chorus::ErrorCode>(notice.code), text, 0, -1);
  // what() is a C string: it ends at the first NUL the text may hold.
  chorus::fuzz::check(text.substr(0, text.find('\0')) == e.what(), "the error carries the text");
  (void)chorus::to_string(e.code());

  const auto again = ErrorNotice::of(e.code(), text);
  chorus::fuzz::check(again.code == notice.code && again.message() == text, "of(message()) round trip");
  const auto rest = in.rest();  // a text of any length, as a sender would pass it
  const std::string long_text(rest.begin(), rest.end());
  const auto cut = ErrorNotice::of(chorus::ErrorCode::mismatch, long_text);
  chorus::fuzz::check(cut.message() == long_text.substr(0, sizeof cut.text), "of() cuts to fit");
  return 0;
}
