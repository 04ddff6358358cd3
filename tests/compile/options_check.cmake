# SPDX-License-Identifier: BSD-3-Clause
# cmake -D STEP=<matched|mixed> -D CHORUS_SOURCE_DIR=... -D SOURCE_DIR=.../options_odr \
#       -D WORK_DIR=... -D GENERATOR=... -D CXX_COMPILER=... -P options_check.cmake
#
# Builds tests/compile/options_odr (two programs from one pair of files, see its CMakeLists.txt):
#   matched  configures WORK_DIR afresh, compiles the three objects, links `matched` and runs it:
#            the pair links when both halves were built in the same mode;
#   mixed    links `mixed` (one half with CHORUS_WITH_RDMA=1, one without) in the same WORK_DIR
#            and passes only when the link fails with an undefined symbol that names the options
#            namespace (chorus::hybrid::with_rdma::Transport, config.hpp).
cmake_minimum_required(VERSION 3.25)

foreach(var IN ITEMS STEP CHORUS_SOURCE_DIR SOURCE_DIR WORK_DIR GENERATOR CXX_COMPILER)
  if(NOT ${var})
    message(FATAL_ERROR "options_check: ${var} is not set")
  endif()
endforeach()

set(build "${WORK_DIR}/build")
if(STEP STREQUAL "matched" OR NOT EXISTS "${build}/CMakeCache.txt")
  file(REMOVE_RECURSE "${WORK_DIR}")
  file(MAKE_DIRECTORY "${WORK_DIR}")
  # No build type (-O0: the test is about symbols), no CUDA (not in the namespace's name).
  set(configure_args -S "${SOURCE_DIR}" -B "${build}" -G "${GENERATOR}" -D "CMAKE_CXX_COMPILER=${CXX_COMPILER}"
      -D "CHORUS_SOURCE_DIR=${CHORUS_SOURCE_DIR}" -D CHORUS_WITH_RDMA=ON -D CHORUS_WITH_CUDA=OFF)
  # Output goes to the test's log; a failing step ends the test.
  execute_process(COMMAND "${CMAKE_COMMAND}" ${configure_args} COMMAND_ERROR_IS_FATAL ANY)
  # Every object compiles: what follows is about the link alone.
  execute_process(COMMAND "${CMAKE_COMMAND}" --build "${build}" --target peer_rdma0 main_rdma0 main_rdma1
                  COMMAND_ERROR_IS_FATAL ANY)
endif()

if(STEP STREQUAL "matched")
  execute_process(COMMAND "${CMAKE_COMMAND}" --build "${build}" --target matched COMMAND_ERROR_IS_FATAL ANY)
  find_program(exe NAMES matched PATHS "${build}" "${build}/Debug" NO_DEFAULT_PATH NO_CACHE)
  if(NOT exe)
    message(FATAL_ERROR "options_check: no matched executable under ${build}")
  endif()
  execute_process(COMMAND "${exe}" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0 OR NOT out MATCHES "chorus options pair ok")
    message(FATAL_ERROR "options_check: matched exited ${rc}: ${out}")
  endif()
  message(STATUS "options_check (matched): the pair built in one mode links and runs: ${out}")
elseif(STEP STREQUAL "mixed")
  execute_process(COMMAND "${CMAKE_COMMAND}" --build "${build}" --target mixed
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(rc EQUAL 0)
    message(FATAL_ERROR "options_check: the mixed program linked: translation units built with and "
                        "without CHORUS_WITH_RDMA were silently combined")
  endif()
  # GNU ld: "undefined reference to `...'"; lld: "undefined symbol: ...".
  set(pattern "(undefined reference to|undefined symbol:)[^\n]*chorus::hybrid::with_rdma::Transport[^\n]*")
  string(REGEX MATCHALL "${pattern}" found "${out}")
  if(NOT found)
    message(FATAL_ERROR "options_check: the mixed program failed to build, but not with an undefined "
                        "symbol naming chorus::hybrid::with_rdma::Transport:\n${out}")
  endif()
  list(REMOVE_DUPLICATES found)
  list(JOIN found "\n  " lines)
  message(STATUS "options_check (mixed): the link failed as expected:\n  ${lines}")
else()
  message(FATAL_ERROR "options_check: unknown STEP '${STEP}'")
endif()
