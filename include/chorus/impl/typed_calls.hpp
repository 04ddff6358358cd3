// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// The Call of each typed form of Communicator<T> (all_reduce(in, out, op), ...): the elements'
// type gives the dtype, the ranges' sizes the count, after the size checks the kind needs.
// Included by impl/communicator.hpp.

#include <ranges>
#include <string>

#include "chorus/core/error.hpp"

namespace chorus {

template <class T>
template <class In, class Out>
Call Communicator<T>::all_reduce_call(const In& in, Out&& out, ReduceOp op) const {
  same_size(count_of(in), count_of(out), "all_reduce: in and out");
  return {CallKind::all_reduce, std::ranges::data(in), std::ranges::data(out), count_of(in), dtype_of<In>(), op};
}

template <class T>
template <class R>
Call Communicator<T>::broadcast_call(R&& buf, int root) const {
  return {CallKind::broadcast, std::ranges::data(buf), std::ranges::data(buf), count_of(buf), dtype_of<R>(), ReduceOp::sum, root};
}

template <class T>
template <class In, class Out>
Call Communicator<T>::reduce_call(const In& in, Out&& out, ReduceOp op, int root) const {
  if (rank() == root) same_size(count_of(in), count_of(out), "reduce: in and out (root)");
  return {CallKind::reduce, std::ranges::data(in), std::ranges::data(out), count_of(in), dtype_of<In>(), op, root};
}

template <class T>
template <class In, class Out>
Call Communicator<T>::scatter_call(const In& in, Out&& out, int root) const {
  if (rank() == root) same_size(count_of(in), count_of(out) * size(), "scatter: in (root) and size() x out");
  return {CallKind::scatter, std::ranges::data(in), std::ranges::data(out), count_of(out), dtype_of<Out>(), ReduceOp::sum, root};
}

template <class T>
template <class In, class Out>
Call Communicator<T>::gather_call(const In& in, Out&& out, int root) const {
  if (rank() == root) same_size(count_of(out), count_of(in) * size(), "gather: out (root) and size() x in");
  return {CallKind::gather, std::ranges::data(in), std::ranges::data(out), count_of(in), dtype_of<In>(), ReduceOp::sum, root};
}

template <class T>
template <class In, class Out>
Call Communicator<T>::all_gather_call(const In& in, Out&& out) const {
  same_size(count_of(out), count_of(in) * size(), "all_gather: out and size() x in");
  return {CallKind::all_gather, std::ranges::data(in), std::ranges::data(out), count_of(in), dtype_of<In>()};
}

template <class T>
template <class In, class Out>
Call Communicator<T>::reduce_scatter_call(const In& in, Out&& out, ReduceOp op) const {
  same_size(count_of(in), count_of(out) * size(), "reduce_scatter: in and size() x out");
  return {CallKind::reduce_scatter, std::ranges::data(in), std::ranges::data(out), count_of(out), dtype_of<Out>(), op};
}

template <class T>
template <class In, class Out>
Call Communicator<T>::all_to_all_call(const In& in, Out&& out) const {
  same_size(count_of(in), count_of(out), "all_to_all: in and out");
  if (count_of(in) % size() != 0)
    throw Error(ErrorCode::invalid_argument, ErrorContext{rank(), -1, "all_to_all"},
                "in has " + std::to_string(count_of(in)) + " elements, not a multiple of size() " + std::to_string(size()));
  return {CallKind::all_to_all, std::ranges::data(in), std::ranges::data(out), count_of(in) / size(), dtype_of<In>()};
}

}  // namespace chorus
