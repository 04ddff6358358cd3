// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// device::CountingRuntime: a device::Runtime that forwards every call to another one and counts
/// what makes a device collective slow, so that tests pin budgets per call without a GPU (over
/// SimRuntime) and the GPU bundle reports the same counts over CudaRuntime.
///
/// ```cpp
/// chorus::device::SimRuntime sim;
/// chorus::device::CountingRuntime rt(sim);        // one per rank; ranks as threads share `sim`
/// comm.set_device_runtime(&rt);
/// const auto before = rt.counts();
/// comm.all_reduce(d_in, d_out, n, dt, op, stream).wait();
/// const auto call = rt.counts() - before;         // call.launches, call.host_waits, ...
/// ```
///
/// What it counts (RuntimeCounts):
/// * launches: kernels (reduce, reduce_many, finalize_avg, wait_flag, write_value, wait_value,
///   the collective kernel);
/// * copies and copy_bytes (cudaMemcpyAsync), fills;
/// * host_waits: synchronize() of a stream or event, and query() that found the work not done
///   (a poll of a wait);
/// * round_trips: host round trips between ranks the library reported (note_round_trip);
/// * cross_process_spins: device waits on memory of another process (mapped by ipc_open): a
///   wait_value on such a word, and each wait of a collective kernel on a peer whose area is
///   mapped so (each barrier or LL exchange, per peer);
/// * traffic_bytes: device-memory bytes read plus written: a device-to-device copy twice its bytes,
///   a copy between host and device once; a reduction its inputs and output; the collective kernel
///   kernel_traffic_bytes (device/collective.hpp).
/// context() is the inner runtime's: ranks as threads may each have a CountingRuntime over one
/// runtime and still address each other's memory.
///
/// Thread safety: as the inner runtime's; the counters are atomic.

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <mutex>
#include <string>

#include "chorus/device/collective.hpp"
#include "chorus/device/runtime.hpp"

namespace chorus::device {

struct RuntimeCounts {
  std::uint64_t launches = 0;
  std::uint64_t copies = 0;
  std::uint64_t copy_bytes = 0;
  std::uint64_t fills = 0;
  std::uint64_t host_waits = 0;
  std::uint64_t round_trips = 0;
  std::uint64_t cross_process_spins = 0;
  std::uint64_t traffic_bytes = 0;

  friend RuntimeCounts operator-(RuntimeCounts a, const RuntimeCounts& b) {
    a.launches -= b.launches;
    a.copies -= b.copies;
    a.copy_bytes -= b.copy_bytes;
    a.fills -= b.fills;
    a.host_waits -= b.host_waits;
    a.round_trips -= b.round_trips;
    a.cross_process_spins -= b.cross_process_spins;
    a.traffic_bytes -= b.traffic_bytes;
    return a;
  }
  /// "launches 1, copies 0 (0 B), host waits 0, round trips 0, cross-process spins 0, traffic 2097152 B"
  std::string to_string() const {
    return "launches " + std::to_string(launches) + ", copies " + std::to_string(copies) + " (" + std::to_string(copy_bytes) +
           " B), host waits " + std::to_string(host_waits) + ", round trips " + std::to_string(round_trips) +
           ", cross-process spins " + std::to_string(cross_process_spins) + ", traffic " + std::to_string(traffic_bytes) + " B";
  }
};

class CountingRuntime final : public Runtime {
 public:
  explicit CountingRuntime(Runtime& inner) : in_(inner) {}

  /// What was counted so far.
  RuntimeCounts counts() const {
    RuntimeCounts c;
    c.launches = launches_.load();
    c.copies = copies_.load();
    c.copy_bytes = copy_bytes_.load();
    c.fills = fills_.load();
    c.host_waits = host_waits_.load();
    c.round_trips = round_trips_.load();
    c.cross_process_spins = spins_.load();
    c.traffic_bytes = traffic_.load();
    return c;
  }
  Runtime& inner() noexcept { return in_; }

  std::string_view name() const noexcept override { return in_.name(); }
  int device_count() override { return in_.device_count(); }
  void set_device(int device) override { in_.set_device(device); }
  int current_device() override { return in_.current_device(); }
  MemoryKind kind_of(const void* p) override { return in_.kind_of(p); }
  void* alloc_device(std::size_t bytes) override {
    void* p = in_.alloc_device(bytes);
    std::lock_guard lk(mu_);
    bases_[reinterpret_cast<std::uintptr_t>(p)] = false;
    return p;
  }
  void free_device(void* p) override {
    in_.free_device(p);
    std::lock_guard lk(mu_);
    bases_.erase(reinterpret_cast<std::uintptr_t>(p));
  }
  void* alloc_device_async(std::size_t bytes, Stream s) override {
    void* p = in_.alloc_device_async(bytes, s);
    std::lock_guard lk(mu_);
    bases_[reinterpret_cast<std::uintptr_t>(p)] = false;
    return p;
  }
  void free_device_async(void* p, Stream s) override {
    in_.free_device_async(p, s);
    std::lock_guard lk(mu_);
    bases_.erase(reinterpret_cast<std::uintptr_t>(p));
  }
  void* alloc_pinned(std::size_t bytes) override { return in_.alloc_pinned(bytes); }
  void free_pinned(void* p) override { in_.free_pinned(p); }
  void* device_address(void* p) override { return in_.device_address(p); }
  bool can_access_peer(int device, int peer_device) override { return in_.can_access_peer(device, peer_device); }
  IpcHandle ipc_export(void* base) override { return in_.ipc_export(base); }
  void* ipc_open(const IpcHandle& h) override {
    void* p = in_.ipc_open(h);
    std::lock_guard lk(mu_);
    bases_[reinterpret_cast<std::uintptr_t>(p)] = true;
    return p;
  }
  void ipc_close(void* p) override {
    {
      std::lock_guard lk(mu_);
      bases_.erase(reinterpret_cast<std::uintptr_t>(p));
    }
    in_.ipc_close(p);
  }
  void load_kernels() override { in_.load_kernels(); }
  Stream create_stream() override { return in_.create_stream(); }
  void destroy_stream(Stream s) override { in_.destroy_stream(s); }
  Event create_event(bool timing) override { return in_.create_event(timing); }
  void destroy_event(Event e) override { in_.destroy_event(e); }
  void record(Event e, Stream s) override { in_.record(e, s); }
  bool query(Event e) override {
    const bool done = in_.query(e);
    if (!done) ++host_waits_;
    return done;
  }
  void synchronize(Event e) override {
    ++host_waits_;
    in_.synchronize(e);
  }
  void synchronize(Stream s) override {
    ++host_waits_;
    in_.synchronize(s);
  }
  void wait(Stream s, Event e) override { in_.wait(s, e); }
  float elapsed_ms(Event start, Event end) override { return in_.elapsed_ms(start, end); }

