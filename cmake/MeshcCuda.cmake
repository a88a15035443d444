# CUDA detection: MESHC_CUDA (default ON when nvcc is found at /usr/local/cuda/bin/nvcc or on
# PATH) enables the CUDA language for sm_90 and provides the targets generated CUDA links:
# CUDA::cudart, CUDA::cublas (CUDAToolkit) and meshc::nccl (NCCL's header and library, looked
# up next to the toolkit: MeshcFindNccl.cmake). With it, meshc_add_program accepts BACKEND cuda.
# No GPU is needed to configure or build.
find_program(MESHC_NVCC nvcc HINTS /usr/local/cuda/bin)
if(MESHC_NVCC)
  set(meshc_cuda_default ON)
else()
  set(meshc_cuda_default OFF)
endif()
option(MESHC_CUDA "Build the CUDA runtime (meshrt_cuda), the NCCL backend and the CUDA tests"
       ${meshc_cuda_default})

if(MESHC_CUDA)
  if(NOT CMAKE_CUDA_COMPILER)
    set(CMAKE_CUDA_COMPILER ${MESHC_NVCC})
  endif()
  if(NOT CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES 90)
  endif()
  if(CMAKE_CXX_COMPILER_LAUNCHER AND NOT CMAKE_CUDA_COMPILER_LAUNCHER)
    set(CMAKE_CUDA_COMPILER_LAUNCHER ${CMAKE_CXX_COMPILER_LAUNCHER})
  endif()
  enable_language(CUDA)
  # CMake 3.25 does not know nvcc's C++20 flag (nvcc 12+ has it): tell it.
  if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
  endif()
  set(CMAKE_CUDA_STANDARD 20)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  set(CMAKE_CUDA_EXTENSIONS OFF)
  find_package(CUDAToolkit REQUIRED)
  include(MeshcFindNccl)
  list(APPEND MESHC_BACKENDS cuda)
  # meshc_add_program's default for BACKEND cuda: the architectures meshrt_cuda is built for.
  set(MESHC_CUDA_ARCHITECTURES ${CMAKE_CUDA_ARCHITECTURES})
  message(STATUS "meshc: CUDA ${CMAKE_CUDA_COMPILER_VERSION} (sm_${CMAKE_CUDA_ARCHITECTURES}), "
                 "NCCL ${MESHC_NCCL_LIBRARY}")
endif()
