#pragma once
/// TcpStore: a Store served over TCP by one process (rank 0), like torch.distributed's TCPStore.
///
///   chorus::TcpStore server("127.0.0.1", 0, /*is_server=*/true, std::chrono::seconds(30));
///   chorus::TcpStore client("127.0.0.1", server.port(), false, std::chrono::seconds(30));
///   client.set("k", "v");  server.get("k", std::chrono::seconds(1));   // "v"
///
/// The server listens on exactly the address it is given (IPv4 or IPv6; "0.0.0.0" or "::" only
/// when asked), on its own thread with one io_context and one coroutine per connection. The
/// server object is also a client of itself, over loopback. Waiting (get, wait) is done by the
/// server: it parks the request until the keys are set or the request's timeout passes, so
/// clients never poll. Every connection opens with the chorus handshake (kind store; with a job
/// token, the HMAC challenge-response). A connection that fails the handshake, sends a malformed
/// or oversized frame, stalls mid-frame, or leaves while its get/wait is parked is dropped and
/// logged; the others are unaffected.
///
/// Requests (client -> server), integers little-endian:
///   header 21 bytes: op (u8: 1 set, 2 get, 3 wait, 4 add, 5 check), nkeys (u32),
///                    arg (u64: timeout in ms for get/wait, delta as i64 for add, else 0),
///                    vlen (u64: value bytes, set only)
///   then nkeys times: klen (u32), key bytes; then vlen value bytes.
///   Limits: key <= 4 KiB, value <= 64 MiB, nkeys 1 (set, get, add) or <= 65536 (wait, check).
/// Responses (server -> client): status (u8: 0 ok, 1 timeout, 2 bad request), len (u64), payload:
///   get: the value; add: the new value (i64); check: 1 byte (0/1); errors: a message.
///
/// A client that loses its connection (server gone) fails that call and every later one with
/// peer_failure at once; it does not reconnect. Both ends' sockets get keepalive and a user
/// timeout (detail/keepalive.hpp), so a host that vanishes fails the other end's calls within
/// seconds; set_within and check_within bound a call more tightly than the store's timeout.

#include <algorithm>
#include <array>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "chorus/bootstrap/handshake.hpp"
#include "chorus/bootstrap/store.hpp"
#include "chorus/core/error.hpp"
#include "chorus/detail/asio.hpp"
#include "chorus/detail/keepalive.hpp"
#include "chorus/detail/log.hpp"

