# SPDX-License-Identifier: BSD-3-Clause
# Optional backends, auto-detected. Each option defaults to ON when its backend is found and OFF
# when it is not; asking for a backend that is absent warns and turns it off, never fails.
#
#   CHORUS_WITH_CUDA  CUDA toolkit (cudart; nvcc for tests/cuda/*.cu)  -> target chorus::cuda
#   CHORUS_WITH_RDMA  libibverbs + <infiniband/verbs.h>                -> target chorus::rdma
#
# The backend targets add their library and the CHORUS_WITH_<X>=1 define on top of chorus::chorus,
# so a program that does not ask for a backend never links it.

include_guard(GLOBAL)
include("${CMAKE_CURRENT_LIST_DIR}/chorusIbverbs.cmake")

# ---- CUDA -----------------------------------------------------------------------------------------
set(_chorus_cuda_found OFF)
if(NOT DEFINED CHORUS_WITH_CUDA OR CHORUS_WITH_CUDA)
  if(NOT DEFINED CUDAToolkit_ROOT AND NOT DEFINED ENV{CUDAToolkit_ROOT} AND NOT DEFINED ENV{CUDA_PATH}
     AND EXISTS "/usr/local/cuda/bin/nvcc")
    set(CUDAToolkit_ROOT "/usr/local/cuda")
  endif()
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND AND TARGET CUDA::cudart)
    set(_chorus_cuda_found ON)
  endif()
endif()
option(CHORUS_WITH_CUDA "Build the CUDA parts (chorus::cuda, tests/cuda); auto-detected" ${_chorus_cuda_found})
if(CHORUS_WITH_CUDA AND NOT _chorus_cuda_found)
  message(WARNING "CHORUS_WITH_CUDA is ON but no CUDA toolkit was found: building without CUDA")
  set(CHORUS_WITH_CUDA OFF)
endif()

# ---- RDMA (libibverbs) ----------------------------------------------------------------------------
set(_chorus_rdma_found OFF)
if(NOT DEFINED CHORUS_WITH_RDMA OR CHORUS_WITH_RDMA)
  chorus_find_ibverbs(_chorus_rdma_found)
endif()
option(CHORUS_WITH_RDMA "Build the RDMA transport (chorus::rdma, libibverbs); auto-detected" ${_chorus_rdma_found})
if(CHORUS_WITH_RDMA AND NOT _chorus_rdma_found)
  message(WARNING "CHORUS_WITH_RDMA is ON but libibverbs or infiniband/verbs.h was not found: building without RDMA")
  set(CHORUS_WITH_RDMA OFF)
endif()

# nvcc as the CUDA compiler, for directories that build .cu files (call at directory scope, before
# adding CUDA targets). Sets CHORUS_CUDA_LANGUAGE to ON when the CUDA language is enabled.
macro(chorus_enable_cuda_language)
  set(CHORUS_CUDA_LANGUAGE OFF)
  if(CHORUS_WITH_CUDA)
    if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND CUDAToolkit_NVCC_EXECUTABLE)
      set(CMAKE_CUDA_COMPILER "${CUDAToolkit_NVCC_EXECUTABLE}")
    endif()
    if(NOT CMAKE_CUDA_ARCHITECTURES)  # unset, or the empty cache entry another directory's enable_language left
      set(CMAKE_CUDA_ARCHITECTURES 80 90)   # A100, H100
    endif()
    include(CheckLanguage)
    check_language(CUDA)
    if(CMAKE_CUDA_COMPILER)
      enable_language(CUDA)
      set(CHORUS_CUDA_LANGUAGE ON)
      # CMake 3.25 does not know nvcc's -std=c++20 (nvcc >= 12 has it): teach it here.
      if(NOT "cuda_std_20" IN_LIST CMAKE_CUDA_COMPILE_FEATURES
         AND CMAKE_CUDA_COMPILER_ID STREQUAL "NVIDIA" AND CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 12.0)
        set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
        set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
        set(CMAKE_CUDA20_COMPILE_FEATURES cuda_std_20)
        list(APPEND CMAKE_CUDA_COMPILE_FEATURES cuda_std_20)
      endif()
    else()
      message(WARNING "CUDA toolkit found but no working nvcc: .cu files are not built")
    endif()
  endif()
endmacro()

# CHORUS_CUDA_CHECK_ONLY: chorus's own CUDA sources compile their device code without nvcc's device
# optimiser (-Xcicc -O0): the front end, every template instantiation and nvcc's warnings as
# before, valid PTX, in a quarter of the CPU time (cmake/instances/cuda_runtime_instance.cu, PTX for
# compute_80: 14 CPU-s against 61). For a build whose CUDA objects no GPU runs: CI's release stage
# (scripts/run-tests) sets it; a GPU bundle of its own tree (scripts/gpu-bundle) and users never do.
option(CHORUS_CUDA_CHECK_ONLY "Compile chorus's own device code unoptimised (a compile check; no GPU runs it)" OFF)

