// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// The fake verbs provider, for tests and benchmarks: include this header in one translation unit
/// of a program, and CHORUS_IB_FAKE=<fabric file> makes the program's rdma transport open the fake
/// (testing/fake_verbs/: an RC-capable "NIC" shared by the processes of one host through that
/// file) instead of libibverbs. Including it registers open_fake with the rdma transport
/// (rdma::detail::fake_provider_opener, transport/rdma/detail/provider.hpp); a program that does
/// not include it never compiles the fake, and refuses CHORUS_IB_FAKE, saying so.
///
/// chorus/chorus.hpp never includes this header (nor anything under testing/).

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

#include "chorus/detail/env.hpp"
#include "chorus/testing/fake_verbs/fabric.hpp"
#include "chorus/testing/fake_verbs/provider.hpp"
#include "chorus/transport/rdma/detail/provider.hpp"
#include "chorus/transport/rdma/detail/verbs.hpp"

namespace chorus::rdma {

/// Opens (creating it if needed) the fake fabric at `fabric` as this process's device "fake0";
/// nullptr with `why` set when it cannot.
inline std::unique_ptr<Verbs> open_fake(const std::string& fabric, std::string& why) {
  using namespace fake;
  Faults faults;
  if (auto spec = chorus::detail::env_string("CHORUS_IB_FAKE_FAULT"))
    if (!parse_faults(*spec, faults, why)) return nullptr;
  const int fd = ::open(fabric.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    why = "cannot open the fake fabric " + fabric + ": " + std::strerror(errno);
    return nullptr;
  }
  const std::size_t bytes = (sizeof(Fabric) + 4095) / 4096 * 4096;
  struct stat st {};
  if (::fstat(fd, &st) != 0 || (static_cast<std::size_t>(st.st_size) < bytes && ::ftruncate(fd, static_cast<off_t>(bytes)) != 0)) {
    why = "cannot size the fake fabric " + fabric + ": " + std::strerror(errno);
    ::close(fd);
    return nullptr;
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) {
    why = "cannot map the fake fabric " + fabric + ": " + std::strerror(errno);
    return nullptr;
  }
  auto* f = static_cast<Fabric*>(p);
  std::uint32_t expected = 0;
  if (f->state.compare_exchange_strong(expected, 1)) {
    pthread_mutexattr_t a;
    ::pthread_mutexattr_init(&a);
    ::pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    ::pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    ::pthread_mutex_init(&f->lock, &a);
    ::pthread_mutexattr_destroy(&a);
    f->magic = kMagic;
    f->next_key = 0x1000;
    f->next_qpn = 0x100;
    f->next_cq = 1;
    f->state.store(2);
  } else {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (f->state.load() != 2 && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (f->state.load() != 2 || f->magic != kMagic) {
      ::munmap(p, bytes);
      why = "the fake fabric " + fabric + " was never set up (or is not one)";
      return nullptr;
    }
  }
  return std::make_unique<FakeVerbs>(f, bytes, fabric, faults);
}

namespace fake {
/// Registers open_fake as the provider CHORUS_IB_FAKE opens, when the program starts (an inline
/// variable: initialized once however many translation units include this header).
inline const bool kRegistered = [] {
  chorus::rdma::detail::fake_provider_opener() = &open_fake;
  return true;
}();
}  // namespace fake

}  // namespace chorus::rdma
