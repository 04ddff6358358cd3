// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// Comm: the communicator under a ProcessGroupChorus, chorus::Communicator<chorus::DefaultTransport>
// (shm between processes of one host, tcp across hosts).
//
// A class of its own rather than an alias so that group.hpp can forward-declare it: only the
// files that call the communicator (group.cpp, launch.cpp, point_to_point.cpp) compile chorus's
// transports; the operations' argument handling does not.

#include <utility>

#include "chorus/chorus.hpp"

namespace chorus_torch {

class Comm final : public chorus::Communicator<chorus::DefaultTransport> {
 public:
  using Base = chorus::Communicator<chorus::DefaultTransport>;
  explicit Comm(Base&& c) : Base(std::move(c)) {}
};

}  // namespace chorus_torch
