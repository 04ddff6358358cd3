# SPDX-License-Identifier: BSD-3-Clause
# ctest driver for the bench.<name>_perf tests (bench/CMakeLists.txt): runs PROGRAM with ARGS (one
# string, split like a shell command line) and fails unless it exits 0 and prints EXPECT (by
# default "# Out of bounds values : 0 OK").
#
#   cmake -D PROGRAM=/path/all_reduce_perf -D "ARGS=-b 8 -e 64K" -P run_quick_test.cmake
separate_arguments(args UNIX_COMMAND "${ARGS}")
execute_process(COMMAND "${PROGRAM}" ${args}
  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
message("${out}")
if(err)
  message("${err}")
endif()
if(NOT rc STREQUAL "0")
  message(FATAL_ERROR "${PROGRAM} exited with ${rc}")
endif()
if(NOT DEFINED EXPECT)
  set(EXPECT "# Out of bounds values : 0 OK")
endif()
string(FIND "${out}" "${EXPECT}" at)
if(at EQUAL -1)
  message(FATAL_ERROR "${PROGRAM} did not report '${EXPECT}'")
endif()
