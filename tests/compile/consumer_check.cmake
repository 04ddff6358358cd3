# SPDX-License-Identifier: BSD-3-Clause
# cmake -D MODE=<find_package|add_subdirectory|fetchcontent|pkg_config> -D CHORUS_SOURCE_DIR=... \
#       -D CHORUS_BINARY_DIR=... -D CONSUMER_SOURCE_DIR=... -D WORK_DIR=... \
#       [-D GENERATOR=...] [-D CXX_COMPILER=...] [-D CONFIG=...] [-D VERSION=...] -P consumer_check.cmake
#
# Builds and runs tests/compile/consumer against chorus. For find_package and pkg_config it first
# installs the current build tree (CHORUS_BINARY_DIR) into WORK_DIR/prefix; pkg_config then
# compiles consumer/main.cpp with nothing but the compiler and `pkg-config --cflags --libs chorus`
# (PKG_CONFIG_PATH=<prefix>/share/pkgconfig), with CHORUS_CONSUMER_ALL_REDUCE: a one-rank
# all_reduce, so that chorus.pc's link line is exercised. With VERSION, the program must print
# "chorus <VERSION>" (chorus::version()). Everything happens under WORK_DIR, which is emptied first,
# so runs in different modes or build trees never share files.
cmake_minimum_required(VERSION 3.25)

foreach(var IN ITEMS MODE CHORUS_SOURCE_DIR CHORUS_BINARY_DIR CONSUMER_SOURCE_DIR WORK_DIR)
  if(NOT ${var})
    message(FATAL_ERROR "consumer_check: ${var} is not set")
  endif()
endforeach()
if(NOT CONFIG)
  set(CONFIG Release)
endif()

function(run step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "consumer_check (${MODE}): ${step} failed (${rc}):\n${out}")
  endif()
  message(STATUS "consumer_check (${MODE}): ${step}: ok")
  set(last_output "${out}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")

set(configure_args -S "${CONSUMER_SOURCE_DIR}" -B "${WORK_DIR}/build" -D CHORUS_CONSUMER_MODE=${MODE})
if(GENERATOR)
  list(APPEND configure_args -G "${GENERATOR}")
endif()
if(CXX_COMPILER)
  list(APPEND configure_args -D "CMAKE_CXX_COMPILER=${CXX_COMPILER}")
endif()

if(MODE STREQUAL "find_package" OR MODE STREQUAL "pkg_config")
  set(prefix "${WORK_DIR}/prefix")
  run("install" "${CMAKE_COMMAND}" --install "${CHORUS_BINARY_DIR}" --prefix "${prefix}" --config "${CONFIG}")
  foreach(f IN ITEMS include/chorus/chorus.hpp share/cmake/chorus/chorusConfig.cmake
                     share/cmake/chorus/chorusConfigVersion.cmake share/cmake/chorus/chorusTargets.cmake)
    if(NOT EXISTS "${prefix}/${f}")
      message(FATAL_ERROR "consumer_check: the install tree lacks ${f}")
    endif()
  endforeach()
  # Only the fresh install may satisfy find_package: no package registry, no system prefixes.
  list(APPEND configure_args -D "CMAKE_PREFIX_PATH=${prefix}" -D "CHORUS_EXPECTED_PREFIX=${prefix}"
       -D CMAKE_FIND_USE_PACKAGE_REGISTRY=OFF -D CMAKE_BUILD_TYPE=${CONFIG})
else()
  # No build type on purpose: the sub-project must leave it empty.
  list(APPEND configure_args -D "CHORUS_SOURCE_DIR=${CHORUS_SOURCE_DIR}")
endif()

if(MODE STREQUAL "pkg_config")
  # No CMake on the consumer's side: the compiler, the .pc file and nothing else.
  find_program(pkg_config NAMES pkg-config pkgconf NO_CACHE)
  if(NOT pkg_config)
    message(FATAL_ERROR "consumer_check: pkg-config not found (scripts/install-deps installs it)")
  endif()
  if(NOT CXX_COMPILER)
    set(CXX_COMPILER c++)
  endif()
  set(pc_dir "${prefix}/share/pkgconfig")
  if(NOT EXISTS "${pc_dir}/chorus.pc")
    message(FATAL_ERROR "consumer_check: the install tree lacks share/pkgconfig/chorus.pc")
  endif()
  run("pkg-config" "${CMAKE_COMMAND}" -E env "PKG_CONFIG_PATH=${pc_dir}"
      "${pkg_config}" --cflags --libs chorus)
  string(STRIP "${last_output}" flags)
  message(STATUS "consumer_check (${MODE}): pkg-config --cflags --libs chorus: ${flags}")
  string(FIND "${flags}" "-I${prefix}/" at)  # ${pcfiledir} resolves to the fresh install
  if(at LESS 0)
    message(FATAL_ERROR "consumer_check: the flags do not name the install's include folder: ${flags}")
  endif()
  run("pkg-config --modversion" "${CMAKE_COMMAND}" -E env "PKG_CONFIG_PATH=${pc_dir}"
      "${pkg_config}" --modversion chorus)
  string(STRIP "${last_output}" modversion)
  if(VERSION AND NOT modversion STREQUAL VERSION)
    message(FATAL_ERROR "consumer_check: chorus.pc says version ${modversion}, the project ${VERSION}")
  endif()
  separate_arguments(flags UNIX_COMMAND "${flags}")
  file(MAKE_DIRECTORY "${WORK_DIR}/build")
  set(consumer_exe "${WORK_DIR}/build/consumer")
  # -O0: the check is about chorus.pc's flags and link line, which an unoptimised build needs at
  # least as much (nothing inlined away), and compiles in about a fifth less CPU time than -O1.
  run("build" "${CXX_COMPILER}" -O0 -DCHORUS_CONSUMER_ALL_REDUCE "${CONSUMER_SOURCE_DIR}/main.cpp"
      -o "${consumer_exe}" ${flags})
else()
  run("configure" "${CMAKE_COMMAND}" ${configure_args})
  run("build" "${CMAKE_COMMAND}" --build "${WORK_DIR}/build" --config "${CONFIG}")
  find_program(consumer_exe NAMES consumer PATHS "${WORK_DIR}/build" "${WORK_DIR}/build/${CONFIG}"
               NO_DEFAULT_PATH NO_CACHE)
endif()

if(NOT consumer_exe)
  message(FATAL_ERROR "consumer_check: no consumer executable under ${WORK_DIR}/build")
endif()
run("run" "${consumer_exe}")
if(NOT last_output MATCHES "chorus consumer ok")
  message(FATAL_ERROR "consumer_check: unexpected output: ${last_output}")
endif()
if(VERSION AND NOT last_output MATCHES "chorus ${VERSION}[,)]")
  message(FATAL_ERROR "consumer_check: the consumer does not print chorus ${VERSION}: ${last_output}")
endif()
string(STRIP "${last_output}" last_output)
message(STATUS "consumer_check (${MODE}): ${last_output}")