namespace chorus {
namespace detail {

inline constexpr std::size_t kStoreMaxKeyBytes = 4096;
inline constexpr std::size_t kStoreMaxValueBytes = std::size_t(64) << 20;
inline constexpr std::size_t kStoreMaxKeys = std::size_t(1) << 16;
inline constexpr std::size_t kStoreRequestHeader = 21;
inline constexpr std::size_t kStoreResponseHeader = 9;
inline constexpr std::uint64_t kStoreMaxWaitMs = std::uint64_t(30) * 24 * 3600 * 1000;

enum class StoreOp : std::uint8_t { set = 1, get = 2, wait = 3, add = 4, check = 5 };
enum class StoreStatus : std::uint8_t { ok = 0, timeout = 1, bad_request = 2 };

inline const char* store_op_name(StoreOp op) {
  switch (op) {
    case StoreOp::set: return "set";
    case StoreOp::get: return "get";
    case StoreOp::wait: return "wait";
    case StoreOp::add: return "add";
    case StoreOp::check: return "check";
  }
  return "?";
}

/// Keys joined for messages: "a, b, c" (at most 10 named).
inline std::string join_keys(const std::vector<std::string>& keys) {
  std::string s;
  std::size_t n = 0;
  for (const auto& k : keys) {
    if (n == 10) return s + ", ... (" + std::to_string(keys.size()) + " keys)";
    if (n++) s += ", ";
    s += "'" + k + "'";
  }
  return s;
}

inline void check_store_key(const std::string& key, const ErrorContext& ctx) {
  if (key.size() > kStoreMaxKeyBytes)
    throw Error(ErrorCode::invalid_argument, ctx,
                "key of " + std::to_string(key.size()) + " bytes; the limit is " + std::to_string(kStoreMaxKeyBytes));
}

inline std::vector<std::uint8_t> encode_store_request(StoreOp op, const std::vector<std::string>& keys, std::uint64_t arg,
                                                      const std::string& value) {
  std::size_t total = kStoreRequestHeader + value.size();
  for (const auto& k : keys) total += 4 + k.size();
  std::vector<std::uint8_t> b(total);
  b[0] = static_cast<std::uint8_t>(op);
  put_u32(b.data() + 1, static_cast<std::uint32_t>(keys.size()));
  put_u64(b.data() + 5, arg);
  put_u64(b.data() + 13, value.size());
  std::size_t off = kStoreRequestHeader;
  for (const auto& k : keys) {
    put_u32(b.data() + off, static_cast<std::uint32_t>(k.size()));
    std::memcpy(b.data() + off + 4, k.data(), k.size());
    off += 4 + k.size();
  }
  if (!value.empty()) std::memcpy(b.data() + off, value.data(), value.size());
  return b;
}

// ---- Decoding what the network sends. Everything below checks every field before using it and
// reports a malformed frame as a chorus::Error (the connection is then dropped: after a bad length
// the stream cannot be resynchronised). The server and the client read frames piece by piece
// from their sockets with these functions; decode_store_request reads a whole frame from memory
// with the same ones (for tests and fuzz/fuzz_store_request.cpp).

/// The fixed part of a request: what follows it is nkeys times (klen, key), then vlen value bytes.
struct StoreRequestHeader {
  StoreOp op{};
  std::uint32_t nkeys = 0;
  std::uint64_t arg = 0;
  std::uint64_t vlen = 0;
};

/// A whole request, as the server executes it.
struct StoreRequest {
  StoreOp op{};
  std::uint64_t arg = 0;
  std::vector<std::string> keys;
  std::string value;
  friend bool operator==(const StoreRequest&, const StoreRequest&) = default;
};

/// Checks a request header from a client: a known op, the key count and value length it allows.
inline StoreRequestHeader decode_store_request_header(std::span<const std::uint8_t, kStoreRequestHeader> b) {
  const std::uint8_t op = b[0];
  if (op < 1 || op > 5) throw Error(ErrorCode::invalid_argument, "unknown request type " + std::to_string(op));
  StoreRequestHeader h;
  h.op = static_cast<StoreOp>(op);
  h.nkeys = get_u32(b.data() + 1);
  h.arg = get_u64(b.data() + 5);
  h.vlen = get_u64(b.data() + 13);
  const bool multi = h.op == StoreOp::wait || h.op == StoreOp::check;
  if (multi ? h.nkeys > kStoreMaxKeys : h.nkeys != 1)
    throw Error(ErrorCode::invalid_argument,
                "bad key count " + std::to_string(h.nkeys) + " for " + store_op_name(h.op));
  if (h.vlen > kStoreMaxValueBytes || (h.op != StoreOp::set && h.vlen != 0))
    throw Error(ErrorCode::invalid_argument, "bad value length " + std::to_string(h.vlen));
  return h;
}

/// Checks the length that precedes each key of a request.
inline std::uint32_t decode_store_key_length(std::span<const std::uint8_t, 4> b) {
  const std::uint32_t klen = get_u32(b.data());
  if (klen > kStoreMaxKeyBytes)
    throw Error(ErrorCode::invalid_argument, "key length " + std::to_string(klen) + " over the limit");
  return klen;
}

/// A whole request frame in memory; throws when it is malformed, cut short or followed by more.
inline StoreRequest decode_store_request(std::span<const std::uint8_t> frame) {
  std::size_t off = 0;
  auto take = [&](std::size_t n) {
    if (frame.size() - off < n) throw Error(ErrorCode::invalid_argument, "request cut short");
    const auto piece = frame.subspan(off, n);
    off += n;
    return piece;
  };
  const auto h = decode_store_request_header(take(kStoreRequestHeader).first<kStoreRequestHeader>());
  StoreRequest req{h.op, h.arg, {}, {}};
  for (std::uint32_t i = 0; i < h.nkeys; ++i) {
    const auto key = take(decode_store_key_length(take(4).first<4>()));
    req.keys.emplace_back(key.begin(), key.end());
  }
  const auto value = take(h.vlen);
  req.value.assign(value.begin(), value.end());
  if (off != frame.size()) throw Error(ErrorCode::invalid_argument, "bytes after the end of the request");
  return req;
}

/// A reply: status (u8), payload length (u64), payload.
inline std::vector<std::uint8_t> encode_store_response(StoreStatus status, const std::string& payload) {
  std::vector<std::uint8_t> out(kStoreResponseHeader + payload.size());
  out[0] = static_cast<std::uint8_t>(status);
  put_u64(out.data() + 1, payload.size());
  if (!payload.empty()) std::memcpy(out.data() + kStoreResponseHeader, payload.data(), payload.size());
  return out;
}

/// The fixed part of a reply.
struct StoreResponseHeader {
  StoreStatus status = StoreStatus::ok;
  std::uint64_t len = 0;  ///< payload bytes that follow
};

/// Checks a reply header from the server: a known status, a payload no longer than any reply.
inline StoreResponseHeader decode_store_response_header(std::span<const std::uint8_t, kStoreResponseHeader> b,
                                                        const ErrorContext& ctx) {
  if (b[0] > 2) throw Error(ErrorCode::peer_failure, ctx, "malformed response from the store");
  StoreResponseHeader h{static_cast<StoreStatus>(b[0]), get_u64(b.data() + 1)};
  if (h.len > kStoreMaxValueBytes + 65536) throw Error(ErrorCode::peer_failure, ctx, "oversized response from the store");
  return h;
}

/// The payload of an ok reply to add: the new value.
inline std::int64_t decode_store_add_reply(const std::string& payload, const ErrorContext& ctx) {
  if (payload.size() != 8) throw Error(ErrorCode::peer_failure, ctx, "malformed add response");
  return static_cast<std::int64_t>(get_u64(reinterpret_cast<const std::uint8_t*>(payload.data())));
}

/// The payload of an ok reply to check: whether every key is set.
inline bool decode_store_check_reply(const std::string& payload, const ErrorContext& ctx) {
  if (payload.size() != 1) throw Error(ErrorCode::peer_failure, ctx, "malformed check response");
  return payload[0] != 0;
}

/// Host text to endpoints: an IP literal (IPv6 with or without brackets) or a name to resolve.
inline std::vector<asio_tcp::endpoint> resolve_endpoints(std::string host, std::uint16_t port) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  if (host.empty()) throw Error(ErrorCode::invalid_argument, "empty host name");
  boost::system::error_code ec;
  auto addr = asio::ip::make_address(host, ec);
  if (!ec) return {asio_tcp::endpoint(addr, port)};
  asio::io_context io;
  asio_tcp::resolver resolver(io);
  auto results = resolver.resolve(host, std::to_string(port), asio_tcp::resolver::numeric_service, ec);
  if (ec || results.empty())
    throw Error(ErrorCode::invalid_argument, "cannot resolve host '" + host + "': " + (ec ? ec.message() : "no address"));
  std::vector<asio_tcp::endpoint> out;
  for (const auto& r : results) out.push_back(r.endpoint());
  return out;
}

inline std::string endpoint_string(const asio_tcp::endpoint& ep) {
  const std::string a = ep.address().to_string();
  return (ep.address().is_v6() ? "[" + a + "]" : a) + ":" + std::to_string(ep.port());
}

/// The server half: owns the data, the listening socket and the thread that runs its io_context.
/// Everything below the constructor runs on that one thread, so the data needs no lock.
class TcpStoreServer {
 public:
  TcpStoreServer(const std::string& host, std::uint16_t port, std::chrono::milliseconds timeout, std::string token)
      : timeout_(timeout), token_(std::move(token)) {
    const auto eps = resolve_endpoints(host, port);
    const ErrorContext ctx{-1, -1, "TcpStore server"};
    boost::system::error_code ec;
    const auto& ep = eps.front();
    acceptor_.open(ep.protocol(), ec);
    if (!ec) acceptor_.set_option(asio_tcp::acceptor::reuse_address(true), ec);
    if (!ec) acceptor_.bind(ep, ec);
    if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (!ec) local_ = acceptor_.local_endpoint(ec);
    if (ec) throw Error(ErrorCode::system, ctx, "cannot listen on " + endpoint_string(ep) + ": " + ec.message());
    asio::co_spawn(io_, accept_loop(), asio::detached);
    thread_ = std::thread([this] { run(); });
    log(LogLevel::info, -1, "TcpStore server listening on ", endpoint_string(local_));
  }

  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  /// Closes every connection (their clients get peer_failure), lets the coroutines unwind and
  /// joins the thread; anything still running after 2 s is abandoned with the io_context.
  ~TcpStoreServer() {
    asio::post(io_, [this] {
      stopping_ = true;
      boost::system::error_code ec;
      acceptor_.close(ec);
      for (auto* s : conns_) s->close(ec);
      for (auto& w : waiters_) w.second->cancel();
      if (active_ == 0) return;
      stop_timer_.expires_after(std::chrono::seconds(2));
      stop_timer_.async_wait([this](const boost::system::error_code& e) {
        if (e) return;
        log(LogLevel::warn, -1, "TcpStore server: ", active_, " connection(s) did not close in 2 s; abandoning them");
        io_.stop();
      });
    });
    if (thread_.joinable()) thread_.join();
    joined_ = true;
  }