  void copy(void* dst, const void* src, std::size_t bytes, Stream s) override {
    in_.copy(dst, src, bytes, s);
    if (bytes == 0) return;
    ++copies_;
    copy_bytes_ += bytes;
    const int device_sides = (in_.kind_of(dst) == MemoryKind::device) + (in_.kind_of(src) == MemoryKind::device);
    traffic_ += bytes * static_cast<std::uint64_t>(device_sides);
  }
  void fill(void* dst, int byte, std::size_t bytes, Stream s) override {
    in_.fill(dst, byte, bytes, s);
    if (bytes == 0) return;
    ++fills_;
    traffic_ += bytes;
  }
  void reduce(ReduceOp op, DataType dt, void* out, const void* a, const void* b, std::size_t count, Stream s) override {
    in_.reduce(op, dt, out, a, b, count, s);
    if (count == 0) return;
    ++launches_;
    traffic_ += 3 * count * size_of(dt);
  }
  void reduce_many(ReduceOp op, DataType dt, void* out, const void* const* srcs, int n, std::size_t count,
                   Stream s) override {
    in_.reduce_many(op, dt, out, srcs, n, count, s);
    if (count == 0) return;
    ++launches_;
    traffic_ += static_cast<std::uint64_t>(n + 1) * count * size_of(dt);
  }
  void finalize_avg(DataType dt, void* data, std::size_t count, int world_size, Stream s) override {
    in_.finalize_avg(dt, data, count, world_size, s);
    if (count == 0) return;
    ++launches_;
    traffic_ += 2 * count * size_of(dt);
  }
  void premul(DataType dt, void* out, const void* in, std::size_t count, const void* scalar, bool scalar_on_device,
              Stream s) override {
    in_.premul(dt, out, in, count, scalar, scalar_on_device, s);
    if (count == 0) return;
    ++launches_;
    traffic_ += 2 * count * size_of(dt);
  }
  void wait_flag(Stream s, const std::uint32_t* flag, std::uint64_t timeout_ns) override {
    in_.wait_flag(s, flag, timeout_ns);
    ++launches_;
  }
  void write_value(Stream s, std::uint64_t* word, std::uint64_t value) override {
    in_.write_value(s, word, value);
    ++launches_;
  }
  void wait_value(Stream s, const std::uint64_t* word, std::uint64_t value, std::uint32_t* abort, std::uint32_t on_timeout,
                  std::uint64_t timeout_ns) override {
    in_.wait_value(s, word, value, abort, on_timeout, timeout_ns);
    ++launches_;
    if (imported(word)) ++spins_;
  }
  void launch_collective(const CollectiveLaunch& a, Stream s) override {
    in_.launch_collective(a, s);
    ++launches_;
    traffic_ += kernel_traffic_bytes(a);
    std::uint64_t waits = 0;
    const std::uint64_t per_peer = a.protocol == KernelProtocol::ll ? 1 : kernel_barriers(a.protocol, a.count, a.chunk);
    for (int q = 0; q < a.ranks; ++q)
      if (q != a.rank && imported(a.areas[q])) waits += per_peer;
    spins_ += waits;
  }
  unsigned collective_blocks(int sharing) override { return in_.collective_blocks(sharing); }
  const void* context() const noexcept override { return in_.context(); }
  void note_round_trip() noexcept override { ++round_trips_; }
  DmabufExport export_dmabuf(void* p, std::size_t bytes) override { return in_.export_dmabuf(p, bytes); }

 private:
  /// Whether p lies in memory ipc_open mapped: the nearest allocation or mapping that starts at or
  /// below it is a mapping (sizes are not known here; callers pass words inside one of them).
  bool imported(const void* p) const {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    std::lock_guard lk(mu_);
    auto it = bases_.upper_bound(a);
    return it != bases_.begin() && std::prev(it)->second;
  }

  Runtime& in_;
  mutable std::mutex mu_;
  std::map<std::uintptr_t, bool> bases_;  ///< allocations (false) and ipc_open's mappings (true) made here
  std::atomic<std::uint64_t> launches_{0}, copies_{0}, copy_bytes_{0}, fills_{0}, host_waits_{0}, round_trips_{0},
      spins_{0}, traffic_{0};
};

}  // namespace chorus::device
