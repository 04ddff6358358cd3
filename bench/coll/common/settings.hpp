// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// The command line of every *_perf program: nccl-tests' flags with their defaults (nccl-tests
/// 2.18, src/common.cu), plus chorus's own (--transport, --algo, --chunk_bytes, --nranks,
/// --show-algo). Sizes take K, M, G suffixes (powers of 1024) like nccl-tests ("32M", "1.5K").
/// So that existing nccl-tests command lines run unchanged, -t and -g (threads and GPUs per
/// process) are accepted with the value 1, -G (CUDA graphs) with 0, and -p (parallel init) and
/// -y (null stream) with 0 or 1, which change nothing here: a process is one rank.

#include <cerrno>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>

#include "chorus/algo/select.hpp"
#include "chorus/core/types.hpp"

namespace chorus::bench {

struct Settings {
  // nccl-tests
  std::size_t min_bytes = 32u << 20;  ///< -b
  std::size_t max_bytes = 32u << 20;  ///< -e
  std::size_t step_bytes = 1u << 20;  ///< -i (used when -f is 1)
  std::size_t step_factor = 1;        ///< -f
  int iters = 20;                     ///< -n
  int warmup_iters = 1;               ///< -w (for every size from -b to -e, doubling)
  int agg_iters = 1;                  ///< -m: collectives per timed iteration, in one group
  int run_cycles = 1;                 ///< -N: 0 repeats forever
  int check = 1;                      ///< -c: checked runs per result (0: #wrong is N/A)
  int blocking = 0;                   ///< -z: blocking calls (the blocking API); 1 adds a barrier after each
  int average = 1;                    ///< -a: time over ranks: 0 rank 0, 1 mean, 2 min, 3 max
  int timeout_s = 0;                  ///< -T: bound on every wait (0: CHORUS_TIMEOUT or 300 s)
  int report_cputime = 0;             ///< -C: report the time to post the calls, not to complete them
  int local_register = 0;             ///< -R: 1 registers the host buffers (chorus::RegisteredMemory)
  std::vector<DataType> types = {DataType::float32};  ///< -d
  std::vector<ReduceOp> ops = {ReduceOp::sum};        ///< -o
  int root = 0;                       ///< -r: -1 is every rank in turn
  std::string output_file;            ///< -J: JSON (when it ends in .json)
  // chorus
  std::string transport = "auto";     ///< --transport
  bool threads = false;               ///< --threads, --transport inproc: ranks as threads of one process
  std::string algorithm;              ///< --algo: empty is the cost model's choice
  std::size_t chunk_bytes = 0;        ///< --chunk_bytes: 0 is the cost model's
  int persistent = 0;                 ///< --persistent: 1 starts one persistent operation per row (chorus/persistent.hpp)
  int nranks = 4;                     ///< --nranks: processes to start when no launcher did
  bool show_algo = false;             ///< --show-algo
  int ngpus = 0;                      ///< -g: 1 puts every rank's buffers on a device, 0 on the host
  std::string device = "host";        ///< --device: host, cuda (the CUDA runtime) or sim (simulated)