  const asio_tcp::endpoint& local_endpoint() const { return local_; }

 private:
  using Clock = std::chrono::steady_clock;
  enum class WaitResult { ok, timeout, stopped, client_gone };

  struct ActiveGuard {
    explicit ActiveGuard(TcpStoreServer& s) : s_(s) { ++s_.active_; }
    ~ActiveGuard() {
      if (s_.joined_) return;  // frames destroyed with the io_context after a forced stop
      if (--s_.active_ == 0 && s_.stopping_) s_.stop_timer_.cancel();
    }
    TcpStoreServer& s_;
  };

  void run() {
    for (;;) {
      try {
        io_.run();
        return;
      } catch (const std::exception& e) {
        log(LogLevel::warn, -1, "TcpStore server: unexpected error: ", e.what());
      }
    }
  }

  asio::awaitable<void> accept_loop() {
    ActiveGuard active(*this);
    for (;;) {
      boost::system::error_code ec;
      asio_tcp::socket s = co_await acceptor_.async_accept(asio::redirect_error(asio::use_awaitable, ec));
      if (stopping_) co_return;
      if (ec) {
        if (ec == asio::error::operation_aborted) co_return;
        // EMFILE and friends: back off instead of spinning; the clients retry.
        log(LogLevel::warn, -1, "TcpStore server: accept failed: ", ec.message());
        asio::steady_timer t(io_, std::chrono::milliseconds(100));
        co_await t.async_wait(asio::redirect_error(asio::use_awaitable, ec));
        continue;
      }
      asio::co_spawn(io_, serve(std::move(s)), asio::detached);
    }
  }

