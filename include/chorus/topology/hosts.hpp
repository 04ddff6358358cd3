// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// Which ranks of a group share a host, and the rank orders the hierarchical algorithms
/// (algo/hierarchical.hpp) build on it. Pure rank arithmetic over a table made once per
/// communicator: no I/O.
///
/// Hosts are numbered in the order of their lowest rank; a host's ranks, in rank order, are its
/// local ranks 0, 1, ... Rail l is the group of the l-th local rank of every host, for l below the
/// smallest host's size R: each rail holds one rank per host, so R rails carry R slices of a
/// buffer between the hosts at once, each over its own connections (NCCL's channels and rails).
/// Leaders are rail 0. Hosts of 3 + 2 + 1 ranks have one rail; their extra local ranks take part
/// inside their host only.

#include <algorithm>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

namespace chorus::topology {

class Hosts {
 public:
  /// One host holding `n` ranks.
  explicit Hosts(int n = 1) { assign(std::vector<std::size_t>(static_cast<std::size_t>(n), 0)); }

  /// From a key per rank, equal for the ranks of one host (host ids, or host indices of a parent).
  template <class Key>
  static Hosts from_keys(std::span<const Key> keys) {
    std::vector<std::size_t> index(keys.size());
    std::vector<std::size_t> first;  // rank holding each host's key first
    for (std::size_t r = 0; r < keys.size(); ++r) {
      std::size_t h = 0;
      while (h < first.size() && !(keys[first[h]] == keys[r])) ++h;
      if (h == first.size()) first.push_back(r);
      index[r] = h;
    }
    Hosts t;
    t.assign(index);
    return t;
  }

  /// The layout of a sub-group: `members[i]` is the rank (of this layout) of its rank i.
  Hosts restrict(std::span<const int> members) const {
    std::vector<int> keys(members.size());
    for (std::size_t i = 0; i < members.size(); ++i) keys[i] = host_of(members[i]);
    return from_keys(std::span<const int>(keys));
  }

  int ranks() const { return static_cast<int>(host_of_.size()); }
  int host_count() const { return static_cast<int>(members_.size()); }
  int host_of(int r) const { return host_of_[static_cast<std::size_t>(r)]; }
  int local_rank(int r) const { return local_[static_cast<std::size_t>(r)]; }
  int local_size(int r) const { return static_cast<int>(members(host_of(r)).size()); }
  /// The ranks of host h, in rank order (local rank -> rank).
  std::span<const int> members(int h) const { return members_[static_cast<std::size_t>(h)]; }
  int min_local_size() const { return min_; }
  int max_local_size() const { return max_; }
  /// Rails: one per local rank of the smallest host (see the top).
  int rails() const { return min_; }
  /// Rail l's ranks, one per host in host order; a rank's index in it is its host.
  std::vector<int> rail(int l) const {
    std::vector<int> r(members_.size());
    for (std::size_t h = 0; h < members_.size(); ++h) r[h] = members_[h][static_cast<std::size_t>(l)];
    return r;
  }
  /// Whether a hierarchy exists: two hosts or more, one of them with two ranks or more.
  bool hierarchical() const { return host_count() >= 2 && max_ >= 2; }
  /// Whether the hosts' ranks are in host order (host 0's ranks first, then host 1's, ...).
  bool blocked() const {
    for (std::size_t r = 1; r < host_of_.size(); ++r)
      if (host_of_[r] < host_of_[r - 1]) return false;
    return true;
  }
  /// "3 hosts: 2 + 2 + 2 ranks".
  std::string describe() const {
    std::string s = std::to_string(host_count()) + (host_count() == 1 ? " host: " : " hosts: ");
    for (std::size_t h = 0; h < members_.size(); ++h) s += (h ? " + " : "") + std::to_string(members_[h].size());
    return s + (ranks() == 1 ? " rank" : " ranks");
  }

 private:
  void assign(const std::vector<std::size_t>& index) {
    host_of_.assign(index.size(), 0);
    local_.assign(index.size(), 0);
    members_.clear();
    for (std::size_t r = 0; r < index.size(); ++r) {
      if (index[r] >= members_.size()) members_.resize(index[r] + 1);
      host_of_[r] = static_cast<int>(index[r]);
      local_[r] = static_cast<int>(members_[index[r]].size());
      members_[index[r]].push_back(static_cast<int>(r));
    }
    min_ = max_ = members_.empty() ? 0 : static_cast<int>(members_[0].size());
    for (const auto& m : members_) {
      min_ = std::min(min_, static_cast<int>(m.size()));
      max_ = std::max(max_, static_cast<int>(m.size()));
    }
  }

  std::vector<int> host_of_, local_;
  std::vector<std::vector<int>> members_;
  int min_ = 0, max_ = 0;
};

}  // namespace chorus::topology
