// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// tcp::Link: one full-duplex TCP connection to a peer (or K of them, CHORUS_SOCKETS_PER_PEER),
/// driven by the thread that waits (or the background thread, for work nobody waits on;
/// transport/progress.hpp).
///
/// Wire protocol (frames of a fixed 32-byte header, optionally followed by a payload):
/// | type  | header fields      | payload | meaning                                              |
/// |-------|--------------------|---------|------------------------------------------------------|
/// | eager | tag, size          | size B  | a small message (size <= Policy::kEagerBytes)        |
/// | rts   | tag, size, id      | none    | "ready to send" a large message                      |
/// | cts   | id, size, flags    | none    | "clear to send": the receive is posted (or rejected) |
/// | data  | id, size           | size B  | a slice of the large message, straight into the      |
/// |       |                    |         | posted buffer behind the slices before it            |
/// Large messages therefore never need a buffer on the receiver: memory stays bounded whatever
/// the message size. A large message goes out as data frames of at most Policy::kDataFrameBytes,
/// in order; the control and eager frames queued meanwhile go out between two slices, so a
/// clear-to-send never waits behind a long message going the other way (see Link::enqueue).
/// Unexpected eager messages are buffered up to Policy::kMaxUnexpectedBytes; past that the link
/// stops reading (TCP flow control holds the sender) until receives drain it.
/// Every header from the network is checked (type, sizes, ids) before it is used; a bad one
/// breaks the link with peer_failure.
///
/// Streams: with K > 1 connections to the peer (stream 0 and K-1 extra streams), every frame above
/// goes on stream 0, so matching and the per-(peer, tag) order are those of one connection; only
/// the data of a large message of at least Policy::kStripeBytes is striped: K data frames, piece i
/// (of K contiguous pieces, detail::stripe_piece) on stream i, each with the message's tag, id and
/// the piece's size. Both ends split the same size the same way (the rts/cts exchange made the
/// sizes equal), the receive completes when its K pieces are in, the send when its K pieces are
/// written. An extra stream carries data frames only; any failure on any stream breaks the link,
/// with one allowance: a peer that exits closes its K connections at once, and their ends may
/// arrive before the data still on the other streams (K = 1 cannot see this: a connection's end
/// comes after its data). So a stream closed by the peer between frames breaks the link only when
/// a piece is still due on it or a later striped message needs it; stream 0 closed that way
/// breaks it once the pieces due on the other streams are in. A close in mid-frame, and any
/// other error, break it at once.
///
/// Threading: isend/irecv may be called from any thread; they post to the io_context, and only the
/// thread that runs it (a waiting caller or the background thread, one at a time: see
/// transport/progress.hpp) touches the socket and the matching state.
///
/// Files: this one has the Link (its state and the short members) and the frame format,
/// detail/link_send.hpp the way out (the writer), detail/link_receive.hpp the way in (the reader).

#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "chorus/core/concepts.hpp"
#include "chorus/core/tag.hpp"
#include "chorus/detail/asio.hpp"
#include "chorus/detail/log.hpp"
#include "chorus/transport/matching.hpp"
#include "chorus/transport/progress.hpp"
#include "chorus/transport/shell.hpp"
#include "chorus/transport/tcp/detail/handler_memory.hpp"

