// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// GradientSynchronizer: averages gradients over the ranks in buckets whose all-reduces start
/// while the backward pass is still running (the scheme of PyTorch DDP's Reducer).
///
///   chorus::sgd::GradientSynchronizer sync(comm, model.gradient_tensors());   // registration order
///   for (...) {
///     model.forward(batch);
///     model.backward(batch, [&](std::size_t tensor) { sync.mark_ready(tensor); });  // last first
///     sync.finish();               // waits, and writes the averaged gradients back
///     optimizer.step();
///   }
///   { auto guard = sync.no_sync(); model.forward_backward(micro_batch); }  // accumulate locally
///
/// Buckets. The tensors are grouped in reverse registration order (the order in which backward
/// produces them): a bucket takes tensors until it holds at least `bucket_bytes` bytes on the wire
/// (SyncOptions::bucket_bytes, else CHORUS_BUCKET_BYTES, else 25 MiB), so a tensor larger than
/// that gets a bucket of its own. mark_ready(t) copies tensor t into its bucket's flat buffer;
/// when the bucket's last tensor arrives, its asynchronous all-reduce starts, and the backward
/// pass goes on while it runs. Buckets start in bucket order whatever order the tensors arrive
/// in, so every rank issues the same collectives in the same order (a bucket that fills early
/// waits for the ones before it). finish() marks the tensors not marked yet, waits for every
/// bucket and writes the averages back into the gradient tensors.
///
/// Compression. With Compression::float16 or bfloat16 the buckets travel and are summed in that
/// 2-byte type: each rank divides its gradient by size() in the gradient type (float32 "master"
/// gradients), rounds it to the wire type, the ranks sum in the wire type, and finish() widens
/// the result. Half the bytes of float32; the error is that of rounding P addends and P-1 partial
/// sums to the wire type (unit roundoff 2^-11 for float16, 2^-8 for bfloat16; float16 also
/// loses magnitudes below 2^-24 and overflows beyond 65504). Without compression the wire type is
/// the gradient type and the result is ReduceOp::avg's, the same as average_gradients'.
///
/// no_sync(): while the returned guard lives, mark_ready() and finish() do nothing, so gradients
/// accumulate in the caller's tensors over several backward passes; the first step after the
/// guard is gone averages the accumulated sums (like DDP's no_sync).
///
/// Contracts. One thread calls mark_ready/finish (not thread-safe). The gradient tensors must
/// stay valid as long as the synchronizer; a tensor may be changed again once it is marked ready
/// (it was copied), and finish() overwrites it. Every rank registers the same shapes and calls
/// finish() once per synchronised step. The destructor waits for buckets still in flight.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "chorus/core/error.hpp"
#include "chorus/core/request.hpp"
#include "chorus/core/types.hpp"
#include "chorus/detail/env.hpp"
#include "chorus/sgd/parameters.hpp"

namespace chorus::sgd {

/// The type in which gradients travel and are summed.
enum class Compression { none, float16, bfloat16 };

/// "none", "float16", "bfloat16".
constexpr std::string_view to_string(Compression c) noexcept {
  switch (c) {
    case Compression::none: return "none";
    case Compression::float16: return "float16";
    case Compression::bfloat16: return "bfloat16";
  }
  return "unknown";
}

/// 25 MiB, PyTorch DDP's default bucket_cap_mb.
inline constexpr std::size_t kDefaultBucketBytes = std::size_t{25} << 20;

/// CHORUS_BUCKET_BYTES (bytes, K/M/G suffixes) or kDefaultBucketBytes; a value that does not
/// parse, or 0, is an invalid_argument error naming the variable.
inline std::size_t bucket_bytes_from_env() {
  auto v = chorus::detail::env_string("CHORUS_BUCKET_BYTES");
  if (!v) return kDefaultBucketBytes;
  const auto bytes = chorus::detail::parse_bytes(*v, "CHORUS_BUCKET_BYTES");
  if (bytes == 0) throw Error(ErrorCode::invalid_argument, "CHORUS_BUCKET_BYTES='" + *v + "' must be positive");
  return static_cast<std::size_t>(bytes);
}

struct SyncOptions {
  /// Bucket size on the wire in bytes; 0: CHORUS_BUCKET_BYTES, else 25 MiB.
  std::size_t bucket_bytes = 0;
  Compression compression = Compression::none;
};

template <Collectives Comm, GradientElement G = float>
class GradientSynchronizer {
 public:
  using element_type = G;

