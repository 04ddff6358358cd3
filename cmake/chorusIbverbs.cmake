# SPDX-License-Identifier: BSD-3-Clause
# chorus_find_ibverbs(<found-var>): looks for libibverbs and <infiniband/verbs.h> and, when both are
# there, defines the imported target chorus::ibverbs. Used by the build and by the installed package
# config (chorus::rdma links chorus::ibverbs by name, so each side finds the library itself).

include_guard(GLOBAL)

function(chorus_find_ibverbs found_var)
  if(TARGET chorus::ibverbs)
    set(${found_var} ON PARENT_SCOPE)
    return()
  endif()
  find_library(CHORUS_IBVERBS_LIBRARY NAMES ibverbs)
  find_path(CHORUS_IBVERBS_INCLUDE_DIR NAMES infiniband/verbs.h)
  mark_as_advanced(CHORUS_IBVERBS_LIBRARY CHORUS_IBVERBS_INCLUDE_DIR)
  if(CHORUS_IBVERBS_LIBRARY AND CHORUS_IBVERBS_INCLUDE_DIR)
    add_library(chorus::ibverbs UNKNOWN IMPORTED GLOBAL)
    set_target_properties(chorus::ibverbs PROPERTIES
      IMPORTED_LOCATION "${CHORUS_IBVERBS_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${CHORUS_IBVERBS_INCLUDE_DIR}")
    set(${found_var} ON PARENT_SCOPE)
  else()
    set(${found_var} OFF PARENT_SCOPE)
  endif()
endfunction()
