#pragma once
/// The shell that the transports share around their links: the request a link operation returns,
/// the checks of link(peer) and the abort that fails every link (the engine-driven tcp and shm use
/// all three; inproc, whose requests have no engine and whose abort breaks its in-process world,
/// uses the peer check), and the completions a link gathers under its lock and runs after it. A new
/// transport folder uses these rather than writing them again.

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include <boost/container/small_vector.hpp>

#include "chorus/core/error.hpp"
#include "chorus/core/request.hpp"
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

/// memory_bytes() of a transport `self` whose links sit in `links`: itself and what each link holds.
template <class T, class L>
std::size_t links_memory_bytes(const T& self, const std::vector<std::unique_ptr<L>>& links) {
  std::size_t b = sizeof(self);
  for (const auto& l : links)
    if (l) b += l->memory_bytes();
  return b;
}

/// The bounds check of link(peer) for a transport that has a link to every rank, itself included
/// (inproc): invalid_argument naming `op`.
inline void check_peer(int rank, int size, int peer, const char* op) {
  if (peer < 0 || peer >= size)
    throw Error(ErrorCode::invalid_argument, ErrorContext{rank, peer, op},
                "peer " + std::to_string(peer) + " is not a rank of this transport (size " + std::to_string(size) + ")");
}

/// abort(why) of an engine-driven transport: fails every link with why's code. A mismatch is told
/// to every rank by the communicator itself, so for it the connections stay open; any other abort
/// closes them (peers see EOF).
template <class Engine>
void abort_links(Engine& engine, const Error& why) {
  engine.fail_all(why.code(), std::string("aborted: ") + why.what(), why.code() != ErrorCode::mismatch);
}

}  // namespace chorus::detail
