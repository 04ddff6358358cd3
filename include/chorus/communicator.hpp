#pragma once
/// Communicator<Transport>: a group of ranks and the public API on it.
///
///   auto comm = chorus::Communicator<chorus::tcp::Transport>::create(chorus::Options::from_env());
///   std::vector<float> v(1024);
///   if (comm.rank() == 0) comm.send(v, /*peer=*/1, /*tag=*/7);
///   else if (comm.rank() == 1) comm.recv(v, 0, 7);
///   comm.barrier();
///
/// Messages between two ranks arrive in order per (peer, tag); receives may be posted for tags
/// in any order. A receive must be posted with exactly the size that was sent (else mismatch).
/// Every blocking call and every Request::wait() is bounded by Options::timeout; a timeout
/// aborts the communicator (like NCCL's watchdog) so no buffer is written after the call threw.
/// A dead peer or broken link fails every pending and later operation with that peer with
/// peer_failure, promptly. Destruction never hangs: pending operations fail with peer_failure.

#include <cstdint>
#include <memory>
#include <ranges>
#include <span>
#include <type_traits>

#include "chorus/core/buffer.hpp"
#include "chorus/core/concepts.hpp"
#include "chorus/core/error.hpp"
#include "chorus/core/request.hpp"
#include "chorus/options.hpp"

namespace chorus {

/// A contiguous range of trivially copyable elements: std::vector, std::array, std::span, ...
template <class R>
concept ByteRange = std::ranges::contiguous_range<R> && std::ranges::sized_range<R> &&
                    std::is_trivially_copyable_v<std::ranges::range_value_t<R>>;

template <class R>
concept WritableByteRange = ByteRange<R> && !std::is_const_v<std::remove_reference_t<std::ranges::range_reference_t<R>>>;

template <Transport T>
class Communicator {
 public:
  using transport_type = T;

  /// Rendezvous through the store named by the options (or the environment) and open links.
  static Communicator create(Options options);

  Communicator(Communicator&&) noexcept = default;
  Communicator& operator=(Communicator&&) noexcept = default;
  ~Communicator();

  int rank() const;
  int size() const;
  const Options& options() const;

  /// Point-to-point. tag must be in [0, 2^31). Blocking forms wait for completion.
  template <ByteRange R>
  void send(const R& data, int peer, int tag = 0) { isend(data, peer, tag).wait(); }
  template <WritableByteRange R>
  void recv(R&& data, int peer, int tag = 0) { irecv(std::forward<R>(data), peer, tag).wait(); }
  template <ByteRange R>
  Request isend(const R& data, int peer, int tag = 0) {
    return isend_bytes(ConstBytes{reinterpret_cast<const std::byte*>(std::ranges::data(data)),
                                  std::ranges::size(data) * sizeof(std::ranges::range_value_t<R>)},
                       peer, tag);
  }
  template <WritableByteRange R>
  Request irecv(R&& data, int peer, int tag = 0) {
    return irecv_bytes(MutableBytes{reinterpret_cast<std::byte*>(std::ranges::data(data)),
                                    std::ranges::size(data) * sizeof(std::ranges::range_value_t<R>)},
                       peer, tag);
  }
  Request isend_bytes(ConstBytes data, int peer, int tag);
  Request irecv_bytes(MutableBytes data, int peer, int tag);

  /// Returns when every rank has entered the barrier.
  void barrier();

  /// Fails every pending and later operation of this communicator, here and (through the links
  /// breaking) on every peer, with peer_failure. Idempotent; never blocks for long.
  void abort();

  /// The transport (links to every peer), for algorithms.
  T& transport();

 private:
  struct State;
  explicit Communicator(std::unique_ptr<State> s);
  std::unique_ptr<State> s_;
};

}  // namespace chorus

#include "chorus/impl/communicator.hpp"
