// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// Reads a network model (network.hpp) from a JSON preset (sim/presets/). Units are in
/// the key names; every key of the file must be known (a misspelt one is an error, not a default):
///
///   { "name": "...", "source": "where each figure comes from",
///     "intra": { "latency_us": 1.5, "bandwidth_GBps": 5, "overhead_us": 0.5,
///                "eager_bytes": 32768, "slice_bytes": 262144 },
///     "inter": { ... the same keys, bandwidth per NIC ... },
///     "nic_per_rank": false, "reduce_GBps": 10, "copy_GBps": 10,
///     "cache_bytes": 33554432, "cached_speedup": 2, "cached_intra_speedup": 1.5, "cores": 2,
///     "hosts_share_cores": false,
///     "wake_us": 5, "core_queues": false }
///
/// The last seven (the host: network.hpp) are optional; left out, a call has no cache tier and
/// every rank its own core.
///
/// GBps is 1e9 bytes/s; "bandwidth_Gbitps" may stand for "bandwidth_GBps" (1e9 bits/s).

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "chorus/core/error.hpp"
#include "chorus/sim/network.hpp"

namespace chorus::sim {

inline NetworkModel load_preset(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw Error(ErrorCode::invalid_argument, "sim preset '" + path + "' cannot be opened");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const std::exception& e) {
    throw Error(ErrorCode::invalid_argument, "sim preset '" + path + "' is not JSON: " + e.what());
  }
  auto bad = [&](const std::string& what) { throw Error(ErrorCode::invalid_argument, "sim preset '" + path + "': " + what); };
  auto known = [&](const nlohmann::json& o, const std::set<std::string>& keys, const std::string& where) {
    if (!o.is_object()) bad(where + " is not an object");
    for (auto it = o.begin(); it != o.end(); ++it)
      if (!keys.count(it.key())) bad("unknown key '" + where + it.key() + "'");
  };
  auto number = [&](const nlohmann::json& o, const char* key, const std::string& where) -> double {
    if (!o.contains(key)) bad("missing '" + where + key + "'");
    if (!o.at(key).is_number()) bad("'" + where + key + "' is not a number");
    return o.at(key).get<double>();
  };
  known(j, {"name", "source", "notes", "intra", "inter", "nic_per_rank", "reduce_GBps", "copy_GBps",
             "cache_bytes", "cached_speedup", "cached_intra_speedup", "cores", "hosts_share_cores", "wake_us", "core_queues", "overhead_queues", "control_queue_bytes",
             "in_place_reduce_speedup"}, "");
  chorus::sim::NetworkModel m;
  m.name = j.value("name", path);
  m.source = j.value("source", "");
  auto link = [&](const char* key) {
    chorus::sim::LinkClass c;
    if (!j.contains(key)) bad(std::string("missing '") + key + "'");
    const auto& o = j.at(key);
    const std::string where = std::string(key) + ".";
    known(o, {"latency_us", "bandwidth_GBps", "bandwidth_Gbitps", "overhead_us", "eager_bytes", "slice_bytes", "burst_bytes", "handshake_us", "cpu_share", "notes"}, where);
    c.latency = number(o, "latency_us", where) * 1e-6;
    if (o.contains("bandwidth_Gbitps"))
      c.bandwidth = number(o, "bandwidth_Gbitps", where) * 1e9 / 8;
    else
      c.bandwidth = number(o, "bandwidth_GBps", where) * 1e9;
    c.overhead = number(o, "overhead_us", where) * 1e-6;
    c.eager_bytes = static_cast<std::size_t>(number(o, "eager_bytes", where));
    c.slice_bytes = static_cast<std::size_t>(number(o, "slice_bytes", where));
    c.burst_bytes = o.contains("burst_bytes") ? number(o, "burst_bytes", where) : 0.0;
    c.handshake = o.contains("handshake_us") ? number(o, "handshake_us", where) * 1e-6 : 0.0;
    c.cpu_share = o.contains("cpu_share") ? number(o, "cpu_share", where) : 0.0;
    return c;
  };
  m.intra = link("intra");
  m.inter = link("inter");
  m.nic_per_rank = j.value("nic_per_rank", false);
  m.reduce_rate = number(j, "reduce_GBps", "") * 1e9;
  m.copy_rate = number(j, "copy_GBps", "") * 1e9;
  auto optional = [&](const char* key, double dflt) { return j.contains(key) ? number(j, key, "") : dflt; };
  m.cache_bytes = static_cast<std::size_t>(optional("cache_bytes", 0));
  m.cached_speedup = optional("cached_speedup", 1);
  m.cached_intra_speedup = optional("cached_intra_speedup", 1);
  m.in_place_reduce_speedup = optional("in_place_reduce_speedup", 1);
  m.cores = optional("cores", 0);
  m.hosts_share_cores = j.value("hosts_share_cores", false);
  m.wake = optional("wake_us", 0) * 1e-6;
  m.core_queues = j.value("core_queues", false);
  m.overhead_queues = j.value("overhead_queues", false);
  m.control_queue_bytes = j.value("control_queue_bytes", 0.0);
  m.check();
  return m;
}

}  // namespace chorus::sim