  /// What the last synchronised step cost this rank (reset by each finish()).
  struct StepStats {
    double mark_seconds = 0;          ///< inside mark_ready: copying into buckets, starting them
    double finish_seconds = 0;        ///< inside finish: waiting for the buckets, copying back
    std::size_t buckets = 0;          ///< all-reduces of the step
    std::size_t started_early = 0;    ///< of those, started by mark_ready (before finish)
  };

  /// Registers the gradient tensors, in the order the model declares them (backward produces them
  /// roughly in reverse). Not collective; no communication until the first bucket is full.
  template <Parameters P>
    requires std::same_as<parameters_element_t<P>, G>
  GradientSynchronizer(Comm& comm, P&& grads, SyncOptions options = {})
      : comm_(&comm), grads_(tensor_spans(grads)), options_(options) {
    if (options_.bucket_bytes == 0) options_.bucket_bytes = bucket_bytes_from_env();
    wire_dt_ = options_.compression == Compression::float16    ? DataType::float16
               : options_.compression == Compression::bfloat16 ? DataType::bfloat16
                                                               : data_type_of<G>;
    build_buckets();
  }

  GradientSynchronizer(const GradientSynchronizer&) = delete;
  GradientSynchronizer& operator=(const GradientSynchronizer&) = delete;

  /// Waits for buckets still in flight (their buffers are ours); never throws.
  ~GradientSynchronizer() {
    for (auto& b : buckets_) {
      try {
        b.request.wait();
      } catch (...) {
      }
    }
  }

  /// Tensor `index` (registration order) holds its final gradient for this step. Starts its
  /// bucket's all-reduce when that completes the bucket (and the buckets before it have started).
  void mark_ready(std::size_t index) {
    if (index >= grads_.size())
      throw error(ErrorCode::invalid_argument, "mark_ready(" + std::to_string(index) + "): there are only " +
                                                   std::to_string(grads_.size()) + " tensors");
    if (no_sync_) return;
    const auto t0 = Clock::now();
    if (ready_[index])
      throw error(ErrorCode::invalid_argument,
                  "mark_ready(" + std::to_string(index) + "): tensor already marked ready in this step");
    mark(index);
    launch_full_buckets(/*early=*/true);
    stats_.mark_seconds += seconds_since(t0);
  }

  /// The same, naming the tensor by the span registered for it (same address and size).
  void mark_ready(std::span<const G> grad) {
    auto it = index_of_.find(grad.data());
    if (it != index_of_.end() && grads_[it->second].size() == grad.size()) return mark_ready(it->second);
    for (std::size_t i = 0; i < grads_.size(); ++i)  // empty tensors may share an address
      if (grads_[i].data() == grad.data() && grads_[i].size() == grad.size()) return mark_ready(i);
    throw error(ErrorCode::invalid_argument, "mark_ready: the span is not one of the registered gradient tensors");
  }

  /// Ends the step: marks the tensors not marked yet, waits for every bucket, writes the averages
  /// into the gradient tensors. Bitwise identical on every rank. Rethrows a bucket's error (after
  /// waiting for the others); the synchronizer is then ready for a new step.
  void finish() {
    if (no_sync_) return;
    const auto t0 = Clock::now();
    std::exception_ptr first;
    try {
      for (std::size_t i = 0; i < grads_.size(); ++i)
        if (!ready_[i]) mark(i);
      launch_full_buckets(/*early=*/false);
    } catch (...) {
      first = std::current_exception();  // still wait for the buckets already started
    }
    for (auto& b : buckets_) {
      try {
        b.request.wait();
      } catch (...) {
        if (!first) first = std::current_exception();
      }
      b.request = Request{};
    }
    if (!first) {
      for (auto& b : buckets_) unpack(b);
    }
    stats_.finish_seconds += seconds_since(t0);
    last_ = stats_;
    reset_step();
    if (first) std::rethrow_exception(first);
  }