namespace chorus::tcp {

namespace asio = chorus::detail::asio;
using chorus::detail::asio_tcp;

struct Policy {
  static constexpr std::size_t kEagerBytes = 64 * 1024;
  static constexpr std::size_t kMaxUnexpectedBytes = 64u << 20;
  static constexpr std::uint64_t kMaxMessageBytes = chorus::kMaxMessageBytes;
  /// Messages of at least this size are striped across a link's streams (when it has more than
  /// one): at 1 MiB the pieces of 4 streams are still 256 KiB, long enough that a piece costs
  /// what its bytes cost, not its system calls and wake-ups (docs/transports.md has the figures).
  static constexpr std::uint64_t kStripeBytes = 1u << 20;
  /// The most one sendmsg takes of a message: a sendmsg of megabytes holds the socket for as long
  /// as it copies, while the peer's data and acknowledgements on the same connection wait behind
  /// it (sendrecv at 64 MiB between namespace hosts: docs/transports.md has the figures).
  static constexpr std::size_t kWriteBytesPerCall = 256u << 10;
  /// The most one recvmsg asks for (it takes what the socket buffer holds, up to this).
  static constexpr std::size_t kReadBytesPerCall = 64u << 20;
  /// The largest data frame: a longer message goes as slices of this size. A control frame
  /// queued behind a message waits for at most one slice (8 ms at 1 Gbit/s), where it waited for
  /// the whole message: two ranks exchanging 64 MiB, the later one's clear-to-send waited behind
  /// the earlier one's data, and the two directions took turns instead of overlapping (recursive
  /// doubling between namespace hosts at 1 Gbit/s: docs/transports.md has the figures).
  static constexpr std::size_t kDataFrameBytes = 1u << 20;
};

namespace detail {

using chorus::detail::RequestState;
using ReqPtr = std::shared_ptr<RequestState>;

static_assert(std::endian::native == std::endian::little, "the tcp wire format is little-endian");

enum class FrameType : std::uint32_t { eager = 1, rts = 2, cts = 3, data = 4 };
inline constexpr std::uint32_t kCtsReject = 1;

struct FrameHeader {
  std::uint32_t type = 0;
  std::uint32_t flags = 0;
  std::uint64_t tag = 0;
  std::uint64_t size = 0;
  std::uint64_t id = 0;
};
static_assert(sizeof(FrameHeader) == 32);

/// What can be checked of a header from the network without the link's state (the ids of cts
/// and data frames are checked against it by the link): a known type, and a size the type
/// allows. Empty when the header is fine, else what is wrong (the link then breaks).
inline std::string frame_header_problem(const FrameHeader& h) {
  switch (static_cast<FrameType>(h.type)) {
    case FrameType::eager:
      if (h.size > Policy::kEagerBytes) return "eager frame of " + std::to_string(h.size) + " bytes";
      return {};
    case FrameType::rts:
      if (h.size > Policy::kMaxMessageBytes) return "message of " + std::to_string(h.size) + " bytes";
      return {};
    case FrameType::cts:
    case FrameType::data: return {};
  }
  return "unknown frame type " + std::to_string(h.type);
}

using chorus::detail::EagerArrival;
using chorus::detail::RecvOp;
struct RtsArrival {
  std::uint64_t size;
  std::uint64_t id;
};
using Arrival = std::variant<EagerArrival, RtsArrival>;

struct OutFrame {
  FrameHeader h;
  ConstBytes payload;
  ReqPtr req;  ///< completed when the frame is written (eager, data); null for control frames
  std::size_t sent = 0;  ///< bytes of header and payload already written (by send_now)
  bool piece = false;    ///< one piece of a striped message (h.id names it; Link::piece_sent)
};

using chorus::detail::size_mismatch;

/// Piece `i` of a message of `size` bytes striped over `n` streams: {offset, length}. Contiguous
/// pieces, the first `size % n` one byte longer; both ends compute it from the size alone.
inline std::pair<std::uint64_t, std::uint64_t> stripe_piece(std::uint64_t size, int i, int n) {
  const auto k = static_cast<std::uint64_t>(n), j = static_cast<std::uint64_t>(i);
  const std::uint64_t base = size / k, rem = size % k;
  return {j * base + std::min(j, rem), base + (j < rem ? 1 : 0)};
}

/// A large receive whose cts went out: its buffer, and how many pieces of its data are still to
/// come (1 unless striped).
struct ActiveRecv {
  RecvOp op;
  int pieces_left = 1;
  std::uint64_t received = 0;  ///< bytes of the slices announced so far (unstriped messages)
};

class LazyLinks;

}  // namespace detail

class Link {
 public:
  /// `driver`: the transport's engine; waiters drive it, and a timeout aborts it.
  /// `token`: the engine's; whoever holds it may touch this link's state.
  /// `streams`: the connections to the peer (CHORUS_SOCKETS_PER_PEER; both ends alike).
  Link(int rank, int peer, chorus::detail::asio::io_context& io, std::chrono::milliseconds timeout,
       std::weak_ptr<chorus::detail::Driver> driver, chorus::detail::DriveToken& token, int streams = 1)
      : rank_(rank),
        peer_(peer),
        io_(io),
        socket_(io),
        requests_(rank, peer, timeout, std::move(driver)),
        token_(token) {
    for (int i = 1; i < streams; ++i) extra_.push_back(std::make_unique<Stream>(io, i));
    batch_.reserve(2 * kMaxBatch);  // a header and a payload per frame: a write never grows it
  }
  Link(const Link&) = delete;
  Link& operator=(const Link&) = delete;

