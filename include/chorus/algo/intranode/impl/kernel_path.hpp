// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// Bodies of algo::KernelPath (algo/intranode/kernel_path.hpp).

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <chrono>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "chorus/algo/intranode/kernel_path.hpp"

namespace chorus::algo {

template <Transport T>
KernelPath<T>::~KernelPath() {
  try {
    for (auto& f : flight_) rt_.destroy_event(f.done);
    for (auto e : spare_) rt_.destroy_event(e);
    if (default_ready_ != nullptr) rt_.destroy_event(default_ready_);
    if (stream_ != nullptr) rt_.destroy_stream(stream_);
    for (auto* p : {abort_, one_}) rt_.free_pinned(p);
    rt_.free_pinned(report_);
    rt_.free_pinned(results_);
  } catch (...) {  // destruction never throws
  }
}

template <Transport T>
void KernelPath<T>::set_up(Store& store, const std::string& key) {
  const int n = g_.size(), r = g_.rank;
  const ErrorContext ctx{r, -1, "the device collective kernel's set-up"};
  if (n > device::kMaxKernelRanks)
    throw Error(ErrorCode::invalid_argument, ctx, "more than " + std::to_string(device::kMaxKernelRanks) + " ranks");
  max_blocks_ = std::clamp(rt_.collective_blocks(same_process_ ? n : 1), 1u, device::kMaxKernelBlocks);
  stream_ = rt_.create_stream();
  abort_ = static_cast<std::uint32_t*>(rt_.alloc_pinned(64));
  one_ = static_cast<std::uint32_t*>(rt_.alloc_pinned(64));
  *abort_ = 0;
  *one_ = 1;
  report_ = static_cast<device::KernelReport*>(rt_.alloc_pinned(device::kMaxKernelBlocks * sizeof(device::KernelReport)));
  results_ = static_cast<device::KernelResult*>(
      rt_.alloc_pinned(device::kKernelResultSlots * device::kMaxKernelBlocks * sizeof(device::KernelResult)));
  abort_dev_ = static_cast<std::uint32_t*>(rt_.device_address(abort_));
  report_dev_ = static_cast<device::KernelReport*>(rt_.device_address(report_));
  results_dev_ = static_cast<device::KernelResult*>(rt_.device_address(results_));
  for (std::size_t i = 0; i < device::kMaxKernelBlocks; ++i) report_[i] = device::KernelReport{};
  for (std::size_t i = 0; i < device::kKernelResultSlots * device::kMaxKernelBlocks; ++i) results_[i] = device::KernelResult{0, -1};
  auto* area = static_cast<std::byte*>(rt_.alloc_device(device::area::bytes(window_)));
  rt_.fill(area, 0, device::area::kWindowOffset, stream_);
  rt_.synchronize(stream_);  // zero before any peer can reach it
  mine_ = area;
  areas_[static_cast<std::size_t>(r)] = mine_;
  opened_.assign(static_cast<std::size_t>(n), false);

  kernel_detail::Published me;
  me.window = window_;
  me.context = reinterpret_cast<std::uintptr_t>(rt_.context());
  if (same_process_)
    me.area = reinterpret_cast<std::uintptr_t>(mine_);
  else
    me.handle = rt_.ipc_export(mine_);
  store.set(key + "/" + std::to_string(r), kernel_detail::hex(reinterpret_cast<const std::byte*>(&me), sizeof me));
  for (int q = 0; q < n; ++q) {
    if (q == r) continue;
    const ErrorContext at{r, q, ctx.op};
    kernel_detail::Published theirs;
    if (!kernel_detail::unhex(store.get(key + "/" + std::to_string(q), timeout_), reinterpret_cast<std::byte*>(&theirs),
                              sizeof theirs))
      throw Error(ErrorCode::system, at, "rank " + std::to_string(q) + " published an unreadable area");
    if (theirs.window != me.window)
      throw Error(ErrorCode::invalid_argument, at,
                  "CHORUS_CUDA_IPC_SLOT_BYTES differs between ranks: " + std::to_string(me.window) + " here, " +
                      std::to_string(theirs.window) + " on rank " + std::to_string(q));
    if (same_process_) {
      if (theirs.context != me.context)
        throw Error(ErrorCode::invalid_argument, at,
                    "ranks that are threads of one process must use one device runtime (set_device_runtime with the same "
                    "runtime, or the process's default): rank " + std::to_string(q) + " uses another");
      areas_[static_cast<std::size_t>(q)] = reinterpret_cast<std::byte*>(static_cast<std::uintptr_t>(theirs.area));
    } else {
      try {
        areas_[static_cast<std::size_t>(q)] = static_cast<std::byte*>(rt_.ipc_open(theirs.handle));
      } catch (const Error& e) {
        throw Error(ErrorCode::peer_failure, at, "cannot map the device memory of rank " + std::to_string(q) + " (CUDA IPC): " + e.what());
      }
      opened_[static_cast<std::size_t>(q)] = true;
    }
  }
  rt_.note_round_trip();  // the exchange through the store, once
}

template <Transport T>
device::CollectiveLaunch KernelPath<T>::prepare(const CollectiveDesc& desc, const std::byte* in, std::byte* out) {
  using device::KernelCollective;
  using device::KernelProtocol;
  device::CollectiveLaunch a{};
  switch (desc.kind) {
    case CollectiveKind::all_reduce: a.kind = KernelCollective::all_reduce; break;
    case CollectiveKind::reduce_scatter: a.kind = KernelCollective::reduce_scatter; break;
    case CollectiveKind::all_gather: a.kind = KernelCollective::all_gather; break;
    case CollectiveKind::broadcast: a.kind = KernelCollective::broadcast; break;
    default: a.kind = KernelCollective::reduce; break;
  }
  const bool reduces = a.kind == KernelCollective::all_reduce || a.kind == KernelCollective::reduce_scatter ||
                       a.kind == KernelCollective::reduce;
  const int n = g_.size();
  const std::size_t es = size_of(desc.dtype), N = desc.count * es;
  a.dtype = desc.dtype;
  a.op = reduces ? desc.op : ReduceOp::sum;
  a.root = std::max(desc.root, 0);
  a.ranks = n;
  a.rank = g_.rank;
  a.count = desc.count;
  const bool ll_kind = a.kind == KernelCollective::all_reduce || a.kind == KernelCollective::all_gather ||
                       a.kind == KernelCollective::reduce_scatter;
  a.protocol = ll_kind && N <= device::kLLMaxBytes ? KernelProtocol::ll
               : same_process_                    ? KernelProtocol::direct
                                                  : KernelProtocol::windowed;
  // Blocks: one per kBlockBytes of what each rank moves, up to what stays resident.
  constexpr std::size_t kBlockBytes = std::size_t(256) << 10;
  const std::size_t pack = 16 / es;
  if (a.protocol == KernelProtocol::windowed) {
    const std::size_t per = a.kind == KernelCollective::reduce_scatter ? static_cast<std::size_t>(n) : 1;
    a.chunk = std::max<std::size_t>(pack, window_ / es / per / pack * pack);
  }
  const std::size_t moved = a.protocol == KernelProtocol::windowed ? std::min<std::size_t>(N, a.chunk * es) : N;
  a.blocks = a.protocol == KernelProtocol::ll
                 ? 1
                 : static_cast<std::uint32_t>(std::clamp<std::size_t>((moved + kBlockBytes - 1) / kBlockBytes, 1, max_blocks_));
  a.in = in;
  a.out = out;
  a.in_shared = reinterpret_cast<std::uintptr_t>(in);
  a.out_shared = reinterpret_cast<std::uintptr_t>(out);
  for (int q = 0; q < n; ++q) a.areas[q] = areas_[static_cast<std::size_t>(q)];
  a.barrier_base = barriers_;
  barriers_ += device::kernel_barriers(a.protocol, a.count, a.chunk);
  if (a.protocol == KernelProtocol::ll) a.ll_flag = static_cast<std::uint32_t>(ll_calls_++ % 0x7fffffffu) + 1;
  const auto words = std::bit_cast<std::array<std::uint64_t, 4>>(desc);
  for (int w = 0; w < 4; ++w) a.desc[w] = words[static_cast<std::size_t>(w)];
  a.abort = abort_dev_;
  a.report = report_dev_;
  a.timeout_ns = static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(timeout_).count());
  return a;
}

