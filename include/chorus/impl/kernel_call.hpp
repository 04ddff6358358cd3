// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// Communicator<T>::kernel_call: a call on device buffers that runs as one collective kernel per
// rank (algo/intranode/kernel_path.hpp). Included by impl/communicator.hpp.
//
// The call takes its sequence number under the call lock, as every collective does, sets the
// kernel's path up the first time, launches the kernel on the caller's stream (a blocking call
// without a stream: the path's own, after the default stream's work, and the default stream
// after it) and returns its Request, which completes when the kernel is over. Nothing waits on
// the host unless the caller does; no message is sent. A kernel that gives up fails its call
// with the error it reported: the communicator is then aborted (its later calls fail at once),
// as after any failed collective.

#include <chrono>
#include <memory>
#include <mutex>

#include "chorus/algo/intranode/kernel_path.hpp"
#include "chorus/impl/state.hpp"

namespace chorus {

template <class T>
Request Communicator<T>::kernel_call(algo::CollectiveDesc d, const std::byte* in, std::byte* out,
                                     const device::Stream* stream, bool async) {
  State& st = *s_;
  std::unique_lock lk(st.call_mu);
  (void)st.device_executor();  // the runtime's kernels are loaded before the first launch
  if (!st.kernels) {
    // Ends of calls (run by whoever completes the Request): the recorder, and a failure ends the
    // communicator as a failed collective does.
    auto on_end = [&st](const algo::CollectiveDesc& desc, const Error* e) {
      st.recorder->finished(desc.seq, e == nullptr);
      if (e == nullptr) return;
      st.note_async_error(*e);
      st.dump_once(std::string(to_string(e->code())) + " in " + algo::describe(desc) + ": " + e->what());
      st.transport->abort(*e);
    };
    st.kernels = std::make_shared<algo::KernelPath<T>>(st.group, *st.runtime, st.kernel_in_process,
                                                       st.kernel_in_process ? 0 : st.ipc_slot_bytes, st.boot.options.timeout,
                                                       on_end);
  }
  algo::KernelPath<T>& kp = *st.kernels;
  if (auto f = kp.failure()) throw *f;
  d.seq = st.coll_seq;
  if (!kp.ready()) {
    kp.set_up(*st.boot.store, st.kernel_key());
    st.kernel_bytes.store(kp.bytes(), std::memory_order_relaxed);
  }
  ++st.coll_seq;
  const device::CollectiveLaunch args = kp.prepare(d, in, out);
  // The host's bound is a second line: the kernel gives up within the timeout of its start.
  auto req = std::make_shared<detail::RequestState>(st.ctx(-1, algo::describe(d)),
                                                    2 * st.boot.options.timeout + std::chrono::seconds(1));
  std::weak_ptr<algo::KernelPath<T>> weak = st.kernels;
  req->set_on_timeout([weak](const Error& e) {
    if (auto k = weak.lock()) k->on_timeout(e);
  });
  st.recorder->started(d, algo::Algorithm::kernel);
  kp.launch(args, stream ? *stream : nullptr, d, req);
  lk.unlock();
  if (!async && !stream) Request(req).wait();
  return Request(std::move(req));
}

}  // namespace chorus
