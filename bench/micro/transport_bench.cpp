// SPDX-License-Identifier: BSD-3-Clause
// Transport and store latency and bandwidth, ranks as two threads of this process.
//
//   pingpong/<transport>/<bytes>  rank 0 sends `bytes` to rank 1, which sends them back. Time is
//                                 the round trip; one_way (seconds) is half of it; bytes processed count
//                                 both directions, so bytes_per_second is the ping-pong bandwidth.
//   stream/<transport>/<bytes>    rank 0 keeps 4 sends of `bytes` in flight to rank 1, which keeps
//                                 4 receives posted; the run ends when rank 1 acknowledges the
//                                 last message. bytes_per_second is the one-way bandwidth.
//   store/<kind>/<op>/<bytes>     set (replacing one key) and get (of a key that is set) of a
//                                 `bytes` value: MemoryStore, FileStore (a file in a fresh temp
//                                 directory), TcpStore (a client of a server on 127.0.0.1, port 0,
//                                 in this process: one loopback round trip per call).
//
// Transports: inproc, tcp (loopback, the MemoryStore rendezvous) and shm where its header exists.
// Rank 1 runs on its own thread and is told, before each timed loop, how many iterations rank 0
// will make (Google Benchmark fixes them before the loop), so both sides stop together.
// Times are wall-clock (UseRealTime): rank 0 mostly waits. Each benchmark runs for about 0.1 s:
//
//   transport_bench                                   # everything, about a minute
//   transport_bench --benchmark_filter='pingpong/tcp'
//   transport_bench --benchmark_min_time=1            # steadier numbers
//   (the 2-process tcp figures: bench/p2p/tcp_pingpong; collectives: bench/coll/*_perf)

#include <benchmark/benchmark.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "chorus/chorus.hpp"
#if __has_include("chorus/transport/shm/transport.hpp")
#include "chorus/transport/shm/transport.hpp"
#define CHORUS_BENCH_HAVE_SHM 1
#endif

namespace {

constexpr double kMinTime = 0.1;  // seconds per benchmark: a short default run
constexpr int kWindow = 4;        // messages in flight when streaming

/// What rank 1 does next.
struct Command {
  enum class Kind { pingpong, stream, quit } kind = Kind::quit;
  std::size_t bytes = 0;
  std::int64_t iterations = 0;
};

/// Two ranks of one transport: rank 0 is the caller's thread, rank 1 a thread that serves
/// commands. Created once per benchmark run (a tcp pair connects in a few milliseconds).
template <class Transport>
class Pair {
 public:
  using Comm = chorus::Communicator<Transport>;

  Pair() {
    auto store = std::make_shared<chorus::MemoryStore>();
    peer_ = std::thread([this, store] { serve(options(1, store)); });
    try {
      comm_.emplace(Comm::create(options(0, store)));
    } catch (...) {
      post({});
      peer_.join();
      throw;
    }
  }
  ~Pair() {
    post({});  // quit
    peer_.join();
  }
  Pair(const Pair&) = delete;
  Pair& operator=(const Pair&) = delete;

  Comm& comm() { return *comm_; }

  /// Hands rank 1 its next command.
  void post(Command c) {
    {
      std::lock_guard lk(mu_);
      next_ = c;
    }
    cv_.notify_one();
  }

 private:
  static chorus::Options options(int rank, std::shared_ptr<chorus::Store> store) {
    chorus::Options o;
    o.rank = rank;
    o.world_size = 2;
    o.store = std::move(store);
    o.timeout = std::chrono::seconds(60);
    return o;
  }

  void serve(chorus::Options o) {
    std::optional<Comm> comm;
    try {
      comm.emplace(Comm::create(std::move(o)));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "transport_bench: rank 1: %s\n", e.what());
      return;
    }
    std::vector<std::byte> buf;
    for (;;) {
      Command c;
      {
        std::unique_lock lk(mu_);
        cv_.wait(lk, [&] { return next_.has_value(); });
        c = *next_;
        next_.reset();
      }
      if (c.kind == Command::Kind::quit) return;
      try {
        if (c.kind == Command::Kind::pingpong) {
          buf.resize(c.bytes);
          for (std::int64_t i = 0; i < c.iterations; ++i) {
            comm->recv(std::span(buf), 0, 0);
            comm->send(std::span<const std::byte>(buf), 0, 0);
          }
        } else {
          buf.resize(c.bytes * kWindow);
          std::vector<chorus::Request> recvs(kWindow);
          auto slot = [&](std::int64_t m) { return std::span(buf).subspan(static_cast<std::size_t>(m % kWindow) * c.bytes, c.bytes); };
          for (std::int64_t m = 0; m < std::min<std::int64_t>(kWindow, c.iterations); ++m) recvs[m] = comm->irecv(slot(m), 0, 1);
          for (std::int64_t m = 0; m < c.iterations; ++m) {
            recvs[m % kWindow].wait();
            if (m + kWindow < c.iterations) recvs[m % kWindow] = comm->irecv(slot(m), 0, 1);
          }
          comm->send(std::span<const std::byte>{}, 0, 2);  // all received
        }
      } catch (const std::exception& e) {
        std::fprintf(stderr, "transport_bench: rank 1: %s\n", e.what());
        return;  // rank 0 fails by timeout
      }
    }
  }