  int peer() const { return peer_; }
  /// Bytes this link holds: itself (its read buffer included) and the eager messages waiting for
  /// their receives (at most about Policy::kMaxUnexpectedBytes: reading pauses past it).
  std::size_t memory_bytes() const { return sizeof(*this) + extra_.size() * sizeof(Stream) + unexpected_bytes_; }
  /// The connections to the peer (CHORUS_SOCKETS_PER_PEER).
  int streams() const { return 1 + static_cast<int>(extra_.size()); }

  Request isend(ConstBytes data, Tag tag) {
    if (!up_.load(std::memory_order_acquire)) ask_for_connection();
    auto req = make_request("send", tag, data.size);
    start([this, data, tag, req] { start_send(data, tag, req); });
    return Request(req);
  }

  Request irecv(MutableBytes data, Tag tag) {
    if (!up_.load(std::memory_order_acquire) && !algo::is_notice_tag(tag)) ask_for_connection();
    auto req = make_request("recv", tag, data.size);
    start([this, data, tag, req] { start_recv(detail::RecvOp{data, req, tag}); });
    return Request(req);
  }

  /// This link's entry of a receive from any source (Communicator::irecv_any_bytes): `req` is
  /// shared by an entry on every link of the communicator, and the first link with a message of
  /// `tag` claims it, naming `source` as its sender (core/request.hpp). Returns the engine that
  /// completes it: this transport's engine.
  std::weak_ptr<chorus::detail::Driver> irecv_any(MutableBytes data, Tag tag, const detail::ReqPtr& req, int source) {
    start([this, data, tag, req, source] { start_recv(detail::RecvOp{data, req, tag, source}); });
    return requests_.driver();
  }

  /// Runs `op` (start_send or start_recv) on this thread when nobody runs the io_context and no
  /// earlier operation still waits in its queue (order is kept), else posts it there. Running it
  /// here saves a handler and the reactor's wake-up on the latency path.
  template <class F>
  void start(F op) {
    if (!token_.held_here() && token_.try_acquire()) {
      if (queued_starts_.load(std::memory_order_relaxed) == 0) {
        op();
        token_.release();
        return;
      }
      token_.release();
    }
    queued_starts_.fetch_add(1, std::memory_order_relaxed);
    asio::post(io_, detail::bind_memory(handlers_, [this, op = std::move(op)] {
      queued_starts_.fetch_sub(1, std::memory_order_relaxed);
      op();
    }));
  }

  // ---- progress thread only ----

  /// Stream `i`'s socket (0: the one that carries every frame but striped data).
  chorus::detail::asio_tcp::socket& socket(int i = 0) {
    return i == 0 ? socket_ : extra_[static_cast<std::size_t>(i - 1)]->socket;
  }