# chorus_cuda_warnings(<target>): nvcc's warnings for the CUDA sources of one of chorus's own
# targets: the host compiler's -Wall -Wextra, and with CHORUS_WERROR every warning of nvcc
# (-Werror all-warnings) and of the host compiler (-Xcompiler=-Werror) an error. With
# CHORUS_CUDA_CHECK_ONLY, the device code unoptimised (above).
function(chorus_cuda_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANG_AND_ID:CUDA,NVIDIA>:-Xcompiler=-Wall,-Wextra>
    $<$<AND:$<BOOL:${CHORUS_WERROR}>,$<COMPILE_LANG_AND_ID:CUDA,NVIDIA>>:-Werror=all-warnings -Xcompiler=-Werror>
    $<$<AND:$<BOOL:${CHORUS_CUDA_CHECK_ONLY}>,$<COMPILE_LANG_AND_ID:CUDA,NVIDIA>>:SHELL:-Xcicc -O0>)
endfunction()

# chorus_cuda_runtime_instance(): defines (once) chorus_cuda_runtime_instance, the static library
# with the CUDA runtime of chorus's own programs (cmake/instances/cuda_runtime_instance.cu: the
# build's one nvcc translation unit that instantiates the runtime's kernels, for every
# architecture; tests/cuda and the *_perf programs share it). Call it after
# chorus_enable_cuda_language() turned CHORUS_CUDA_LANGUAGE on.
function(chorus_cuda_runtime_instance)
  if(TARGET chorus_cuda_runtime_instance)
    return()
  endif()
  add_library(chorus_cuda_runtime_instance STATIC "${PROJECT_SOURCE_DIR}/cmake/instances/cuda_runtime_instance.cu")
  target_link_libraries(chorus_cuda_runtime_instance PUBLIC chorus_cuda_static PRIVATE chorus_project_options)
  target_include_directories(chorus_cuda_runtime_instance PUBLIC "${PROJECT_SOURCE_DIR}/cmake/instances")
  set_target_properties(chorus_cuda_runtime_instance PROPERTIES CUDA_STANDARD 20 CUDA_STANDARD_REQUIRED ON
                        CUDA_RUNTIME_LIBRARY Static)
  chorus_cuda_warnings(chorus_cuda_runtime_instance)
endfunction()

# chorus_cuda_program(<target>): one of chorus's own CUDA programs (tests/cuda, the *_perf
# programs), made so that it runs when copied to a machine with nothing but a CUDA driver
# (scripts/gpu-bundle): cudart linked statically (nvcc's default; with chorus_cuda_static, never
# beside the shared one), and an RPATH of $ORIGIN, as DT_RPATH (not DT_RUNPATH) so that it also
# serves the dependencies of the shared libraries copied beside the program.
function(chorus_cuda_program target)
  set_target_properties(${target} PROPERTIES CUDA_RUNTIME_LIBRARY Static BUILD_RPATH "$ORIGIN")
  target_link_options(${target} PRIVATE "LINKER:--disable-new-dtags")
endfunction()

# Defines chorus::cuda and chorus::rdma for the backends that are ON, and chorus_cuda_static
# (chorus::cuda with cudart linked statically, for chorus's own CUDA programs; not installed).
function(chorus_define_backend_targets)
  if(CHORUS_WITH_CUDA)
    add_library(chorus_cuda INTERFACE)
    add_library(chorus::cuda ALIAS chorus_cuda)
    set_target_properties(chorus_cuda PROPERTIES EXPORT_NAME cuda)
    target_link_libraries(chorus_cuda INTERFACE chorus CUDA::cudart)
    target_compile_definitions(chorus_cuda INTERFACE CHORUS_WITH_CUDA=1)
    add_library(chorus_cuda_static INTERFACE)
    target_link_libraries(chorus_cuda_static INTERFACE chorus CUDA::cudart_static)
    target_compile_definitions(chorus_cuda_static INTERFACE CHORUS_WITH_CUDA=1)
  endif()
  if(CHORUS_WITH_RDMA)
    add_library(chorus_rdma INTERFACE)
    add_library(chorus::rdma ALIAS chorus_rdma)
    set_target_properties(chorus_rdma PROPERTIES EXPORT_NAME rdma)
    target_link_libraries(chorus_rdma INTERFACE chorus chorus::ibverbs)
    target_compile_definitions(chorus_rdma INTERFACE CHORUS_WITH_RDMA=1)
  endif()
endfunction()
