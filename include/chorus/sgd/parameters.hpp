// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// Data-parallel SGD, the simple helpers: every replica starts from the root's weights, and
/// gradients are averaged over the replicas after each backward pass.
///
///   auto comm = chorus::init();
///   std::vector<std::span<float>> weights = model.parameter_tensors();   // or one flat span
///   chorus::sgd::broadcast_parameters(comm, weights, /*root=*/0);
///   for (...) {
///     model.forward_backward(batch);                                     // fills the gradients
///     chorus::sgd::average_gradients(comm, model.gradient_tensors());
///     optimizer.step();
///   }
///
/// A parameter list (concept Parameters) is either one tensor, a writable contiguous range of
/// float, double, float16 or bfloat16 (std::vector<float>, std::span<float>, ...), or a range of
/// such tensors (std::vector<std::span<float>>, std::vector<std::vector<bfloat16>>, ...), all of
/// one element type. Every rank passes the same shapes in the same order.
///
/// The helpers call only the type-erased collectives (concept Collectives below), so they work with
/// any Communicator<Transport> (and sub-communicators from split) without instantiating more of it.
/// GradientSynchronizer (synchronizer.hpp) does what average_gradients does with fewer, larger
/// all-reduces that overlap the backward pass.

#include <concepts>
#include <cstddef>
#include <exception>
#include <ranges>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "chorus/core/error.hpp"
#include "chorus/core/request.hpp"
#include "chorus/core/types.hpp"

namespace chorus::sgd {

/// What the SGD helpers need of a communicator: rank, size, and the type-erased asynchronous
/// all-reduce and broadcast. Every chorus::Communicator<T> satisfies it.
template <class C>
concept Collectives = requires(C& c, const void* in, void* out, std::size_t n, DataType dt, ReduceOp op, int root) {
  { c.rank() } -> std::convertible_to<int>;
  { c.size() } -> std::convertible_to<int>;
  { c.all_reduce_async(in, out, n, dt, op) } -> std::same_as<Request>;
  { c.broadcast_async(out, n, dt, root) } -> std::same_as<Request>;
};

/// The element types of weights and gradients.
template <class T>
concept GradientElement = std::same_as<T, float> || std::same_as<T, double> || std::same_as<T, float16> ||
                          std::same_as<T, bfloat16>;

/// One tensor: a writable contiguous range of a GradientElement.
template <class R>
concept Tensor = std::ranges::contiguous_range<R> && std::ranges::sized_range<R> &&
                 GradientElement<std::remove_cv_t<std::ranges::range_value_t<R>>> &&
                 !std::is_const_v<std::remove_reference_t<std::ranges::range_reference_t<R>>>;

/// A range of tensors (iterated once per call).
template <class R>
concept TensorList = !Tensor<R> && std::ranges::forward_range<R> && Tensor<std::ranges::range_reference_t<R>>;

/// One tensor or a list of tensors.
template <class R>
concept Parameters = Tensor<R> || TensorList<R>;

namespace detail {
template <class R>
struct ParametersElement;
template <Tensor R>
struct ParametersElement<R> {
  using type = std::remove_cv_t<std::ranges::range_value_t<R>>;
};
template <TensorList R>
struct ParametersElement<R> {
  using type = std::remove_cv_t<std::ranges::range_value_t<std::ranges::range_reference_t<R>>>;
};
}  // namespace detail

/// The element type of a parameter list: float for std::vector<std::span<float>>.
template <Parameters R>
using parameters_element_t = typename detail::ParametersElement<std::remove_reference_t<R>>::type;

/// The tensors of a parameter list as spans (one span for a single tensor).
template <Parameters R>
std::vector<std::span<parameters_element_t<R>>> tensor_spans(R&& params) {
  using G = parameters_element_t<R>;
  std::vector<std::span<G>> out;
  if constexpr (Tensor<R>) {
    out.emplace_back(std::ranges::data(params), std::ranges::size(params));
  } else {
    for (auto&& t : params) out.emplace_back(std::ranges::data(t), std::ranges::size(t));
  }
  return out;
}

namespace detail {

/// Waits for every request, even after one failed (their buffers belong to the caller, who may
/// free them once we return), then rethrows the first failure.
inline void wait_all(std::vector<Request>& requests) {
  std::exception_ptr first;
  for (auto& r : requests) {
    try {
      r.wait();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  requests.clear();
  if (first) std::rethrow_exception(first);
}

}  // namespace detail

/// Every rank's parameters become a copy of `root`'s (bitwise). Collective: every rank calls it
/// with the same shapes. One asynchronous broadcast per non-empty tensor, all in flight at once.
template <Collectives Comm, Parameters P>
void broadcast_parameters(Comm& comm, P&& params, int root = 0) {
  using G = parameters_element_t<P>;
  if (root < 0 || root >= comm.size())
    throw Error(ErrorCode::invalid_argument, ErrorContext{comm.rank(), -1, "sgd::broadcast_parameters"},
                "root " + std::to_string(root) + " is not a rank of this communicator of " +
                    std::to_string(comm.size()));
  std::vector<Request> requests;
  for (std::span<G> t : tensor_spans(params)) {
    if (!t.empty()) requests.push_back(comm.broadcast_async(t.data(), t.size(), data_type_of<G>, root));
  }
  detail::wait_all(requests);
}

/// Every rank's gradients become the element-wise mean over the ranks (ReduceOp::avg: the sum,
/// then one division by size()), bitwise identical on every rank. Collective. One asynchronous
/// all-reduce per non-empty tensor, all in flight at once; GradientSynchronizer packs tensors
/// into fewer, larger buckets and overlaps them with the backward pass.
template <Collectives Comm, Parameters P>
void average_gradients(Comm& comm, P&& grads) {
  using G = parameters_element_t<P>;
  std::vector<Request> requests;
  for (std::span<G> t : tensor_spans(grads)) {
    if (!t.empty())
      requests.push_back(comm.all_reduce_async(t.data(), t.data(), t.size(), data_type_of<G>, ReduceOp::avg));
  }
  detail::wait_all(requests);
}

}  // namespace chorus::sgd
