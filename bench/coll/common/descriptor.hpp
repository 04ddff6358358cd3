// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// What a *_perf program tells the shared driver about its collective (nccl-tests' `struct
/// testColl`): one small struct of static members per collective, checked by the concept below,
/// and handed to the driver as a `Collective` (describe<D>()).
///
///   struct AllReduce {
///     static constexpr std::string_view kName = "all_reduce";        // -> "all_reduce_perf"
///     static constexpr std::optional<algo::CollectiveKind> kKind = algo::CollectiveKind::all_reduce;
///     static constexpr bool kReduces = true;        // loops over -o, prints the op
///     static constexpr bool kRooted = false;        // loops over -r, prints the root
///     static constexpr bool kInPlaceChecked = true; // false: in place is timed, #wrong is N/A
///     static Layout layout(std::size_t count, int n);          // buffers, from size / typesize
///     static double algbw_elements(const Layout& l, int n);   // elements algbw counts
///     static double bus_factor(int n);                         // busbw = algbw * this
///     static Expect expect(const Layout& l, int rank, int n, int root, std::size_t j);
///     static void run(Comm& comm, const Call& call, std::vector<Request>& pending);
///   };
///
/// Every rank's input is the same function of (seed, rank, index) (bench/coll/common/data.hpp);
/// `expect` says where output element j comes from, which is all the checker needs.

#include <concepts>
#include <cstddef>
#include <cstring>
#include <optional>
#include <string_view>
#include <vector>

#include "chorus/algo/descriptor.hpp"
#include "chorus/chorus.hpp"
#include "chorus/transport/inproc/transport.hpp"
#include "chorus/device/runtime.hpp"

namespace chorus::bench {

using Comm = Communicator<DefaultTransport>;

/// The buffers of one call, in elements, for a row of `size` bytes (nccl-tests getCollByteCount).
struct Layout {
  std::size_t send = 0;           ///< elements of the send buffer
  std::size_t recv = 0;           ///< elements of the receive buffer
  std::size_t count = 0;          ///< the count the collective is called with (the "count" column)
  std::size_t send_in_place = 0;  ///< in place, the input starts at recv + rank * send_in_place
  std::size_t recv_in_place = 0;  ///< in place, the output starts at recv + rank * recv_in_place
};

/// Where one output element comes from.
struct Expect {
  enum class Kind { copy, reduce, none };
  Kind kind = Kind::none;
  int rank = 0;           ///< copy: the rank whose input it is
  std::size_t index = 0;  ///< copy: the index in that rank's input; reduce: the index on every rank

  static constexpr Expect copy(int rank, std::size_t index) { return {Kind::copy, rank, index}; }
  static constexpr Expect reduce(std::size_t index) { return {Kind::reduce, 0, index}; }
  static constexpr Expect none() { return {}; }
};

/// One call of the collective: where the input and output are, and its parameters.
struct Call {
  const std::byte* in = nullptr;
  std::byte* out = nullptr;
  Layout layout;
  DataType dtype = DataType::float32;
  ReduceOp op = ReduceOp::sum;
  int root = 0;
  int rank = 0;
  int size = 1;
  bool blocking = false;  ///< -z: through the blocking API (as MPI's calls are timed), else *_async
  /// The device runtime where the buffers are device memory (-g 1), else null: the host must not
  /// touch them itself (copy() below does it through the runtime).
  device::Runtime* rt = nullptr;
  /// The rank's own stream, where it has one (device buffers, ranks as threads: --transport
  /// inproc), else null: the calls then go to the default stream through the API without one.
  const device::Stream* stream = nullptr;

  std::size_t bytes(std::size_t elements) const { return elements * size_of(dtype); }
  /// Copies n bytes between this call's buffers: a memcpy, or through the device runtime where
  /// they are device memory: on the rank's stream after the call, or on the legacy default
  /// stream, waited for.
  void copy(std::byte* dst, const std::byte* src, std::size_t n) const {
    if (n == 0) return;
    if (!rt) return void(std::memcpy(dst, src, n));
    if (stream) return rt->copy(dst, src, n, *stream);
    rt->copy(dst, src, n, device::Stream{});
    rt->synchronize(device::Stream{});
  }
};

/// Issues one call of a descriptor's run(): through the blocking API when the run is blocking
/// (-z), else posted through *_async with its request kept in `pending`.
template <class Blocking, class Async>
void issue(const Call& c, std::vector<Request>& pending, Blocking&& blocking, Async&& async) {
  if (c.blocking)
    blocking();
  else
    pending.push_back(async());
}

/// Ranks as threads of one process (--transport inproc).
using ThreadComm = Communicator<inproc::Transport>;

template <class D>
concept CollectiveDescriptor = requires(const Layout& l, int n, std::size_t j, Comm& comm, ThreadComm& tcomm, const Call& call,
                                        std::vector<Request>& pending) {
  { D::kName } -> std::convertible_to<std::string_view>;
  { D::kKind } -> std::convertible_to<std::optional<algo::CollectiveKind>>;
  { D::kReduces } -> std::convertible_to<bool>;
  { D::kRooted } -> std::convertible_to<bool>;
  { D::kInPlaceChecked } -> std::convertible_to<bool>;
  { D::layout(j, n) } -> std::same_as<Layout>;
  { D::algbw_elements(l, n) } -> std::convertible_to<double>;
  { D::bus_factor(n) } -> std::convertible_to<double>;
  { D::expect(l, n, n, n, j) } -> std::same_as<Expect>;
  D::run(comm, call, pending);
  D::run(tcomm, call, pending);
};

/// A descriptor as the driver uses it: the same members, as values and function pointers.
struct Collective {
  std::string_view name;
  std::optional<algo::CollectiveKind> kind;
  bool reduces = false;
  bool rooted = false;
  bool in_place_checked = false;
  Layout (*layout)(std::size_t count, int n) = nullptr;
  double (*algbw_elements)(const Layout& l, int n) = nullptr;
  double (*bus_factor)(int n) = nullptr;
  Expect (*expect)(const Layout& l, int rank, int n, int root, std::size_t j) = nullptr;
  void (*run)(Comm& comm, const Call& call, std::vector<Request>& pending) = nullptr;
  void (*run_threads)(ThreadComm& comm, const Call& call, std::vector<Request>& pending) = nullptr;
};

template <CollectiveDescriptor D>
constexpr Collective describe() {
  return {D::kName,   D::kKind,           D::kReduces,    D::kRooted, D::kInPlaceChecked,
          &D::layout, &D::algbw_elements, &D::bus_factor, &D::expect, &D::template run<Comm>,
          &D::template run<ThreadComm>};
}

}  // namespace chorus::bench
