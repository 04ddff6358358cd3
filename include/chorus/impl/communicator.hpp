#pragma once
// Bodies of Communicator<Transport>; included at the bottom of communicator.hpp.

#include <atomic>
#include <limits>
#include <memory>
#include <string>

#include "chorus/bootstrap/rendezvous.hpp"
#include "chorus/detail/log.hpp"
#include "chorus/transport/matching.hpp"

namespace chorus {

template <Transport T>
struct Communicator<T>::State {
  Bootstrap boot;
  std::unique_ptr<T> transport;
  Tag context = 0;                  ///< high bits of every tag of this communicator
  std::uint64_t barrier_seq = 0;    ///< barriers called so far (identical on every rank)
  std::atomic<bool> aborted{false};

  ErrorContext ctx(int peer, std::string op) const { return {boot.rank, peer, std::move(op)}; }
};

template <Transport T>
Communicator<T> Communicator<T>::create(Options options) {
  auto s = std::make_unique<State>();
  s->boot = rendezvous(std::move(options));
  s->transport = std::make_unique<T>(s->boot);
  detail::log(detail::LogLevel::info, s->boot.rank, "communicator ready: ", s->boot.size, " ranks over ", T::kName);
  return Communicator(std::move(s));
}

template <Transport T>
Communicator<T>::Communicator(std::unique_ptr<State> s) : s_(std::move(s)) {}

template <Transport T>
Communicator<T>::~Communicator() = default;

template <Transport T>
int Communicator<T>::rank() const {
  return s_->boot.rank;
}

template <Transport T>
int Communicator<T>::size() const {
  return s_->boot.size;
}

template <Transport T>
const Options& Communicator<T>::options() const {
  return s_->boot.options;
}

template <Transport T>
T& Communicator<T>::transport() {
  return *s_->transport;
}

namespace detail {
inline void check_p2p_args(int rank, int size, int peer, int tag, const char* verb) {
  if (peer < 0 || peer >= size)
    throw Error(ErrorCode::invalid_argument, ErrorContext{rank, peer, std::string(verb) + " tag " + std::to_string(tag)},
                "peer " + std::to_string(peer) + " is not a rank of this communicator (size " + std::to_string(size) + ")");
  if (tag < 0)
    throw Error(ErrorCode::invalid_argument, ErrorContext{rank, peer, std::string(verb) + " tag " + std::to_string(tag)},
                "tags must be non-negative");
}
}  // namespace detail

template <Transport T>
Request Communicator<T>::isend_bytes(ConstBytes data, int peer, int tag) {
  detail::check_p2p_args(rank(), size(), peer, tag, "send");
  return s_->transport->link(peer).isend(data, s_->context | static_cast<Tag>(tag));
}

template <Transport T>
Request Communicator<T>::irecv_bytes(MutableBytes data, int peer, int tag) {
  detail::check_p2p_args(rank(), size(), peer, tag, "recv");
  return s_->transport->link(peer).irecv(data, s_->context | static_cast<Tag>(tag));
}

/// Dissemination barrier: in round k every rank signals rank + 2^k and waits for rank - 2^k;
/// after ceil(log2 P) rounds every rank has heard, directly or not, from every other.
template <Transport T>
void Communicator<T>::barrier() {
  const int n = size(), r = rank();
  const Tag tag = s_->context | detail::kInternalTagBit | (Tag(1) << 40) | (s_->barrier_seq++ & 0xffffffffffull);
  for (int k = 1; k < n; k <<= 1) {
    Request in = s_->transport->link((r - k + n) % n).irecv(MutableBytes{}, tag);
    Request out = s_->transport->link((r + k) % n).isend(ConstBytes{}, tag);
    out.wait();
    in.wait();
  }
}

template <Transport T>
void Communicator<T>::abort() {
  if (s_->aborted.exchange(true)) return;
  s_->transport->abort(Error(ErrorCode::peer_failure, s_->ctx(-1, "abort"), "communicator aborted by the user"));
}

}  // namespace chorus
