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
