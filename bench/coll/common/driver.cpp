// SPDX-License-Identifier: BSD-3-Clause
/// The driver every *_perf program shares (nccl-tests' src/common.cu), compiled once into the
/// chorus_perf_driver library.
///
/// For each data type, op (reducing collectives) and root (rooted ones), in nccl-tests' order:
///   warm-up   -w calls of every size from -b to -e, doubling;
///   each row  for out-of-place, then in-place:
///             1. inputs written, one untimed call, a barrier;
///             2. -n x -m calls timed back to back (async; with -z through the blocking API, the
///                mode MPI's and Gloo's calls are timed in), over the same
///                buffers at offsets that walk through them (as nccl-tests does, against cache
///                effects); time = elapsed / calls, combined over ranks by -a (mean by default;
///                -C reports the time to post the calls instead, bandwidth stays as is);
///                algbw = bytes / time (1 GB = 1e9 B), busbw = algbw x the collective's factor;
///             3. -c checked calls: fresh inputs (a new seed), the output compared bit for bit
///                with the reference (data.hpp); #wrong = wrong elements summed over ranks.
/// Exit status 1 when any element was wrong (or a rank failed), else 0. Only rank 0 prints; the
/// other ranks' pid and host reach it through a gather.
///
/// Launch (launch.hpp): run plainly, the program starts --nranks local ranks of itself; under
/// torchrun, mpirun or srun it joins through env://, where the rendezvous finds the store
/// without MASTER_ADDR on one host (mpirun) or from Slurm's node list (srun).
///
/// Device buffers (-g 1, --device cuda|sim): send and receive buffers are in device memory, the
/// calls run on the default stream through the same API (the communicator finds the memory kind),
/// and the time is taken with timing events on that stream, as nccl-tests does; inputs are
/// written and outputs checked in host copies of the buffers, moved with the runtime's copies.
///
/// -R 1 registers the host send and receive buffers once (chorus::RegisteredMemory, where
/// nccl-tests calls ncclCommRegister), so rdma uses one registration of each instead of
/// registering the buffer of every large message: the mode perftest's figures are taken in.
///
/// Out-of-place and in-place buffers follow nccl-tests: in place, the input sits at
/// recv + rank * layout.send_in_place and the output at recv + rank * layout.recv_in_place.
/// Where chorus has no in-place form (all_to_all, send/recv), the in-place half is timed on
/// aliased buffers and its #wrong is N/A, as in nccl-tests.

#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <set>
#include <thread>
#include <type_traits>
#include <atomic>
#include <string>
#include <vector>

#include "chorus/algo/select.hpp"
#include "chorus/bootstrap/launch_env.hpp"
#include "chorus/registered_memory.hpp"
#include "chorus/testing/fake_verbs.hpp"  // CHORUS_IB_FAKE=<file> runs -t rdma on the fake verbs
#include "chorus/testing/sim_runtime.hpp"
#include "coll/common/data.hpp"
#include "coll/common/descriptor.hpp"
#include "coll/common/driver.hpp"
#include "coll/common/launch.hpp"
#include "coll/common/report.hpp"
#include "coll/common/settings.hpp"

