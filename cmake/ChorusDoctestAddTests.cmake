# SPDX-License-Identifier: BSD-3-Clause
# Run at build time (POST_BUILD) by chorus_discover_doctests(): lists the doctest cases of
# TEST_EXECUTABLE and writes CTEST_FILE with one ctest test per case.
#
# Why not doctest's own doctestAddTests.cmake: it splits the listing into a CMake list, so a case
# name with a ';' falls apart, and its trailing empty LABELS argument is fragile. Here every line
# stays one string and every name is written as a bracket argument.
#
# Inputs: TEST_EXECUTABLE, TEST_WORKING_DIR, TEST_PREFIX, TEST_LABEL, TEST_TIMEOUT, CTEST_FILE,
#         TEST_EMULATOR (optional, ;-separated command that runs the executable).

cmake_minimum_required(VERSION 3.25)

if(NOT EXISTS "${TEST_EXECUTABLE}")
  message(FATAL_ERROR "chorus: test executable '${TEST_EXECUTABLE}' does not exist")
endif()
execute_process(
  COMMAND ${TEST_EMULATOR} "${TEST_EXECUTABLE}" --list-test-cases
  WORKING_DIRECTORY "${TEST_WORKING_DIR}"
  OUTPUT_VARIABLE output
  ERROR_VARIABLE error_output
  RESULT_VARIABLE result)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "chorus: listing the test cases of '${TEST_EXECUTABLE}' failed (${result}):\n"
                      "${output}${error_output}")
endif()

# The cases of the doctest test suite "waits" (TEST_CASE(name * doctest::test_suite("waits"))):
# cases that spend most of their time waiting (for a timeout, a stalled peer) get the ctest label
# `waits` as well, which scripts/run-tests runs in a second ctest beside the others. Kept as
# "\n<name>\n" lines, matched as whole lines.
execute_process(
  COMMAND ${TEST_EMULATOR} "${TEST_EXECUTABLE}" --list-test-cases --test-suite=waits
  WORKING_DIRECTORY "${TEST_WORKING_DIR}"
  OUTPUT_VARIABLE waits_output
  ERROR_VARIABLE error_output
  RESULT_VARIABLE result)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "chorus: listing the waits cases of '${TEST_EXECUTABLE}' failed (${result}):\n"
                      "${waits_output}${error_output}")
endif()
set(waits_output "\n${waits_output}\n")

# A bracket argument that cannot be closed by its content.
function(bracket out value)
  set(eq "=")
  while(value MATCHES "]${eq}]")
    string(APPEND eq "=")
  endwhile()
  set(${out} "[${eq}[${value}]${eq}]" PARENT_SCOPE)
endfunction()

set(script "")
set(count 0)
bracket(exe_arg "${TEST_EXECUTABLE}")
bracket(dir_arg "${TEST_WORKING_DIR}")
set(emulator_args "")
foreach(word IN LISTS TEST_EMULATOR)
  bracket(word_arg "${word}")
  string(APPEND emulator_args "${word_arg} ")
endforeach()
while(NOT output STREQUAL "")
  string(FIND "${output}" "\n" nl)
  if(nl EQUAL -1)
    set(line "${output}")
    set(output "")
  else()
    string(SUBSTRING "${output}" 0 ${nl} line)
    math(EXPR rest "${nl} + 1")
    string(SUBSTRING "${output}" ${rest} -1 output)
  endif()
  set(name "${line}")
  string(STRIP "${line}" stripped)
  if(stripped STREQUAL "" OR stripped MATCHES "^====" OR stripped MATCHES "^\\[doctest\\] ")
    continue()
  endif()
  # doctest's --test-case filter separates patterns with ',' (escaped as '\,') and treats '\' as
  # the escape character.
  string(REPLACE "\\" "\\\\" filter "${name}")
  string(REPLACE "," "\\," filter "${filter}")
  set(labels "${TEST_LABEL}")
  string(FIND "${waits_output}" "\n${name}\n" at)
  if(NOT at EQUAL -1)
    set(labels "${TEST_LABEL};waits")
  endif()
  bracket(name_arg "${TEST_PREFIX}${name}")
  bracket(filter_arg "--test-case=${filter}")
  string(APPEND script
    "add_test(${name_arg} ${emulator_args}${exe_arg} ${filter_arg})\n"
    "set_tests_properties(${name_arg} PROPERTIES WORKING_DIRECTORY ${dir_arg} LABELS \"${labels}\""
    " TIMEOUT ${TEST_TIMEOUT} SKIP_RETURN_CODE 77)\n")
  math(EXPR count "${count} + 1")
endwhile()
if(count EQUAL 0)
  message(WARNING "chorus: '${TEST_EXECUTABLE}' has no test cases")
endif()

file(WRITE "${CTEST_FILE}.tmp" "${script}")
file(RENAME "${CTEST_FILE}.tmp" "${CTEST_FILE}")
