// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// CHORUS_SOCKET_IFNAME's value, read as NCCL reads NCCL_SOCKET_IFNAME: a comma-separated list of
/// interface name prefixes ("eth,ib": eth0, eth1, ib0, ...); "^" before the list keeps the
/// interfaces that match none of it instead ("^docker,lo"); "=" makes the names exact ("=eth0":
/// eth0 but not eth0.100; "^=docker0": all but docker0). A single plain name ("eth0") is a prefix
/// too; the interface of exactly that name is preferred over the others it matches
/// (tcp/detail/socket.hpp), so the name of one interface still means that interface.

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include "chorus/core/error.hpp"
#include "chorus/detail/env.hpp"

namespace chorus::detail {

struct InterfaceFilter {
  std::string text;                ///< as given, for messages
  bool exclude = false;            ///< "^": the interfaces that match no entry
  bool exact = false;              ///< "=": entries are whole names, not prefixes
  std::vector<std::string> names;  ///< the entries, at least one

  /// Throws invalid_argument naming CHORUS_SOCKET_IFNAME when the list has no entry ("", "^", "=,").
  static InterfaceFilter parse(std::string_view text) {
    InterfaceFilter f;
    f.text = std::string(text);
    if (text.starts_with('^')) {
      f.exclude = true;
      text.remove_prefix(1);
    }
    if (text.starts_with('=')) {
      f.exact = true;
      text.remove_prefix(1);
    }
    f.names = split_list(text);
    if (f.names.empty())
      throw Error(ErrorCode::invalid_argument,
                  "CHORUS_SOCKET_IFNAME='" + f.text +
                      "' names no interface (a comma-separated list of name prefixes, '^' before it to exclude, "
                      "'=' for exact names: 'eth,ib', '^docker,lo', '=eth0')");
    return f;
  }

  /// True when an entry names `ifname` (equal to it, or with "=" absent a prefix of it).
  bool listed(std::string_view ifname) const {
    return std::any_of(names.begin(), names.end(),
                       [&](const std::string& n) { return exact ? ifname == n : ifname.starts_with(n); });
  }
  /// True for the interfaces the filter keeps.
  bool matches(std::string_view ifname) const { return listed(ifname) != exclude; }
  /// True when an entry is exactly `ifname` and keeps it: preferred over prefix matches.
  bool named(std::string_view ifname) const {
    return !exclude && std::find(names.begin(), names.end(), ifname) != names.end();
  }
};

}  // namespace chorus::detail
