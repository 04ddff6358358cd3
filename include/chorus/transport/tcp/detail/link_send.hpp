// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// tcp::Link's way out (link.hpp has the protocol): a send becoming frames, and the writer (one
/// async_write at a time, frames in queue order, what the socket takes at once written without
/// a handler). Every member here runs on the thread that runs the io_context (the holder of the
/// engine's token).

#include <cstdint>
#include <utility>

#include "chorus/transport/tcp/link.hpp"

namespace chorus::tcp {

inline void Link::start_send(ConstBytes data, Tag tag, const detail::ReqPtr& req) {
  if (failed_) return req->fail(fail_code_, fail_why_);
  if (data.size <= Policy::kEagerBytes) {
    enqueue({{static_cast<std::uint32_t>(detail::FrameType::eager), 0, tag, data.size, 0}, data, req});
  } else {
    const std::uint64_t id = next_send_id_++;
    pending_rts_.emplace(id, PendingSend{data, req, tag});
    enqueue({{static_cast<std::uint32_t>(detail::FrameType::rts), 0, tag, data.size, id}, {}, nullptr});
  }
}

inline void Link::enqueue(detail::OutFrame f) {
  // Nothing queued and no write in flight: the frame goes straight to the socket (one sendmsg,
  // no Asio operation). What the socket does not take waits in the queue for an async_write.
  if (!writing_ && !write_posted_ && write_queue_.empty() && !failed_ &&
      up_.load(std::memory_order_relaxed)) {
    f.sent = send_now(f.h, f.payload);
    if (f.sent == sizeof f.h + f.payload.size) {
      if (f.piece) return piece_sent(f.h.id);
      if (f.req) f.req->complete(f.payload.size);
      return;
    }
  }
  // A control or eager frame goes ahead of the data frames queued at the back (not of those being
  // written, nor of one partly written): eager and rts frames keep their order among themselves,
  // which is what matching needs, and a clear-to-send leaves within one slice of a long message.
  if (static_cast<detail::FrameType>(f.h.type) != detail::FrameType::data) {
    std::size_t keep = writing_ ? batch_frames_ : 0;
    if (keep == 0 && !write_queue_.empty() && write_queue_.front().sent != 0) keep = 1;
    std::size_t at = write_queue_.size();
    while (at > keep && static_cast<detail::FrameType>(write_queue_[at - 1].h.type) == detail::FrameType::data) --at;
    if (at != write_queue_.size()) {
      chorus::detail::insert_growing(write_queue_, at, std::move(f));
      return;  // data frames were queued: a write is in flight or posted
    }
  }
  chorus::detail::push_back_growing(write_queue_, std::move(f));
  if (writing_ || write_posted_ || !up_.load(std::memory_order_relaxed))
    return;  // not connected: connected() writes
  write_posted_ = true;
  asio::post(io_, detail::bind_memory(handlers_, [this] {
    write_posted_ = false;
    write_next();
  }));
}

inline void Link::write_next() {
  if (writing_ || failed_ || write_queue_.empty() || !up_.load(std::memory_order_relaxed)) return;
  writing_ = true;
  // The frames stay in the queue until the write completes; their headers are copied to
  // batch_headers_, since the queue may reallocate while more frames are appended.
  batch_.clear();
  batch_frames_ = 0;
  std::size_t batch_bytes = 0;
  for (auto& f : write_queue_) {
    // At most about a slice per write: what is queued later may go ahead of the data behind it.
    if (batch_frames_ == kMaxBatch || batch_bytes >= Policy::kDataFrameBytes) break;
    batch_bytes += f.payload.size;
    batch_headers_[batch_frames_] = f.h;  // the queue may grow (and move) during the write
    // f.sent: bytes send_now() wrote already (the first frame only).
    const auto* head = reinterpret_cast<const std::byte*>(&batch_headers_[batch_frames_]);
    if (f.sent < sizeof f.h) batch_.push_back(asio::buffer(head + f.sent, sizeof f.h - f.sent));
    const std::size_t skip = f.sent > sizeof f.h ? f.sent - sizeof f.h : 0;
    if (f.payload.size > skip) batch_.push_back(asio::buffer(f.payload.data + skip, f.payload.size - skip));
    ++batch_frames_;
  }
  asio::async_write(socket_, detail::BufferRange{batch_.data(), batch_.data() + batch_.size()}, detail::TransferAll{Policy::kWriteBytesPerCall}, detail::bind_memory(handlers_, [this](const boost::system::error_code& ec, std::size_t) {
    writing_ = false;
    if (failed_) return write_queue_.clear();
    if (ec) return fail(ErrorCode::peer_failure, "write to peer failed: " + ec.message());
    // Take the written frames off the queue before completing any: a completion may fail this
    // link (an abort), which clears the queue.
    struct Done {
      detail::ReqPtr req;
      std::size_t bytes;
      std::uint64_t piece_of;  ///< the striped message's id, or 0
    };
    std::array<Done, kMaxBatch> done;
    const std::size_t k = batch_frames_;
    for (std::size_t i = 0; i < k; ++i) {
      auto& f = write_queue_.front();
      done[i] = {std::move(f.req), f.payload.size, f.piece ? f.h.id : 0};
      write_queue_.pop_front();
    }
    for (std::size_t i = 0; i < k; ++i) {
      if (done[i].piece_of != 0) piece_sent(done[i].piece_of);
      if (done[i].req) done[i].req->complete(done[i].bytes);
    }
    write_next();
  }));
}

inline std::size_t Link::send_now(const detail::FrameHeader& h, ConstBytes payload) {
  iovec iov[2] = {{const_cast<detail::FrameHeader*>(&h), sizeof h}, {const_cast<std::byte*>(payload.data), std::min(payload.size, Policy::kWriteBytesPerCall)}};
  msghdr m{};
  m.msg_iov = iov;
  m.msg_iovlen = payload.size != 0 ? 2 : 1;
  ssize_t k;
  do {
    k = ::sendmsg(socket_.native_handle(), &m, MSG_DONTWAIT | MSG_NOSIGNAL);
  } while (k < 0 && errno == EINTR);
  return k > 0 ? static_cast<std::size_t>(k) : 0;
}

inline void Link::send_striped(const PendingSend& s, std::uint64_t id) {
  const int n = streams();
  striped_sends_.emplace(id, StripedSend{s.req, s.data.size, n});
  if (fail_if_stream_closed()) return;
  // The extra streams first: stream 0's piece may be written at once, in this call.
  for (int i = n - 1; i >= 0; --i) {
    const auto [off, len] = detail::stripe_piece(s.data.size, i, n);
    detail::OutFrame f{{static_cast<std::uint32_t>(detail::FrameType::data), 0, s.tag, len, id},
                       {s.data.data + off, len, s.data.kind},
                       nullptr,
                       0,
                       true};
    if (i == 0) return enqueue(std::move(f));
    Stream& st = *extra_[static_cast<std::size_t>(i - 1)];
    chorus::detail::push_back_growing(st.queue, std::move(f));
    write_stream(st);
  }
}

inline void Link::send_sliced(const PendingSend& s, std::uint64_t id) {
  const std::uint64_t slices = (s.data.size + Policy::kDataFrameBytes - 1) / Policy::kDataFrameBytes;
  striped_sends_.emplace(id, StripedSend{s.req, s.data.size, static_cast<int>(slices)});
  for (std::uint64_t off = 0; off < s.data.size && !failed_; off += Policy::kDataFrameBytes) {
    const std::uint64_t len = std::min<std::uint64_t>(Policy::kDataFrameBytes, s.data.size - off);
    enqueue({{static_cast<std::uint32_t>(detail::FrameType::data), 0, 0, len, id},
             {s.data.data + off, static_cast<std::size_t>(len), s.data.kind},
             nullptr,
             0,
             true});
  }
}

inline void Link::piece_sent(std::uint64_t id) {
  auto it = striped_sends_.find(id);
  if (it == striped_sends_.end() || --it->second.pieces_left > 0) return;  // gone: the link failed
  auto req = std::move(it->second.req);
  const auto size = it->second.size;
  striped_sends_.erase(it);
  req->complete(size);
}

inline void Link::write_stream(Stream& s) {
  if (s.writing || failed_ || s.queue.empty()) return;
  s.writing = true;
  const auto& f = s.queue.front();
  s.out = f.h;
  s.out_buffers = {asio::buffer(&s.out, sizeof s.out), asio::buffer(f.payload.data, f.payload.size)};
  asio::async_write(s.socket, detail::BufferRange{s.out_buffers.data(), s.out_buffers.data() + s.out_buffers.size()}, detail::TransferAll{Policy::kWriteBytesPerCall},
                    detail::bind_memory(s.handlers, [this, &s](const boost::system::error_code& ec, std::size_t) {
                      s.writing = false;
                      if (failed_) return s.queue.clear();
                      if (ec)
                        return fail(ErrorCode::peer_failure, "write to peer failed on stream " +
                                                                 std::to_string(s.index) + " of " +
                                                                 std::to_string(streams()) + ": " + ec.message());
                      const std::uint64_t id = s.queue.front().h.id;
                      s.queue.pop_front();
                      piece_sent(id);
                      write_stream(s);
                    }));
}

}  // namespace chorus::tcp
