// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// shm::Link's way out (link.hpp has the protocol): isend, and the records that wait for room in
/// the ring towards the peer (a large message streamed in data records among them). Every member
/// here runs with Hub::mu held.

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>

#include "chorus/transport/shm/link.hpp"

namespace chorus::shm {

inline Request Link::isend(ConstBytes data, Tag tag) {
  auto req = make_request("send", tag, data.size);
  detail::Completions done;
  bool kick = false;
  {
    std::lock_guard lk(hub_.mu);
    if (failed_) {
      done.fail(req, fail_code_, fail_why_);
    } else if (data.size <= Policy::kEagerBytes) {
      detail::Record h = detail::make_record(detail::RecordType::eager, tag, data.size);
      h.payload = data.size;
      kick = !post({h, data, req}, done);
    } else if (data.size > Policy::kMaxMessageBytes) {
      done.fail(req, ErrorCode::invalid_argument, "message of " + std::to_string(data.size) + " bytes is too large");
    } else {
      const std::uint64_t id = next_send_id_++;
      pending_sends_.emplace(id, PendingSend{data, req});
      detail::Record h = detail::make_record(detail::RecordType::rts, tag, data.size, id);
      h.addr = reinterpret_cast<std::uintptr_t>(data.data);
      kick = !post({h, {}, nullptr}, done);
    }
  }
  if (kick) hub_.kick();
  return Request(req);
}

inline bool Link::post(detail::OutRecord o, detail::Completions& done) {
  if (queue_.empty() && !o.stream && !failed_ && map_.valid() && out_.try_write(o.h, o.payload.data)) {
    if (o.req) done.complete(std::move(o.req), o.payload.size);
    if (out_.take_reader_sleeping()) ring_doorbell();
    return true;
  }
  chorus::detail::push_back_growing(queue_, std::move(o));
  return pump(done);
}

inline bool Link::pump(detail::Completions& done) {
  if (failed_ || !map_.valid()) return queue_.empty();
  bool wrote = false;
  while (!queue_.empty()) {
    auto& o = queue_.front();
    if (o.stream) {
      const std::size_t len = std::min(Policy::kStreamChunkBytes, o.payload.size - o.offset);
      detail::Record h = detail::make_record(detail::RecordType::data, 0, o.payload.size, o.h.id);
      h.offset = o.offset;
      h.payload = len;
      if (!out_.try_write(h, o.payload.data + o.offset)) break;
      wrote = true;
      o.offset += len;
      if (o.offset < o.payload.size) continue;
    } else {
      if (!out_.try_write(o.h, o.payload.data)) break;
      wrote = true;
    }
    if (o.req) done.complete(std::move(o.req), o.payload.size);
    queue_.pop_front();
  }
  if (wrote && out_.take_reader_sleeping()) ring_doorbell();
  return queue_.empty();
}

}  // namespace chorus::shm