namespace chorus::bench {
namespace {

void wait_all(std::vector<Request>& pending) {
  for (auto& r : pending) r.wait();
  pending.clear();
}

/// C: Comm (ranks as processes) or ThreadComm (ranks as threads, --transport inproc).
template <class C>
class Driver {
 public:
  /// `stream`: the rank's own stream for its device calls (ranks as threads), or null: the default.
  Driver(const Collective& d, C& comm, const Settings& s, std::string program, device::Runtime* rt,
         device::Stream stream = nullptr)
      : rt_(rt),
        stream_(stream),
        d_(d),
        comm_(comm),
        s_(s),
        rank_(comm.rank()),
        n_(comm.size()),
        report_(comm.rank() == 0, s, std::move(program)),
        capacity_(std::max<std::size_t>(s.max_bytes, 64)),
        send_(capacity_),
        recv_(capacity_) {
    if (s.persistent != 0 && !d.kind)
      throw chorus::Error(chorus::ErrorCode::invalid_argument, chorus::ErrorContext{rank_, -1, std::string(d.name) + "_perf"},
                          "--persistent 1: " + std::string(d.name) + " is not a collective (no persistent form)");
    if (s.local_register != 0 && !rt_) {
      reg_send_ = RegisteredMemory(send_);
      reg_recv_ = RegisteredMemory(recv_);
    }
    if (!rt_) return;
    dsend_ = static_cast<std::byte*>(rt_->alloc_device(capacity_));
    drecv_ = static_cast<std::byte*>(rt_->alloc_device(capacity_));
    t0_ = rt_->create_event(/*timing=*/true);
    t1_ = rt_->create_event(/*timing=*/true);
  }
  ~Driver() {
    if (!rt_) return;
    rt_->free_device(dsend_);
    rt_->free_device(drecv_);
    rt_->destroy_event(t0_);
    rt_->destroy_event(t1_);
  }
  Driver(const Driver&) = delete;
  Driver& operator=(const Driver&) = delete;

  int run() {
    report_.header(gather_ranks(), transport_name(), comm_.options().algorithm, comm_.options().timeout);
    if (rt_ && rank_ == 0) {
      const double gbps = device_copy_gbps();
      std::printf("# chorus: device-to-device copy on rank 0's device: %.2f GB/s (%zu bytes, median of 5; counting the "
                  "read and the write: %.2f GB/s), what busbw over cuda_ipc compares with\n",
                  gbps, capacity_, 2 * gbps);
    }
    report_.table_header();
    for (DataType dt : s_.types) {
      for (ReduceOp op : d_.reduces ? s_.ops : std::vector<ReduceOp>{ReduceOp::sum}) {
        const int first = !d_.rooted ? -1 : s_.root >= 0 ? s_.root : 0;
        const int last = !d_.rooted ? -1 : s_.root >= 0 ? s_.root : n_ - 1;
        for (int root = first; root <= last; ++root) time_test(dt, op, root);
      }
    }
    report_.footer(wrong_total_);
    comm_.barrier();
    return wrong_total_ == 0 ? 0 : 1;
  }

 private:
  /// The device's own copy bandwidth (bytes copied per second), device to device on a stream of
  /// its own, between the row buffers (the largest row's size), timed with the runtime's events:
  /// the median of 5 after one untimed copy.
  double device_copy_gbps() {
    const device::Stream s = rt_->create_stream();
    rt_->copy(drecv_, dsend_, capacity_, s);
    std::vector<double> gbps;
    for (int i = 0; i < 5; ++i) {
      rt_->record(t0_, s);
      rt_->copy(drecv_, dsend_, capacity_, s);
      rt_->record(t1_, s);
      rt_->synchronize(t1_);
      const double secs = std::max(1e-9, static_cast<double>(rt_->elapsed_ms(t0_, t1_)) * 1e-3);
      gbps.push_back(static_cast<double>(capacity_) / secs / 1e9);
    }
    rt_->destroy_stream(s);
    std::sort(gbps.begin(), gbps.end());
    return gbps[gbps.size() / 2];
  }

  /// How rank 0 reaches the others: "shm", "tcp" or "shm+tcp" (the hybrid transport picks per
  /// peer), else the transport's name.
  std::string transport_name() {
    auto& t = comm_.transport();
    if constexpr (requires(int p) { t.link_kind(p); }) {
      std::set<std::string_view> kinds;
      for (int p = 0; p < n_; ++p)
        if (p != rank_) kinds.insert(t.link_kind(p));
      std::string name;
      for (auto k : kinds) name += (name.empty() ? "" : "+") + std::string(k);
      if (!name.empty()) return name;
    }
    return std::string(C::transport_type::kName);
  }

