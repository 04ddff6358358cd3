// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// Ranks as threads of one process on one simulated device (device::SimRuntime), at every world
/// size from 1 to `max_world`: each rank makes its communicator over inproc with the runtime set,
/// and a stream of its own, and runs fn(comm, runtime, stream); its stream goes afterwards, after
/// a barrier. The runtime outlives the communicators. Ranks as threads share the device: a body
/// frees device memory only between two barriers (freeing waits for the whole device, and a
/// peer's call may still run; support/device_matrix.hpp says more).

#include <doctest/doctest.h>

#include <chrono>
#include <cstddef>
#include <utility>
#include <vector>

#include "chorus/communicator.hpp"
#include "chorus/testing/sim_runtime.hpp"
#include "chorus/transport/inproc/transport.hpp"
#include "support/spawn.hpp"

namespace chorus::test {

template <class Fn>
void run_device_threads(int max_world, const Fn& fn, std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  for (int n = 1; n <= max_world; ++n) {
    CAPTURE(n);
    chorus::device::SimRuntime rt;
    ThreadOptions t;
    t.timeout = timeout;
    run_threads(
        n,
        [&](int, chorus::Options o) {
          auto c = chorus::Communicator<chorus::inproc::Transport>::create(std::move(o));
          c.set_device_runtime(&rt);
          const chorus::device::Stream s = rt.create_stream();
          fn(c, rt, s);
          c.barrier();
          rt.destroy_stream(s);
          c.barrier();
        },
        t);
  }
}

/// The `count` elements at device address `d`, read back once stream `s` has run its work.
template <class T>
std::vector<T> read_device(chorus::device::Runtime& rt, const T* d, std::size_t count,
                           chorus::device::Stream s) {
  std::vector<T> h(count);
  rt.copy(h.data(), d, count * sizeof(T), s);
  rt.synchronize(s);
  return h;
}

}  // namespace chorus::test
