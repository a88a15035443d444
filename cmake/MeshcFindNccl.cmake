# meshc::nccl: NCCL's header and library, looked up next to the CUDA toolkit (needs
# find_package(CUDAToolkit) first). An imported target, so that meshrt_nccl's exported link
# interface names meshc::nccl and the installed package config recreates it on the user's machine
# with this same file instead of recording this machine's paths.
if(NOT TARGET meshc::nccl)
  find_path(MESHC_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} REQUIRED)
  find_library(MESHC_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} REQUIRED)
  add_library(meshc::nccl INTERFACE IMPORTED GLOBAL)
  target_include_directories(meshc::nccl INTERFACE ${MESHC_NCCL_INCLUDE_DIR})
  target_link_libraries(meshc::nccl INTERFACE ${MESHC_NCCL_LIBRARY})
endif()