  /// Every rank's pid, host name and local rank and size (the communicator's, and the launcher's
  /// where it says), gathered on rank 0 in fixed-size records: 5 int32 fields, then the name.
  std::vector<RankInfo> gather_ranks() {
    constexpr std::size_t kRecord = 256, kFields = 5, kName = kFields * sizeof(std::int32_t);
    std::array<std::uint8_t, kRecord> mine{};
    const auto launch = chorus::detect_launch();
    const std::array<std::int32_t, kFields> fields = {static_cast<std::int32_t>(::getpid()), comm_.local_rank(),
                                                      comm_.local_size(), launch ? launch->local_rank : -1,
                                                      launch ? launch->local_size : -1};
    std::memcpy(mine.data(), fields.data(), kName);
    ::gethostname(reinterpret_cast<char*>(mine.data()) + kName, kRecord - kName - 1);
    std::vector<std::uint8_t> all(rank_ == 0 ? kRecord * static_cast<std::size_t>(n_) : 0);
    comm_.gather(mine, all, 0);
    std::vector<RankInfo> ranks;
    for (int r = 0; rank_ == 0 && r < n_; ++r) {
      const std::uint8_t* rec = all.data() + kRecord * static_cast<std::size_t>(r);
      std::array<std::int32_t, kFields> f{};
      std::memcpy(f.data(), rec, kName);
      RankInfo info;
      info.rank = r;
      info.pid = f[0];
      info.local_rank = f[1];
      info.local_size = f[2];
      info.launcher_local_rank = f[3];
      info.launcher_local_size = f[4];
      if (launch) info.launcher = launch->source;
      const char* name = reinterpret_cast<const char*>(rec) + kName;
      info.host.assign(name, strnlen(name, kRecord - kName - 1));
      ranks.push_back(std::move(info));
    }
    return ranks;
  }

  /// The algorithm the communicator will run for this row (the same cost model, same inputs).
  std::string algorithm(const Layout& l, DataType dt) const {
    if (!d_.kind) return "p2p";
    if (n_ == 1) return "local";
    const algo::Choice c = comm_.planned(*d_.kind, l.count * size_of(dt));
    if (c.algorithm == algo::Algorithm::hierarchical) return c.latency ? "hier/latency" : "hier/bandwidth";
    return std::string(algo::to_string(c.algorithm));
  }

  /// The call for iteration `iter`: buffers shifted by a multiple of the row's footprint.
  Call call(const Layout& l, DataType dt, ReduceOp op, int root, bool in_place, long iter) {
    const std::size_t elem = size_of(dt);
    const std::size_t footprint = std::max(l.send, l.recv) * elem;
    const std::size_t steps = footprint ? s_.max_bytes / footprint : 1;
    const std::size_t shift = steps > 1 ? footprint * (static_cast<std::size_t>(iter) % steps) : 0;
    Call c;
    c.layout = l;
    c.dtype = dt;
    c.op = op;
    c.root = root;
    c.rank = rank_;
    c.size = n_;
    c.blocking = s_.blocking != 0;
    c.rt = rt_;
    c.stream = rt_ && stream_ ? &stream_ : nullptr;
    std::byte* recv = recv_base() + shift;
    const auto r = static_cast<std::size_t>(rank_);
    c.in = in_place ? recv + r * l.send_in_place * elem : send_base() + shift;
    c.out = in_place ? recv + r * l.recv_in_place * elem : recv;
    return c;
  }

  void start(const Call& c) {
    if constexpr (std::is_same_v<C, ThreadComm>)
      d_.run_threads(comm_, c, pending_);
    else
      d_.run(comm_, c, pending_);
    if (s_.blocking != 0 && !comm_.in_group()) {  // a group's calls are done at its end
      wait_all(pending_);
      if (s_.blocking == 1) comm_.barrier();
    }
  }

  void finish() { wait_all(pending_); }