  std::optional<Comm> comm_;
  std::thread peer_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<Command> next_;
};

template <class Transport>
void bm_pingpong(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  Pair<Transport> pair;
  auto& comm = pair.comm();
  std::vector<std::byte> buf(bytes, std::byte{0x42});
  pair.post({Command::Kind::pingpong, bytes, static_cast<std::int64_t>(state.max_iterations)});
  for (auto _ : state) {
    comm.send(std::span<const std::byte>(buf), 1, 0);
    comm.recv(std::span(buf), 1, 0);
  }
  const auto it = static_cast<std::int64_t>(state.iterations());
  state.SetBytesProcessed(2 * it * static_cast<std::int64_t>(bytes));
  state.counters["one_way"] = benchmark::Counter(static_cast<double>(2 * it),
                                                    benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

template <class Transport>
void bm_stream(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  Pair<Transport> pair;
  auto& comm = pair.comm();
  std::vector<std::byte> src(bytes, std::byte{0x17});
  std::vector<chorus::Request> sends(kWindow);
  pair.post({Command::Kind::stream, bytes, static_cast<std::int64_t>(state.max_iterations)});
  const auto last = static_cast<std::int64_t>(state.max_iterations);
  std::int64_t m = 0;
  for (auto _ : state) {
    auto& s = sends[static_cast<std::size_t>(m++ % kWindow)];
    if (s.valid()) s.wait();
    s = comm.isend(std::span<const std::byte>(src), 1, 1);
    if (m == last) {  // drain inside the timed region: the run ends when rank 1 has the last byte
      for (auto& r : sends) r.wait();
      comm.recv(std::span<std::byte>{}, 1, 2);
    }
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(bytes));
}

// ---------------------------------------------------------------------------------------------
// Stores

/// A fresh directory under $TMPDIR (or /tmp), removed with the object.
class TempDir {
 public:
  TempDir() {
    std::string t = (std::filesystem::temp_directory_path() / "chorus-store-bench-XXXXXX").string();
    if (::mkdtemp(t.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = t;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

enum class StoreKind { memory, file, tcp };
enum class StoreOp { set, get };

void bm_store(benchmark::State& state, StoreKind kind, StoreOp op) {
  const std::string value(static_cast<std::size_t>(state.range(0)), 'v');
  const auto timeout = std::chrono::seconds(30);
  std::optional<TempDir> dir;
  std::unique_ptr<chorus::TcpStore> server;
  std::unique_ptr<chorus::Store> store;
  switch (kind) {
    case StoreKind::memory: store = std::make_unique<chorus::MemoryStore>(); break;
    case StoreKind::file:
      dir.emplace();
      store = std::make_unique<chorus::FileStore>((dir->path() / "store").string(), timeout);
      break;
    case StoreKind::tcp:
      server = std::make_unique<chorus::TcpStore>("127.0.0.1", 0, /*is_server=*/true, timeout);
      store = std::make_unique<chorus::TcpStore>("127.0.0.1", server->port(), /*is_server=*/false, timeout);
      break;
  }
  store->set("key", value);
  for (auto _ : state) {
    if (op == StoreOp::set) {
      store->set("key", value);
    } else {
      benchmark::DoNotOptimize(store->get("key", timeout));
    }
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(value.size()));
  state.counters["per_call"] = benchmark::Counter(static_cast<double>(state.iterations()),
                                            benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

template <class Transport>
void register_transport(const char* name) {
  const std::string n(name);
  benchmark::RegisterBenchmark(("pingpong/" + n).c_str(), bm_pingpong<Transport>)
      ->RangeMultiplier(32)
      ->Range(8, 1 << 20)  // 8 B, 256 B, 8 KiB, 256 KiB, 1 MiB
      ->UseRealTime()
      ->MinTime(kMinTime)
      ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark(("stream/" + n).c_str(), bm_stream<Transport>)
      ->RangeMultiplier(16)
      ->Range(4 << 10, 16 << 20)  // 4 KiB, 64 KiB, 1 MiB, 16 MiB
      ->UseRealTime()
      ->MinTime(kMinTime)
      ->Unit(benchmark::kMicrosecond);
}

[[maybe_unused]] const bool kRegistered = [] {
  register_transport<chorus::inproc::Transport>("inproc");
  register_transport<chorus::tcp::Transport>("tcp");
#if defined(CHORUS_BENCH_HAVE_SHM)
  register_transport<chorus::shm::Transport>("shm");
#endif
  // Transports still to come (rdma, cuda_ipc) register here, under the same names.
  for (auto [kind, kname] : {std::pair{StoreKind::memory, "memory"}, std::pair{StoreKind::file, "file"},
                             std::pair{StoreKind::tcp, "tcp"}}) {
    for (auto [op, oname] : {std::pair{StoreOp::set, "set"}, std::pair{StoreOp::get, "get"}}) {
      benchmark::RegisterBenchmark(("store/" + std::string(kname) + "/" + oname).c_str(), bm_store, kind, op)
          ->Arg(64)
          ->Arg(4096)
          ->UseRealTime()
          ->MinTime(kMinTime)
          ->Unit(benchmark::kMicrosecond);
    }
  }
  return true;
}();

}  // namespace

BENCHMARK_MAIN();