  std::vector<std::string> argv;      ///< as given, for the JSON record
};

/// nccl-tests' names: what the "type" and "redop" columns show.
constexpr std::string_view nccl_name(DataType t) noexcept {
  switch (t) {
    case DataType::float16: return "half";
    case DataType::float32: return "float";
    case DataType::float64: return "double";
    case DataType::float8_e4m3:
      return "f8e4m3";
    case DataType::float8_e5m2:
      return "f8e5m2";
    default: return to_string(t);  // the others are named alike
  }
}

/// -d all and -o all, in nccl-tests' order.
inline constexpr DataType kNcclTypeOrder[] = {
    DataType::int8,    DataType::uint8,    DataType::int32,       DataType::uint32,
    DataType::int64,   DataType::uint64,   DataType::float16,     DataType::float32,
    DataType::float64, DataType::bfloat16, DataType::float8_e4m3, DataType::float8_e5m2};
inline constexpr ReduceOp kNcclOpOrder[] = {ReduceOp::sum, ReduceOp::prod, ReduceOp::max, ReduceOp::min,
                                            ReduceOp::avg};

namespace detail {

/// nccl-tests' size syntax: a non-negative decimal number, then optionally K, M or G.
inline std::size_t parse_size(const std::string& text, const char* what) {
  const char* s = text.c_str();
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(s, &end);
  double unit = 1;
  std::string_view rest(end);
  while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
  if (rest.size() == 1) {
    switch (rest.front()) {
      case 'K': case 'k': unit = 1024.0; break;
      case 'M': case 'm': unit = 1024.0 * 1024; break;
      case 'G': case 'g': unit = 1024.0 * 1024 * 1024; break;
      default: unit = 0;
    }
    if (unit != 0) rest.remove_prefix(1);
  }
  if (end == s || errno != 0 || !rest.empty() || !(v >= 0) || !std::isfinite(v) || v * unit > 1e18)
    throw CLI::ValidationError(what, "'" + text + "' is not a size (a number, optionally followed by K, M or G)");
  return static_cast<std::size_t>(v * unit);
}

}  // namespace detail

/// Parses the command line; prints help or an error and exits on a bad one (like nccl-tests).
inline Settings parse_settings(int argc, char** argv, const std::string& program) {
  Settings s;
  s.argv.assign(argv, argv + argc);
  CLI::App app{program + ": nccl-tests' " + program +
               " for chorus. Without a launcher it starts --nranks local processes of itself; under "
               "mpirun, srun or torchrun it joins their job."};
  std::string minb = "32M", maxb = "32M", stepb = "1M", type = "float", op = "sum", root = "0";
  app.add_option("-b,--minbytes", minb, "smallest size in bytes (K, M, G suffixes)")->capture_default_str();
  app.add_option("-e,--maxbytes", maxb, "largest size in bytes")->capture_default_str();
  app.add_option("-i,--stepbytes", stepb, "size increment when --stepfactor is 1")->capture_default_str();
  app.add_option("-f,--stepfactor", s.step_factor, "size multiplier between rows (1: add --stepbytes)")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 30))
      ->capture_default_str();
  app.add_option("-n,--iters", s.iters, "timed iterations per result")->check(CLI::Range(1, 1 << 30))->capture_default_str();
  app.add_option("-w,--warmup_iters", s.warmup_iters, "warm-up iterations per size")
      ->check(CLI::Range(0, 1 << 30))
      ->capture_default_str();
  app.add_option("-m,--agg_iters", s.agg_iters, "collectives per timed iteration, issued as one group (chorus/group.hpp)")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("-N,--run_cycles", s.run_cycles, "times to run the whole sweep (0: forever)")
      ->check(CLI::Range(0, 1 << 30))
      ->capture_default_str();
  app.add_option("-c,--check", s.check, "checked runs per result (0: no check, #wrong is N/A)")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  app.add_option("-o,--op", op, "sum, prod, min, max, avg or all")->capture_default_str();
  app.add_option("-d,--datatype", type,
                 "int8, uint8, int32, uint32, int64, uint64, half (float16), bfloat16, float (float32), "
                 "double (float64), f8e4m3 (float8_e4m3), f8e5m2 (float8_e5m2) or all")
      ->capture_default_str();
  app.add_option("-r,--root", root, "root rank of rooted collectives, or all")->capture_default_str();
  app.add_option("-z,--blocking", s.blocking,
                 "0: time back-to-back async calls; 1: blocking calls, a barrier after each; 2: blocking calls")
      ->check(CLI::Range(0, 2))
      ->capture_default_str();
  app.add_option("-a,--average", s.average, "time reported over ranks: 0 rank 0, 1 mean, 2 min, 3 max")
      ->check(CLI::Range(0, 3))
      ->capture_default_str();
  app.add_option("-T,--timeout", s.timeout_s, "seconds any wait may take before the run fails (0: default)")
      ->check(CLI::Range(0, 1 << 24))
      ->capture_default_str();
  app.add_option("-C,--report_cputime", s.report_cputime, "1: report the time to post the calls (cputime)")
      ->check(CLI::Range(0, 1))
      ->capture_default_str();
  app.add_option("-R,--local_register", s.local_register,
                 "1: register the send and receive buffers once (chorus::RegisteredMemory, as nccl-tests' -R 1 "
                 "calls ncclCommRegister): rdma then registers no buffer per message; host buffers only")
      ->check(CLI::Range(0, 1))
      ->capture_default_str();
  app.add_option("--persistent", s.persistent,
                 "1: each row's timed calls are starts of one persistent operation (comm.persistent(call), "
                 "chorus/persistent.hpp), made once per row: run() with -z 1 or 2, start() and wait() with -z 0; "
                 "not with -m above 1")
      ->check(CLI::Range(0, 1))
      ->capture_default_str();
  app.add_option("-J,--output_file", s.output_file, "write the results as JSON to this file (*.json)");
  int one_thread = 1, graph = 0, parallel_init = 0, stream_null = 0;
  app.add_option("-t,--nthreads", one_thread,
                 "nccl-tests' threads per process: N > 1 runs N ranks as threads of this process (as --threads "
                 "--nranks N; not with a launcher or --nranks)")
      ->check(CLI::Range(1, 1024));
  app.add_option("-g,--ngpus", s.ngpus,
                 "GPUs per rank: 1 puts the buffers in device memory (--device, default cuda), 0 in host memory")
      ->check(CLI::Range(0, 1))
      ->capture_default_str();
  std::string device;
  app.add_option("--device", device,
                 "where the buffers are: host, cuda (device memory through the CUDA runtime; needs a build "
                 "with nvcc) or sim (the simulated CUDA runtime: checks the device path, its times mean little)")
      ->check(CLI::IsMember({"host", "cuda", "sim"}));
  app.add_option("-G,--cudagraph", graph, "nccl-tests' CUDA graph launches: only 0")->check(CLI::Range(0, 0));
  app.add_option("-p,--parallel_init", parallel_init, "accepted for nccl-tests command lines; no effect")
      ->check(CLI::Range(0, 1));
  app.add_option("-y,--stream_null", stream_null, "accepted for nccl-tests command lines; no effect")
      ->check(CLI::Range(0, 1));
  app.add_option("--transport", s.transport,
                 "transport: auto (cuda_ipc or shm on one host, rdma or tcp across), cuda_ipc (device buffers "
                 "read directly by the peers of one host; with -g 1), shm, rdma, tcp, or inproc (--nranks ranks "
                 "as threads of this one process, each on a stream of its own, sharing one device with -g 1)")
      ->check(CLI::IsMember({"auto", "cuda_ipc", "shm", "rdma", "tcp", "inproc"}))
      ->capture_default_str();
  app.add_flag("--threads", s.threads, "ranks as threads of this process: --transport inproc");
  app.add_option("--algo", s.algorithm, "force the algorithm: auto, ring, tree, recursive_doubling, ...")
      ->check([](const std::string& v) -> std::string {
        try {
          (void)algo::parse_algorithm(v, "--algo");
          return {};
        } catch (const std::exception& e) {
          return e.what();
        }
      });
  std::string chunk = "0";
  app.add_option("--chunk_bytes", chunk, "force the pipeline slice size in bytes (0: the cost model's)");
  app.add_option("--nranks", s.nranks, "local processes to start when no launcher started this one")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  app.add_flag("--show-algo", s.show_algo, "add a column with the algorithm the cost model picks per row");
  try {
    app.parse(argc, argv);
    s.min_bytes = detail::parse_size(minb, "--minbytes");
    s.max_bytes = detail::parse_size(maxb, "--maxbytes");
    s.step_bytes = detail::parse_size(stepb, "--stepbytes");
    s.chunk_bytes = detail::parse_size(chunk, "--chunk_bytes");
    if (s.min_bytes > s.max_bytes)
      throw CLI::ValidationError("--minbytes", "is larger than --maxbytes (" + minb + " > " + maxb + ")");
    if (s.step_factor <= 1 && s.step_bytes == 0)
      throw CLI::ValidationError("--stepbytes", "must be positive when --stepfactor is 1");
    if (s.algorithm == "auto") s.algorithm.clear();
    if (device.empty()) device = s.ngpus > 0 ? "cuda" : "host";
    if (device == "host" && s.ngpus > 0) throw CLI::ValidationError("--device", "host contradicts -g 1");
    if (s.persistent != 0 && s.agg_iters > 1)
      throw CLI::ValidationError("--persistent", "one persistent operation starts once per group: not with -m above 1");
    s.device = device;
    if (one_thread > 1) {
      if (app.count("--nranks") > 0)
        throw CLI::ValidationError("--nthreads", "-t N (ranks as threads) and --nranks M (processes) together");
      s.nranks = one_thread;
      s.threads = true;
    }
    if (s.transport == "inproc") s.threads = true;
    if (s.threads) s.transport = "inproc";
    s.ngpus = device == "host" ? 0 : 1;
    if (type == "all") {
      s.types.assign(std::begin(kNcclTypeOrder), std::end(kNcclTypeOrder));
    } else if (auto t = parse_data_type(type)) {
      s.types = {*t};
    } else {
      throw CLI::ValidationError("--datatype", "'" + type + "' is not a data type (see --help)");
    }
    if (op == "all") {
      s.ops.assign(std::begin(kNcclOpOrder), std::end(kNcclOpOrder));
    } else if (auto o = parse_reduce_op(op)) {
      s.ops = {*o};
    } else {
      throw CLI::ValidationError("--op", "'" + op + "' is not one of sum, prod, min, max, avg, all");
    }
    if (root == "all") {
      s.root = -1;
    } else {
      char* end = nullptr;
      const long r = std::strtol(root.c_str(), &end, 10);
      if (root.empty() || *end != '\0' || r < -1 || r > (1 << 24))
        throw CLI::ValidationError("--root", "'" + root + "' is not a rank or all");
      s.root = static_cast<int>(r);
    }
  } catch (const CLI::ParseError& e) {
    std::exit(app.exit(e));
  }
  return s;
}

}  // namespace chorus::bench