  /// Times over ranks, as -a says: rank 0's, the mean, the minimum or the maximum.
  std::array<double, 2> combine_times(std::array<double, 2> v) {
    switch (s_.average) {
      case 0: comm_.broadcast(v, 0); break;
      case 1:
        comm_.all_reduce(v, ReduceOp::sum);
        for (double& x : v) x /= n_;
        break;
      case 2: comm_.all_reduce(v, ReduceOp::min); break;
      default: comm_.all_reduce(v, ReduceOp::max); break;
    }
    return v;
  }

  Result bench_time(const Layout& l, DataType dt, ReduceOp op, int root, bool in_place) {
    const std::size_t elem = size_of(dt);
    // 1. Inputs, one untimed call, everyone ready.
    if (s_.check > 0) write_input(call(l, dt, op, root, in_place, 0), 99);
    start(call(l, dt, op, root, in_place, 0));
    finish();
    comm_.barrier();
    // --persistent 1: one operation for the row, on iteration 0's buffers, made before the clock starts.
    const Call first = call(l, dt, op, root, in_place, 0);
    chorus::Persistent<typename C::transport_type> persistent;
    if (s_.persistent != 0 && d_.kind)
      persistent = comm_.persistent(chorus::Call{*d_.kind, first.in, first.out, l.count, dt, op, root});
    // 2. Timed calls.
    const long calls = static_cast<long>(s_.iters) * s_.agg_iters;
    using Clock = std::chrono::steady_clock;
    if (rt_) rt_->record(t0_, stream_);
    const auto t0 = Clock::now();
    // -m: each iteration's calls in one group, as nccl-tests' ncclGroupStart/End (chorus/group.hpp).
    const bool grouped = s_.agg_iters > 1;
    if (persistent.valid()) {  // --persistent 1: started `calls` times, each start complete before the next
      for (long i = 0; i < calls; ++i) {
        if (s_.blocking != 0) {
          persistent.run();
          if (s_.blocking == 1) comm_.barrier();
          continue;
        }
        if (first.stream) persistent.start(*first.stream);
        else persistent.start();
        persistent.wait();
      }
    }
    for (long i = 0; i < (persistent.valid() ? 0 : calls); ++i) {
      if (grouped && i % s_.agg_iters == 0) comm_.group_start();
      start(call(l, dt, op, root, in_place, i));
      if (grouped && i % s_.agg_iters == s_.agg_iters - 1) comm_.group_end();
    }
    const auto posted = Clock::now();
    if (rt_) rt_->record(t1_, stream_);
    finish();
    const auto done = Clock::now();
    auto per_call = [&](Clock::time_point t) {
      return std::chrono::duration<double>(t - t0).count() / static_cast<double>(calls);
    };
    double elapsed = per_call(done);
    if (rt_) {  // device buffers: the stream's own clock, from before the first call to after the last
      rt_->synchronize(t1_);
      elapsed = static_cast<double>(rt_->elapsed_ms(t0_, t1_)) / 1e3 / static_cast<double>(calls);
    }
    // Bandwidth always from the time to completion; -C reports the time to post instead.
    const auto [t, cpu] = combine_times({elapsed, per_call(posted)});
    Result res;
    res.time_us = (s_.report_cputime ? cpu : t) * 1e6;
    res.algbw = d_.algbw_elements(l, n_) * static_cast<double>(elem) / 1e9 / t;
    res.busbw = res.algbw * d_.bus_factor(n_);
    comm_.barrier();
    // 3. Checked calls.
    if (s_.check > 0 && (!in_place || d_.in_place_checked)) {
      std::int64_t wrong = 0;
      for (int c = 0; c < s_.check; ++c) {
        const std::uint64_t seed = ++rep_;
        std::memset(recv_.data(), 0, std::max(l.send, l.recv) * elem);
        const Call cl = call(l, dt, op, root, in_place, 0);
        write_input(cl, seed);
        start(cl);
        finish();
        const std::string what = std::string(d_.name) + " " + std::string(nccl_name(dt)) + " " +
                                 std::string(to_string(op)) + " root " + std::to_string(root) + " size " +
                                 std::to_string(std::max(l.send, l.recv) * elem) + (in_place ? " in-place" : " out-of-place");
        std::array<std::int64_t, 1> w{count_wrong(d_, read_output(cl), seed, what.c_str())};
        comm_.all_reduce(w, ReduceOp::sum);
        wrong = w[0];
        if (wrong != 0) break;
      }
      res.wrong = wrong;
      wrong_total_ += wrong;
    }
    return res;
  }