  /// A lazy link (CHORUS_CONNECT=lazy, detail/lazy_links.hpp) is made unconnected; its first send
  /// or receive (but an error notice's) asks `lazy` for the connection, so that a rank waiting on
  /// a peer hears of its end as over an eager link; frames wait in the queue until connected(),
  /// which starts reading and writes them.
  void set_unconnected(detail::LazyLinks& lazy) {
    lazy_ = &lazy;
    up_.store(false, std::memory_order_release);
  }
  bool is_connected() const { return up_.load(std::memory_order_acquire); }
  void connected() {
    up_.store(true, std::memory_order_release);
    start();
    write_next();
  }

  /// Starts reading frames; called once the handshakes are done.
  void start() {
    read_header();
    for (auto& s : extra_) read_stream(*s);
  }

  /// Breaks the link: closes the socket and fails everything pending with `code`. Messages already
  /// read stay receivable. Idempotent.
  /// With close == false the connection stays open (its operations are cancelled, so no buffer is
  /// touched again): used when the peers learn the reason another way (a collective mismatch is
  /// reported to every rank directly), so that they do not see a bare closed connection first.
  void fail(ErrorCode code, const std::string& why, bool close = true) {
    if (failed_) return;
    failed_ = true;
    fail_code_ = code;
    fail_why_ = why;
    boost::system::error_code ignored;
    if (close) {
      socket_.shutdown(asio::socket_base::shutdown_both, ignored);
      socket_.close(ignored);
    } else {
      socket_.cancel(ignored);
    }
    for (auto& s : extra_) {
      if (close) {
        s->socket.shutdown(asio::socket_base::shutdown_both, ignored);
        s->socket.close(ignored);
      } else {
        s->socket.cancel(ignored);
      }
      if (!s->writing) s->queue.clear();
    }
    chorus::detail::log(chorus::detail::LogLevel::info, chorus::detail::LogSubsys::net, rank_, "link to peer ", peer_, " broken: ", why);
    matcher_.drain_posted([&](detail::RecvOp& r) { r.req->fail(code, why); });
    matcher_.remove_unexpected_from([](detail::Arrival& a) { return std::holds_alternative<detail::RtsArrival>(a); });
    for (auto& [id, r] : active_recv_) r.op.req->fail(code, why);
    active_recv_.clear();
    for (auto& [id, s] : striped_sends_) s.req->fail(code, why);
    striped_sends_.clear();
    if (reading_into_) reading_into_->fail(code, why);
    reading_into_.reset();
    for (auto& [id, s] : pending_rts_) s.req->fail(code, why);
    pending_rts_.clear();
    for (auto& f : write_queue_)
      if (f.req) f.req->fail(code, why), f.req.reset();
    if (!writing_) write_queue_.clear();
  }

  bool failed() const { return failed_; }

 private:
  detail::ReqPtr make_request(const char* verb, Tag tag, std::size_t bytes) {
    return chorus::detail::make_link_request(requests_, verb, tag, bytes);
  }

  void start_send(ConstBytes data, Tag tag, const detail::ReqPtr& req);
  /// Asks lazy_ for the connection (detail/lazy_links.hpp; any thread, once per link).
  void ask_for_connection();

  struct PendingSend {
    ConstBytes data;
    detail::ReqPtr req;
    Tag tag = 0;
  };

  // ---- striping (K > 1 streams) ----

  /// One of the K-1 extra connections: data frames only, one write and one read at a time.
  struct Stream {
    Stream(asio::io_context& io, int i) : socket(io), index(i) {}
    asio_tcp::socket socket;
    int index;                                  ///< 1..K-1
    boost::circular_buffer<detail::OutFrame> queue;  ///< pieces to write (grows, never shrinks)
    bool writing = false;
    detail::FrameHeader out;                    ///< the header being written
    std::array<asio::const_buffer, 2> out_buffers;
    detail::FrameHeader in;                     ///< the header being read
    detail::HandlerMemory handlers;
    std::uint64_t due = 0;  ///< pieces still to read here: one per striped receive cleared to send
    bool closed = false;    ///< the peer closed it between frames (see the top of this file)
  };

