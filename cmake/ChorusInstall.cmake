# SPDX-License-Identifier: BSD-3-Clause
# Install rules: headers, the exported targets (chorus::chorus, and chorus::cuda / chorus::rdma when
# built) and a package config, so that after `cmake --install build --prefix P` a consumer writes
#   find_package(chorus CONFIG REQUIRED)        # with CMAKE_PREFIX_PATH=P
#   target_link_libraries(app PRIVATE chorus::chorus)

include_guard(GLOBAL)

# chorus is header-only: the package is architecture-independent and lives under share/.
set(CHORUS_INSTALL_CMAKEDIR "${CMAKE_INSTALL_DATADIR}/cmake/chorus"
    CACHE STRING "Where the chorus package config is installed, relative to the prefix")
mark_as_advanced(CHORUS_INSTALL_CMAKEDIR)

install(DIRECTORY "${PROJECT_SOURCE_DIR}/include/"
        DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}"
        FILES_MATCHING PATTERN "*.hpp" PATTERN "*.h" PATTERN "*.cuh" PATTERN "*.inl")

install(TARGETS chorus EXPORT chorusTargets)
install(EXPORT chorusTargets NAMESPACE chorus:: DESTINATION "${CHORUS_INSTALL_CMAKEDIR}")

# Backend targets go to their own export files: the package config loads them only when the
# consumer's machine has the backend too.
if(TARGET chorus_cuda)
  install(TARGETS chorus_cuda EXPORT chorusCudaTargets)
  install(EXPORT chorusCudaTargets NAMESPACE chorus:: DESTINATION "${CHORUS_INSTALL_CMAKEDIR}")
endif()
if(TARGET chorus_rdma)
  install(TARGETS chorus_rdma EXPORT chorusRdmaTargets)
  install(EXPORT chorusRdmaTargets NAMESPACE chorus:: DESTINATION "${CHORUS_INSTALL_CMAKEDIR}")
endif()

configure_package_config_file(
  "${PROJECT_SOURCE_DIR}/cmake/chorusConfig.cmake.in"
  "${PROJECT_BINARY_DIR}/chorusConfig.cmake"
  INSTALL_DESTINATION "${CHORUS_INSTALL_CMAKEDIR}")
write_basic_package_version_file(
  "${PROJECT_BINARY_DIR}/chorusConfigVersion.cmake"
  VERSION "${PROJECT_VERSION}"
  COMPATIBILITY SameMajorVersion
  ARCH_INDEPENDENT)
install(FILES
  "${PROJECT_BINARY_DIR}/chorusConfig.cmake"
  "${PROJECT_BINARY_DIR}/chorusConfigVersion.cmake"
  "${PROJECT_SOURCE_DIR}/cmake/chorusIbverbs.cmake"
  DESTINATION "${CHORUS_INSTALL_CMAKEDIR}")

# chorus.pc, for build systems other than CMake (pkg-config --cflags --libs chorus), beside the
# package config: <prefix>/share/pkgconfig, which pkg-config searches by default. It locates
# itself (${pcfiledir}), so an install with `cmake --install ... --prefix P` anywhere works. The
# include directories of Boost and OpenSSL and libcrypto's directory are written only where they
# are not the compiler's own (pkg-config would drop -I/usr/include anyway).
set(CHORUS_INSTALL_PKGCONFIGDIR "${CMAKE_INSTALL_DATADIR}/pkgconfig"
    CACHE STRING "Where chorus.pc is installed, relative to the prefix")
mark_as_advanced(CHORUS_INSTALL_PKGCONFIGDIR)
function(_chorus_write_pkg_config)
  if(IS_ABSOLUTE "${CHORUS_INSTALL_PKGCONFIGDIR}")
    set(CHORUS_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
  else()
    # "share/pkgconfig" -> ${pcfiledir}/../..: the prefix seen from the .pc file's folder.
    file(RELATIVE_PATH up "/p/${CHORUS_INSTALL_PKGCONFIGDIR}" "/p")
    string(REGEX REPLACE "/$" "" up "${up}")
    set(CHORUS_PC_PREFIX "\${pcfiledir}/${up}")
  endif()
  if(IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
    set(CHORUS_PC_INCLUDEDIR "${CMAKE_INSTALL_INCLUDEDIR}")
  else()
    set(CHORUS_PC_INCLUDEDIR "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
  endif()
  set(cflags "")
  foreach(dir IN LISTS Boost_INCLUDE_DIRS OPENSSL_INCLUDE_DIR)
    if(dir AND NOT dir IN_LIST CMAKE_CXX_IMPLICIT_INCLUDE_DIRECTORIES AND NOT dir STREQUAL "/usr/include"
       AND NOT " -I${dir}" IN_LIST cflags)
      list(APPEND cflags " -I${dir}")
    endif()
  endforeach()
  set(libs "")
  if(OPENSSL_CRYPTO_LIBRARY)
    get_filename_component(dir "${OPENSSL_CRYPTO_LIBRARY}" DIRECTORY)
    if(NOT dir IN_LIST CMAKE_CXX_IMPLICIT_LINK_DIRECTORIES)
      set(libs " -L${dir}")
    endif()
  endif()
  list(JOIN cflags "" CHORUS_PC_CFLAGS)
  set(CHORUS_PC_LIBS "${libs}")
  configure_file("${PROJECT_SOURCE_DIR}/cmake/chorus.pc.in" "${PROJECT_BINARY_DIR}/chorus.pc" @ONLY)
endfunction()
_chorus_write_pkg_config()
install(FILES "${PROJECT_BINARY_DIR}/chorus.pc" DESTINATION "${CHORUS_INSTALL_PKGCONFIGDIR}")
