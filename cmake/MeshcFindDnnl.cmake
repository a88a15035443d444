# meshc::dnnl: oneDNN (Debian's libdnnl-dev), which runs meshrt_kernels' GEMMs, and the OpenMP
# runtime it threads with (meshrt_kernels sets OpenMP's per-thread count to the BLAS count). An
# imported target, so that meshrt_kernels' exported link interface names meshc::dnnl and the
# installed package config recreates it with this same file. Not find_package(dnnl CONFIG):
# Debian's config also requires the OpenCL headers of oneDNN's GPU runtime, which meshc does not
# use.
if(NOT TARGET meshc::dnnl)
  find_package(OpenMP REQUIRED COMPONENTS CXX)
  find_path(MESHC_DNNL_INCLUDE_DIR oneapi/dnnl/dnnl.hpp REQUIRED)
  find_library(MESHC_DNNL_LIBRARY dnnl REQUIRED)
  add_library(meshc::dnnl INTERFACE IMPORTED GLOBAL)
  target_include_directories(meshc::dnnl INTERFACE ${MESHC_DNNL_INCLUDE_DIR})
  target_link_libraries(meshc::dnnl INTERFACE ${MESHC_DNNL_LIBRARY} OpenMP::OpenMP_CXX)
endif()
