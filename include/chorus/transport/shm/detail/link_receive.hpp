// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// shm::Link's way in (link.hpp has the protocol): irecv, draining the incoming ring record by
/// record (eager, rts, cts, data, fin), matching a receive to what arrived, and answering a large
/// message with a pull (CMA) or a cts (streamed). Every member here runs with Hub::mu held.

#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <utility>
#include <variant>

#include "chorus/transport/shm/link.hpp"

namespace chorus::shm {

inline Request Link::irecv(MutableBytes data, Tag tag) {
  auto req = make_request("recv", tag, data.size);
  start_recv(detail::RecvOp{data, req, tag});
  return Request(req);
}

inline void Link::start_recv(detail::RecvOp r) {
  detail::Completions done;
  bool kick = false;
  {
    std::lock_guard lk(hub_.mu);
    const Tag tag = r.tag;
    const auto req = r.req;
    if (!matcher_.admit(r, failed_)) {  // another link took it (any source)
    } else if (matcher_.take_unexpected(tag, [&](detail::Arrival& a) { kick = match(std::move(r), std::move(a), done); })) {
    } else if (failed_) {
      done.fail(req, fail_code_, fail_why_);
    } else {
      matcher_.add_posted(tag, std::move(r));
    }
    if (!queue_.empty()) kick = !pump(done) || kick;
  }
  if (kick) hub_.kick();
}

inline bool Link::drain(detail::Completions& done) {
  bool any = false;
  std::string bad;
  while (!paused_) {
    const detail::Record* r = in_.peek(bad);
    if (!r) break;
    if (!on_record(*r, done)) break;  // paused, or the link broke
    in_.pop(r);
    any = true;
  }
  if (!bad.empty()) protocol_error(bad, done);
  if (any && in_.take_writer_sleeping()) ring_doorbell();
  return any;
}

inline bool Link::on_record(const detail::Record& h, detail::Completions& done) {
  using detail::RecordType;
  if (std::string bad = detail::record_problem(h); !bad.empty()) {
    protocol_error(bad, done);
    return false;
  }
  switch (static_cast<RecordType>(h.type)) {
    case RecordType::eager: {
      const std::byte* src = detail::RingReader::payload(&h);
      if (auto r = matcher_.take_posted(h.tag)) {
        if (r->dst.size != h.size) {
          chorus::detail::write_prefix(r->dst, src, h.size);
          done.fail(r->req, ErrorCode::mismatch, detail::size_mismatch(h.size, r->dst.size));
        } else {
          if (h.size) std::memcpy(r->dst.data, src, h.size);
          done.complete(r->req, h.size);
        }
        return true;
      }
      if (unexpected_bytes_ > 0 && unexpected_bytes_ + h.size > Policy::kMaxUnexpectedBytes) {
        paused_ = true;
        return false;
      }
      if (chorus::detail::over_buffered_cap(h.size)) {
        fail(ErrorCode::system, chorus::detail::buffered_cap_error(h.size), true, done);
        return false;
      }
      unexpected_bytes_ += h.size;
      matcher_.add_unexpected(h.tag, detail::EagerArrival{spare_.take(src, h.size)});
      return true;
    }
    case RecordType::rts: {
      if (auto r = matcher_.take_posted(h.tag))
        accept_rts(std::move(*r), h.size, h.id, h.addr, done);
      else
        matcher_.add_unexpected(h.tag, detail::RtsArrival{h.size, h.id, h.addr});
      return true;
    }
    case RecordType::fin: {
      auto it = pending_sends_.find(h.id);
      if (it == pending_sends_.end()) {
        protocol_error("completion of unknown message " + std::to_string(h.id), done);
        return false;
      }
      PendingSend s = std::move(it->second);
      pending_sends_.erase(it);
      if (h.flags & detail::kFinReject)
        done.fail(s.req, ErrorCode::mismatch, detail::size_mismatch(s.data.size, h.size));
      else
        done.complete(s.req, s.data.size);
      return true;
    }
    case RecordType::cts: {
      auto it = pending_sends_.find(h.id);
      if (it == pending_sends_.end()) {
        protocol_error("clear-to-send for unknown message " + std::to_string(h.id), done);
        return false;
      }
      PendingSend s = std::move(it->second);
      pending_sends_.erase(it);
      detail::OutRecord o{detail::make_record(detail::RecordType::data, 0, s.data.size, h.id), s.data, s.req};
      o.stream = true;
      chorus::detail::push_back_growing(queue_, std::move(o));
      pump(done);
      return true;
    }
    case RecordType::data: {
      auto it = active_recv_.find(h.id);
      if (it == active_recv_.end() || h.offset != it->second.received ||
          h.offset + h.payload > it->second.recv.dst.size || h.size != it->second.recv.dst.size) {
        protocol_error("data record out of place for message " + std::to_string(h.id), done);
        return false;
      }
      auto& a = it->second;
      if (h.payload) std::memcpy(a.recv.dst.data + h.offset, detail::RingReader::payload(&h), h.payload);
      a.received += h.payload;
      if (a.received == a.recv.dst.size) {
        done.complete(a.recv.req, a.received);
        active_recv_.erase(it);
      }
      return true;
    }
    case RecordType::pad:
      break;
  }
  protocol_error("unknown record type " + std::to_string(h.type), done);
  return false;
}

inline bool Link::match(detail::RecvOp r, detail::Arrival a, detail::Completions& done) {
  if (auto* e = std::get_if<detail::EagerArrival>(&a)) {
    unexpected_bytes_ -= e->data.size();
    if (e->data.size() != r.dst.size) {
      chorus::detail::write_prefix(r.dst, e->data.data(), e->data.size());
      done.fail(r.req, ErrorCode::mismatch, detail::size_mismatch(e->data.size(), r.dst.size));
    } else {
      if (!e->data.empty()) std::memcpy(r.dst.data, e->data.data(), e->data.size());
      done.complete(r.req, e->data.size());
    }
    spare_.give(std::move(e->data));
    if (paused_ && unexpected_bytes_ <= Policy::kMaxUnexpectedBytes / 2) {
      paused_ = false;
      return true;
    }
    return false;
  }
  const auto& rts = std::get<detail::RtsArrival>(a);
  accept_rts(std::move(r), rts.size, rts.id, rts.addr, done);
  return !pulls_.empty();
}

inline void Link::accept_rts(detail::RecvOp r, std::uint64_t size, std::uint64_t id, std::uint64_t addr,
                detail::Completions& done) {
  if (size != r.dst.size) {
    detail::Record h = detail::make_record(detail::RecordType::fin, 0, r.dst.size, id);
    h.flags = detail::kFinReject;
    done.fail(r.req, ErrorCode::mismatch, detail::size_mismatch(size, r.dst.size));
    return enqueue(h, done);
  }
  if (cma_) {
    chorus::detail::push_back_growing(pulls_, detail::Pull{std::move(r), id, addr, size});
    return;
  }
  if (!active_recv_.emplace(id, ActiveRecv{std::move(r), 0}).second)
    return protocol_error("duplicate message id", done);
  enqueue(detail::make_record(detail::RecordType::cts, 0, size, id), done);
}

}  // namespace chorus::shm
