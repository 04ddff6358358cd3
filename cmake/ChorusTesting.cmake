# SPDX-License-Identifier: BSD-3-Clause
# Test conventions (used by tests/CMakeLists.txt):
#
#   tests/<dir>/test_*.cpp       ->  one executable <dir>_tests, linked with chorus::chorus, the
#                                    shared doctest main and doctest; tests/ is on its include path
#                                    (#include "support/spawn.hpp"). Its files are compiled as a
#                                    unity build, CHORUS_TEST_UNITY_BATCH files per translation unit
#                                    (default 8: a whole folder; the headers, which cost most of a
#                                    small test file, are parsed once per batch), so each file keeps
#                                    its names in a namespace of its own (<dir>_<stem>). tests/cuda:
#                                    one executable per file.
#   each doctest TEST_CASE       ->  one ctest test "<dir>.<case name>", LABELS <dir>, TIMEOUT 300;
#                                    a case of the doctest suite "waits" (TEST_CASE(name *
#                                    doctest::test_suite("waits")), or TEST_SUITE_BEGIN("waits")):
#                                    LABELS <dir> and waits (it mostly waits: scripts/run-tests
#                                    runs that label in a second ctest beside the others).
#   the executables of a <dir>   ->  aggregate target chorus_tests_<dir> (build one label alone).
#
# Tests that run ranks as processes re-run their own executable, so nothing else is registered.
# A test that exits with 77 is reported as skipped (no GPU, no RDMA device, not root, ...).

include_guard(GLOBAL)

find_package(doctest 2.4 CONFIG REQUIRED)

set(CHORUS_TEST_TIMEOUT 300 CACHE STRING "ctest timeout of one test case, in seconds")

set(_chorus_doctest_add_tests "${CMAKE_CURRENT_LIST_DIR}/ChorusDoctestAddTests.cmake")

# chorus_discover_doctests(<target> PREFIX <p> LABEL <l> WORKING_DIRECTORY <d>): after each build of
# <target>, lists its doctest cases and registers one ctest test per case (like doctest's
# doctest_discover_tests, but robust to any character in a case name). Before the first build,
# ctest shows a placeholder test <target>_NOT_BUILT without labels, which fails.
function(chorus_discover_doctests target)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "PREFIX;LABEL;WORKING_DIRECTORY" "")
  set(ctest_file "${CMAKE_CURRENT_BINARY_DIR}/${target}_tests.cmake")
  set(include_file "${CMAKE_CURRENT_BINARY_DIR}/${target}_include.cmake")
  get_property(emulator TARGET ${target} PROPERTY CROSSCOMPILING_EMULATOR)
  add_custom_command(TARGET ${target} POST_BUILD
    BYPRODUCTS "${ctest_file}"
    COMMAND "${CMAKE_COMMAND}"
      -D "TEST_EXECUTABLE=$<TARGET_FILE:${target}>"
      -D "TEST_WORKING_DIR=${arg_WORKING_DIRECTORY}"
      -D "TEST_PREFIX=${arg_PREFIX}"
      -D "TEST_LABEL=${arg_LABEL}"
      -D "TEST_TIMEOUT=${CHORUS_TEST_TIMEOUT}"
      -D "TEST_EMULATOR=${emulator}"
      -D "CTEST_FILE=${ctest_file}"
      -P "${_chorus_doctest_add_tests}"
    VERBATIM)
  file(WRITE "${include_file}"
    "if(EXISTS \"${ctest_file}\")\n"
    "  include(\"${ctest_file}\")\n"
    "else()\n"
    "  add_test(${target}_NOT_BUILT ${target}_NOT_BUILT)\n"
    "endif()\n")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${include_file}")
endfunction()

set(CHORUS_TEST_UNITY_BATCH 8 CACHE STRING
    "test files per translation unit (unity build); 1 compiles each file on its own")
option(CHORUS_TEST_PCH "test executables share one precompiled header (chorus.hpp, doctest)" ON)

# chorus_add_test_executable(<dir> <target> SOURCES <files>... [LINK <targets>...])
function(chorus_add_test_executable dir target)
  cmake_parse_arguments(PARSE_ARGV 2 arg "" "" "SOURCES;LINK")
  add_executable(${target} ${arg_SOURCES})
  target_link_libraries(${target} PRIVATE chorus::chorus chorus_test_main chorus_project_options ${arg_LINK})
  set_target_properties(${target} PROPERTIES RUNTIME_OUTPUT_DIRECTORY "${CMAKE_CURRENT_BINARY_DIR}/${dir}")
  if(TARGET chorus_test_pch)  # tests/CMakeLists.txt
    target_precompile_headers(${target} REUSE_FROM chorus_test_pch)
  endif()
  list(LENGTH arg_SOURCES n)
  if(n GREATER 1 AND CHORUS_TEST_UNITY_BATCH GREATER 1)
    set_target_properties(${target} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE ${CHORUS_TEST_UNITY_BATCH})
  endif()
  chorus_discover_doctests(${target} PREFIX "${dir}." LABEL "${dir}"
                           WORKING_DIRECTORY "${CMAKE_CURRENT_BINARY_DIR}/${dir}")
  if(NOT TARGET chorus_tests_${dir})
    add_custom_target(chorus_tests_${dir})
  endif()
  add_dependencies(chorus_tests_${dir} ${target})
endfunction()

# chorus_add_test_dir(<dir> [PER_FILE] [PATTERNS <globs>...] [LINK <targets>...]): the files
# tests/<dir>/test_*.cpp (or the given patterns) make one test executable, <dir>_tests; with
# PER_FILE, one executable <dir>_<stem> each. A missing or empty folder adds nothing.
function(chorus_add_test_dir dir)
  cmake_parse_arguments(PARSE_ARGV 1 arg "PER_FILE" "" "PATTERNS;LINK")
  if(NOT arg_PATTERNS)
    set(arg_PATTERNS "test_*.cpp")
  endif()
  set(globs "")
  foreach(pattern IN LISTS arg_PATTERNS)
    list(APPEND globs "${CMAKE_CURRENT_SOURCE_DIR}/${dir}/${pattern}")
  endforeach()
  # CONFIGURE_DEPENDS on a missing folder still re-checks, so a folder created later is picked up.
  file(GLOB sources CONFIGURE_DEPENDS ${globs})
  list(SORT sources)
  if(NOT TARGET chorus_tests_${dir})
    add_custom_target(chorus_tests_${dir})   # exists even when the folder is empty
  endif()
  list(LENGTH sources n)
  if(n EQUAL 0)
  elseif(arg_PER_FILE)
    foreach(source IN LISTS sources)
      get_filename_component(stem "${source}" NAME_WE)
      chorus_add_test_executable(${dir} ${dir}_${stem} SOURCES "${source}" LINK ${arg_LINK})
    endforeach()
  else()
    chorus_add_test_executable(${dir} ${dir}_tests SOURCES ${sources} LINK ${arg_LINK})
  endif()
  message(STATUS "chorus tests: ${dir}: ${n} file(s)")
endfunction()
