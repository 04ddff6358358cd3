// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// rdma::Link's way out (link.hpp has the protocol): isend, the queue of work that waits for
/// credits or send-queue room, the posting of messages (inline or from a send slot) and of a large
/// message's RDMA writes, the registrations of sends, and the credit writes. Every member here
/// runs with Hub::mu held.

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "chorus/transport/rdma/link.hpp"

namespace chorus::rdma {

inline Request Link::isend(ConstBytes data, Tag tag) {
  auto req = chorus::detail::make_link_request(requests_, "send", tag, data.size);
  Completions done;
  Kick kick{hub_};
  std::lock_guard lk(hub_.mu);
  if (failed_) {
    done.fail(req, fail_code_, fail_why_);
  } else if (data.kind == MemoryKind::device && !hub_.device.runtime) {
    done.fail(req, ErrorCode::invalid_argument, kNoDeviceMemory);
  } else if (data.size <= kEagerBytes && data.kind == MemoryKind::host) {
    Out o{Out::message, {static_cast<std::uint32_t>(detail::MsgType::eager), 0, tag, data.size, 0, 0, 0}, data, req, 0, 0};
    // Straight out when nothing waits before it and a credit and queue room are there.
    const int e = queue_.empty() && room(true) ? post_message(o, done) : -1;
    if (e > 0) {
      fail(ErrorCode::system, std::string("ibv_post_send failed: ") + std::strerror(e), true, done);
    } else if (e < 0) {
      queue_.push_back(std::move(o));
      pump(done);
    }
  } else if (data.size > Policy::kMaxMessageBytes) {
    done.fail(req, ErrorCode::invalid_argument, "message of " + std::to_string(data.size) + " bytes is too large");
  } else {
    std::string why;
    Registration mr;
    // Registered now, so that registering overlaps the rts and cts, while under the cap;
    // else once the cts came (pump).
    if (send_regs_ < Policy::kMaxRegistered && !(mr = register_buffer(data.data, data.size, data.kind, why))) {
      // The message cannot go, and later ones on its tag must not overtake it: the link fails.
      done.fail(req, ErrorCode::system, why);
      fail(ErrorCode::system, why, true, done);
    } else {
      if (mr) ++send_regs_;
      const std::uint32_t id = next_id_++;
      sends_.emplace(id, PendingSend{data, req, std::move(mr), 0, 0, false});
      detail::Header h{static_cast<std::uint32_t>(detail::MsgType::rts), 0, tag, data.size, id, 0, 0};
      queue_.push_back(Out{Out::message, h, {}, nullptr, 0, 0});
      pump(done);
    }
  }
  kick.needed = !queue_.empty();
  return Request(req);
}

inline bool Link::pump(Completions& done) {
  bool moved = false;
  while (!failed_ && !queue_.empty()) {
    Out& o = queue_.front();
    PendingSend* s = nullptr;
    if (o.kind == Out::write) {
      auto it = sends_.find(o.id);
      if (it == sends_.end()) {  // failed meanwhile
        queue_.pop_front();
        continue;
      }
      s = &it->second;
    }
    if (!room(!s || o.offset + Policy::kChunkBytes >= s->data.size)) break;  // a message, or the last write
    if (s && !s->mr && !register_send(*s, done)) {
      if (failed_) return true;
      break;  // every registration is on writes under way: wait for one to complete
    }
    const int e = s ? post_write(o, *s) : post_message(o, done);
    if (e < 0) break;  // no send slot free: wait for a completion
    if (e > 0) {
      fail(ErrorCode::system, std::string("ibv_post_send failed: ") + std::strerror(e), true, done);
      return true;
    }
    moved = true;
    if (s && o.offset < s->data.size) continue;  // more chunks
    queue_.pop_front();
  }
  if (!failed_ && owed_ >= Policy::kCreditBatch && !credit_in_flight_ && sq_used_ < Policy::kSendDepth) {
    return_credits(done);
    moved = true;
  }
  return moved;
}

inline bool Link::register_send(PendingSend& s, Completions& done) {
  if (send_regs_ >= Policy::kMaxRegistered)
    for (auto& [id, other] : sends_)
      if (other.mr && !other.writing) {
        release_send(other);
        break;
      }
  if (send_regs_ >= Policy::kMaxRegistered) return false;
  std::string why;
  s.mr = register_buffer(s.data.data, s.data.size, s.data.kind, why);
  if (!s.mr) {
    fail(ErrorCode::system, why, true, done);
    return false;
  }
  ++send_regs_;
  return true;
}

inline void Link::release_send(PendingSend& s) {
  if (!s.mr) return;
  s.mr = Registration();
  --send_regs_;
}

inline int Link::post_message(Out& o, Completions& done) {
  const std::size_t len = sizeof(detail::Header) + o.payload.size;
  SendWr wr;
  wr.opcode = Opcode::send;
  if (len <= max_inline_) {
    // Inline: the provider copies it at post time.
    std::memcpy(inline_buf_.data(), &o.h, sizeof o.h);
    if (o.payload.size) std::memcpy(inline_buf_.data() + sizeof o.h, o.payload.data, o.payload.size);
    // Unsignaled but every kSignalEvery-th: nothing waits for an inline message's completion,
    // and a completion costs the driver a CQ entry; the signaled one frees the queue slots of
    // the ones before it (an error completes any work request, signaled or not).
    const bool signal = unsignaled_ + 1 >= kSignalEvery;
    wr.signaled = signal;
    wr.wr_id = detail::make_wr(detail::WrKind::inline_msg, peer_, signal ? unsignaled_ + 1 : 0);
    wr.sge = {reinterpret_cast<std::uintptr_t>(inline_buf_.data()), static_cast<std::uint32_t>(len), 0};
    wr.inline_data = true;
    if (const int e = verbs_.post_send(qp_, wr); e != 0) return e;
    unsignaled_ = signal ? 0 : unsignaled_ + 1;
  } else {
    if (free_send_slots_.empty()) return -1;
    const std::uint32_t s = free_send_slots_.back();
    std::byte* p = send_slot(s);
    std::memcpy(p, &o.h, sizeof o.h);
    if (o.payload.size) std::memcpy(p + sizeof o.h, o.payload.data, o.payload.size);
    wr.wr_id = detail::make_wr(detail::WrKind::send_slot, peer_, s);
    wr.sge = {reinterpret_cast<std::uintptr_t>(p), static_cast<std::uint32_t>(len), mem_.lkey};
    if (const int e = verbs_.post_send(qp_, wr); e != 0) return e;
    free_send_slots_.pop_back();
  }
  ++sq_used_;
  ++used_;
  if (o.req) done.complete(std::move(o.req), o.payload.size);
  return 0;
}

inline int Link::post_write(Out& o, PendingSend& s) {
  const std::uint64_t len = std::min<std::uint64_t>(Policy::kChunkBytes, s.data.size - o.offset);
  const bool last = o.offset + len == s.data.size;
  SendWr wr;
  wr.wr_id = detail::make_wr(last ? detail::WrKind::write_last : detail::WrKind::write, peer_, o.id);
  wr.opcode = last ? Opcode::rdma_write_imm : Opcode::rdma_write;
  wr.sge = {reinterpret_cast<std::uintptr_t>(s.data.data + o.offset), static_cast<std::uint32_t>(len), s.mr.lkey()};
  wr.imm = o.id;
  wr.remote_addr = s.remote_addr + o.offset;
  wr.rkey = s.rkey;
  if (const int e = verbs_.post_send(qp_, wr); e != 0) return e;
  ++sq_used_;
  if (last) ++used_;
  o.offset += len;
  s.writing = true;
  return 0;
}

inline SendWr Link::credit_block_write(detail::WrKind kind, const std::uint64_t* src, std::size_t offset) const {
  SendWr wr;
  wr.wr_id = detail::make_wr(kind, peer_, 0);
  wr.opcode = Opcode::rdma_write;
  wr.sge = {reinterpret_cast<std::uintptr_t>(src), 2 * sizeof(std::uint64_t), mem_.lkey};
  wr.inline_data = max_inline_ >= wr.sge.length;
  wr.remote_addr = remote_credits_ + offset;
  wr.rkey = remote_rkey_;
  return wr;
}

inline void Link::return_credits(Completions& done) {
  auto& out = *mem_.credits_out;
  out.returned += owed_;
  out.returned_check = ~out.returned;
  owed_ = 0;
  const SendWr wr = credit_block_write(detail::WrKind::credit, &out.returned, offsetof(detail::CreditBlock, returned));
  if (const int e = verbs_.post_send(qp_, wr); e != 0)
    return fail(ErrorCode::system, std::string("ibv_post_send (credits) failed: ") + std::strerror(e), true, done);
  ++sq_used_;
  credit_in_flight_ = true;  // one at a time: the source words stay still until it completes
}

}  // namespace chorus::rdma