  /// One connection: handshake, then request/response until the client leaves.
  asio::awaitable<void> serve(asio_tcp::socket s) {
    ActiveGuard active(*this);
    conns_.insert(&s);
    struct Unregister {
      std::set<asio_tcp::socket*>& set;
      asio_tcp::socket* s;
      ~Unregister() { set.erase(s); }
    } unregister{conns_, &s};
    const std::string from = endpoint_text(s);
    if (stopping_) co_return;
    boost::system::error_code ec;
    s.set_option(asio_tcp::no_delay(true), ec);
    tune_keepalive(s.native_handle(), tuning_);  // a client host that vanishes frees its slot

    // Handshake, bounded so that a silent client cannot hold a slot forever.
    const auto hs_limit = std::min<std::chrono::milliseconds>(timeout_, std::chrono::seconds(10));
    bool fired = false;
    std::string failure;
    {
      SocketWatchdog dog(s, hs_limit);
      try {
        co_await handshake_accept(s, kHandshakeStore, token_, nullptr);
      } catch (const std::exception& e) {
        failure = e.what();
      }
      fired = dog.fired();
    }
    if (fired) failure = "no handshake within " + std::to_string(hs_limit.count()) + " ms";
    if (!failure.empty()) {
      if (!stopping_) log(LogLevel::warn, -1, "TcpStore server: refused connection from ", from, ": ", failure);
      co_return;
    }

    try {
      while (co_await serve_one(s, from)) {
      }
    } catch (const std::exception& e) {
      if (!stopping_) log(LogLevel::warn, -1, "TcpStore server: dropped client ", from, ": ", e.what());
    }
  }

  /// Reads one request, executes it, replies. False when the connection is done with.
  asio::awaitable<bool> serve_one(asio_tcp::socket& s, const std::string& from) {
    std::array<std::uint8_t, kStoreRequestHeader> hdr{};
    boost::system::error_code ec;
    co_await asio::async_read(s, asio::buffer(hdr.data(), 1), asio::redirect_error(asio::use_awaitable, ec));
    if (ec) {  // between requests: a client leaving is normal
      if (!stopping_) log(LogLevel::info, -1, "TcpStore server: client ", from, " left (", ec.message(), ")");
      co_return false;
    }
    StoreRequest req;
    bool dog_fired = false;
    std::string bad;
    {
      SocketWatchdog dog(s, timeout_);  // the rest of the frame must follow promptly
      try {
        co_await read_request(s, hdr, req);
      } catch (const std::exception& e) {
        bad = e.what();
      }
      dog_fired = dog.fired();
    }
    if (dog_fired) bad = "incomplete request after " + std::to_string(timeout_.count()) + " ms";
    if (!bad.empty()) {
      if (!stopping_) log(LogLevel::warn, -1, "TcpStore server: dropped client ", from, ": ", bad);
      co_return false;
    }
    Response resp;
    if (!co_await handle(s, req, resp)) co_return false;  // stopping, or the client left
    const std::vector<std::uint8_t> out = encode_store_response(resp.status, resp.payload);
    {
      SocketWatchdog dog(s, timeout_);  // a client that stops reading cannot pin us
      co_await asio::async_write(s, asio::buffer(out), asio::redirect_error(asio::use_awaitable, ec));
    }
    if (ec) {
      if (!stopping_) log(LogLevel::warn, -1, "TcpStore server: dropped client ", from, ": reply: ", ec.message());
      co_return false;
    }
    co_return true;
  }

