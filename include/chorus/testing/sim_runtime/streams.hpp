// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// device::SimRuntime (testing/sim_runtime.hpp): streams and events. A stream is a queue run by
/// one worker thread; an event is a position in a stream's queue. The worker loop (run) is here;
/// what it does with each operation is in work.hpp and flags.hpp.

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "chorus/testing/sim_runtime.hpp"

namespace chorus::device {

// --- streams and events --------------------------------------------------------------------------

CHORUS_DETAIL_SIM_INLINE std::shared_ptr<SimRuntime::StreamState> SimRuntime::start_stream() {
  auto st = std::make_shared<StreamState>();
  st->worker = std::thread([this, st] { run(st); });
  return st;
}

CHORUS_DETAIL_SIM_INLINE std::shared_ptr<SimRuntime::StreamState> SimRuntime::stream_of(Stream s, std::string_view call) {
  if (s == nullptr) return default_stream_;
  auto it = streams_.find(reinterpret_cast<const StreamState*>(s));
  if (it == streams_.end())
    throw detail::cuda_error(call, detail::kCudaInvalidHandle, "stream " + detail::hex(s) + " is not a live stream");
  return it->second;
}

CHORUS_DETAIL_SIM_INLINE std::shared_ptr<SimRuntime::EventState> SimRuntime::event_of(Event e, std::string_view call) {
  auto it = events_.find(reinterpret_cast<const EventState*>(e));
  if (it == events_.end())
    throw detail::cuda_error(call, detail::kCudaInvalidHandle, "event " + detail::hex(e) + " is not a live event");
  return it->second;
}

CHORUS_DETAIL_SIM_INLINE void SimRuntime::throw_if_failed(const StreamState& st) {
  if (st.error)
    throw Error(means_no_gpu(st.error->cuda_error) ? ErrorCode::unsupported : ErrorCode::system, st.error->text);
}

CHORUS_DETAIL_SIM_INLINE void SimRuntime::reap_retired() {
  for (auto it = retired_.begin(); it != retired_.end();) {
    if ((*it)->exited && (*it)->worker.joinable()) {
      (*it)->worker.join();  // it has exited: returns at once
      it = retired_.erase(it);
    } else {
      ++it;
    }
  }
}

CHORUS_DETAIL_SIM_INLINE Stream SimRuntime::create_stream() {
  std::lock_guard lk(mu_);
  if (const int e = take_injection("create_stream"))
    throw detail::cuda_error("cudaStreamCreateWithFlags", e, "injected");
  reap_retired();
  auto st = start_stream();
  const StreamState* key = st.get();
  streams_.emplace(key, std::move(st));
  return reinterpret_cast<Stream>(const_cast<StreamState*>(key));
}

CHORUS_DETAIL_SIM_INLINE void SimRuntime::destroy_stream(Stream s) {
  std::lock_guard lk(mu_);
  if (s == nullptr)
    throw detail::cuda_error("cudaStreamDestroy", detail::kCudaInvalidHandle, "the null stream is not destroyed");
  auto st = stream_of(s, "cudaStreamDestroy");
  streams_.erase(st.get());
  // Like CUDA: returns at once; what is queued still runs, then the worker ends.
  st->closing = true;
  st->cv.notify_all();
  retired_.push_back(std::move(st));
  reap_retired();
}

CHORUS_DETAIL_SIM_INLINE Event SimRuntime::create_event(bool timing) {
  std::lock_guard lk(mu_);
  if (const int e = take_injection("create_event")) throw detail::cuda_error("cudaEventCreateWithFlags", e, "injected");
  auto ev = std::make_shared<EventState>();
  ev->timing = timing;
  const EventState* key = ev.get();
  events_.emplace(key, std::move(ev));
  return reinterpret_cast<Event>(const_cast<EventState*>(key));
}

CHORUS_DETAIL_SIM_INLINE void SimRuntime::destroy_event(Event e) {
  std::lock_guard lk(mu_);
  auto ev = event_of(e, "cudaEventDestroy");
  events_.erase(ev.get());  // a record still queued keeps its state alive
}

CHORUS_DETAIL_SIM_INLINE void SimRuntime::record(Event e, Stream s) {
  std::lock_guard lk(mu_);
  auto ev = event_of(e, "cudaEventRecord");
  auto st = stream_of(s, "cudaEventRecord");
  throw_if_failed(*st);
  Op op(OpKind::record);
  op.event = ev;
  op.generation = ++ev->generation;
  ev->stream = st;
  ev->stamped = false;
  st->queue.push_back(std::move(op));
  ev->position = ++st->enqueued;
  st->cv.notify_one();
}

CHORUS_DETAIL_SIM_INLINE bool SimRuntime::query(Event e) {
  std::lock_guard lk(mu_);
  auto ev = event_of(e, "cudaEventQuery");
  if (!ev->stream) return true;  // never recorded: complete, as in CUDA
  throw_if_failed(*ev->stream);
  return ev->stream->completed >= ev->position;
}

CHORUS_DETAIL_SIM_INLINE void SimRuntime::synchronize(Event e) {
  std::unique_lock lk(mu_);
  auto ev = event_of(e, "cudaEventSynchronize");
  if (!ev->stream) return;
  auto st = ev->stream;
  const std::uint64_t target = ev->position;
  progress_.wait(lk, [&] { return stopping_ || st->completed >= target || st->exited; });
  throw_if_failed(*st);
}

CHORUS_DETAIL_SIM_INLINE void SimRuntime::synchronize(Stream s) {
  std::unique_lock lk(mu_);
  auto st = stream_of(s, "cudaStreamSynchronize");
  const std::uint64_t target = st->enqueued;
  progress_.wait(lk, [&] { return stopping_ || st->completed >= target || st->exited; });
  throw_if_failed(*st);
}

CHORUS_DETAIL_SIM_INLINE void SimRuntime::wait(Stream s, Event e) {
  std::lock_guard lk(mu_);
  auto ev = event_of(e, "cudaStreamWaitEvent");
  auto st = stream_of(s, "cudaStreamWaitEvent");
  throw_if_failed(*st);
  if (!ev->stream) return;  // never recorded: nothing to wait for
  Op op(OpKind::wait_event);
  op.target = ev->stream;
  op.position = ev->position;
  st->queue.push_back(std::move(op));
  ++st->enqueued;
  st->cv.notify_one();
}

CHORUS_DETAIL_SIM_INLINE float SimRuntime::elapsed_ms(Event start, Event end) {
  std::lock_guard lk(mu_);
  auto a = event_of(start, "cudaEventElapsedTime");
  auto b = event_of(end, "cudaEventElapsedTime");
  if (!a->timing || !b->timing || !a->stream || !b->stream)
    throw detail::cuda_error("cudaEventElapsedTime", detail::kCudaInvalidHandle,
                             "both events must be timing events that have been recorded");
  throw_if_failed(*a->stream);
  throw_if_failed(*b->stream);
  if (!a->stamped || !b->stamped) throw detail::cuda_error("cudaEventElapsedTime", detail::kCudaNotReady);
  return std::chrono::duration<float, std::milli>(b->when - a->when).count();
}

// --- the workers ---------------------------------------------------------------------------------

CHORUS_DETAIL_SIM_INLINE void SimRuntime::run(const std::shared_ptr<StreamState>& st) {
  std::unique_lock lk(mu_);
  for (;;) {
    st->cv.wait(lk, [&] { return stopping_ || !st->queue.empty() || st->closing; });
    if (stopping_) break;  // destruction drops what is queued
    if (st->queue.empty()) break;  // closing, and nothing left
    Op op = std::move(st->queue.front());
    st->queue.pop_front();
    if (op.stall.count() > 0) st->cv.wait_for(lk, op.stall, [&] { return stopping_; });
    if (!st->error && !stopping_) execute(*st, op, lk);
    if (holds_stream(op.kind)) --st->holds;
    ++st->completed;
    progress_.notify_all();
  }
  st->exited = true;
  progress_.notify_all();
}

}  // namespace chorus::device
