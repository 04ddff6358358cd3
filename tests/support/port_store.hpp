// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// The store of a multi-process test whose ranks are started by a script (tests/integration/):
/// rank 0 serves a TcpStore on `host` port 0 and publishes the port the kernel gave it in
/// `port_file` (written aside, then renamed, so a reader never sees half of it); the other ranks
/// wait for that file (bounded by `timeout`, then timeout naming the file) and connect. No port
/// is fixed in advance, so tests can run at once.

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>

#include "chorus/bootstrap/tcp_store.hpp"
#include "chorus/core/error.hpp"

namespace chorus::test {

inline std::shared_ptr<Store> open_port_file_store(int rank, const std::string& host, const std::string& port_file,
                                                   std::chrono::milliseconds timeout) {
  if (rank == 0) {
    auto s = std::make_shared<TcpStore>(host, 0, /*is_server=*/true, timeout);
    const std::string tmp = port_file + ".tmp";
    std::ofstream(tmp) << s->port() << "\n";
    std::filesystem::rename(tmp, port_file);
    return s;
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int port = 0;
  while (!(std::ifstream(port_file) >> port)) {
    if (std::chrono::steady_clock::now() > deadline) throw Error(ErrorCode::timeout, "no port file " + port_file);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return std::make_shared<TcpStore>(host, static_cast<std::uint16_t>(port), false, timeout);
}

}  // namespace chorus::test
