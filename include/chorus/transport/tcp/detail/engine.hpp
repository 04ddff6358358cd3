// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// tcp's engine: the io_context that every link's socket lives on, the links, and the progress
/// thread (transport/progress.hpp has the model; tcp/transport.hpp starts and stops it).

#include <sched.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "chorus/detail/asio.hpp"
#include "chorus/transport/progress.hpp"
#include "chorus/transport/tcp/detail/handler_memory.hpp"
#include "chorus/transport/tcp/link.hpp"

namespace chorus::tcp {
namespace detail {

/// What the progress thread, the timeout hooks and the waiting callers share; outlives neither
/// the thread nor the links. Requests hold it (weakly) as their Driver: the thread that waits for
/// one runs the io_context itself (transport/progress.hpp), one thread at a time (the token), so
/// the links' state is only ever touched by the one thread that runs the io_context.
struct Engine final : chorus::detail::DrivenEngine<Engine> {
  /// An exception out of a handler leaves the io_context usable: the thread runs on.
  static constexpr bool kRunAgainAfterError = true;

  asio::io_context io{1};
  std::vector<std::unique_ptr<Link>> links;  ///< by peer; null at this rank's own index
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work;
  std::thread thread;
  /// The set-up of links made on first use (CHORUS_CONNECT=lazy; detail/lazy_links.hpp): here, so
  /// that it outlives the handlers that the progress thread runs to the end; null when eager.
  std::unique_ptr<LazyLinks> lazy;

  /// Fails every link (from any thread; at once when called on the thread that runs the
  /// io_context, so that an error reported by a peer wins over the connection closes that follow
  /// it); peers see their connection close.
  void fail_all(ErrorCode code, std::string why, bool close = true) {
    asio::dispatch(io, [this, code, why = std::move(why), close] {
      for (auto& l : links)
        if (l) l->fail(code, why, close);
    });
  }

  /// The transport goes: the lazy links' listening socket and the connections being made close;
  /// without the work guard, the io_context's run() ends once what is left
  /// (the closes) has run.
  void on_stop() {
    if (lazy) asio::post(io, [l = lazy.get()] { l->shutdown(); });  // runs before what is left ends
    work.reset();
  }

  // ---- what DrivenEngine needs ----
  /// Runs the handlers that are ready (a non-blocking look at the sockets included).
  bool pass() { return io.poll() > 0; }
  template <class Ready>
  void spin_wait(const Ready&) const {
    for (int i = 0; i < 16; ++i) chorus::detail::cpu_relax();
    ::sched_yield();
  }
  /// The one wait that covers every link: Asio's reactor. (Only requests are waited for on tcp,
  /// and their completion is a handler that ends the wait.)
  template <class Ready>
  void sleep_until(Clock::time_point until, const Ready&) {
    io.run_one_until(until);
  }
  /// A handler for the background thread's reactor wait to return for.
  void wake_background() {
    asio::post(io, bind_memory(wake_memory, [] {}));
  }
  HandlerMemory wake_memory;  ///< for those handlers (no allocation when a caller takes over)

  // ---- the background thread ----
  void run() {
    run_background([&] { io.run_one_for(std::chrono::milliseconds(500)); });
    // Stopping: the work guard is gone and every link failed; run what is left (the closes) out.
    io.restart();
    io.run();
  }
};

}  // namespace detail

}  // namespace chorus::tcp
