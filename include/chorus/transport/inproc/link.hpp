// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// inproc::Link: a peer that is another thread of this process. Messages of up to kEagerBytes are
/// copied at send time (the send completes at once) while at most kMaxUnexpectedBytes of such
/// copies wait for their receives on the link (and the process holds less than
/// CHORUS_MAX_BUFFERED_BYTES of them); larger ones, and those past either cap, wait for the
/// receive and are copied once, straight into the receiver's buffer.

#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <variant>
#include <vector>

#include "chorus/core/concepts.hpp"
#include "chorus/transport/matching.hpp"

namespace chorus::inproc {

struct Policy {
  static constexpr std::size_t kEagerBytes = 64 * 1024;
  static constexpr std::size_t kMaxUnexpectedBytes = 64u << 20;
};

namespace detail {

using chorus::detail::RequestState;
using ReqPtr = std::shared_ptr<RequestState>;

struct RecvOp {
  MutableBytes dst;
  ReqPtr req;
  Tag tag = 0;  ///< set by the matcher
  int source = -1;  ///< an any-source receive's entry: the sender it names (chorus::detail::RecvOp)
};
struct EagerArrival {
  std::vector<std::byte> data;
};
struct RendezvousArrival {
  ConstBytes src;
  ReqPtr send_req;
};
using Arrival = std::variant<EagerArrival, RendezvousArrival>;

/// The messages from one rank to another. Completions are collected under the lock and run after
/// it is released, so a completion callback may post new operations.
struct Mailbox {
  std::mutex mu;
  chorus::detail::TagMatcher<RecvOp, Arrival> matcher;
  /// Bytes of eager messages waiting for their receive (at most Policy::kMaxUnexpectedBytes).
  chorus::detail::ByteGauge unexpected_bytes;
  bool broken = false;
  std::string broken_reason;
  ErrorCode broken_code = ErrorCode::peer_failure;
  int broken_by = -1;  ///< the rank whose failure or abort broke it

  /// The code an operation of `rank` fails with on a broken mailbox: an abort is `aborted` for the
  /// rank that aborted and a peer's failure for the others (as a closed socket is on tcp).
  ErrorCode code_for(int rank) const {
    return broken_code == ErrorCode::aborted && rank != broken_by ? ErrorCode::peer_failure : broken_code;
  }
};

/// Deferred completions: run once the mailbox lock is released.
class Completions {
 public:
  void ok(ReqPtr r, std::size_t n) { done_.push_back({std::move(r), n, ErrorCode::system, {}, false}); }
  void fail(ReqPtr r, ErrorCode c, std::string msg) { done_.push_back({std::move(r), 0, c, std::move(msg), true}); }
  ~Completions() {
    for (auto& d : done_) {
      if (d.failed)
        d.req->fail(d.code, d.msg);
      else
        d.req->complete(d.bytes);
    }
  }

 private:
  struct Done {
    ReqPtr req;
    std::size_t bytes;
    ErrorCode code;
    std::string msg;
    bool failed;
  };
  std::vector<Done> done_;
};

using chorus::detail::size_mismatch;

/// Delivers an arrival into a receive; both sizes must match.
inline void deliver(Arrival& a, RecvOp& r, Completions& done) {
  if (auto* e = std::get_if<EagerArrival>(&a)) {
    if (e->data.size() != r.dst.size) {
      chorus::detail::write_prefix(r.dst, e->data.data(), e->data.size());
      return done.fail(r.req, ErrorCode::mismatch, size_mismatch(e->data.size(), r.dst.size));
    }
    if (!e->data.empty()) std::memcpy(r.dst.data, e->data.data(), e->data.size());
    return done.ok(r.req, e->data.size());
  }
  auto& z = std::get<RendezvousArrival>(a);
  if (z.src.size != r.dst.size) {
    // A small message that met its receive directly counts as eager (see the Link concept): its
    // first bytes are written and the send completes, as it would have had it waited copied. A
    // large one fails on both sides, as a rendezvous does on every transport.
    if (z.src.size <= Policy::kEagerBytes) {
      chorus::detail::write_prefix(r.dst, z.src.data, z.src.size);
      done.ok(z.send_req, z.src.size);
    } else {
      done.fail(z.send_req, ErrorCode::mismatch, size_mismatch(z.src.size, r.dst.size));
    }
    return done.fail(r.req, ErrorCode::mismatch, size_mismatch(z.src.size, r.dst.size));
  }
  if (z.src.size != 0) std::memcpy(r.dst.data, z.src.data, z.src.size);
  done.ok(z.send_req, z.src.size);
  done.ok(r.req, z.src.size);
}

}  // namespace detail

class Link {
 public:
  using TimeoutHook = std::function<void(const Error&)>;