template <Transport T>
void KernelPath<T>::launch(const device::CollectiveLaunch& args, device::Stream user, const CollectiveDesc& desc,
                           std::shared_ptr<chorus::detail::RequestState> req) {
  if (in_flight() >= device::kKernelResultSlots) {  // the ring of results is full: wait for the oldest
    const auto deadline = Clock::now() + 2 * timeout_ + std::chrono::seconds(1);
    while (in_flight() >= device::kKernelResultSlots && Clock::now() < deadline) {
      if (!reap()) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  device::CollectiveLaunch a = args;
  const std::size_t slot = (calls_++ % device::kKernelResultSlots) * device::kMaxKernelBlocks;
  device::KernelResult* result = results_ + slot;
  for (std::uint32_t b = 0; b < a.blocks; ++b) result[b] = device::KernelResult{0, -1};
  a.result = results_dev_ + slot;
  // The default stream (null) is shared by every thread of the process, so ranks as threads
  // would queue their kernels behind one another there: the call runs on this path's stream,
  // after the default stream's work, and the default stream's later work follows it.
  device::Stream s = user;
  if (user == nullptr) {
    if (default_ready_ == nullptr) default_ready_ = rt_.create_event();
    rt_.record(default_ready_, nullptr);
    rt_.wait(stream_, default_ready_);
    s = stream_;
  }
  if (launched_ && s != last_stream_) rt_.wait(s, last_);  // after the last kernel, on the device
  rt_.launch_collective(a, s);
  device::Event done = nullptr;
  {
    std::lock_guard lk(mu_);
    if (!spare_.empty()) {
      done = spare_.back();
      spare_.pop_back();
    }
  }
  if (done == nullptr) done = rt_.create_event();
  rt_.record(done, s);
  // (Not with ranks as threads: the default stream is every thread's, and a rank that synchronises
  // it would wait for a peer's kernel that may wait for this rank.)
  if (user == nullptr && !same_process_) rt_.wait(nullptr, done);
  last_ = done;
  last_stream_ = s;
  launched_ = true;
  req->set_driver(this->weak_from_this());
  std::lock_guard lk(mu_);
  flight_.push_back(Flight{done, desc, std::move(req), result, a.blocks});
}

template <Transport T>
std::optional<Error> KernelPath<T>::outcome(const Flight& f) {
  // The worst of the call's blocks: a mismatch says most, an abort least.
  std::uint32_t status = 0;
  int peer = -1;
  std::uint32_t block = 0;
  for (std::uint32_t b = 0; b < f.blocks; ++b) {
    const std::uint32_t s = std::atomic_ref<std::uint32_t>(f.result[b].status).load(std::memory_order_acquire);
    if (s > status) status = s, peer = f.result[b].peer, block = b;
  }
  const ErrorContext ctx{g_.rank, peer, describe(f.desc)};
  using device::KernelStatus;
  switch (static_cast<KernelStatus>(status)) {
    case KernelStatus::ok: return std::nullopt;
    case KernelStatus::mismatch: {
      std::array<std::uint64_t, 4> words{};
      for (int w = 0; w < 4; ++w) words[static_cast<std::size_t>(w)] = report_[block].peer_desc[w];
      return Error(ErrorCode::mismatch, ctx, describe_difference(g_.rank, f.desc, peer, std::bit_cast<CollectiveDesc>(words)));
    }
    case KernelStatus::timeout:
      return Error(ErrorCode::timeout, ctx,
                   "this rank's device waited more than " + std::to_string(timeout_.count()) + " ms for rank " +
                       std::to_string(peer) + " in the collective kernel (CHORUS_TIMEOUT)");
    case KernelStatus::peer_failure:
      return Error(ErrorCode::peer_failure, ctx,
                   "rank " + std::to_string(peer) + " failed or aborted while this rank's device waited for it");
    case KernelStatus::aborted: break;
  }
  if (failure_) return Error::from_text(failure_->code(), failure_->what(), failure_->rank(), failure_->peer());
  if (const int q = broken_peer_.load(); q >= 0)
    return Error(ErrorCode::peer_failure, ErrorContext{g_.rank, q, describe(f.desc)},
                 "rank " + std::to_string(q) + " failed while this rank's device waited for it");
  return Error(ErrorCode::aborted, ctx, "the communicator was aborted while the collective kernel ran");
}

template <Transport T>
bool KernelPath<T>::reap() {
  struct Ended {
    CollectiveDesc desc;
    std::shared_ptr<chorus::detail::RequestState> req;
    std::optional<Error> error;
  };
  std::vector<Ended> ended;
  bool empty = false;
  {
    std::lock_guard lk(mu_);
    while (!flight_.empty()) {
      Flight& f = flight_.front();
      std::optional<Error> error;
      try {
        if (!rt_.query(f.done)) break;
        error = outcome(f);
      } catch (const Error& e) {  // the stream failed (a device fault): nothing after it ran
        error = e;
      }
      if (error && !failure_) failure_ = *error;
      ended.push_back(Ended{f.desc, std::move(f.req), std::move(error)});
      spare_.push_back(f.done);
      flight_.pop_front();
    }
    empty = flight_.empty();
  }
  for (auto& e : ended) {
    if (on_end_) on_end_(e.desc, e.error ? &*e.error : nullptr);
    if (e.error)
      e.req->fail(*e.error);
    else
      e.req->complete();
  }
  return empty;
}

template <Transport T>
void KernelPath<T>::watch_links() {
  if (broken_peer_.load() >= 0) return;
  for (int q = 0; q < g_.size(); ++q) {
    if (q == g_.rank) continue;
    const auto code = link_failure(g_, q);
    // A peer that found a mismatch published its descriptor before it aborted (every block of its
    // call does; its area's abort word stays clear, device/collective_body.hpp): the kernels find
    // the mismatch themselves, and every rank reports it, as the host path's herald makes them.
    if (!code || *code == ErrorCode::mismatch) continue;
    // A peer that died or failed otherwise may never set it: the kernels give up, kLinkGrace after
    // the link was seen broken (a kernel about to find a mismatch of that peer's, which then exited,
    // finds it first).
    const auto now = Clock::now().time_since_epoch().count();
    auto seen = broken_seen_.load();
    if (seen == 0 && broken_seen_.compare_exchange_strong(seen, now)) seen = now;
    if (Clock::duration(now - seen) < kLinkGrace) return;
    int none = -1;
    if (broken_peer_.compare_exchange_strong(none, q)) abort_kernels();
    return;
  }
}

template <Transport T>
void KernelPath<T>::drive(const chorus::detail::RequestState& r, Clock::time_point deadline) {
  // Spin first (a kernel of a few microseconds is seen at once), then sleep in short naps; the
  // links are looked at every millisecond or so.
  auto next_watch = Clock::now();
  for (int polls = 0; !r.done(); ++polls) {
    reap();
    if (r.done()) return;
    const auto now = Clock::now();
    if (now >= deadline) return;
    if (now >= next_watch) {
      watch_links();
      next_watch = now + std::chrono::milliseconds(1);
    }
    if (polls < 2000)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(polls < 4000 ? 20 : 200));
  }
}

template <Transport T>
void KernelPath<T>::drive_until(bool (*ready)(const void*), const void* ctx, Clock::time_point deadline) {
  while (!ready(ctx) && Clock::now() < deadline) {
    reap();
    std::this_thread::yield();
  }
}

template <Transport T>
void KernelPath<T>::on_timeout(const Error& e) {
  {
    std::lock_guard lk(mu_);
    if (!failure_) failure_ = e;
  }
  abort_kernels();
}

template <Transport T>
void KernelPath<T>::abort_kernels(const Error* why) {
  if (why != nullptr) {
    std::lock_guard lk(mu_);
    if (!failure_) failure_ = *why;
  }
  if (abort_ == nullptr) return;
  std::atomic_ref<std::uint32_t>(*abort_).store(1, std::memory_order_release);
  try {
    rt_.copy(mine_ + device::area::kAbortOffset, one_, sizeof(std::uint32_t), stream_);  // the peers' kernels see it
  } catch (const Error&) {  // the stream failed: the kernels give up on their own abort word anyway
  }
}

template <Transport T>
bool KernelPath<T>::settle(std::chrono::milliseconds bound) {
  const auto deadline = Clock::now() + bound;
  for (int polls = 0;; ++polls) {
    if (reap()) return true;
    if (Clock::now() >= deadline) return false;
    if (polls % 64 == 63) watch_links();
    std::this_thread::sleep_for(std::chrono::microseconds(polls < 100 ? 10 : 200));
  }
}

template <Transport T>
void KernelPath<T>::release(Store* store, const std::string& key, bool failed, std::chrono::milliseconds bound) {
  if (mine_ == nullptr) return;
  const bool settled = settle(bound);
  if (!settled) {  // a peer that never came: the kernels give up now, before their memory goes
    abort_kernels();
    (void)settle(std::chrono::seconds(2));
  }
  bool quiet = false;
  if (settled && !failed && store != nullptr && !failure()) {
    // Every peer's kernels are over once it says so: then none reads or writes this area.
    try {
      store->set(key + "/bye/" + std::to_string(g_.rank), "1");
      std::vector<std::string> keys;
      for (int q = 0; q < g_.size(); ++q)
        if (q != g_.rank) keys.push_back(key + "/bye/" + std::to_string(q));
      store->wait(keys, bound);
      quiet = true;
    } catch (const Error&) {  // a peer left without a word: leave the area to the process
    }
  }
  try {
    close_peers();
    if (quiet) rt_.free_device(mine_);
  } catch (const Error&) {  // the device failed; what is left goes with the process
  }
  mine_ = nullptr;
}

template <Transport T>
void KernelPath<T>::close_peers() {
  for (std::size_t q = 0; q < opened_.size(); ++q)
    if (opened_[q]) {
      opened_[q] = false;
      rt_.ipc_close(areas_[q]);
    }
}

}  // namespace chorus::algo