  /// One data type, op and root: warm-up, then a row per size (nccl-tests' TimeTest).
  void time_test(DataType dt, ReduceOp op, int root) {
    const std::size_t elem = size_of(dt);
    comm_.barrier();
    for (std::size_t size = s_.min_bytes; size <= s_.max_bytes; size = size ? size * 2 : 1) {
      const Layout l = d_.layout(size / elem, n_);
      for (int w = 0; w < s_.warmup_iters; ++w) {  // -m: each warm-up iteration a group, as the timed ones
        if (s_.agg_iters > 1) comm_.group_start();
        for (int a = 0; a < s_.agg_iters; ++a) start(call(l, dt, op, root, false, static_cast<long>(w) * s_.agg_iters + a));
        if (s_.agg_iters > 1) comm_.group_end();
      }
      finish();
      if (size > s_.max_bytes / 2) break;
    }
    long repeat = s_.run_cycles;
    do {
      for (std::size_t size = s_.min_bytes; size <= s_.max_bytes;) {
        const Layout l = d_.layout(size / elem, n_);
        report_.row_begin(std::max(l.send, l.recv) * elem, l.count, nccl_name(dt), d_.reduces ? to_string(op) : "none",
                          root);
        report_.result(bench_time(l, dt, op, root, false), true);
        report_.result(bench_time(l, dt, op, root, true), false);
        report_.row_end(algorithm(l, dt));
        const std::size_t next = s_.step_factor > 1 ? (size ? size * s_.step_factor : 1) : size + s_.step_bytes;
        if (next <= size) break;  // overflow
        size = next;
      }
    } while (--repeat != 0);
  }

  std::byte* send_base() { return rt_ ? dsend_ : send_.data(); }
  std::byte* recv_base() { return rt_ ? drecv_ : recv_.data(); }
  /// The call with its buffers' host copies (itself for host buffers).
  Call host_call(const Call& c) {
    if (!rt_) return c;
    auto host_of = [&](const std::byte* p) {
      return p >= dsend_ && p < dsend_ + capacity_ ? send_.data() + (p - dsend_) : recv_.data() + (p - drecv_);
    };
    Call h = c;
    h.in = host_of(c.in);
    h.out = host_of(c.out);
    return h;
  }
  /// Writes the call's input into the host copies, then (device buffers) both copies whole to
  /// the device: in place, the receive buffer is as zeroed before the check.
  void write_input(const Call& c, std::uint64_t seed) {
    fill_input(host_call(c), seed);
    if (!rt_) return;
    rt_->copy(dsend_, send_.data(), capacity_, stream_);
    rt_->copy(drecv_, recv_.data(), capacity_, stream_);
    rt_->synchronize(stream_);
  }
  /// The call as the host sees it once done: for device buffers, the receive buffer is copied
  /// back whole first.
  Call read_output(const Call& c) {
    if (rt_) {
      rt_->copy(recv_.data(), drecv_, capacity_, stream_);
      rt_->synchronize(stream_);
    }
    return host_call(c);
  }

