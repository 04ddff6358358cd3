// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// The CHORUS_ALGO value that forces `name` on every collective that has it and leaves the others
/// to the model ("ring" -> "all_reduce:ring,reduce:ring,all_gather:ring,reduce_scatter:ring"): a
/// bare name forces every collective, and one that lacks it fails (algo/select.hpp).

#include <algorithm>
#include <string>

#include "chorus/algo/select.hpp"

namespace chorus::test {

inline std::string forced_where_it_applies(const std::string& name) {
  if (name.empty()) return name;
  const algo::Algorithm a = algo::parse_algorithm(name, "forced_where_it_applies");
  std::string out;
  for (algo::CollectiveKind k : algo::kForcibleKinds) {
    const auto have = algo::forcible_algorithms(k);
    if (std::find(have.begin(), have.end(), a) == have.end()) continue;
    if (!out.empty()) out.push_back(',');
    out.append(algo::to_string(k)).append(":").append(name);
  }
  return out;
}

}  // namespace chorus::test