  struct Response {
    StoreStatus status = StoreStatus::ok;
    std::string payload;
  };

  /// Reads the rest of a request whose first byte is in hdr[0]; throws what is wrong with it.
  asio::awaitable<void> read_request(asio_tcp::socket& s, std::array<std::uint8_t, kStoreRequestHeader>& hdr,
                                     StoreRequest& req) {
    const ErrorContext ctx{-1, -1, "TcpStore server"};
    co_await read_exact(s, std::span(hdr.data() + 1, kStoreRequestHeader - 1), ctx, "reading request");
    const StoreRequestHeader h = decode_store_request_header(hdr);
    req.op = h.op;
    req.arg = h.arg;
    req.keys.resize(h.nkeys);
    for (auto& k : req.keys) {
      std::array<std::uint8_t, 4> kl{};
      co_await read_exact(s, kl, ctx, "reading request");
      const std::uint32_t klen = decode_store_key_length(kl);
      k.resize(klen);
      if (klen)
        co_await read_exact(s, std::span(reinterpret_cast<std::uint8_t*>(k.data()), klen), ctx, "reading request");
    }
    req.value.resize(h.vlen);
    if (h.vlen)
      co_await read_exact(s, std::span(reinterpret_cast<std::uint8_t*>(req.value.data()), h.vlen), ctx,
                          "reading request");
  }

  /// Executes a request; false when there is no one to reply to (stopping, or the client left).
  asio::awaitable<bool> handle(asio_tcp::socket& s, const StoreRequest& req, Response& resp) {
    switch (req.op) {
      case StoreOp::set:
        data_[req.keys[0]] = req.value;
        notify(req.keys[0]);
        break;
      case StoreOp::get:
      case StoreOp::wait: {
        const auto ms = std::min(req.arg, kStoreMaxWaitMs);
        const auto deadline = Clock::now() + std::chrono::milliseconds(ms);
        const auto r = co_await wait_keys(s, req.keys, deadline);
        if (r == WaitResult::stopped) co_return false;
        if (r == WaitResult::client_gone) {
          log(LogLevel::info, -1, "TcpStore server: client ", endpoint_text(s), " left during ", store_op_name(req.op));
          co_return false;
        }
        if (r == WaitResult::timeout) {
          std::vector<std::string> missing;
          for (const auto& k : req.keys)
            if (!data_.count(k)) missing.push_back(k);
          resp.status = StoreStatus::timeout;
          resp.payload = (missing.size() == 1 ? "key " : "keys ") + join_keys(missing) + " not set within " +
                         std::to_string(ms) + " ms";
        } else if (req.op == StoreOp::get) {
          resp.payload = data_[req.keys[0]];
        }
        break;
      }
      case StoreOp::add: {
        std::int64_t v = 0;
        const auto& k = req.keys[0];
        auto it = data_.find(k);
        if (it != data_.end()) {
          const auto& t = it->second;
          auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
          if (ec != std::errc() || p != t.data() + t.size()) {
            resp.status = StoreStatus::bad_request;
            resp.payload = "add: the value of '" + k + "' is not an integer";
            break;
          }
        }
        std::int64_t r = 0;
        if (__builtin_add_overflow(v, static_cast<std::int64_t>(req.arg), &r)) {
          resp.status = StoreStatus::bad_request;
          resp.payload = "add: '" + k + "' would overflow";
          break;
        }
        data_[k] = std::to_string(r);
        notify(k);
        resp.payload.resize(8);
        put_u64(reinterpret_cast<std::uint8_t*>(resp.payload.data()), static_cast<std::uint64_t>(r));
        break;
      }
      case StoreOp::check: {
        bool all = true;
        for (const auto& k : req.keys) all = all && data_.count(k) != 0;
        resp.payload.assign(1, all ? '\1' : '\0');
        break;
      }
    }
    co_return true;
  }