  device::Runtime* rt_;          ///< null: host buffers
  device::Stream stream_;        ///< the rank's stream (ranks as threads), or null: the default stream
  std::byte* dsend_ = nullptr;   ///< device buffers (with rt_); send_ and recv_ are their host copies
  std::byte* drecv_ = nullptr;
  device::Event t0_ = nullptr, t1_ = nullptr;
  const Collective& d_;
  C& comm_;
  const Settings& s_;
  const int rank_;
  const int n_;
  Reporter report_;
  std::size_t capacity_;
  std::vector<std::byte> send_;
  std::vector<std::byte> recv_;
  RegisteredMemory reg_send_;  ///< -R 1: send_ and recv_ (host buffers)
  RegisteredMemory reg_recv_;
  std::vector<Request> pending_;
  std::int64_t wrong_total_ = 0;
  std::uint64_t rep_ = 0;
};

/// --transport inproc: --nranks ranks as threads of this process, over inproc links, sharing the
/// process's device runtime (one device); each rank calls on a stream of its own, as nccl-tests'
/// threads do. The first rank to fail decides the exit status.
int run_threads(const Collective& d, const Settings& settings, const std::string& program, const Options& options,
                device::Runtime* runtime) {
  auto store = std::make_shared<MemoryStore>();
  std::vector<std::thread> threads;
  std::atomic<int> status{0};
  for (int r = 0; r < settings.nranks; ++r)
    threads.emplace_back([&, r] {
      try {
        Options o = options;
        o.rank = r;
        o.world_size = settings.nranks;
        o.store = store;
        o.init_method.clear();
        ThreadComm comm = ThreadComm::create(o);
        const device::Stream stream = runtime ? runtime->create_stream() : nullptr;
        int rc = 0;
        {
          Driver<ThreadComm> driver(d, comm, settings, program, runtime, stream);
          rc = driver.run();
        }
        if (stream) runtime->destroy_stream(stream);
        if (rc != 0) status = rc;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "%s: rank %d (a thread): %s\n", program.c_str(), r, e.what());
        status = 1;
      }
    });
  for (auto& t : threads) t.join();
  return status.load();
}

/// main() of a *_perf program.
}  // namespace

int perf_main(const Collective& d, int argc, char** argv) {
  ::setvbuf(stdout, nullptr, _IOLBF, 0);
  const std::string program = std::string(d.name) + "_perf";
  const Settings settings = parse_settings(argc, argv, program);
  int rank = -1;
  try {
    if (settings.threads && launched_by_launcher())
      throw Error(ErrorCode::invalid_argument,
                  "ranks as threads (--transport inproc, --threads, -t N) run in one process: start it plainly, "
                  "not under a launcher");
    if (!settings.threads && !launched_by_launcher()) return launch_local(settings.nranks, argc, argv);
    std::unique_ptr<device::Runtime> runtime;
    if (settings.device == "sim") runtime = std::make_unique<device::SimRuntime>();
    if (settings.device == "cuda") runtime = make_cuda_runtime();
    if (runtime && runtime->device_count() == 0)
      throw Error(ErrorCode::unsupported, "--device " + settings.device + ": no device can be used");
    device::set_default_runtime(runtime.get());
    Options options = job_options(settings);
    // --algo forces this program's collective only: the driver's own barriers and checks keep theirs.
    if (d.kind && !options.algorithm.empty() && options.algorithm.find(':') == std::string::npos)
      options.algorithm = std::string(algo::to_string(*d.kind)) + ":" + options.algorithm;
    if (settings.threads) return run_threads(d, settings, program, options, runtime.get());
    Comm comm = Comm::create(options);
    rank = comm.rank();
    return Driver<Comm>(d, comm, settings, program, runtime.get()).run();
  } catch (const std::exception& e) {
    // Before the communicator exists there is no rank: rank_label() says so, or names the
    // launcher's rank variable ("rank 3 (from RANK, before rank assignment)").
    std::fprintf(stderr, "%s: %s: %s\n", program.c_str(), rank_label(rank).c_str(), e.what());
    return 1;
  }
}

}  // namespace chorus::bench
