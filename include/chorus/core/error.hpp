// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// chorus::Error: the one exception type. Every message names the rank, the peer (where there is
/// one) and the operation, so a log line from any rank says who failed talking to whom, doing what.

#include <cerrno>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

namespace chorus {

enum class ErrorCode {
  timeout,           ///< a wait ran past CHORUS_TIMEOUT (or the per-call timeout)
  peer_failure,      ///< a peer died, a link broke, or the communicator was aborted
  mismatch,          ///< ranks disagree: different collectives, sizes, dtypes, roots
  invalid_argument,  ///< bad input from the caller or the environment
  system,            ///< an operating-system call failed
  unsupported,       ///< a feature this build or machine does not have
  aborted,           ///< this rank aborted the communicator (abort(), or destroyed with work pending)
};

constexpr std::string_view to_string(ErrorCode c) noexcept {
  switch (c) {
    case ErrorCode::timeout: return "timeout";
    case ErrorCode::peer_failure: return "peer_failure";
    case ErrorCode::mismatch: return "mismatch";
    case ErrorCode::invalid_argument: return "invalid_argument";
    case ErrorCode::system: return "system";
    case ErrorCode::unsupported: return "unsupported";
    case ErrorCode::aborted: return "aborted";
  }
  return "unknown";
}

/// Who was doing what when an error happened. rank/peer are -1 when not known or not relevant.
struct ErrorContext {
  int rank = -1;
  int peer = -1;
  std::string op;  ///< e.g. "recv tag 7 (1024 bytes)" or "all_reduce float32 sum count 13 seq 4"
};

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message) : std::runtime_error(format(code, message)), code_(code) {}
  Error(ErrorCode code, const ErrorContext& ctx, const std::string& message)
      : std::runtime_error(format(code, ctx, message)), code_(code), rank_(ctx.rank), peer_(ctx.peer) {}

  /// An error whose message is already formatted (what() of another Error): lets an error be
  /// carried across threads as plain data and thrown anew where it is reported.
  static Error from_text(ErrorCode code, const std::string& what, int rank, int peer) {
    Error e(code, what, Preformatted{});
    e.rank_ = rank;
    e.peer_ = peer;
    return e;
  }

  ErrorCode code() const noexcept { return code_; }
  int rank() const noexcept { return rank_; }
  int peer() const noexcept { return peer_; }
  /// what() without its "chorus <code>: " prefix (the context, then the message): for an error
  /// that says more about another and keeps its words.
  std::string message() const { return std::string(what()).substr(format(code_, "").size()); }

  static std::string format(ErrorCode code, const std::string& message) {
    std::string s = "chorus ";
    s += to_string(code);
    s += ": ";
    s += message;
    return s;
  }
  static std::string format(ErrorCode code, const ErrorContext& ctx, const std::string& message) {
    std::ostringstream os;
    os << "chorus " << to_string(code) << ": ";
    if (ctx.rank >= 0) os << "rank " << ctx.rank << ": ";
    if (ctx.peer >= 0) os << "peer " << ctx.peer << ": ";
    if (!ctx.op.empty()) os << ctx.op << ": ";
    os << message;
    return os.str();
  }

 private:
  struct Preformatted {};
  Error(ErrorCode code, const std::string& what, Preformatted) : std::runtime_error(what), code_(code) {}

  ErrorCode code_;
  int rank_ = -1;
  int peer_ = -1;
};

namespace detail {
/// Error for a failed system call, with errno's text.
inline Error system_error(const ErrorContext& ctx, std::string_view call, int err = errno) {
  std::string m(call);
  m += ": ";
  m += std::strerror(err);
  return Error(ErrorCode::system, ctx, m);
}
}  // namespace detail

}  // namespace chorus