  /// Parks until every key is set (woken by notify), the deadline passes, the server stops, or
  /// the client leaves. A client sends nothing while it waits for a reply, so the socket turning
  /// readable means it closed (or broke the protocol): the request is dropped at once instead of
  /// holding its coroutine until the deadline.
  asio::awaitable<WaitResult> wait_keys(asio_tcp::socket& s, const std::vector<std::string>& keys,
                                        Clock::time_point deadline) {
    asio::steady_timer timer(io_, deadline);
    struct Watch {
      asio::steady_timer* timer = nullptr;  ///< null once wait_keys has returned
      bool readable = false;
    };
    auto watch = std::make_shared<Watch>();
    watch->timer = &timer;
    bool watching = false;
    struct StopWatching {
      asio_tcp::socket& s;
      std::shared_ptr<Watch> w;
      bool& watching;
      ~StopWatching() {
        w->timer = nullptr;
        if (watching) {
          boost::system::error_code ec;
          s.cancel(ec);  // completes the pending wait with operation_aborted
        }
      }
    } stop_watching{s, watch, watching};
    for (;;) {
      if (stopping_) co_return WaitResult::stopped;
      std::vector<const std::string*> missing;
      for (const auto& k : keys)
        if (!data_.count(k)) missing.push_back(&k);
      if (missing.empty()) co_return WaitResult::ok;
      if (watch->readable) co_return WaitResult::client_gone;
      if (Clock::now() >= deadline) co_return WaitResult::timeout;
      if (!watching) {
        watching = true;
        s.async_wait(asio_tcp::socket::wait_read, [w = watch, &watching](const boost::system::error_code& ec) {
          if (!w->timer) return;  // wait_keys is over: `watching` is gone too
          watching = false;
          if (ec == asio::error::operation_aborted) return;
          w->readable = true;
          w->timer->cancel();
        });
      }
      struct Registration {
        std::multimap<std::string, asio::steady_timer*>& map;
        std::vector<std::multimap<std::string, asio::steady_timer*>::iterator> its;
        ~Registration() {
          for (auto it : its) map.erase(it);
        }
      } reg{waiters_, {}};
      for (const auto* k : missing) reg.its.push_back(waiters_.emplace(*k, &timer));
      boost::system::error_code ec;
      co_await timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));  // cancelled = woken
    }
  }

  void notify(const std::string& key) {
    auto [b, e] = waiters_.equal_range(key);
    for (auto it = b; it != e; ++it) it->second->cancel();
  }

  // Declared before io_ so they outlive coroutine frames that a forced stop leaves to ~io_context.
  std::chrono::milliseconds timeout_;
  std::string token_;
  SocketTuning tuning_ = SocketTuning::from_env();
  std::map<std::string, std::string> data_;
  std::multimap<std::string, asio::steady_timer*> waiters_;
  std::set<asio_tcp::socket*> conns_;
  bool stopping_ = false;
  bool joined_ = false;
  int active_ = 0;
  asio::io_context io_;
  asio_tcp::acceptor acceptor_{io_};
  asio::steady_timer stop_timer_{io_};
  asio_tcp::endpoint local_;
  std::thread thread_;
};

/// The client half: one connection, one io_context driven by the calling thread under a mutex.
class TcpStoreClient {
 public:
  using Clock = std::chrono::steady_clock;

  TcpStoreClient(std::string host, std::uint16_t port, std::chrono::milliseconds timeout, std::string token)
      : host_(std::move(host)), port_(port), timeout_(timeout), token_(std::move(token)) {
    connect();
  }

  /// set and check take an optional bound of their own (`limit`; default: the store's timeout).
  void set(const std::string& key, const std::string& value) { set(key, value, timeout_); }
  void set(const std::string& key, const std::string& value, std::chrono::milliseconds limit) {
    const ErrorContext ctx = context("set", key);
    check_store_key(key, ctx);
    if (value.size() > kStoreMaxValueBytes)
      throw Error(ErrorCode::invalid_argument, ctx,
                  "value of " + std::to_string(value.size()) + " bytes; the limit is 64 MiB");
    expect_ok(request(encode_store_request(StoreOp::set, {key}, 0, value), Clock::now() + limit, ctx), ctx);
  }

