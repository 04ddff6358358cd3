// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// The shell that the transports share around their links: the request a link operation returns,
/// the checks of link(peer), the completions a link gathers under its lock and runs after it, and
/// EngineTransport, the whole Transport block of the engine-driven transports (tcp, shm, rdma: the
/// link table, link(peer), memory_bytes(), abort(), the progress thread and the stop). inproc,
/// whose requests have no engine and whose abort breaks its in-process world, uses the peer check;
/// cuda_ipc the link check. A new transport folder uses these rather than writing them again.

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <boost/container/small_vector.hpp>

#include "chorus/core/error.hpp"
#include "chorus/core/request.hpp"
#include "chorus/detail/log.hpp"
#include "chorus/transport/matching.hpp"

namespace chorus::detail {

/// Completions gathered under the lock and run after it is released.
/// The first kInline completions of a pass live in the object itself (constructed only when
/// added), so a pass that completes a few requests allocates nothing and one that completes none
/// costs next to nothing.
class Completions {
 public:
  void complete(std::shared_ptr<RequestState> r, std::size_t bytes) { items_.push_back({std::move(r), true, bytes, {}, {}}); }
  void fail(std::shared_ptr<RequestState> r, ErrorCode code, std::string why) {
    items_.push_back({std::move(r), false, 0, code, std::move(why)});
  }
  void run() {
    for (Item& i : items_) finish(i);
    items_.clear();
  }
  ~Completions() { run(); }

 private:
  struct Item {
    std::shared_ptr<RequestState> req;
    bool ok = false;
    std::size_t bytes = 0;
    ErrorCode code = ErrorCode::system;
    std::string why;
  };
  static constexpr std::size_t kInline = 8;

  static void finish(Item& i) {
    std::shared_ptr<RequestState> r = std::move(i.req);
    if (i.ok)
      r->complete(i.bytes);
    else
      r->fail(i.code, i.why);
  }

  boost::container::small_vector<Item, kInline> items_;
};

/// The request of one link operation ("send" or "recv"), from the link's pooled factory: it names
/// the rank, peer, tag, bytes, timeout and the engine that drives it.
inline std::shared_ptr<RequestState> make_link_request(RequestFactory& f, const char* verb, std::uint64_t tag,
                                                       std::size_t bytes) {
  return f.make(verb, tag, bytes, &describe_op);
}

/// link(peer) of a transport of `size` ranks whose links sit by peer in `links` (null where it has
/// none):
/// invalid_argument with `op` and the transport's own texts otherwise.
template <class L>
L& checked_link(const std::vector<std::unique_ptr<L>>& links, int rank, int size, int peer, const char* op,
                const char* self_text, const char* none_text) {
  if (peer < 0 || peer >= size || peer == rank || !links[static_cast<std::size_t>(peer)])
    throw Error(ErrorCode::invalid_argument, ErrorContext{rank, peer, op}, peer == rank ? self_text : none_text);
  return *links[static_cast<std::size_t>(peer)];
}

/// The bounds check of link(peer) for a transport that has a link to every rank, itself included
/// (inproc): invalid_argument naming `op`.
inline void check_peer(int rank, int size, int peer, const char* op) {
  if (peer < 0 || peer >= size)
    throw Error(ErrorCode::invalid_argument, ErrorContext{rank, peer, op},
                "peer " + std::to_string(peer) + " is not a rank of this transport (size " + std::to_string(size) + ")");
}

/// The Transport block of an engine-driven transport, written once for tcp, shm and rdma: the
/// rank and size, link(peer) over the engine's link table, memory_bytes(), abort(), the progress
/// thread, and the stop when the transport goes. A backend derives from it (CRTP: its kName names
/// the errors and the log lines, its size counts in memory_bytes()), fills the engine's links in
/// its constructor, connects them, and calls start_progress_thread() last.
///
/// `Engine` derives from DrivenEngine<Engine> (transport/progress.hpp) and has:
///   std::vector<std::unique_ptr<Link>> links;   by peer; null where there is no link
///   std::thread thread;                         the progress thread (started here)
///   void fail_all(ErrorCode, std::string why, bool close);   fails every link, from any thread;
///                                               close: peers hear of it (EOF, an abort word)
///   void run();                                 the progress thread's loop, until `stop`
///   static constexpr bool kRunAgainAfterError;  whether the thread runs run() again after it
///                                               threw (tcp: a handler's exception leaves the
///                                               io_context usable), else every link fails
///   void on_stop();                             optional: what must go before `stop` is set
///                                               (tcp: the work guard); DrivenEngine's does nothing
template <class Derived, class Engine, class Link>
class EngineTransport {
 public:
  EngineTransport(const EngineTransport&) = delete;
  EngineTransport& operator=(const EngineTransport&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }

