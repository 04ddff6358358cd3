// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// Compile-mode macros: the one place that knows whether nvcc is compiling. (The version macros
/// are in chorus/version.hpp.)

#if defined(__CUDACC__)
#define CHORUS_HOST_DEVICE __host__ __device__
#define CHORUS_DEVICE_COMPILE 1
#else
#define CHORUS_HOST_DEVICE
#define CHORUS_DEVICE_COMPILE 0
#endif

#if defined(CHORUS_WITH_CUDA) && CHORUS_WITH_CUDA
#define CHORUS_HAS_CUDA 1
#else
#define CHORUS_HAS_CUDA 0
#endif

#if defined(CHORUS_WITH_RDMA) && CHORUS_WITH_RDMA
#define CHORUS_HAS_RDMA 1
#else
#define CHORUS_HAS_RDMA 0
#endif

/// The inline namespace that holds every definition CHORUS_WITH_RDMA changes, so that translation
/// units of one program built with and without it (one target linking chorus::rdma, another only
/// chorus::chorus) cannot silently share one of them (an ODR violation the linker would not see:
/// it keeps one copy of each inline function). It holds rdma::Transport and its provider
/// (transport/rdma/detail/provider.hpp opens libibverbs only with the option), hybrid::Transport
/// (chorus::DefaultTransport) and chorus::init(); every Communicator<DefaultTransport> member is
/// named after its transport, so it differs too. Users never spell it. A communicator passed from
/// a translation unit of one mode to a function compiled in the other, or an extern-template
/// instance compiled in the other mode, fails to link, the missing symbol naming the namespace:
///   undefined reference to `chorus::Communicator<chorus::hybrid::with_rdma::Transport>::barrier()'
/// (tests/compile/options_odr). CHORUS_WITH_CUDA is not in the name: no header reads it (the CUDA
/// runtime comes in at run time, registered by the .cu file that includes chorus/cuda.hpp), so
/// targets with and without chorus::cuda share communicators. A definition that comes to depend on
/// CHORUS_HAS_CUDA or on a new option belongs in a namespace whose name says that option too.
#if CHORUS_HAS_RDMA
#define CHORUS_OPTIONS_NAMESPACE with_rdma
#else
#define CHORUS_OPTIONS_NAMESPACE without_rdma
#endif

/// CHORUS_DECL marks a function whose body lives in a body file (an impl/ header beside its
/// declaration; Boost.Asio's BOOST_ASIO_DECL): inline in a header-only program, whose headers
/// include the bodies, and plain in a program built with CHORUS_SEPARATE_COMPILATION
/// (chorus/compiled.hpp), where the bodies are compiled once, in chorus::compiled or the program's
/// chorus/src.hpp (both through chorus/impl/bodies.hpp), and every other unit sees the declaration
/// only. The entry points so marked are those through which a unit would otherwise compile the
/// stores, the launcher and the host reduction loops again: rendezvous(), launch_local(),
/// launched_by_launcher(), TcpStore's constructor, destructor and operations, the logger, and
/// reduce() / finalize_avg() on a DataType.
#if defined(CHORUS_SEPARATE_COMPILATION)
#define CHORUS_DECL
#else
#define CHORUS_DECL inline
#endif