  std::string get(const std::string& key, std::chrono::milliseconds timeout) {
    const ErrorContext ctx = context("get", key);
    check_store_key(key, ctx);
    const auto ms = clamp_ms(timeout);
    auto r = request(encode_store_request(StoreOp::get, {key}, ms, {}), wait_deadline(ms), ctx);
    expect_ok(r, ctx);
    return std::move(r.payload);
  }

  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
    const ErrorContext ctx = context("wait", keys.size() == 1 ? keys.front() : std::string());
    check_keys(keys, ctx);
    const auto ms = clamp_ms(timeout);
    expect_ok(request(encode_store_request(StoreOp::wait, keys, ms, {}), wait_deadline(ms), ctx), ctx);
  }

  std::int64_t add(const std::string& key, std::int64_t delta) {
    const ErrorContext ctx = context("add", key);
    check_store_key(key, ctx);
    auto r = request(encode_store_request(StoreOp::add, {key}, static_cast<std::uint64_t>(delta), {}),
                     Clock::now() + timeout_, ctx);
    expect_ok(r, ctx);
    return decode_store_add_reply(r.payload, ctx);
  }

  bool check(const std::vector<std::string>& keys) { return check(keys, timeout_); }
  bool check(const std::vector<std::string>& keys, std::chrono::milliseconds limit) {
    const ErrorContext ctx = context("check", keys.size() == 1 ? keys.front() : std::string());
    check_keys(keys, ctx);
    auto r = request(encode_store_request(StoreOp::check, keys, 0, {}), Clock::now() + limit, ctx);
    expect_ok(r, ctx);
    return decode_store_check_reply(r.payload, ctx);
  }

 private:
  struct Response {
    StoreStatus status = StoreStatus::ok;
    std::string payload;
  };

  std::string where() const {
    const bool v6 = host_.find(':') != std::string::npos && host_.front() != '[';
    return (v6 ? "[" + host_ + "]" : host_) + ":" + std::to_string(port_);
  }
  ErrorContext context(const char* op, const std::string& key) const {
    std::string s = std::string("TcpStore ") + op;
    if (!key.empty()) s += " '" + key + "'";
    return ErrorContext{-1, -1, s + " at " + where()};
  }
  static void check_keys(const std::vector<std::string>& keys, const ErrorContext& ctx) {
    if (keys.size() > kStoreMaxKeys) throw Error(ErrorCode::invalid_argument, ctx, "too many keys in one call");
    for (const auto& k : keys) check_store_key(k, ctx);
  }
  static std::uint64_t clamp_ms(std::chrono::milliseconds t) {
    const auto c = t.count();
    return c <= 0 ? 0 : std::min(static_cast<std::uint64_t>(c), kStoreMaxWaitMs);
  }
  /// The server answers a parked request by its timeout; allow a little more for the reply.
  static Clock::time_point wait_deadline(std::uint64_t ms) {
    return Clock::now() + std::chrono::milliseconds(ms) + std::chrono::seconds(2);
  }
  static void expect_ok(const Response& r, const ErrorContext& ctx) {
    if (r.status == StoreStatus::ok) return;
    if (r.status == StoreStatus::timeout) throw Error(ErrorCode::timeout, ctx, r.payload);
    throw Error(ErrorCode::invalid_argument, ctx, r.payload);
  }

  Response request(const std::vector<std::uint8_t>& frame, Clock::time_point deadline, const ErrorContext& ctx) {
    std::lock_guard lk(mu_);
    if (!broken_.empty())
      throw Error(ErrorCode::peer_failure, ctx, "the connection to the store was lost earlier: " + broken_);
    try {
      const auto allowed = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      return run_with_deadline(
          io_, exchange(frame, ctx), deadline, [this] { close(); }, ctx,
          "store request, allowed " + std::to_string(allowed.count()) + " ms");
    } catch (const std::exception& e) {  // the stream is mid-frame: unusable from here on
      broken_ = e.what();
      close();
      throw;
    }
  }

  asio::awaitable<Response> exchange(const std::vector<std::uint8_t>& frame, const ErrorContext& ctx) {
    co_await write_all(socket_, frame, ctx, "sending the request (store server gone?)");
    std::array<std::uint8_t, kStoreResponseHeader> hdr{};
    co_await read_exact(socket_, hdr, ctx, "reading the response (store server gone?)");
    const StoreResponseHeader h = decode_store_response_header(hdr, ctx);
    Response r;
    r.status = h.status;
    r.payload.resize(h.len);
    if (h.len)
      co_await read_exact(socket_, std::span(reinterpret_cast<std::uint8_t*>(r.payload.data()), h.len), ctx,
                          "reading the response (store server gone?)");
    co_return r;
  }

  void close() {
    boost::system::error_code ec;
    socket_.close(ec);
  }

  asio::awaitable<void> connect_once(asio_tcp::endpoint ep) {
    const ErrorContext ctx{-1, -1, "TcpStore connect to " + endpoint_string(ep)};
    boost::system::error_code ec;
    co_await socket_.async_connect(ep, asio::redirect_error(asio::use_awaitable, ec));
    if (ec) throw Error(ErrorCode::peer_failure, ctx, ec.message());
    socket_.set_option(asio_tcp::no_delay(true), ec);
    tune_keepalive(socket_.native_handle(), tuning_);  // a store host that vanishes fails the calls
    Hello hello;
    hello.kind = kHandshakeStore;
    co_await handshake_connect(socket_, hello, token_);
  }

  /// Retries with backoff until the timeout: the server may start after its clients.
  void connect() {
    const ErrorContext ctx{-1, -1, "TcpStore connect to " + where()};
    const auto deadline = Clock::now() + timeout_;
    auto backoff = std::chrono::milliseconds(10);
    std::string last = "no attempt";
    for (;;) {
      try {
        for (const auto& ep : resolve_endpoints(host_, port_)) {
          try {
            close();
            socket_ = asio_tcp::socket(io_);
            run_with_deadline(
                io_, connect_once(ep), deadline, [this] { close(); }, ctx, "connecting");
            return;
          } catch (const HandshakeRefused&) {
            close();
            throw;
          } catch (const Error& e) {
            close();
            last = e.what();
            if (e.code() == ErrorCode::timeout) break;
          }
        }
      } catch (const HandshakeRefused&) {
        throw;
      } catch (const Error& e) {
        last = e.what();
      }
      const auto now = Clock::now();
      if (now >= deadline) break;
      std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - now));
      backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
    }
    throw Error(ErrorCode::timeout, ctx,
                "no store server reachable within " + std::to_string(timeout_.count()) +
                    " ms (is rank 0 running, and MASTER_ADDR/MASTER_PORT right?); last error: " + last);
  }

  std::string host_;
  std::uint16_t port_;
  std::chrono::milliseconds timeout_;
  std::string token_;
  SocketTuning tuning_ = SocketTuning::from_env();
  std::mutex mu_;
  std::string broken_;  ///< why the connection is unusable; empty while it is fine
  asio::io_context io_{1};
  asio_tcp::socket socket_{io_};
};

}  // namespace detail