  /// The link to `peer`; invalid_argument naming "<kind> link" for this rank itself, a rank out of
  /// range, or one this transport has no link to.
  Link& link(int peer) {
    static const std::string op = std::string(Derived::kName) + " link";
    static const std::string none = "no " + std::string(Derived::kName) + " link to this peer";
    return checked_link(engine_->links, rank_, size_, peer, op.c_str(),
                        "no link to this rank itself (send to self is not supported)", none.c_str());
  }

  /// Bytes the transport holds: itself and what each link holds (Link::memory_bytes()).
  std::size_t memory_bytes() const {
    std::size_t b = sizeof(Derived);
    for (const auto& l : engine_->links)
      if (l) b += l->memory_bytes();
    return b;
  }

  /// Fails every link with why's code (peer_failure for a user abort, mismatch when a collective
  /// mismatch is being spread). A mismatch is told to every rank by the communicator itself, so
  /// for it the connections stay open (peers then get the mismatch, not a closed connection); any
  /// other abort closes them (peers see EOF, or their abort word).
  void abort(const Error& why) {
    engine_->fail_all(why.code(), std::string("aborted: ") + why.what(), why.code() != ErrorCode::mismatch);
  }

 protected:
  /// Checks the peer mask's size and CHORUS_MAX_BUFFERED_BYTES, and makes the engine with a slot
  /// for every rank's link.
  EngineTransport(int rank, int size, std::size_t mask_size)
      : rank_(rank), size_(size), engine_(std::make_shared<Engine>()) {
    if (mask_size != static_cast<std::size_t>(size_))
      throw Error(ErrorCode::invalid_argument, ErrorContext{rank_, -1, std::string(Derived::kName)},
                  "peer mask of the wrong size");
    (void)buffered_cap();  // a bad CHORUS_MAX_BUFFERED_BYTES fails here, not in a link
    engine_->links.resize(static_cast<std::size_t>(size_));
  }

  /// Fails every link ("the communicator was destroyed"; peers see it) and ends the progress
  /// thread: joined, or detached when the transport is destroyed on that very thread (a
  /// completion callback dropping the last owner), which shares the engine and ends once run()
  /// returns. A transport whose constructor threw never started one, and fails nothing.
  ~EngineTransport() {
    Engine& e = *engine_;
    if (!e.thread.joinable()) return;
    e.fail_all(ErrorCode::peer_failure, "the communicator was destroyed", true);
    e.on_stop();
    e.stop.store(true);
    e.wake_background();
    e.token.unpark();
    if (e.thread.get_id() == std::this_thread::get_id())
      e.thread.detach();
    else
      e.thread.join();
  }

  /// Starts the progress thread, once the links are connected (the last step of construction).
  void start_progress_thread() {
    engine_->thread = std::thread([eng = engine_, rank = rank_] {
      for (;;) {
        try {
          eng->run();
          return;
        } catch (const std::exception& e) {
          log(LogLevel::warn, LogSubsys::transport, rank, Derived::kName, " progress thread: ", e.what());
          if constexpr (!Engine::kRunAgainAfterError) {
            eng->fail_all(ErrorCode::system, std::string(Derived::kName) + " progress thread failed: " + e.what(), true);
            return;
          }
        }
      }
    });
  }

  int rank_;
  int size_;
  std::shared_ptr<Engine> engine_;
};

}  // namespace chorus::detail