  /// RAII guard of no_sync(); movable, restores synchronisation when destroyed.
  class NoSync {
   public:
    NoSync(NoSync&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;
    NoSync& operator=(NoSync&&) = delete;
    ~NoSync() {
      if (s_) s_->no_sync_ = false;
    }

   private:
    friend class GradientSynchronizer;
    explicit NoSync(GradientSynchronizer* s) : s_(s) {}
    GradientSynchronizer* s_;
  };

  /// Skips synchronisation while the guard lives (gradient accumulation). Throws
  /// invalid_argument in the middle of a step (some tensors marked, finish() not called) or when
  /// a guard already exists.
  [[nodiscard]] NoSync no_sync() {
    if (no_sync_) throw error(ErrorCode::invalid_argument, "no_sync(): already inside no_sync()");
    if (in_step_) throw error(ErrorCode::invalid_argument, "no_sync(): called in the middle of a step (before finish())");
    no_sync_ = true;
    return NoSync(this);
  }
  bool syncing() const { return !no_sync_; }

  /// The bucket layout: bucket b holds these tensors (indices in registration order), in the
  /// order they sit in its buffer.
  std::size_t bucket_count() const { return buckets_.size(); }
  std::span<const std::size_t> bucket_tensors(std::size_t b) const { return buckets_.at(b).tensors; }
  /// Elements (of the wire type) of bucket b.
  std::size_t bucket_elements(std::size_t b) const { return buckets_.at(b).count; }
  DataType wire_type() const { return wire_dt_; }
  const SyncOptions& options() const { return options_; }
  std::size_t tensor_count() const { return grads_.size(); }
  /// The cost of the last completed step.
  const StepStats& last_step() const { return last_; }

 private:
  using Clock = std::chrono::steady_clock;

  struct Bucket {
    std::vector<std::size_t> tensors;  ///< registration indices, in buffer order
    std::vector<std::size_t> offsets;  ///< element offset of each tensor in the buffer
    std::size_t count = 0;             ///< elements
    std::size_t pending = 0;           ///< tensors not yet marked in this step
    Request request;
    // The flat buffer, in the wire type: exactly one of these is sized.
    std::vector<G> same;
    std::vector<float16> f16;
    std::vector<bfloat16> bf16;
  };

  static double seconds_since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
  }
  Error error(ErrorCode code, const std::string& msg) const {
    return Error(code, ErrorContext{comm_->rank(), -1, "sgd::GradientSynchronizer"}, msg);
  }

  void build_buckets() {
    const std::size_t n = grads_.size();
    ready_.assign(n, false);
    where_.assign(n, {0, 0});
    index_of_.clear();
    for (std::size_t i = 0; i < n; ++i) index_of_.emplace(grads_[i].data(), i);
    const std::size_t wire_size = size_of(wire_dt_);
    Bucket cur;
    std::size_t cur_bytes = 0;
    auto close = [&] {
      buckets_.push_back(std::move(cur));
      cur = Bucket{};
      cur_bytes = 0;
    };
    for (std::size_t k = n; k-- > 0;) {  // reverse registration order
      where_[k] = {buckets_.size(), cur.tensors.size()};
      cur.tensors.push_back(k);
      cur.offsets.push_back(cur.count);
      cur.count += grads_[k].size();
      cur_bytes += grads_[k].size() * wire_size;
      if (cur_bytes >= options_.bucket_bytes) close();
    }
    if (!cur.tensors.empty()) close();
    for (auto& b : buckets_) {
      b.pending = b.tensors.size();
      if (wire_dt_ == DataType::float16 && !std::same_as<G, float16>) b.f16.resize(b.count);
      else if (wire_dt_ == DataType::bfloat16 && !std::same_as<G, bfloat16>) b.bf16.resize(b.count);
      else b.same.resize(b.count);
    }
  }