/// A Store served by one process over TCP. See the top of this header for the protocol.
class TcpStore final : public Store {
 public:
  /// is_server: bind host:port (port 0: an ephemeral port, see port()) and serve; also connect
  /// to it as a client. Otherwise connect to host:port, retrying with backoff until `timeout`.
  /// `timeout` also bounds each call (get and wait take their own). `token`: the job token for
  /// the handshake (empty: none); client and server must agree.
  TcpStore(std::string host, std::uint16_t port, bool is_server, std::chrono::milliseconds timeout,
           std::string token = {})
      : host_(std::move(host)), port_(port) {
    if (is_server) {
      server_ = std::make_unique<detail::TcpStoreServer>(host_, port, timeout, token);
      auto ep = server_->local_endpoint();
      port_ = ep.port();
      auto addr = ep.address();
      if (addr.is_unspecified())
        addr = addr.is_v6() ? detail::asio::ip::address(detail::asio::ip::address_v6::loopback())
                             : detail::asio::ip::address(detail::asio::ip::address_v4::loopback());
      client_ = std::make_unique<detail::TcpStoreClient>(addr.to_string(), port_, timeout, token);
    } else {
      client_ = std::make_unique<detail::TcpStoreClient>(host_, port_, timeout, token);
    }
  }

  ~TcpStore() override {
    client_.reset();  // our own connection first, then the server
    server_.reset();
  }

  /// The port: the bound one for a server (useful with port 0), else the one connected to.
  std::uint16_t port() const { return port_; }
  const std::string& host() const { return host_; }
  bool is_server() const { return server_ != nullptr; }

  void set(const std::string& key, const std::string& value) override { client_->set(key, value); }
  std::string get(const std::string& key, Duration timeout) override { return client_->get(key, timeout); }
  void wait(const std::vector<std::string>& keys, Duration timeout) override { client_->wait(keys, timeout); }
  std::int64_t add(const std::string& key, std::int64_t delta) override { return client_->add(key, delta); }
  bool check(const std::vector<std::string>& keys) override { return client_->check(keys); }
  void set_within(const std::string& key, const std::string& value, Duration limit) override {
    client_->set(key, value, limit);
  }
  bool check_within(const std::vector<std::string>& keys, Duration limit) override {
    return client_->check(keys, limit);
  }

 private:
  std::string host_;
  std::uint16_t port_;
  std::unique_ptr<detail::TcpStoreServer> server_;
  std::unique_ptr<detail::TcpStoreClient> client_;
};

}  // namespace chorus
