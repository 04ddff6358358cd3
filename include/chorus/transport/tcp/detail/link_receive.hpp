// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// tcp::Link's way in (link.hpp has the protocol): a receive meeting what arrived, and the reader
/// of the frames (a header, then the payload it announces, through the read buffer). Every member
/// here runs on the thread that runs the io_context (the holder of the engine's token).

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <variant>

#include "chorus/transport/tcp/link.hpp"

namespace chorus::tcp {

inline void Link::start_recv(detail::RecvOp r) {
  if (!matcher_.admit(r, failed_)) return;  // another link took it (any source)
  if (matcher_.take_unexpected(r.tag, [&](detail::Arrival& a) { match(std::move(r), std::move(a)); })) return;
  if (failed_) return r.req->fail(fail_code_, fail_why_);
  const Tag tag = r.tag;
  matcher_.add_posted(tag, std::move(r));
}

inline void Link::match(detail::RecvOp r, detail::Arrival a) {
  if (auto* e = std::get_if<detail::EagerArrival>(&a)) {
    unexpected_bytes_ -= e->data.size();
    if (e->data.size() != r.dst.size) {
      chorus::detail::write_prefix(r.dst, e->data.data(), e->data.size());
      r.req->fail(ErrorCode::mismatch, detail::size_mismatch(e->data.size(), r.dst.size));
    } else {
      if (!e->data.empty()) std::memcpy(r.dst.data, e->data.data(), e->data.size());
      r.req->complete(e->data.size());
    }
    spare_.give(std::move(e->data));
    if (paused_ && unexpected_bytes_ <= Policy::kMaxUnexpectedBytes) {
      paused_ = false;
      read_header();
    }
    return;
  }
  const auto& rts = std::get<detail::RtsArrival>(a);
  accept_rts(std::move(r), rts.size, rts.id);
}

inline void Link::accept_rts(detail::RecvOp r, std::uint64_t size, std::uint64_t id) {
  if (size != r.dst.size) {
    enqueue({{static_cast<std::uint32_t>(detail::FrameType::cts), detail::kCtsReject, 0, r.dst.size, id}, {}, nullptr});
    return r.req->fail(ErrorCode::mismatch, detail::size_mismatch(size, r.dst.size));
  }
  const int pieces = striped(size) ? streams() : 1;
  if (!active_recv_.emplace(id, detail::ActiveRecv{std::move(r), pieces}).second)
    return protocol_error("duplicate message id");
  if (pieces > 1) {
    for (auto& s : extra_) ++s->due;
    // A closed stream cannot bring its piece: the link breaks, from a handler of its own, since
    // this may run inside the matcher's walk of its lists (start_recv), which fail() empties.
    if (std::any_of(extra_.begin(), extra_.end(), [](const auto& s) { return s->closed; }))
      asio::post(io_, detail::bind_memory(handlers_, [this] { fail_if_stream_closed(); }));
  }
  enqueue({{static_cast<std::uint32_t>(detail::FrameType::cts), 0, 0, size, id}, {}, nullptr});
}

inline void Link::read_header() {
  if (parsing_) {
    again_ = true;
    return;
  }
  parsing_ = true;
  do {
    again_ = false;
    if (failed_) break;
    if (in_end_ - in_begin_ >= sizeof in_) {
      std::memcpy(&in_, inbuf_.data() + in_begin_, sizeof in_);
      in_begin_ += sizeof in_;
      on_header();
    } else {
      fill_inbuf();
    }
  } while (again_);
  parsing_ = false;
}

inline void Link::fill_inbuf() {
  const std::size_t left = in_end_ - in_begin_;
  if (left != 0 && in_begin_ != 0) std::memmove(inbuf_.data(), inbuf_.data() + in_begin_, left);
  in_begin_ = 0;
  in_end_ = left;
  socket_.async_read_some(asio::buffer(inbuf_.data() + in_end_, inbuf_.size() - in_end_),
                          detail::bind_memory(handlers_, [this](const boost::system::error_code& ec, std::size_t n) {
                            if (failed_) return;
                            if (ec) return on_read_error_between_frames(ec);
                            in_end_ += n;
                            read_header();
                          }));
}

inline void Link::on_header() {
  const auto h = in_;
  if (std::string bad = detail::frame_header_problem(h); !bad.empty()) return protocol_error(bad);
  switch (static_cast<detail::FrameType>(h.type)) {
    case detail::FrameType::eager: {
      if (auto r = matcher_.take_posted(h.tag)) {
        if (r->dst.size != h.size) {
          scratch_.resize(h.size);
          auto req = r->req;
          return read_payload(
              {scratch_.data(), scratch_.size()},
              [this, r = std::move(*r), size = h.size] {
                chorus::detail::write_prefix(r.dst, scratch_.data(), size);
                r.req->fail(ErrorCode::mismatch, detail::size_mismatch(size, r.dst.size));
              },
              std::move(req));
        }
        auto req = r->req;
        return read_payload(r->dst, [r = std::move(*r), size = h.size] { r.req->complete(size); }, std::move(req));
      }
      if (chorus::detail::over_buffered_cap(h.size))
        return fail(ErrorCode::system, chorus::detail::buffered_cap_error(h.size));
      // One payload is read at a time: into a spare buffer, kept here until it is in.
      unexpected_in_ = spare_.take(h.size);
      return read_payload({unexpected_in_.data(), unexpected_in_.size()}, [this, tag = h.tag] {
        // A receive may have been posted while the payload was being read.
        unexpected_bytes_ += unexpected_in_.size();
        if (auto r = matcher_.take_posted(tag))
          return match(std::move(*r), detail::EagerArrival{std::move(unexpected_in_)});
        matcher_.add_unexpected(tag, detail::EagerArrival{std::move(unexpected_in_)});
        if (unexpected_bytes_ > Policy::kMaxUnexpectedBytes) paused_ = true;
      });
    }
    case detail::FrameType::rts: {
      if (auto r = matcher_.take_posted(h.tag))
        accept_rts(std::move(*r), h.size, h.id);
      else
        matcher_.add_unexpected(h.tag, detail::RtsArrival{h.size, h.id});
      return read_header();
    }
    case detail::FrameType::cts: {
      auto it = pending_rts_.find(h.id);
      if (it == pending_rts_.end()) return protocol_error("clear-to-send for unknown message " + std::to_string(h.id));
      PendingSend s = std::move(it->second);
      pending_rts_.erase(it);
      if (h.flags & detail::kCtsReject)
        s.req->fail(ErrorCode::mismatch, detail::size_mismatch(s.data.size, h.size));
      else if (striped(s.data.size))
        send_striped(s, h.id);
      else if (s.data.size > Policy::kDataFrameBytes)
        send_sliced(s, h.id);
      else
        enqueue({{static_cast<std::uint32_t>(detail::FrameType::data), 0, 0, s.data.size, h.id}, s.data, s.req});
      return read_header();
    }
    case detail::FrameType::data: {
      auto it = active_recv_.find(h.id);
      if (it == active_recv_.end()) return protocol_error("data for unknown message " + std::to_string(h.id));
      if (it->second.pieces_left > 1 || striped(it->second.op.dst.size)) {
        // Piece 0 of a striped message; the others come on the extra streams.
        const auto [off, len] = detail::stripe_piece(it->second.op.dst.size, 0, streams());
        if (h.size != len) return protocol_error(piece_size_problem(h, 0, len));
        return read_payload({it->second.op.dst.data + off, len}, [this, id = h.id] { piece_received(id); });
      }
      // The next slice, behind those before it: every slice but the last is a whole
      // Policy::kDataFrameBytes (a message of at most that is one frame).
      auto& a = it->second;
      const std::uint64_t left = a.op.dst.size - a.received;
      if (h.size != std::min<std::uint64_t>(left, Policy::kDataFrameBytes))
        return protocol_error("data frame of " + std::to_string(h.size) + " bytes for message " + std::to_string(h.id) +
                              " of " + std::to_string(a.op.dst.size) + " bytes, " + std::to_string(left) + " of them to come");
      MutableBytes dst{a.op.dst.data + a.received, static_cast<std::size_t>(h.size), a.op.dst.kind};
      a.received += h.size;
      // A slice before the last: the receive stays in active_recv_, which fail() fails.
      if (a.received != a.op.dst.size) return read_payload(dst, [] {});
      detail::RecvOp r = std::move(a.op);
      active_recv_.erase(it);
      auto req = r.req;
      return read_payload(dst, [r = std::move(r)] { r.req->complete(r.dst.size); }, std::move(req));
    }
  }
}

template <class F>
inline void Link::read_payload(MutableBytes dst, F done, detail::ReqPtr into) {
  // What is buffered first, then the rest from the socket.
  const std::size_t have = std::min(dst.size, in_end_ - in_begin_);
  if (have != 0) std::memcpy(dst.data, inbuf_.data() + in_begin_, have);
  in_begin_ += have;
  if (have == dst.size) {
    done();
    if (!paused_) read_header();
    return;
  }
  reading_into_ = std::move(into);
  asio::async_read(socket_, asio::buffer(dst.data + have, dst.size - have), detail::TransferAll{Policy::kReadBytesPerCall},
                   detail::bind_memory(handlers_, [this, done = std::move(done)](const boost::system::error_code& ec,
                                                                                 std::size_t) mutable {
                     if (failed_) return;
                     if (ec) return on_read_error(ec);
                     reading_into_.reset();
                     done();
                     if (!paused_) read_header();
                   }));
}

inline std::string Link::piece_size_problem(const detail::FrameHeader& h, int stream, std::uint64_t len) const {
  return "piece " + std::to_string(stream) + " of message " + std::to_string(h.id) + " should be " +
         std::to_string(len) + " bytes, its frame says " + std::to_string(h.size);
}

inline void Link::piece_received(std::uint64_t id) {
  auto it = active_recv_.find(id);
  if (it == active_recv_.end() || --it->second.pieces_left > 0) return;
  detail::RecvOp r = std::move(it->second.op);
  active_recv_.erase(it);
  r.req->complete(r.dst.size);
}

inline void Link::piece_arrived(Stream& s, std::uint64_t id) {
  --s.due;
  piece_received(id);
  if (failed_) return;
  // Stream 0 was closed by the peer while this piece was due: the link ends with the last one.
  if (closed0_ && !pieces_due()) return fail(ErrorCode::peer_failure, closed_why_);
  read_stream(s);
}

inline void Link::read_stream(Stream& s) {
  asio::async_read(
      s.socket, asio::buffer(&s.in, sizeof s.in),
      detail::bind_memory(s.handlers, [this, &s](const boost::system::error_code& ec, std::size_t) {
        if (failed_) return;
        if (ec) {
          // Closed between frames with no piece due: the peer is leaving; whatever needs this
          // stream later breaks the link (see link.hpp).
          if (closed_by_peer(ec) && s.due == 0) return void(s.closed = true);
          return on_read_error(ec);
        }
        const auto h = s.in;
        if (static_cast<detail::FrameType>(h.type) != detail::FrameType::data)
          return protocol_error("frame of type " + std::to_string(h.type) + " on stream " + std::to_string(s.index) +
                                ", which carries data frames only");
        auto it = active_recv_.find(h.id);
        if (it == active_recv_.end() || !striped(it->second.op.dst.size))
          return protocol_error("data on stream " + std::to_string(s.index) + " for unknown message " +
                                std::to_string(h.id));
        const auto [off, len] = detail::stripe_piece(it->second.op.dst.size, s.index, streams());
        if (h.size != len) return protocol_error(piece_size_problem(h, s.index, len));
        asio::async_read(s.socket, asio::buffer(it->second.op.dst.data + off, len), detail::TransferAll{Policy::kReadBytesPerCall},
                         detail::bind_memory(s.handlers, [this, &s, id = h.id](const boost::system::error_code& ec2,
                                                                                std::size_t) {
                           if (failed_) return;
                           if (ec2) return on_read_error(ec2);
                           piece_arrived(s, id);
                         }));
      }));
}

}  // namespace chorus::tcp
