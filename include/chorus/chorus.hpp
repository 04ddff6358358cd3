// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// The one include a user needs.
///
///   #include <chorus/chorus.hpp>
///   int main() {
///     auto comm = chorus::init();          // rank, size, store from the environment
///     std::vector<float> grad(1 << 20);
///     comm.barrier();
///   }

#include "chorus/config.hpp"
#include "chorus/version.hpp"
#include "chorus/core/buffer.hpp"
#include "chorus/core/concepts.hpp"
#include "chorus/core/error.hpp"
#include "chorus/core/request.hpp"
#include "chorus/core/types.hpp"
#include "chorus/options.hpp"
#include "chorus/bootstrap/store.hpp"
#include "chorus/bootstrap/file_store.hpp"
#include "chorus/bootstrap/tcp_store.hpp"
#include "chorus/bootstrap/launch_env.hpp"
#include "chorus/bootstrap/local_launch.hpp"
#include "chorus/bootstrap/rendezvous.hpp"
#include "chorus/transport/hybrid/transport.hpp"
#include "chorus/transport/inproc/transport.hpp"
#include "chorus/transport/shm/transport.hpp"
#include "chorus/transport/tcp/transport.hpp"
#include "chorus/communicator.hpp"
#include "chorus/call.hpp"
#include "chorus/group.hpp"
#include "chorus/persistent.hpp"
#include "chorus/compiled.hpp"
#include "chorus/fwd.hpp"
#include "chorus/all_to_all_v.hpp"
#include "chorus/v_collectives.hpp"
#include "chorus/registered_memory.hpp"
#include "chorus/sgd/sgd.hpp"

namespace chorus {

// chorus::DefaultTransport, hybrid::Transport, is declared in chorus/fwd.hpp.

#if defined(CHORUS_EXTERN_TEMPLATES) && !defined(CHORUS_SEPARATE_COMPILATION)
/// A build that compiles the default communicator once, in one file holding
/// `template class chorus::Communicator<chorus::DefaultTransport>;`, defines CHORUS_EXTERN_TEMPLATES
/// for its other files, which then only declare it. (CHORUS_SEPARATE_COMPILATION, chorus/compiled.hpp,
/// does that for every transport and Boost.Asio at once.)
extern template class Communicator<DefaultTransport>;
#endif

// Its return type depends on CHORUS_WITH_RDMA, its name does not: named after the option
// (config.hpp: CHORUS_OPTIONS_NAMESPACE).
inline namespace CHORUS_OPTIONS_NAMESPACE {

/// Creates the communicator the environment describes (see docs/environment.md).
inline Communicator<DefaultTransport> init(Options options = Options::from_env()) {
  return Communicator<DefaultTransport>::create(std::move(options));
}

}  // inline namespace CHORUS_OPTIONS_NAMESPACE

}  // namespace chorus
