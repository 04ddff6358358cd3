// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// Separate compilation (Boost.Asio's model): a program defines CHORUS_SEPARATE_COMPILATION (and
/// BOOST_ASIO_SEPARATE_COMPILATION) in every translation unit and links one compiled copy of
/// chorus: the CMake target chorus::compiled, or one .cpp of its own that includes chorus/src.hpp.
/// Every other unit then sees the communicators of every transport declared `extern` here and
/// compiles none of their members again, nor Boost.Asio's. chorus/chorus.hpp includes this header;
/// without CHORUS_SEPARATE_COMPILATION it declares nothing and chorus stays header-only.
///
/// The list of transports is CHORUS_COMPILED_TRANSPORTS(X): X(transport type) for each.

#include "chorus/communicator.hpp"
#include "chorus/transport/cuda_ipc/transport.hpp"
#include "chorus/transport/hybrid/transport.hpp"
#include "chorus/transport/inproc/transport.hpp"
#include "chorus/transport/rdma/transport.hpp"
#include "chorus/transport/shm/transport.hpp"
#include "chorus/transport/tcp/transport.hpp"

// clang-format off
#define CHORUS_COMPILED_TRANSPORTS(X) \
  X(chorus::hybrid::Transport)        \
  X(chorus::inproc::Transport)        \
  X(chorus::tcp::Transport)           \
  X(chorus::shm::Transport)           \
  X(chorus::rdma::Transport)          \
  X(chorus::cuda_ipc::Transport)
// clang-format on

#if defined(CHORUS_SEPARATE_COMPILATION)
#if !defined(BOOST_ASIO_SEPARATE_COMPILATION)
#error "CHORUS_SEPARATE_COMPILATION needs BOOST_ASIO_SEPARATE_COMPILATION too (chorus::compiled defines both)"
#endif
#define CHORUS_DETAIL_EXTERN_COMMUNICATOR(T) extern template class chorus::Communicator<T>; extern template class chorus::Persistent<T>;
CHORUS_COMPILED_TRANSPORTS(CHORUS_DETAIL_EXTERN_COMMUNICATOR)
#undef CHORUS_DETAIL_EXTERN_COMMUNICATOR
#endif
