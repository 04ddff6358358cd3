// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// Declarations for code that only passes communicators around: a header that names
/// `chorus::Communicator<chorus::DefaultTransport>&` in its functions includes this instead of
/// chorus/chorus.hpp (which brings every transport, Boost.Asio and OpenSSL); the .cpp file that
/// calls the communicator's members includes chorus/chorus.hpp.
///
///   // trainer.hpp
///   #include <chorus/fwd.hpp>
///   void train(chorus::Communicator<chorus::DefaultTransport>& comm, Model& model);
///
/// It includes chorus/config.hpp and nothing else (no standard header): a file that includes only
/// it preprocesses to under 40 lines, against about 280,000 for chorus/chorus.hpp.

#include "chorus/config.hpp"

namespace chorus {

enum class DataType;  // core/types.hpp
enum class ReduceOp;  // core/types.hpp
struct Options;       // options.hpp
class Request;        // core/request.hpp

template <class T>
class Communicator;  // communicator.hpp (T models chorus::Transport, checked where it is complete)

namespace hybrid {
inline namespace CHORUS_OPTIONS_NAMESPACE {  // config.hpp: named after CHORUS_WITH_RDMA
class Transport;                             // transport/hybrid/transport.hpp
}  // inline namespace CHORUS_OPTIONS_NAMESPACE
}  // namespace hybrid

/// The transport chorus::init() uses: picks per peer from Options::transport (CHORUS_TRANSPORT,
/// default auto): per pair of ranks, the first of cuda_ipc, shm, rdma, tcp that can connect it
/// (transport/registry.hpp, transport/hybrid).
using DefaultTransport = hybrid::Transport;

}  // namespace chorus
