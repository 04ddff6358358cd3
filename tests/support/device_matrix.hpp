// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// The device-buffer collective matrix, shared by the simulated-runtime tests (tests/device) and the
/// GPU suite (tests/cuda): every collective x the twelve dtypes (six under ASan, four under TSan:
/// sanitized.hpp) x every op that applies x counts {0, 1, 13, 1000} and one large count, roots other than 0,
/// in place and out of place. Every call runs twice on the same communicator with the same inputs: on host
/// buffers (the host path) and on device buffers on a stream; the device result must equal the host result
/// bit for bit, and the host result the reference: support/fill.hpp's for all_reduce and reduce_scatter
/// (whose inputs make every reduction order give the same bits), the other ranks' inputs for the
/// data-movement collectives.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "chorus/communicator.hpp"
#include "chorus/device/runtime.hpp"
#include "support/fill.hpp"
#include "support/sanitized.hpp"
#include "support/spawn.hpp"

namespace chorus::test::device_matrix {

using chorus::DataType;
using chorus::ReduceOp;
using chorus::device::Stream;
using chorus::test::expect;
using Bytes = std::vector<std::byte>;

enum class Coll { all_reduce, broadcast, reduce, scatter, gather, all_gather, reduce_scatter, all_to_all };
constexpr const char* name(Coll c) {
  constexpr const char* names[] = {"all_reduce", "broadcast", "reduce", "scatter", "gather", "all_gather",
                                   "reduce_scatter", "all_to_all"};
  return names[static_cast<int>(c)];
}

/// `len` elements of rank `rank`'s reduction input (fill.hpp: exact in any order) or pattern.
inline Bytes make_input(DataType dt, std::uint64_t seed, int world, int rank, std::size_t len, ReduceOp op, bool reduction) {
  return chorus::dispatch(dt, [&]<class T>(std::type_identity<T>) {
    Bytes b(len * sizeof(T));
    for (std::size_t i = 0; i < len; ++i) {
      const T v = reduction ? chorus::test::input<T>(seed, world, rank, i, op) : chorus::test::pattern<T>(seed, rank, i);
      std::memcpy(b.data() + i * sizeof(T), &v, sizeof(T));
    }
    return b;
  });
}

/// fill.hpp's all_reduce reference for `len` elements.
inline Bytes reference_all_reduce(DataType dt, std::uint64_t seed, int world, std::size_t len, ReduceOp op) {
  return chorus::dispatch(dt, [&]<class T>(std::type_identity<T>) {
    Bytes b(len * sizeof(T));
    for (std::size_t i = 0; i < len; ++i) {
      const T v = chorus::test::expected_all_reduce<T>(seed, world, i, op);
      std::memcpy(b.data() + i * sizeof(T), &v, sizeof(T));
    }
    return b;
  });
}

/// Index of the first differing byte's element, or -1.
inline long first_difference(const Bytes& a, const Bytes& b, std::size_t elem) {
  if (a.size() != b.size()) return 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) return static_cast<long>(i / elem);
  return -1;
}