  bool striped(std::uint64_t size) const { return !extra_.empty() && size >= Policy::kStripeBytes; }
  /// The peer cleared `s` (message `id`) to send: its K pieces go out, one on each stream.
  void send_striped(const PendingSend& s, std::uint64_t id);
  /// A piece of striped send `id` is written; the last one completes the send.
  void piece_sent(std::uint64_t id);
  /// The peer cleared `s` (message `id`, unstriped) to send: its data frames, a slice each.
  void send_sliced(const PendingSend& s, std::uint64_t id);
  /// A piece of striped receive `id` is in; the last one completes the receive.
  void piece_received(std::uint64_t id);
  void write_stream(Stream& s);
  void read_stream(Stream& s);
  /// A piece was read on extra stream `s`.
  void piece_arrived(Stream& s, std::uint64_t id);
  bool pieces_due() const {
    for (const auto& s : extra_)
      if (s->due != 0) return true;
    return false;
  }
  /// Fails the link when an extra stream is closed (a striped message would need it); true then.
  bool fail_if_stream_closed() {
    for (const auto& s : extra_)
      if (s->closed) {
        fail(ErrorCode::peer_failure, "stream " + std::to_string(s->index) + " of " + std::to_string(streams()) +
                                          " was closed by the peer (it exited, aborted or was killed)");
        return true;
      }
    return false;
  }
  std::string piece_size_problem(const detail::FrameHeader& h, int stream, std::uint64_t len) const;

  void start_recv(detail::RecvOp r);

  void match(detail::RecvOp r, detail::Arrival a);

  /// A large message and its receive have met: clear the sender to send, or reject a size mismatch
  /// on both sides.
  void accept_rts(detail::RecvOp r, std::uint64_t size, std::uint64_t id);

  // ---- writing: one async_write at a time, frames in queue order ----
  // The first frame queued on an idle link does not start a write at once: the write runs from a
  // handler posted after it, so the frames queued meanwhile (a call's descriptor and its first
  // data message, a CTS and the next eager send) leave in one write and one segment, and the
  // peer handles them in one wake-up.

  static constexpr std::size_t kMaxBatch = 32;  ///< frames per write

  void enqueue(detail::OutFrame f);

  void write_next();

  /// Writes what the socket takes of a frame now, without blocking; the bytes written (0 on
  /// EAGAIN or an error, which the async_write that follows then reports).
  std::size_t send_now(const detail::FrameHeader& h, ConstBytes payload);

  // ---- reading: header, then the payload it announces ----

  // Reads go through inbuf_: one recv takes a header and what follows it (a small message's
  // payload, the next frames), so a small message costs one system call, not two. A payload
  // longer than what is buffered is read straight into its destination after the buffered part.
  // read_header() parses in a loop (a trampoline: a handler that calls it while it runs only asks
  // for another round), so a burst of buffered frames does not nest calls.

  void read_header();

  /// Reads what the socket has (at least one byte) behind the bytes still buffered, then parses.
  void fill_inbuf();

  void on_read_error(const boost::system::error_code& ec) { fail(ErrorCode::peer_failure, read_error_text(ec)); }
  static std::string read_error_text(const boost::system::error_code& ec) {
    if (closed_by_peer(ec)) return "connection closed by the peer (it exited, aborted or was killed)";
    return "read from peer failed: " + ec.message();
  }
  static bool closed_by_peer(const boost::system::error_code& ec) {
    return ec == asio::error::eof || ec == asio::error::connection_reset;
  }
  /// Stream 0's reader met `ec` between frames: breaks the link, unless the peer closed it while
  /// pieces are still due on other streams (then the last of them breaks it: piece_arrived).
  void on_read_error_between_frames(const boost::system::error_code& ec) {
    if (!closed_by_peer(ec) || !pieces_due()) return on_read_error(ec);
    closed0_ = true;
    closed_why_ = read_error_text(ec);
  }

