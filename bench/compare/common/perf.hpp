// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// What the comparison harnesses (mpi_all_reduce_perf.cpp, gloo_all_reduce_perf.cpp) share: the
/// subset of nccl-tests' command line they take, inputs whose result is known exactly, the timing
/// loop, and the table, printed with the same format strings as bench/coll/common/report.hpp so
/// that scripts/compare-bench (and any script written for nccl-tests) reads every library's output
/// the same way. No chorus header: a harness links only the library it measures.
///
/// The loop is the one of bench/coll/common/driver.hpp, so that the numbers compare:
///   warm-up   -w calls of every size from -b to -e, doubling;
///   each row  out-of-place, then in-place:
///             1. inputs written, one untimed call, a barrier;
///             2. -n calls timed back to back over buffers shifted through a -e sized allocation
///                (against cache effects); time = elapsed / calls, combined over ranks by -a
///                (mean by default); algbw = bytes / time (1 GB = 1e9 B), busbw = algbw x 2(n-1)/n;
///             3. -c checked calls on fresh inputs; #wrong = elements that differ bit for bit from
///                the reference, summed over ranks.
/// The libraries compared here call blocking collectives, so "back to back" means one after the
/// other (chorus's driver posts its async calls back to back; with -z 2 it waits after each).
///
/// Inputs (as bench/coll/common/data.hpp): element i of rank r is a small integer drawn from
/// hash(seed, r, i): within [-k, k] for sum/min/max (k = min(64, 2^24 / n) for float, [0, k]
/// for unsigned types), +-1 or +-2 for prod, so every partial result is exact in any order and
/// the reference (64-bit integers, or double) is exact too.
///
/// A backend B provides:
///   int rank() const; int size() const; void barrier();
///   void all_reduce(const void* in /* nullptr: in place */, void* out, std::size_t count, Type, Op);

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <CLI/CLI.hpp>