/// A buffer in the simulated device memory, filled from (and read back into) host bytes.
class DeviceBuffer {
 public:
  DeviceBuffer(chorus::device::Runtime& rt, const Bytes& init) : rt_(rt), n_(init.size()) {
    p_ = static_cast<std::byte*>(rt_.alloc_device(n_));
    if (n_ != 0) rt_.copy(p_, init.data(), n_, nullptr);
    rt_.synchronize(Stream{});
  }
  ~DeviceBuffer() { rt_.free_device(p_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  std::byte* data() const { return p_; }
  /// The contents, read once `s` has done its work.
  Bytes read(Stream s) const {
    rt_.synchronize(s);
    Bytes b(n_);
    if (n_ != 0) rt_.copy(b.data(), p_, n_, s);
    rt_.synchronize(s);
    return b;
  }

 private:
  chorus::device::Runtime& rt_;
  std::size_t n_;
  std::byte* p_;
};

/// Runs one collective on host buffers and on device buffers (on `stream`) and compares.
template <class Comm>
struct Runner {
  Comm& comm;
  chorus::device::Runtime& rt;
  Stream stream;
  std::string where;
  std::uint64_t call = 0;
  /// The communicator of the host-path reference calls, where not `comm` (one that forces an
  /// algorithm of device buffers only, which host calls refuse).
  Comm* host_comm = nullptr;
  /// Ranks as threads of one process, on one device: a host barrier after each call, before its
  /// buffers are freed, and one after (freeing waits for the whole device, as cudaFree does, and a
  /// peer's work of the next call, its kernel or a stream held for a staged call, may wait for this
  /// rank: docs/design.md, "Ranks as threads on one device").
  bool barrier_before_free = false;

  void run(Coll coll, DataType dt, std::size_t count, ReduceOp op, int root, bool in_place) {
    const int r = comm.rank(), n = comm.size();
    const std::size_t es = chorus::size_of(dt), total = count * static_cast<std::size_t>(n);
    const std::uint64_t seed = chorus::test::seed_of(call++, static_cast<int>(coll), dt, op, count, root, in_place);
    std::ostringstream os;
    os << name(coll) << ' ' << chorus::to_string(dt) << ' ' << chorus::to_string(op) << " count " << count << " root "
       << root << (in_place ? " in place " : " out of place ") << where << " rank " << r;
    const std::string what = os.str();
    const bool reduction = coll == Coll::all_reduce || coll == Coll::reduce || coll == Coll::reduce_scatter;

    // Sizes of in and out (elements), and which are one buffer.
    std::size_t in_len = count, out_len = count;
    switch (coll) {
      case Coll::all_reduce: case Coll::broadcast: case Coll::reduce: break;
      case Coll::scatter: in_len = r == root ? total : 0; break;
      case Coll::gather: out_len = r == root ? total : 0; break;
      case Coll::all_gather: out_len = total; break;
      case Coll::reduce_scatter: in_len = total; break;
      case Coll::all_to_all: in_len = out_len = total; break;
    }
    if (coll == Coll::broadcast) in_place = true;
    if (coll == Coll::all_to_all || coll == Coll::scatter || coll == Coll::gather || coll == Coll::all_gather ||
        coll == Coll::reduce_scatter)
      in_place = false;  // their in-place forms alias sub-ranges; the host matrix covers them
    const Bytes in = coll == Coll::broadcast
                         ? (r == root ? make_input(dt, seed, n, root, count, op, false) : make_input(dt, seed ^ 1, n, r, count, op, false))
                         : make_input(dt, seed, n, r, in_len, op, reduction);
    const Bytes garbage = make_input(dt, seed ^ 0xabcdef, n, r + 100, out_len, op, false);

    // 1. The host path.
    Bytes h_in = in, h_out = in_place ? Bytes{} : garbage;
    std::byte* hi = h_in.data();
    std::byte* ho = in_place ? h_in.data() : h_out.data();
    start(coll, hi, ho, count, dt, op, root, /*device=*/false);
    const Bytes& host_result = in_place ? h_in : h_out;

    // 2. The device path, on the stream; read back after the stream has done it.
    Bytes device_result;
    {
      DeviceBuffer d_in(rt, in), d_out(rt, in_place ? Bytes{} : garbage);
      std::byte* di = d_in.data();
      std::byte* dout = in_place ? d_in.data() : d_out.data();
      chorus::Request req = start(coll, di, dout, count, dt, op, root, /*device=*/true);
      device_result = (in_place ? d_in : d_out).read(stream);
      req.wait();
      if (barrier_before_free) comm.barrier();
    }
    if (barrier_before_free) comm.barrier();  // and no rank's next call starts while one frees

    if (coll == Coll::all_reduce || coll == Coll::reduce_scatter || (coll == Coll::reduce && r == root)) {
      // The host path against fill.hpp's reference first: a failure then says which path is wrong.
      const std::size_t base = coll == Coll::reduce_scatter ? static_cast<std::size_t>(r) * count : 0;
      Bytes want = reference_all_reduce(dt, seed, n, base + count, op);
      want.erase(want.begin(), want.begin() + static_cast<std::ptrdiff_t>(base * es));
      const long ref = first_difference(host_result, want, es);
      expect(ref < 0, what + ": the host result differs from the reference at element " + std::to_string(ref));
      const long dref = first_difference(device_result, want, es);
      expect(dref < 0, what + ": the device result differs from the reference at element " + std::to_string(dref));
    }
    if (Bytes want; movement_reference(coll, dt, seed, r, n, count, root, want)) {
      const long ref = first_difference(host_result, want, es);
      expect(ref < 0, what + ": the host result differs from the reference at element " + std::to_string(ref));
    }
    const long at = first_difference(device_result, host_result, es);
    expect(at < 0, what + ": the device result differs from the host result at element " + std::to_string(at));
  }

  /// What a data-movement collective (and reduce, at its root) must leave in rank r's output,
  /// built from the inputs every rank makes: false where there is nothing to check.
  static bool movement_reference(Coll coll, DataType dt, std::uint64_t seed, int r, int n, std::size_t count, int root,
                                 Bytes& want) {
    const std::size_t es = chorus::size_of(dt), total = count * static_cast<std::size_t>(n);
    auto block = [&](const Bytes& b, int i) {
      const auto at = b.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(i) * count * es);
      return Bytes(at, at + static_cast<std::ptrdiff_t>(count * es));
    };
    auto append = [&](const Bytes& b) { want.insert(want.end(), b.begin(), b.end()); };
    switch (coll) {
      case Coll::broadcast: want = make_input(dt, seed, n, root, count, ReduceOp::sum, false); return true;
      case Coll::scatter: want = block(make_input(dt, seed, n, root, total, ReduceOp::sum, false), r); return true;
      case Coll::gather:
        if (r != root) return false;
        for (int q = 0; q < n; ++q) append(make_input(dt, seed, n, q, count, ReduceOp::sum, false));
        return true;
      case Coll::all_gather:
        for (int q = 0; q < n; ++q) append(make_input(dt, seed, n, q, count, ReduceOp::sum, false));
        return true;
      case Coll::all_to_all:
        for (int q = 0; q < n; ++q) append(block(make_input(dt, seed, n, q, total, ReduceOp::sum, false), r));
        return true;
      default: return false;
    }
  }

  chorus::Request start(Coll coll, std::byte* in, std::byte* out, std::size_t count, DataType dt, ReduceOp op, int root,
                        bool device) {
    if (!device) {
      Comm& hc = host_comm ? *host_comm : comm;
      switch (coll) {
        case Coll::all_reduce: hc.all_reduce(in, out, count, dt, op); break;
        case Coll::broadcast: hc.broadcast(out, count, dt, root); break;
        case Coll::reduce: hc.reduce(in, out, count, dt, op, root); break;
        case Coll::scatter: hc.scatter(in, out, count, dt, root); break;
        case Coll::gather: hc.gather(in, out, count, dt, root); break;
        case Coll::all_gather: hc.all_gather(in, out, count, dt); break;
        case Coll::reduce_scatter: hc.reduce_scatter(in, out, count, dt, op); break;
        case Coll::all_to_all: hc.all_to_all(in, out, count, dt); break;
      }
      return {};
    }
    // Null pointers for the buffers a rank does not use (as the host path gets empty vectors).
    switch (coll) {
      case Coll::all_reduce: return comm.all_reduce(in, out, count, dt, op, stream);
      case Coll::broadcast: return comm.broadcast(out, count, dt, root, stream);
      case Coll::reduce: return comm.reduce(in, out, count, dt, op, root, stream);
      case Coll::scatter: return comm.scatter(in, out, count, dt, root, stream);
      case Coll::gather: return comm.gather(in, out, count, dt, root, stream);
      case Coll::all_gather: return comm.all_gather(in, out, count, dt, stream);
      case Coll::reduce_scatter: return comm.reduce_scatter(in, out, count, dt, op, stream);
      case Coll::all_to_all: return comm.all_to_all(in, out, count, dt, stream);
    }
    return {};
  }
};

/// The whole matrix on `comm` (slices of 512 bytes, so the small counts already pipeline), with
/// buffers of `rt`: the dtypes of this build (runs_dtype), or those of `only` where given.
template <class Comm>
void run_all(Comm& comm, chorus::device::Runtime& rt, const std::string& where, bool threads = false,
             std::span<const DataType> only = {}) {
  const int world = comm.size();
  comm.set_device_runtime(&rt);
  const Stream stream = rt.create_stream();
  Runner<Comm> run{comm, rt, stream, where};
  run.barrier_before_free = threads;
  const int root = world - 1;
  const std::size_t large = chorus::test::kSanitized ? 4099 : 40009;
  for (DataType dt : chorus::kAllDataTypes) {
    if (only.empty()
            ? !chorus::test::runs_dtype(dt)  // six of the twelve under ASan, four under TSan (sanitized.hpp)
            : std::find(only.begin(), only.end(), dt) == only.end())
      continue;
    for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{13}, std::size_t{1000}, large}) {
      if (count == large && dt != DataType::float32 && dt != DataType::bfloat16 && dt != DataType::int64) continue;
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max, ReduceOp::avg, ReduceOp::band,
                          ReduceOp::bor, ReduceOp::bxor}) {
        if (!chorus::is_valid_op(dt, op)) continue;
        if (count == large && op != ReduceOp::sum && op != ReduceOp::max) continue;
        for (bool in_place : {false, true}) run.run(Coll::all_reduce, dt, count, op, -1, in_place);
        run.run(Coll::reduce, dt, count, op, root, op == ReduceOp::min);
        run.run(Coll::reduce_scatter, dt, count, op, -1, false);
      }
      run.run(Coll::broadcast, dt, count, ReduceOp::sum, root, true);
      run.run(Coll::scatter, dt, count, ReduceOp::sum, world / 2, false);
      run.run(Coll::gather, dt, count, ReduceOp::sum, root, false);
      run.run(Coll::all_gather, dt, count, ReduceOp::sum, -1, false);
      run.run(Coll::all_to_all, dt, count, ReduceOp::sum, -1, false);
    }
  }
  comm.barrier();
  rt.destroy_stream(stream);
}

/// The matrix at one world size with ranks as processes (bounds in `p`): each rank makes its
/// runtime with make_runtime(rank), then a communicator of type Comm with slices of chunk_bytes,
/// and runs run_all.
template <class Comm, class MakeRuntime>
void run_in_processes(int world, std::string_view runtime_name, chorus::test::ProcessOptions p,
                      const MakeRuntime& make_runtime, std::size_t chunk_bytes = 512) {
  chorus::test::run_processes(
      world,
      [&](int rank, chorus::Options o) {
        const std::unique_ptr<chorus::device::Runtime> rt = make_runtime(rank);  // outlives comm
        o.chunk_bytes = chunk_bytes;
        Comm comm = Comm::create(o);
        std::ostringstream where;
        where << "(" << Comm::transport_type::kName << ", world " << world << ", " << runtime_name << ")";
        run_all(comm, *rt, where.str());
      },
      p);
}

}  // namespace chorus::test::device_matrix