  /// `out`: this rank's messages to the peer; `in`: the peer's messages to this rank.
  Link(int rank, int peer, detail::Mailbox* out, detail::Mailbox* in, std::chrono::milliseconds timeout,
       TimeoutHook on_timeout)
      : rank_(rank), peer_(peer), out_(out), in_(in), timeout_(timeout), on_timeout_(std::move(on_timeout)) {}

  int peer() const { return peer_; }
  /// The peer is a thread of this process: device pointers pass between them as they are
  /// (algo/intranode/kernel_path.hpp).
  static constexpr bool same_process() { return true; }
  /// Either direction has failed (the peer left, failed or aborted).
  bool broken() const {
    {
      std::lock_guard lk(in_->mu);
      if (in_->broken) return true;
    }
    std::lock_guard lk(out_->mu);
    return out_->broken;
  }
  /// Why it broke (broken()): the code the failure or abort carried, and its text.
  std::pair<ErrorCode, std::string> failure() const {
    for (detail::Mailbox* b : {in_, out_}) {
      std::lock_guard lk(b->mu);
      if (b->broken) return {b->broken_code, b->broken_reason};
    }
    return {ErrorCode::peer_failure, "not broken"};
  }

  Request isend(ConstBytes data, Tag tag) {
    auto req = make_request("send", tag, data.size);
    detail::Completions done;
    std::lock_guard lk(out_->mu);
    if (out_->broken) {
      done.fail(req, out_->code_for(rank_), out_->broken_reason);
      return Request(req);
    }
    if (auto r = out_->matcher.take_posted(tag)) {
      detail::Arrival a = detail::RendezvousArrival{data, req};
      detail::deliver(a, *r, done);
    } else if (data.size <= Policy::kEagerBytes && out_->unexpected_bytes + data.size <= Policy::kMaxUnexpectedBytes &&
               !chorus::detail::over_buffered_cap(data.size)) {
      detail::EagerArrival e{std::vector<std::byte>(data.data, data.data + data.size)};
      out_->matcher.add_unexpected(tag, std::move(e));
      out_->unexpected_bytes += data.size;
      done.ok(req, data.size);
    } else {  // large, or too much is waiting already: the send completes when its receive comes
      out_->matcher.add_unexpected(tag, detail::RendezvousArrival{data, req});
    }
    return Request(req);
  }

  Request irecv(MutableBytes data, Tag tag) {
    auto req = make_request("recv", tag, data.size);
    start_recv(detail::RecvOp{data, req, tag});
    return Request(req);
  }

  /// This link's entry of a receive from any source (Communicator::irecv_any_bytes): `req` is
  /// shared by an entry on every link of the communicator, and the first link with a message of
  /// `tag` claims it, naming `source` as its sender (core/request.hpp). Returns the engine that
  /// completes it: none here (the sender completes it).
  std::weak_ptr<chorus::detail::Driver> irecv_any(MutableBytes data, Tag tag, const detail::ReqPtr& req, int source) {
    start_recv(detail::RecvOp{data, req, tag, source});
    return {};
  }

 private:
  void start_recv(detail::RecvOp r) {
    detail::Completions done;
    std::lock_guard lk(in_->mu);
    if (!in_->matcher.admit(r, in_->broken)) return;  // another link took it (any source)
    const Tag tag = r.tag;
    const detail::ReqPtr req = r.req;
    if (in_->matcher.take_unexpected(tag, [&](detail::Arrival& a) {
          if (auto* e = std::get_if<detail::EagerArrival>(&a)) in_->unexpected_bytes -= e->data.size();
          detail::deliver(a, r, done);
        })) {
      // delivered
    } else if (in_->broken) {
      done.fail(req, in_->code_for(rank_), in_->broken_reason);
    } else {
      in_->matcher.add_posted(tag, std::move(r));
    }
  }

  detail::ReqPtr make_request(const char* verb, Tag tag, std::size_t bytes) {
    auto req = std::make_shared<detail::RequestState>(
        rank_, peer_, chorus::detail::LazyOp{verb, tag, bytes, &chorus::detail::describe_op}, timeout_);
    req->set_on_timeout(on_timeout_);
    return req;
  }

  int rank_;
  int peer_;
  detail::Mailbox* out_;
  detail::Mailbox* in_;
  std::chrono::milliseconds timeout_;
  TimeoutHook on_timeout_;
};

}  // namespace chorus::inproc