namespace compare {

/// The nccl-tests release whose layout the table follows (as report.hpp's kNcclTestsFormat).
inline constexpr const char* kNcclTestsFormat = "2.19.7";

enum class Type { int8, uint8, int32, uint32, int64, uint64, float32, float64 };
enum class Op { sum, prod, max, min };

/// nccl-tests' names and order.
inline constexpr Type kTypes[] = {Type::int8,  Type::uint8,  Type::int32,   Type::uint32,
                                  Type::int64, Type::uint64, Type::float32, Type::float64};
inline constexpr Op kOps[] = {Op::sum, Op::prod, Op::max, Op::min};

inline const char* name(Type t) {
  switch (t) {
    case Type::int8: return "int8";
    case Type::uint8: return "uint8";
    case Type::int32: return "int32";
    case Type::uint32: return "uint32";
    case Type::int64: return "int64";
    case Type::uint64: return "uint64";
    case Type::float32: return "float";
    case Type::float64: return "double";
  }
  return "?";
}

inline const char* name(Op o) {
  switch (o) {
    case Op::sum: return "sum";
    case Op::prod: return "prod";
    case Op::max: return "max";
    case Op::min: return "min";
  }
  return "?";
}

/// Calls f(std::type_identity<T>{}) with the C++ type of t.
template <class F>
decltype(auto) dispatch(Type t, F&& f) {
  switch (t) {
    case Type::int8: return f(std::type_identity<std::int8_t>{});
    case Type::uint8: return f(std::type_identity<std::uint8_t>{});
    case Type::int32: return f(std::type_identity<std::int32_t>{});
    case Type::uint32: return f(std::type_identity<std::uint32_t>{});
    case Type::int64: return f(std::type_identity<std::int64_t>{});
    case Type::uint64: return f(std::type_identity<std::uint64_t>{});
    case Type::float32: return f(std::type_identity<float>{});
    case Type::float64: return f(std::type_identity<double>{});
  }
  return f(std::type_identity<float>{});
}

inline std::size_t size_of(Type t) {
  return dispatch(t, []<class T>(std::type_identity<T>) { return sizeof(T); });
}

// ---------------------------------------------------------------------------------------------
// Command line

struct Settings {
  std::size_t min_bytes = 32u << 20;  ///< -b
  std::size_t max_bytes = 32u << 20;  ///< -e
  std::size_t step_bytes = 1u << 20;  ///< -i (when -f is 1)
  std::size_t step_factor = 1;        ///< -f
  int iters = 20;                     ///< -n
  int warmup_iters = 1;               ///< -w
  int check = 1;                      ///< -c
  int average = 1;                    ///< -a: 0 rank 0, 1 mean, 2 min, 3 max
  std::vector<Type> types = {Type::float32};  ///< -d
  std::vector<Op> ops = {Op::sum};            ///< -o
  std::string transport = "default";  ///< --transport: a label for the header (the launcher picks it)
  int nranks = 4;                     ///< --nranks (harnesses that launch themselves)
};

/// nccl-tests' size syntax: a non-negative number, optionally followed by K, M or G (powers of 1024).
inline std::size_t parse_size(const std::string& text, const char* what) {
  const char* s = text.c_str();
  char* end = nullptr;
  const double v = std::strtod(s, &end);
  double unit = 1;
  std::string_view rest(end);
  if (rest.size() == 1) {
    switch (rest.front()) {
      case 'K': case 'k': unit = 1024.0; break;
      case 'M': case 'm': unit = 1024.0 * 1024; break;
      case 'G': case 'g': unit = 1024.0 * 1024 * 1024; break;
      default: unit = 0;
    }
    if (unit != 0) rest.remove_prefix(1);
  }
  if (end == s || !rest.empty() || !(v >= 0) || !std::isfinite(v) || v * unit > 1e15)
    throw CLI::ValidationError(what, "'" + text + "' is not a size (a number, optionally followed by K, M or G)");
  return static_cast<std::size_t>(v * unit);
}

/// Parses the command line; prints help or the error and exits on a bad one.
inline Settings parse_settings(int argc, char** argv, const std::string& about, bool self_launching) {
  Settings s;
  CLI::App app{about};
  std::string minb = "32M", maxb = "32M", stepb = "1M", type = "float", op = "sum";
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
  app.add_option("-c,--check", s.check, "checked runs per result (0: no check, #wrong is N/A)")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  app.add_option("-a,--average", s.average, "time reported over ranks: 0 rank 0, 1 mean, 2 min, 3 max")
      ->check(CLI::Range(0, 3))
      ->capture_default_str();
  app.add_option("-d,--datatype", type, "int8, uint8, int32, uint32, int64, uint64, float, double or all")
      ->capture_default_str();
  app.add_option("-o,--op", op, "sum, prod, max, min or all")->capture_default_str();
  app.add_option("--transport", s.transport, "what the header calls the transport (the launcher chooses it)")
      ->capture_default_str();
  if (self_launching)
    app.add_option("--nranks", s.nranks, "local processes to start")->check(CLI::Range(1, 256))->capture_default_str();
  try {
    app.parse(argc, argv);
    s.min_bytes = parse_size(minb, "--minbytes");
    s.max_bytes = parse_size(maxb, "--maxbytes");
    s.step_bytes = parse_size(stepb, "--stepbytes");
    if (s.min_bytes > s.max_bytes) throw CLI::ValidationError("--minbytes", "is larger than --maxbytes");
    if (s.step_factor <= 1 && s.step_bytes == 0)
      throw CLI::ValidationError("--stepbytes", "must be positive when --stepfactor is 1");
    auto pick = [](const std::string& v, const auto& all, const char* what) {
      using E = std::remove_cvref_t<decltype(all[0])>;
      std::vector<E> out;
      for (E e : all)
        if (v == "all" || v == name(e) || (v == "float32" && name(e) == std::string_view("float")) ||
            (v == "float64" && name(e) == std::string_view("double")))
          out.push_back(e);
      if (out.empty()) throw CLI::ValidationError(what, "'" + v + "' is not supported here (see --help)");
      return out;
    };
    s.types = pick(type, kTypes, "--datatype");
    s.ops = pick(op, kOps, "--op");
  } catch (const CLI::ParseError& e) {
    std::exit(app.exit(e));
  }
  return s;
}

// ---------------------------------------------------------------------------------------------
// Inputs and reference

inline std::uint64_t mix(std::uint64_t x) {  // splitmix64's finaliser
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/// Element i of rank r's input, and the exact result of op over every rank's element i.
template <class T>
struct Inputs {
  std::uint64_t seed = 0;
  int n = 1;
  Op op = Op::sum;

  static constexpr bool kSigned = !std::is_integral_v<T> || std::is_signed_v<T>;

  std::int64_t magnitude() const {
    if constexpr (std::is_same_v<T, float>) return static_cast<std::int64_t>(std::clamp(16777216.0 / n, 1.0, 64.0));
    return 64;  // double: 2^53 / n is far above 64; integers wrap, exact anyway
  }

  T operator()(int rank, std::size_t i) const {
    const std::uint64_t h = mix(mix(seed * 0x9e3779b97f4a7c15ull + static_cast<std::uint64_t>(rank) + 1) + i);
    if (op == Op::prod) {
      const std::int64_t v = (h & 7) == 0 ? 2 : 1;
      return static_cast<T>(kSigned && (h & 8) ? -v : v);
    }
    const std::int64_t k = magnitude();
    const std::uint64_t r = h >> 8;
    if constexpr (kSigned) return static_cast<T>(static_cast<std::int64_t>(r % static_cast<std::uint64_t>(2 * k + 1)) - k);
    return static_cast<T>(r % static_cast<std::uint64_t>(k + 1));
  }

  T reduced(std::size_t i) const {
    if constexpr (std::is_integral_v<T>) {
      auto wide = [](T v) {
        if constexpr (std::is_signed_v<T>) return static_cast<std::uint64_t>(static_cast<std::int64_t>(v));
        return static_cast<std::uint64_t>(v);
      };
      std::uint64_t acc = op == Op::prod ? 1 : 0;
      T best = (*this)(0, i);
      for (int r = 0; r < n; ++r) {
        const T v = (*this)(r, i);
        if (op == Op::sum) acc += wide(v);
        if (op == Op::prod) acc *= wide(v);
        if (op == Op::min) best = std::min(best, v);
        if (op == Op::max) best = std::max(best, v);
      }
      return op == Op::min || op == Op::max ? best : static_cast<T>(acc);  // modulo 2^bits
    } else {
      double acc = static_cast<double>((*this)(0, i));
      for (int r = 1; r < n; ++r) {
        const double v = static_cast<double>((*this)(r, i));
        if (op == Op::sum) acc += v;
        if (op == Op::prod) acc *= v;
        if (op == Op::min) acc = std::min(acc, v);
        if (op == Op::max) acc = std::max(acc, v);
      }
      return static_cast<T>(acc);
    }
  }
};

// ---------------------------------------------------------------------------------------------
// The table (format strings as in bench/coll/common/report.hpp)

/// value in `width` characters, with as many decimals as fit (nccl-tests' getFloatStr).
inline std::string fit(double value, int width) {
  char buf[64];
  if (!std::isfinite(value)) {
    std::snprintf(buf, sizeof buf, "%*s", width, std::isnan(value) ? "nan" : "inf");
    return buf;
  }
  int digits = 0;
  for (double p = 1; value >= p && digits < 40; p *= 10) ++digits;
  if (digits < width - 2) {
    std::snprintf(buf, sizeof buf, "%*.2f", width, value);
  } else if (digits < width - 1) {
    std::snprintf(buf, sizeof buf, "%*.1f", width, value);
  } else if (digits < width + 1) {
    std::snprintf(buf, sizeof buf, "%*.0f", width, value);
  } else {
    std::snprintf(buf, sizeof buf, "%*.1e", width, value);
  }
  return buf;
}

struct Result {
  double time_us = 0;
  double algbw = 0;
  double busbw = 0;
  long long wrong = -1;  ///< -1: not checked (N/A)
};

inline std::string half_row(const Result& r) {
  char buf[128];
  const std::string t = fit(r.time_us, 7), a = fit(r.algbw, 6), b = fit(r.busbw, 6);
  if (r.wrong >= 0) {
    std::snprintf(buf, sizeof buf, "  %7s  %6s  %6s  %6g", t.c_str(), a.c_str(), b.c_str(), static_cast<double>(r.wrong));
  } else {
    std::snprintf(buf, sizeof buf, "  %7s  %6s  %6s    N/A", t.c_str(), a.c_str(), b.c_str());
  }
  return buf;
}

// ---------------------------------------------------------------------------------------------
// The driver

template <class B>
class Driver {
 public:
  /// library: e.g. "openmpi=4.1.4"; description: the library's own version line.
  Driver(B& b, const Settings& s, std::string library, std::string description)
      : b_(b),
        s_(s),
        library_(std::move(library)),
        description_(std::move(description)),
        capacity_(std::max<std::size_t>(s.max_bytes, 64)),
        send_(capacity_ / 8 + 1),
        recv_(capacity_ / 8 + 1) {}

  int run() {
    header();
    for (Type t : s_.types)
      for (Op op : s_.ops) time_test(t, op);
    const double avg = bus_count_ ? bus_sum_ / bus_count_ : 0.0;
    if (b_.rank() == 0) {
      if (s_.check == 0)  // -c 0: nothing was compared, so nothing is claimed
        std::printf("# %-20s : not checked (-c 0)\n", "Out of bounds values");
      else
        std::printf("# %-20s : %lld %s\n", "Out of bounds values", wrong_total_, wrong_total_ ? "FAILED" : "OK");
      std::printf("# %-20s : %g %s\n", "Avg bus bandwidth", avg, "");
      std::printf("#\n# Collective test concluded: all_reduce_perf\n#\n\n");
      std::fflush(stdout);
    }
    b_.barrier();
    return wrong_total_ == 0 ? 0 : 1;
  }

 private:
  std::byte* send() { return reinterpret_cast<std::byte*>(send_.data()); }
  std::byte* recv() { return reinterpret_cast<std::byte*>(recv_.data()); }

  /// Every rank's pid and host: each writes its record into a zeroed slot; a uint8 sum gathers them.
  void header() {
    constexpr std::size_t kRecord = 128;
    const auto n = static_cast<std::size_t>(b_.size());
    std::vector<std::uint8_t> all(kRecord * n, 0);
    std::uint8_t* mine = all.data() + kRecord * static_cast<std::size_t>(b_.rank());
    const auto pid = static_cast<std::int32_t>(::getpid());
    std::memcpy(mine, &pid, sizeof pid);
    ::gethostname(reinterpret_cast<char*>(mine) + 4, kRecord - 5);
    b_.all_reduce(nullptr, all.data(), all.size(), Type::uint8, Op::sum);
    if (b_.rank() != 0) return;
    std::printf("# nccl-tests version %s %s\n", kNcclTestsFormat, library_.c_str());
    std::printf("# Collective test starting: all_reduce_perf\n");
    const bool factor = s_.step_factor > 1;
    std::printf(
        "# nThread 1 nGpus 0 minBytes %zu maxBytes %zu step: %zu(%s) warmup iters: %d iters: %d agg iters: %d "
        "validation: %d graph: 0 unalign: 0\n",
        s_.min_bytes, s_.max_bytes, factor ? s_.step_factor : s_.step_bytes, factor ? "factor" : "bytes",
        s_.warmup_iters, s_.iters, 1, s_.check);
    std::printf("# %s: %d ranks, transport %s\n", description_.c_str(), b_.size(), s_.transport.c_str());
    std::printf("#\n# Using devices\n");
    for (std::size_t r = 0; r < n; ++r) {
      const std::uint8_t* rec = all.data() + kRecord * r;
      std::int32_t p = 0;
      std::memcpy(&p, rec, sizeof p);
      std::printf("#  Rank %2zu Group %2d Pid %6d on %10s transport %s\n", r, 0, p,
                  std::string(reinterpret_cast<const char*>(rec) + 4, strnlen(reinterpret_cast<const char*>(rec) + 4, kRecord - 5)).c_str(),
                  s_.transport.c_str());
    }
    std::printf("#\n");
    std::printf("# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          \n", "", "",
                "", "", "");
    std::printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s %s\n", "size", "count", "type",
                "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong", "");
    std::printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s %s\n", "(B)", "(elements)", "", "",
                "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "", "");
    std::fflush(stdout);
  }

  /// Input and output of iteration `iter`: shifted by a multiple of the row's footprint.
  std::pair<const std::byte*, std::byte*> buffers(std::size_t bytes, bool in_place, long iter) {
    const std::size_t steps = bytes ? s_.max_bytes / bytes : 1;
    const std::size_t shift = steps > 1 ? bytes * (static_cast<std::size_t>(iter) % steps) : 0;
    return {in_place ? nullptr : send() + shift, recv() + shift};
  }

  void call(std::size_t count, Type t, Op op, bool in_place, long iter) {
    const auto [in, out] = buffers(count * size_of(t), in_place, iter);
    b_.all_reduce(in, out, count, t, op);
  }

  void fill(std::byte* p, std::size_t count, Type t, Op op, std::uint64_t seed) {
    dispatch(t, [&]<class T>(std::type_identity<T>) {
      const Inputs<T> gen{seed, b_.size(), op};
      T* v = reinterpret_cast<T*>(p);
      for (std::size_t i = 0; i < count; ++i) v[i] = gen(b_.rank(), i);
    });
  }

  long long count_wrong(const std::byte* p, std::size_t count, Type t, Op op, std::uint64_t seed, bool in_place) {
    return dispatch(t, [&]<class T>(std::type_identity<T>) {
      const Inputs<T> gen{seed, b_.size(), op};
      const T* v = reinterpret_cast<const T*>(p);
      long long wrong = 0;
      for (std::size_t i = 0; i < count; ++i) {
        const T want = gen.reduced(i);
        if (std::memcmp(&want, v + i, sizeof(T)) == 0) continue;
        if (++wrong <= 4)
          std::fprintf(stderr, "# rank %d: all_reduce %s %s size %zu %s: element %zu is %.17g, expected %.17g\n",
                       b_.rank(), name(t), name(op), count * sizeof(T), in_place ? "in-place" : "out-of-place", i,
                       static_cast<double>(v[i]), static_cast<double>(want));
      }
      return wrong;
    });
  }

  /// Over ranks, as -a says.
  double combine(double v) {
    const Op how = s_.average == 2 ? Op::min : s_.average == 3 ? Op::max : Op::sum;
    if (s_.average == 0 && b_.rank() != 0) v = 0;  // rank 0's value: a sum of it and zeros
    b_.all_reduce(nullptr, &v, 1, Type::float64, how);
    return s_.average == 1 ? v / b_.size() : v;
  }

  Result bench_time(std::size_t count, Type t, Op op, bool in_place) {
    const std::size_t bytes = count * size_of(t);
    // 1. Inputs, one untimed call, everyone ready.
    if (s_.check > 0) {
      const auto [in, out] = buffers(bytes, in_place, 0);
      fill(in_place ? out : const_cast<std::byte*>(in), count, t, op, 99);
    }
    call(count, t, op, in_place, 0);
    b_.barrier();
    // 2. Timed calls.
    using Clock = std::chrono::steady_clock;
    const auto t0 = Clock::now();
    for (long i = 0; i < s_.iters; ++i) call(count, t, op, in_place, i);
    const double secs = combine(std::chrono::duration<double>(Clock::now() - t0).count() / s_.iters);
    Result res;
    res.time_us = secs * 1e6;
    res.algbw = static_cast<double>(bytes) / 1e9 / secs;
    res.busbw = res.algbw * 2.0 * (b_.size() - 1) / b_.size();
    bus_sum_ += res.busbw;
    ++bus_count_;
    b_.barrier();
    // 3. Checked calls: fresh inputs each time.
    if (s_.check > 0) {
      long long wrong = 0;
      for (int c = 0; c < s_.check && wrong == 0; ++c) {
        const std::uint64_t seed = ++rep_;
        const auto [in, out] = buffers(bytes, in_place, 0);
        std::memset(out, 0, bytes);
        fill(in_place ? out : const_cast<std::byte*>(in), count, t, op, seed);
        b_.all_reduce(in, out, count, t, op);
        double w = static_cast<double>(count_wrong(out, count, t, op, seed, in_place));
        b_.all_reduce(nullptr, &w, 1, Type::float64, Op::sum);
        wrong = static_cast<long long>(w);
      }
      res.wrong = wrong;
      wrong_total_ += wrong;
    }
    return res;
  }

  /// One data type and op: warm-up, then one row per size (nccl-tests' TimeTest).
  void time_test(Type t, Op op) {
    const std::size_t elem = size_of(t);
    b_.barrier();
    for (std::size_t size = s_.min_bytes; size <= s_.max_bytes; size = size ? size * 2 : 1) {
      for (int w = 0; w < s_.warmup_iters; ++w) call(size / elem, t, op, false, w);
      if (size > s_.max_bytes / 2) break;
    }
    for (std::size_t size = s_.min_bytes; size <= s_.max_bytes;) {
      const std::size_t count = size / elem;
      const Result oop = bench_time(count, t, op, false);
      const Result ip = bench_time(count, t, op, true);
      if (b_.rank() == 0) {
        std::printf("%12zu  %12zu  %8s  %6s  %6i%s%s\n", count * elem, count, name(t), name(op), -1,
                    half_row(oop).c_str(), half_row(ip).c_str());
        std::fflush(stdout);
      }
      const std::size_t next = s_.step_factor > 1 ? (size ? size * s_.step_factor : 1) : size + s_.step_bytes;
      if (next <= size) break;
      size = next;
    }
  }

  B& b_;
  const Settings& s_;
  std::string library_;
  std::string description_;
  std::size_t capacity_;
  std::vector<std::uint64_t> send_;  // 8-byte aligned storage for every type
  std::vector<std::uint64_t> recv_;
  double bus_sum_ = 0;
  long bus_count_ = 0;
  long long wrong_total_ = 0;
  std::uint64_t rep_ = 0;
};

}  // namespace compare
