// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// rdma::Link's way in (link.hpp has the protocol): irecv, the completions of the link's work
/// requests, the slot messages (eager, rts, cts) and the last write of a large message, matching a
/// receive to what arrived, and registering a matched receive's buffer for its cts. Every member
/// here runs with Hub::mu held.

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <variant>

#include "chorus/transport/rdma/link.hpp"

namespace chorus::rdma {

inline Request Link::irecv(MutableBytes data, Tag tag) {
  auto req = chorus::detail::make_link_request(requests_, "recv", tag, data.size);
  start_recv(detail::RecvOp{data, req, tag});
  return Request(req);
}

inline void Link::start_recv(detail::RecvOp r) {
  Completions done;
  Kick kick{hub_};
  std::lock_guard lk(hub_.mu);
  const Tag tag = r.tag;
  const auto req = r.req;
  if (r.dst.kind == MemoryKind::device && !hub_.device.runtime) {
    if (req->claim_source(r.source)) done.fail(req, ErrorCode::invalid_argument, kNoDeviceMemory);
  } else if (!matcher_.admit(r, failed_)) {  // another link took it (any source)
  } else if (matcher_.take_unexpected(tag, [&](detail::Arrival& a) { match(std::move(r), std::move(a), done); })) {
  } else if (failed_) {
    done.fail(req, fail_code_, fail_why_);
  } else {
    matcher_.add_posted(tag, std::move(r));
  }
  pump(done);
  kick.needed = !queue_.empty();
}

inline void Link::on_completion(const Wc& wc, Completions& done) {
  const auto kind = detail::wr_kind(wc.wr_id);
  const auto low = detail::wr_low(wc.wr_id);
  // A signaled inline message also stands for the unsignaled ones before it (its low bits).
  if (kind == detail::WrKind::inline_msg)
    sq_used_ -= static_cast<std::uint32_t>(low);
  else if (kind != detail::WrKind::recv_slot)
    --sq_used_;
  if (wc.status != WcStatus::success) {
    if (kind == detail::WrKind::recv_slot && failed_) return;  // flushed after a failure
    return fail(ErrorCode::peer_failure,
                std::string(kind == detail::WrKind::recv_slot ? "receive" : "send") + " work completion failed: " +
                    status_str(wc.status),
                // A flush here means the QP went to ERROR on its own (after this side's
                // fail() every completion is ignored): the peer must hear it too.
                kind != detail::WrKind::abort, done);
  }
  // A message polled after this side failed (it was in the CQ before the QP went to ERROR) is
  // dropped: an rts kept as unexpected would let a later receive match it and wait for writes
  // that never come, instead of failing with the link.
  if (failed_) return;
  switch (kind) {
    case detail::WrKind::recv_slot: on_slot(static_cast<std::uint32_t>(low), wc, done); break;
    case detail::WrKind::send_slot: free_send_slots_.push_back(static_cast<std::uint32_t>(low)); break;
    case detail::WrKind::inline_msg: break;
    case detail::WrKind::write: break;
    case detail::WrKind::write_last: {
      auto it = sends_.find(static_cast<std::uint32_t>(low));
      if (it == sends_.end()) return protocol_error("completion of unknown message " + std::to_string(low), done);
      done.complete(it->second.req, it->second.data.size);
      release_send(it->second);
      sends_.erase(it);
      break;
    }
    case detail::WrKind::credit: credit_in_flight_ = false; break;
    case detail::WrKind::abort: break;
  }
}

inline void Link::on_slot(std::uint32_t slot, const Wc& wc, Completions& done) {
  if (wc.opcode == Opcode::recv_rdma_imm) {
    auto it = recvs_.find(wc.imm);
    if (it == recvs_.end()) return protocol_error("data for unknown message " + std::to_string(wc.imm), done);
    done.complete(it->second.recv.req, it->second.recv.dst.size);
    recvs_.erase(it);  // deregisters
    while (!deferred_.empty() && recvs_.size() < Policy::kMaxRegistered && !failed_) {
      DeferredRecv d = std::move(deferred_.front());
      deferred_.pop_front();
      register_recv(std::move(d.recv), d.id, done);
    }
  } else {
    detail::Header h;
    if (wc.byte_len < sizeof h) return protocol_error("short message (" + std::to_string(wc.byte_len) + " bytes)", done);
    std::memcpy(&h, recv_slot(slot), sizeof h);
    if (!on_message(h, recv_slot(slot) + sizeof h, wc.byte_len - sizeof h, done)) return;
  }
  if (failed_) return;
  try {
    repost(slot);
  } catch (const VerbsError& e) {
    return fail(ErrorCode::system, e.call + " failed: " + std::strerror(e.err), true, done);
  }
  ++owed_;
  pump(done);
}

inline bool Link::on_message(const detail::Header& h, const std::byte* payload, std::size_t bytes, Completions& done) {
  using detail::MsgType;
  switch (static_cast<MsgType>(h.type)) {
    case MsgType::eager: {
      if (bytes != h.size) {
        protocol_error("eager message of " + std::to_string(bytes) + " bytes says " + std::to_string(h.size), done);
        return false;
      }
      if (auto r = matcher_.take_posted(h.tag)) {
        deliver_eager(*r, payload, h.size, done);
        return true;
      }
      if (chorus::detail::over_buffered_cap(h.size)) {
        fail(ErrorCode::system, chorus::detail::buffered_cap_error(h.size), true, done);
        return false;
      }
      unexpected_bytes_ += h.size;
      matcher_.add_unexpected(h.tag, detail::EagerArrival{spare_.take(payload, h.size)});
      return true;
    }
    case MsgType::rts:
      if (auto r = matcher_.take_posted(h.tag))
        accept_rts(std::move(*r), h.size, h.id, done);
      else
        matcher_.add_unexpected(h.tag, detail::RtsArrival{h.size, h.id});
      return !failed_;
    case MsgType::cts: {
      auto it = sends_.find(h.id);
      if (it == sends_.end()) {
        protocol_error("clear-to-send for unknown message " + std::to_string(h.id), done);
        return false;
      }
      if (h.flags & detail::kReject) {
        done.fail(it->second.req, ErrorCode::mismatch, chorus::detail::size_mismatch(it->second.data.size, h.size));
        release_send(it->second);
        sends_.erase(it);
        return true;
      }
      it->second.remote_addr = h.addr;
      it->second.rkey = h.rkey;
      queue_.push_back(Out{Out::write, {}, {}, nullptr, h.id, 0});
      return true;
    }
  }
  protocol_error("unknown message type " + std::to_string(h.type), done);
  return false;
}

inline void Link::deliver_eager(detail::RecvOp& r, const std::byte* src, std::size_t n, Completions& done) {
  if (r.dst.kind == MemoryKind::device) {
    // No eager copy targets device memory: the sender's buffer took the eager path (a message
    // of another size, or a sender that is no part of the same call). Nothing is written.
    done.fail(std::move(r.req), ErrorCode::mismatch,
              "an eager message of " + std::to_string(n) + " bytes met a receive of " + std::to_string(r.dst.size) +
                  " bytes into device memory, which takes rendezvous (rts/cts) messages only");
    return;
  }
  if (r.dst.size != n) {
    chorus::detail::write_prefix(r.dst, src, n);
    done.fail(std::move(r.req), ErrorCode::mismatch, chorus::detail::size_mismatch(n, r.dst.size));
    return;
  }
  if (n) std::memcpy(r.dst.data, src, n);
  done.complete(std::move(r.req), n);
}

inline void Link::match(detail::RecvOp r, detail::Arrival a, Completions& done) {
  if (auto* e = std::get_if<detail::EagerArrival>(&a)) {
    unexpected_bytes_ -= e->data.size();
    deliver_eager(r, e->data.data(), e->data.size(), done);
    spare_.give(std::move(e->data));
    return;
  }
  const auto& rts = std::get<detail::RtsArrival>(a);
  accept_rts(std::move(r), rts.size, rts.id, done);
}

inline void Link::accept_rts(detail::RecvOp r, std::uint64_t size, std::uint32_t id, Completions& done) {
  if (size != r.dst.size) {
    detail::Header h{static_cast<std::uint32_t>(detail::MsgType::cts), detail::kReject, 0, r.dst.size, id, 0, 0};
    done.fail(r.req, ErrorCode::mismatch, chorus::detail::size_mismatch(size, r.dst.size));
    queue_.push_back(Out{Out::message, h, {}, nullptr, 0, 0});
  } else if (recvs_.size() >= Policy::kMaxRegistered) {
    deferred_.push_back(DeferredRecv{std::move(r), id});  // its cts goes when an earlier receive completes
  } else {
    register_recv(std::move(r), id, done);
  }
}

inline void Link::register_recv(detail::RecvOp r, std::uint32_t id, Completions& done) {
  std::string why;
  Registration mr = register_buffer(r.dst.data, r.dst.size, r.dst.kind, why);
  if (!mr) {
    done.fail(r.req, ErrorCode::system, why);
    // The sender waits for an answer: tell it, and everything else on this link, to stop.
    return fail(ErrorCode::peer_failure, "rank " + std::to_string(rank_) + " could not register a receive buffer", true,
                done);
  }
  detail::Header h{static_cast<std::uint32_t>(detail::MsgType::cts), 0, 0, r.dst.size, id, mr.rkey(),
                   reinterpret_cast<std::uintptr_t>(r.dst.data)};
  if (!recvs_.emplace(id, ActiveRecv{std::move(r), std::move(mr)}).second)
    return protocol_error("duplicate message id " + std::to_string(id), done);
  queue_.push_back(Out{Out::message, h, {}, nullptr, 0, 0});
}

}  // namespace chorus::rdma
