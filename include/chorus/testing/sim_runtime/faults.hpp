// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// device::SimRuntime (testing/sim_runtime.hpp): fault injection. fail_after and stall_after, and
/// CHORUS_SIM_FAIL (docs/environment.md), which the constructor reads.

#include <algorithm>
#include <chrono>
#include <iterator>
#include <string>
#include <string_view>
#include <utility>

#include "chorus/detail/env.hpp"
#include "chorus/testing/sim_runtime.hpp"

namespace chorus::device {

namespace detail {
/// The calls fail_after knows: the allocations and creations (they throw at the call), then the
/// stream operations (they fail inside their stream).
inline constexpr std::string_view kSimCalls[] = {"alloc_device", "alloc_pinned", "create_stream", "create_event",
                                                 "copy",         "fill",         "reduce",        "reduce_many",
                                                 "finalize_avg", "premul",        "wait_flag",     "write_value",   "wait_value",
                                                 "collective"};
}  // namespace detail

CHORUS_DETAIL_SIM_INLINE void SimRuntime::apply_env() {
  if (const auto loading = chorus::detail::env_string("CUDA_MODULE_LOADING"); loading && *loading == "EAGER")
    kernels_loaded_ = true;
  const auto v = chorus::detail::env_string("CHORUS_SIM_FAIL");
  if (!v) return;
  std::string_view rest = *v;
  const auto bad = [&](std::string_view why) {
    return Error(ErrorCode::invalid_argument,
                 "CHORUS_SIM_FAIL='" + *v + "': " + std::string(why) + " (expected call:n:cuda_error[,...])");
  };
  while (!rest.empty()) {
    const std::size_t comma = rest.find(',');
    std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    const std::size_t c1 = item.find(':');
    const std::size_t c2 = c1 == std::string_view::npos ? c1 : item.find(':', c1 + 1);
    if (c2 == std::string_view::npos) throw bad("an entry is not call:n:cuda_error");
    try {
      const auto n = chorus::detail::parse_int(item.substr(c1 + 1, c2 - c1 - 1), "n", 1, 1 << 30);
      const auto e = chorus::detail::parse_int(item.substr(c2 + 1), "cuda_error", 1, 100000);
      fail_after(item.substr(0, c1), static_cast<int>(n), static_cast<int>(e));
    } catch (const Error& e) {
      std::string_view why = e.what();
      const std::string prefix = Error::format(ErrorCode::invalid_argument, "");
      if (why.starts_with(prefix)) why.remove_prefix(prefix.size());
      throw bad(why);
    }
  }
}

CHORUS_DETAIL_SIM_INLINE void SimRuntime::fail_after(std::string_view call, int n, int cuda_error) {
  if (std::find(std::begin(detail::kSimCalls), std::end(detail::kSimCalls), call) == std::end(detail::kSimCalls)) {
    std::string known;
    for (auto c : detail::kSimCalls) known += (known.empty() ? "" : ", ") + std::string(c);
    throw Error(ErrorCode::invalid_argument,
                "SimRuntime::fail_after: unknown call '" + std::string(call) + "' (one of " + known + ")");
  }
  if (n < 1 || cuda_error == 0)
    throw Error(ErrorCode::invalid_argument, "SimRuntime::fail_after: n must be >= 1 and the error not 0");
  std::lock_guard lk(mu_);
  injections_.insert_or_assign(std::string(call), Injection{n, cuda_error});
}

CHORUS_DETAIL_SIM_INLINE void SimRuntime::stall_after(std::string_view call, int n, std::chrono::milliseconds how_long) {
  const auto first_stream_call = std::begin(detail::kSimCalls) + 4;  // after the allocations and creations
  if (std::find(first_stream_call, std::end(detail::kSimCalls), call) == std::end(detail::kSimCalls) || n < 1)
    throw Error(ErrorCode::invalid_argument, "SimRuntime::stall_after: '" + std::string(call) +
                                                 "' is not a stream operation of the simulation, or n < 1");
  std::lock_guard lk(mu_);
  stalls_.insert_or_assign(std::string(call), std::pair{n, how_long});
}

CHORUS_DETAIL_SIM_INLINE int SimRuntime::take_injection(std::string_view call) {
  auto it = injections_.find(call);
  if (it == injections_.end()) return 0;
  if (--it->second.remaining > 0) return 0;
  const int e = it->second.cuda_error;
  injections_.erase(it);
  return e;
}

}  // namespace chorus::device
