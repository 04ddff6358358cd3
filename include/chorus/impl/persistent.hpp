// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// Persistent collectives (chorus/persistent.hpp): Communicator::persistent checks a Call once
// and, on host buffers, plans it once; each start of a host call then enters the call path after
// the plan (Communicator::planned_call: sequence number, call order, recorder, the algorithm);
// a start inside a group, on a stream or on device buffers goes through Communicator::start as
// the plain call does. Included at the bottom of impl/communicator.hpp.

#include <memory>
#include <optional>
#include <string>

#include "chorus/algo/plan.hpp"
#include "chorus/algo/validate.hpp"
#include "chorus/impl/group_items.hpp"
#include "chorus/impl/state.hpp"

namespace chorus {

namespace detail {

/// What a persistent operation holds: its call, and for host buffers the descriptor, arguments
/// and plan that each start reuses.
template <class T>
struct PersistentState {
  typename Communicator<T>::State* st = nullptr;
  std::weak_ptr<const int> life;  ///< the communicator's state is alive while this is
  Call call;
  bool planned = false;  ///< host buffers: desc, args and plan below are made (else: Communicator::start)
  algo::CollectiveDesc desc;
  algo::Args args;
  algo::Plan plan;

  /// The communicator, or invalid_argument naming `op` where it is gone.
  Communicator<T>& comm(const char* op) const {
    if (life.expired())
      throw Error(ErrorCode::invalid_argument, ErrorContext{-1, -1, std::string("persistent ") + op},
                  "the communicator of this persistent " + std::string(algo::to_string(call.kind)) +
                      " was destroyed (or assigned over, as comm = comm.shrink() does)");
    return *st->self;
  }
};

/// Where an operation is not valid(): invalid_argument naming `op`.
[[noreturn]] inline void persistent_not_valid(const char* op) {
  throw Error(ErrorCode::invalid_argument, ErrorContext{-1, -1, std::string("persistent ") + op},
              "this persistent operation is not valid (default-constructed or moved from)");
}

}  // namespace detail

template <class T>
Persistent<T> Communicator<T>::persistent(const Call& call) {
  State& st = live("persistent");
  auto p = std::make_shared<detail::PersistentState<T>>();
  p->st = &st;
  p->life = st.life;
  p->call = normalized(call, "persistent(Call)");
  const Call& c = p->call;
  detail::check_collective_args(c.kind, c.in, c.out, c.count, c.dtype, c.op, c.root, rank(), size());
  p->desc = detail::desc_of(c);
  detail::check_root(p->desc, rank(), size());
  // premul_sum reads its scalar at each start: such a call is issued whole each time.
  if (st.kind_of(c.in, c.out, p->desc) == MemoryKind::host && c.op != ReduceOp::premul_sum) {
    algo::Args& a = p->args;
    a.in = static_cast<const std::byte*>(c.in);
    a.out = static_cast<std::byte*>(c.out);
    a.exec = &st.host_exec;
    a.dtype = p->desc.dtype;
    a.op = p->desc.op;
    a.root = p->desc.root;
    a.count = p->desc.count;
    std::unique_lock lk(st.call_mu);  // plan_inputs as a call reads them
    p->plan = algo::plan<T>(p->desc, a.bytes(a.count), false, st.plan_inputs, [] { return std::size_t(0); },
                            st.internal_calls > 0);
    a.slice_bytes = p->plan.choice.slice_bytes;
    p->planned = true;
  }
  return Persistent<T>(std::move(p));
}

template <class T>
void Persistent<T>::begin(bool blocking, std::optional<device::Stream> stream) {
  const char* op = blocking ? "run" : "start";
  if (!p_) detail::persistent_not_valid(op);
  detail::PersistentState<T>& p = *p_;
  Communicator<T>& comm = p.comm(op);
  if (req_.state() && !req_.state()->done())
    throw Error(ErrorCode::invalid_argument, ErrorContext{comm.rank(), -1, std::string("persistent ") + op},
                "the persistent " + std::string(algo::to_string(p.call.kind)) +
                    " was started again before its previous start completed (wait() for it first)");
  ++starts_;
  req_ = Request();
  if (p.planned && !stream && !p.st->grouping()) {
    std::unique_lock lk(p.st->call_mu);
    Request r = comm.planned_call(lk, p.desc, p.args, p.plan, !blocking);
    if (!blocking) req_ = std::move(r);
    return;
  }
  Request r = comm.start(p.call, blocking ? CallMode::blocking : CallMode::async, stream);
  if (!blocking || p.st->grouping()) req_ = std::move(r);
}

template <class T>
void Persistent<T>::start() {
  begin(false, std::nullopt);
}

template <class T>
void Persistent<T>::start(device::Stream stream) {
  begin(false, stream);
}

template <class T>
void Persistent<T>::run() {
  begin(true, std::nullopt);
}

template <class T>
void Persistent<T>::wait() {
  if (!p_) detail::persistent_not_valid("wait");
  req_.wait();
}

template <class T>
bool Persistent<T>::test() {
  if (!p_) detail::persistent_not_valid("test");
  return req_.test();
}

template <class T>
const Call& Persistent<T>::call() const {
  if (!p_) detail::persistent_not_valid("call");
  return p_->call;
}

}  // namespace chorus