  /// Calls f(std::span<W>) with bucket b's buffer, W its wire type.
  template <class F>
  static void with_buffer(Bucket& b, F&& f) {
    if (!b.f16.empty()) f(std::span<float16>(b.f16));
    else if (!b.bf16.empty()) f(std::span<bfloat16>(b.bf16));
    else f(std::span<G>(b.same));
  }

  /// Copies tensor i into its bucket (pre-divided by size() and narrowed when compressing).
  void mark(std::size_t i) {
    in_step_ = true;
    ready_[i] = true;
    const std::size_t slot = where_[i].second;  // not a structured binding: lambdas capture it
    Bucket& b = buckets_[where_[i].first];
    const std::span<const G> g = grads_[i];
    with_buffer(b, [&]<class W>(std::span<W> buf) {
      W* out = buf.data() + b.offsets[slot];
      if constexpr (std::same_as<W, G>) {
        std::copy(g.begin(), g.end(), out);
      } else {
        const float p = static_cast<float>(comm_->size());
        for (std::size_t j = 0; j < g.size(); ++j) out[j] = W(static_cast<float>(g[j]) / p);
      }
    });
    --b.pending;
  }

  /// Starts, in bucket order, every bucket that is complete and whose predecessors have started.
  void launch_full_buckets(bool early) {
    while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) {
      Bucket& b = buckets_[next_launch_++];
      if (b.count == 0) continue;  // only empty tensors: the same on every rank, nothing to send
      ++stats_.buckets;
      if (early) ++stats_.started_early;
      with_buffer(b, [&]<class W>(std::span<W> buf) {
        // Uncompressed: avg (sum, then one division). Compressed: the addends are pre-divided.
        const ReduceOp op = std::same_as<W, G> ? ReduceOp::avg : ReduceOp::sum;
        b.request = comm_->all_reduce_async(buf.data(), buf.data(), buf.size(), data_type_of<W>, op);
      });
    }
  }

  /// Writes bucket b's averages back into its tensors.
  void unpack(Bucket& b) {
    with_buffer(b, [&]<class W>(std::span<W> buf) {
      for (std::size_t s = 0; s < b.tensors.size(); ++s) {
        const std::span<G> g = grads_[b.tensors[s]];
        const W* in = buf.data() + b.offsets[s];
        if constexpr (std::same_as<W, G>) {
          std::copy(in, in + g.size(), g.begin());
        } else {
          for (std::size_t j = 0; j < g.size(); ++j) g[j] = G(static_cast<float>(in[j]));
        }
      }
    });
  }

  void reset_step() {
    std::fill(ready_.begin(), ready_.end(), false);
    for (auto& b : buckets_) {
      b.pending = b.tensors.size();
    }
    next_launch_ = 0;
    in_step_ = false;
    stats_ = StepStats{};
  }

  Comm* comm_;
  std::vector<std::span<G>> grads_;
  SyncOptions options_;
  DataType wire_dt_ = data_type_of<G>;
  std::vector<Bucket> buckets_;
  std::vector<bool> ready_;                                    ///< per tensor, this step
  std::vector<std::pair<std::size_t, std::size_t>> where_;     ///< per tensor: bucket, slot
  std::unordered_map<const G*, std::size_t> index_of_;         ///< span address -> tensor
  std::size_t next_launch_ = 0;                                ///< first bucket not started
  bool in_step_ = false;
  bool no_sync_ = false;
  StepStats stats_;
  StepStats last_;
};

template <Collectives Comm, Parameters P>
GradientSynchronizer(Comm&, P&&, SyncOptions = {}) -> GradientSynchronizer<Comm, parameters_element_t<P>>;

}  // namespace chorus::sgd
