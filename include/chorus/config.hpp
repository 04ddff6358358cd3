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