  void protocol_error(const std::string& what) {
    chorus::detail::log(chorus::detail::LogLevel::warn, chorus::detail::LogSubsys::net, rank_, "peer ", peer_, ": protocol error: ", what);
    fail(ErrorCode::peer_failure, "protocol error from peer: " + what);
  }

  void on_header();

  /// Reads exactly dst.size bytes, runs `done`, then goes on with the next header (unless paused).
  /// `into` is the receive whose buffer is being filled, if any: fail() fails it should the link
  /// break mid-payload.
  template <class F>
  void read_payload(MutableBytes dst, F done, detail::ReqPtr into = nullptr);

  struct StripedSend {
    detail::ReqPtr req;
    std::uint64_t size;
    int pieces_left;
  };

  int rank_;
  int peer_;
  asio::io_context& io_;
  asio_tcp::socket socket_;
  chorus::detail::RequestFactory requests_;  ///< pooled request states, naming the engine
  chorus::detail::DriveToken& token_;
  detail::LazyLinks* lazy_ = nullptr;  ///< where a lazy link asks for its connection
  std::atomic<bool> up_{true};         ///< connected (false for a lazy link until it is)
  /// start()s posted and not yet run: while any is, later ones are posted behind it. Changed
  /// under the token (or by the posting thread before it posts).
  std::atomic<int> queued_starts_{0};

  // State of the thread that runs the io_context (the one holding the engine's token).
  chorus::detail::TagMatcher<detail::RecvOp, detail::Arrival> matcher_;
  chorus::detail::IdMap<detail::ActiveRecv> active_recv_;
  chorus::detail::IdMap<PendingSend> pending_rts_;
  chorus::detail::IdMap<StripedSend> striped_sends_;  ///< cleared, pieces being written
  std::vector<std::unique_ptr<Stream>> extra_;        ///< streams 1..K-1
  bool closed0_ = false;    ///< stream 0 closed by the peer while pieces were due elsewhere
  std::string closed_why_;  ///< ... and how
  boost::circular_buffer<detail::OutFrame> write_queue_;  ///< grows, never shrinks (push_back_growing)
  chorus::detail::SpareBuffers spare_;
  std::vector<std::byte> unexpected_in_;  ///< the unexpected eager payload being read
  detail::HandlerMemory handlers_;        ///< the asynchronous operations' memory
  std::vector<std::byte> scratch_;
  detail::ReqPtr reading_into_;  ///< the receive whose payload is being read, if any
  detail::FrameHeader in_;
  static constexpr std::size_t kInBufBytes = 16 << 10;
  std::array<std::byte, kInBufBytes> inbuf_;  ///< bytes read and not yet parsed: [in_begin_, in_end_)
  std::size_t in_begin_ = 0;
  std::size_t in_end_ = 0;
  bool parsing_ = false;  ///< read_header's loop runs
  bool again_ = false;    ///< ... and should go round once more
  std::uint64_t next_send_id_ = 1;
  chorus::detail::ByteGauge unexpected_bytes_;  ///< eager messages waiting for their receives
  bool writing_ = false;
  bool write_posted_ = false;                  ///< a write_next is posted
  std::vector<asio::const_buffer> batch_;      ///< the frames of the write in flight
  std::array<detail::FrameHeader, kMaxBatch> batch_headers_;  ///< their headers
  std::size_t batch_frames_ = 0;
  bool paused_ = false;
  bool failed_ = false;
  ErrorCode fail_code_ = ErrorCode::peer_failure;
  std::string fail_why_;
};

}  // namespace chorus::tcp

// The bodies of the way out and the way in, and the lazy links' set-up.
#include "chorus/transport/tcp/detail/lazy_links.hpp"
#include "chorus/transport/tcp/detail/link_receive.hpp"
#include "chorus/transport/tcp/detail/link_send.hpp"
