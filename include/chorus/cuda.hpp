// SPDX-License-Identifier: BSD-3-Clause
#pragma once
/// chorus with CUDA device buffers. Include this from one translation unit that nvcc compiles (a
/// .cu file, e.g. the one with your kernels) and link chorus::cuda: it makes the CUDA runtime
/// (device/cuda_runtime.hpp) the process's default device runtime, so every communicator created
/// afterwards tells device memory from host memory and takes device buffers on a stream. The
/// communicator itself is host code: include chorus/chorus.hpp from the .cpp files (nvcc 13's
/// front end cannot compile Boost.Asio, which chorus.hpp brings):
///
///   // kernels.cu
///   #include <chorus/cuda.hpp>
///   // train.cpp
///   #include <chorus/chorus.hpp>
///   auto comm = chorus::init();
///   comm.all_reduce(d_grads, d_grads, n, chorus::DataType::float32, chorus::ReduceOp::sum, stream);

#if defined(__CUDACC__)
#include "chorus/device/cuda_runtime.hpp"
#include "chorus/device/default.hpp"

namespace chorus::device::detail {
/// The process's CUDA runtime, made the default before main() (it makes no CUDA call until a
/// communicator uses it).
inline CudaRuntime& cuda_runtime() {
  static CudaRuntime rt;
  return rt;
}
inline const bool cuda_runtime_registered = [] {
  if (default_runtime() == nullptr) set_default_runtime(&cuda_runtime());
  return true;
}();
}  // namespace chorus::device::detail
#else
#error "chorus/cuda.hpp is for a translation unit that nvcc compiles (a .cu file); host code includes chorus/chorus.hpp"
#endif
