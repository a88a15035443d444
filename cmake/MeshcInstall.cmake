# `cmake --install`: meshc, the runtime (meshrt, meshrt_kernels, their headers and the support
# headers generated code includes; with MESHC_CUDA also meshrt_cuda and meshrt_nccl) and a package
# config, so that find_package(meshc CONFIG) provides meshc::meshc (the tool), meshc::runtime,
# meshc::cuda_runtime (with CUDA) and meshc_add_program().
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# meshc::runtime: what generated code links (the kernels, meshrt, oneDNN, OpenBLAS) and the support
# header's directory. In this tree the meshc:: names are aliases.
add_library(meshc_runtime INTERFACE)
set_target_properties(meshc_runtime PROPERTIES EXPORT_NAME runtime)
target_link_libraries(meshc_runtime INTERFACE meshrt_kernels meshrt_launch meshrt)
target_include_directories(
  meshc_runtime INTERFACE $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/compiler/codegen/support>
                          $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
add_library(meshc::runtime ALIAS meshc_runtime)
add_executable(meshc::meshc ALIAS meshc)

# meshc::cuda_runtime: what generated CUDA links (meshrt_cuda, the NCCL backend, the kernels,
# meshrt, cuBLAS, NCCL; not meshrt_launch: its runner launches through meshrt::nccl), the support
# headers' directory and the nvcc flags its headers need, for CUDA sources only (device lambdas;
# -fmad=false so that the scalar bodies round as on the CPU).
if(MESHC_CUDA)
  add_library(meshc_cuda_runtime INTERFACE)
  set_target_properties(meshc_cuda_runtime PROPERTIES EXPORT_NAME cuda_runtime)
  target_link_libraries(meshc_cuda_runtime INTERFACE meshrt_cuda meshrt_nccl meshrt_kernels meshrt
                                                     CUDA::cudart CUDA::cublas meshc::nccl)
  target_include_directories(
    meshc_cuda_runtime INTERFACE $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/compiler/codegen/support>
                                 $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  target_compile_options(
    meshc_cuda_runtime
    INTERFACE $<$<COMPILE_LANGUAGE:CUDA>:--extended-lambda --expt-relaxed-constexpr -fmad=false>)
  add_library(meshc::cuda_runtime ALIAS meshc_cuda_runtime)
endif()

# meshc runs from the install prefix with the system's LLVM/Clang shared libraries.
set_target_properties(meshc PROPERTIES INSTALL_RPATH_USE_LINK_PATH TRUE)
install(TARGETS meshc EXPORT meshcTargets RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
set(meshc_runtime_targets meshrt meshrt_kernels meshrt_launch meshc_runtime)
set(meshc_header_dirs ${PROJECT_SOURCE_DIR}/runtime/include/ ${PROJECT_SOURCE_DIR}/runtime/kernels/include/
                      ${PROJECT_SOURCE_DIR}/compiler/codegen/support/)
set(MESHC_WITH_MPI OFF)
if(TARGET meshrt_mpi)
  list(APPEND meshc_runtime_targets meshrt_mpi)
  set(MESHC_WITH_MPI ON)
endif()
# The config's MESHC_BACKENDS, and what it finds again for the CUDA targets (CUDAToolkit, NCCL
# next to it, MPI's C++ part for meshrt_nccl's MPI bootstrap) only when they were built.
set(MESHC_WITH_CUDA OFF)
set(MESHC_WITH_NCCL_MPI OFF)
if(MESHC_CUDA)
  set(MESHC_WITH_CUDA ON)
  set(MESHC_WITH_NCCL_MPI ${MESHC_NCCL_WITH_MPI})
  list(APPEND meshc_runtime_targets meshrt_cuda meshrt_nccl meshc_cuda_runtime)
  list(APPEND meshc_header_dirs ${PROJECT_SOURCE_DIR}/runtime/cuda/include/
              ${PROJECT_SOURCE_DIR}/runtime/nccl/include/)
  install(FILES ${PROJECT_SOURCE_DIR}/cmake/MeshcFindNccl.cmake
          DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/meshc)
endif()
install(TARGETS ${meshc_runtime_targets} EXPORT meshcTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(DIRECTORY ${meshc_header_dirs} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.h")

set(MESHC_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/meshc)
install(FILES ${PROJECT_SOURCE_DIR}/cmake/MeshcFindDnnl.cmake DESTINATION ${MESHC_CMAKE_DIR})
install(EXPORT meshcTargets NAMESPACE meshc:: DESTINATION ${MESHC_CMAKE_DIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/meshcConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/meshcConfig.cmake
                              INSTALL_DESTINATION ${MESHC_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/meshcConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/meshcConfig.cmake ${PROJECT_BINARY_DIR}/meshcConfigVersion.cmake
              ${PROJECT_SOURCE_DIR}/cmake/MeshcAddProgram.cmake
        DESTINATION ${MESHC_CMAKE_DIR})
