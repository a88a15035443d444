# meshc_add_program(<target> SOURCES <main.mesh> [<imported.mesh>...]
#                   [MESH "data=2,model=4"] [LAYOUT "batch:data;d_ff:model"] [MACHINE <name|file>]
#                   [BACKEND cpu|cuda] [CUDA_MATH fp32|tf32|bf16] [HEADERS <user header>...]
#                   [FUNCTION <name>...] [DIMS <name=size>...] [PRECOMPILE_PRELUDE]
#                   [SOURCE_PARTS <n>])
#
# Compiles <main.mesh> with meshc into <target>.meshc/<stem>.h and <stem>.cpp in the current
# binary directory (one custom command, in the manner of Halide's add_halide_library and
# protobuf_generate) and adds the static library <target> holding the generated classes. The
# source is split into SOURCE_PARTS files (default 4; meshc --source-parts): <stem>.cpp,
# <stem>.part2.cpp ... and the header they share, <stem>.parts.h, all sources of the library, so
# that the build compiles them in parallel. meshc fills only the parts the code's size pays for
# (about 64 KB of source each); the others hold a comment and compile to nothing. SOURCE_PARTS 1
# writes the one <stem>.cpp. The
# library carries the generated header's directory as its include directory and links
# meshc::runtime (meshrt, its kernels and OpenBLAS). meshc writes a depfile (-MD -MF) listing
# every imported .mesh file and user C++ header, so Ninja and Makefiles regenerate the code when
# any of them changes; SOURCES after the first and HEADERS are listed as dependencies too.
# The main file's directory is a private include directory, for the user kernels' headers.
# LAYOUT items are separated by ',' (a ';' would split the CMake list), e.g. "batch:data,d_ff:model".
# PRECOMPILE_PRELUDE (cpu backend, CMake 3.16+; ignored before) precompiles the prelude every
# generated source includes first (meshc/GeneratedPrelude.h: the support and launch headers, what
# `meshc run` keeps precompiled in its cache) with target_precompile_headers: a rebuild after the
# .mesh files change no longer parses it (transformer: 6.3 -> 5.6 CPU s), but the first build of
# a tree writes the header (GCC 12: a 98 MB .gch, 3.4 s; transformer 6.4 -> 8.9 s), so it pays
# for a model rebuilt more than about four times per build tree (bench/README.md). Off by
# default; CMake's CMAKE_DISABLE_PRECOMPILE_HEADERS turns it off again. The compile flags stay
# the project's own either way (no -march=native).
#
# BACKEND cuda (when meshc has CUDA: cuda in MESHC_BACKENDS) runs `--emit=cuda` (CUDA_MATH:
# --cuda-math) into <stem>.h and <stem>.cu instead; the calling project must have enabled the
# CUDA language. The library is compiled by nvcc as C++20 with --extended-lambda
# --expt-relaxed-constexpr -fmad=false (meshc::cuda_runtime carries them, for CUDA sources only),
# for CMAKE_CUDA_ARCHITECTURES when the caller set it, else for the architectures meshrt_cuda was
# built for (MESHC_CUDA_ARCHITECTURES: 90), and links meshc::cuda_runtime (meshrt_cuda,
# meshrt_nccl, the kernels, cuBLAS, NCCL, OpenBLAS). Its header and class are the cpu backend's;
# the caller runs the class on the nccl backend (meshrt::nccl::runNccl, meshrt/Nccl.h), one GPU
# per rank. User kernels it calls must be __host__ __device__ under nvcc.
# Works in meshc's own tree and through find_package(meshc CONFIG).
include_guard(GLOBAL)

function(meshc_add_program target)
  cmake_parse_arguments(ARG "PRECOMPILE_PRELUDE" "MESH;LAYOUT;MACHINE;BACKEND;CUDA_MATH;SOURCE_PARTS"
                        "SOURCES;HEADERS;FUNCTION;DIMS" ${ARGN})
  if(ARG_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "meshc_add_program(${target}): unknown arguments ${ARG_UNPARSED_ARGUMENTS}")
  endif()
  if(NOT ARG_SOURCES)
    message(FATAL_ERROR "meshc_add_program(${target}): SOURCES <main.mesh> is required")
  endif()
  if(NOT ARG_BACKEND)
    set(ARG_BACKEND cpu)
  endif()
  if(NOT ARG_BACKEND IN_LIST MESHC_BACKENDS)
    message(FATAL_ERROR "meshc_add_program(${target}): BACKEND ${ARG_BACKEND} is not available "
                        "in this meshc (it supports: ${MESHC_BACKENDS})")
  endif()
  set(emit cpp)
  set(source_suffix .cpp)
  if(ARG_BACKEND STREQUAL "cuda")
    set(emit cuda)
    set(source_suffix .cu)
    get_property(languages GLOBAL PROPERTY ENABLED_LANGUAGES)
    if(NOT "CUDA" IN_LIST languages)
      message(FATAL_ERROR "meshc_add_program(${target}): BACKEND cuda compiles the generated code "
                          "with nvcc, but the CUDA language is not enabled in this project: call "
                          "enable_language(CUDA) or project(... LANGUAGES CXX CUDA) first")
    endif()
  endif()
  if(ARG_CUDA_MATH)
    if(NOT ARG_BACKEND STREQUAL "cuda")
      message(FATAL_ERROR "meshc_add_program(${target}): CUDA_MATH needs BACKEND cuda")
    endif()
    if(NOT ARG_CUDA_MATH MATCHES "^(fp32|tf32|bf16)$")
      message(FATAL_ERROR "meshc_add_program(${target}): CUDA_MATH must be fp32, tf32 or bf16, "
                          "not ${ARG_CUDA_MATH}")
    endif()
  endif()

  list(GET ARG_SOURCES 0 main)
  get_filename_component(main "${main}" ABSOLUTE)
  get_filename_component(main_dir "${main}" DIRECTORY)
  get_filename_component(stem "${main}" NAME_WE)
  set(out_dir "${CMAKE_CURRENT_BINARY_DIR}/${target}.meshc")
  set(base "${out_dir}/${stem}")
  set(depends "")
  foreach(file IN LISTS ARG_SOURCES ARG_HEADERS)
    get_filename_component(file "${file}" ABSOLUTE)
    list(APPEND depends "${file}")
  endforeach()

  set(options "")
  if(ARG_MESH)
    list(APPEND options --mesh "${ARG_MESH}")
  endif()
  if(ARG_LAYOUT)
    list(APPEND options --layout "${ARG_LAYOUT}")
  endif()
  if(ARG_MACHINE)
    list(APPEND options --machine "${ARG_MACHINE}")
  endif()
  foreach(function IN LISTS ARG_FUNCTION)
    list(APPEND options --function "${function}")
  endforeach()
  foreach(dim IN LISTS ARG_DIMS)
    list(APPEND options --dim "${dim}")
  endforeach()
  if(ARG_CUDA_MATH)
    list(APPEND options --cuda-math=${ARG_CUDA_MATH})
  endif()

  set(sources "${base}${source_suffix}" "${base}.h")
  # The source's parts (the CUDA source is one file).
  if(NOT DEFINED ARG_SOURCE_PARTS)
    set(ARG_SOURCE_PARTS 4)
  endif()
  if(NOT ARG_SOURCE_PARTS MATCHES "^[1-9][0-9]*$")
    message(FATAL_ERROR "meshc_add_program(${target}): SOURCE_PARTS must be a positive number, "
                        "not '${ARG_SOURCE_PARTS}'")
  endif()
  if(ARG_BACKEND STREQUAL "cuda")
    set(ARG_SOURCE_PARTS 1)
  endif()
  if(ARG_SOURCE_PARTS GREATER 1)
    list(APPEND options --source-parts ${ARG_SOURCE_PARTS})
    foreach(part RANGE 2 ${ARG_SOURCE_PARTS})
      list(APPEND sources "${base}.part${part}${source_suffix}")
    endforeach()
    list(APPEND sources "${base}.parts.h")
  endif()
  file(MAKE_DIRECTORY "${out_dir}")
  # The depfile names <base>.cpp (<base>.cu for cuda) as its target: the first output.
  add_custom_command(
    OUTPUT ${sources}
    COMMAND meshc::meshc "${main}" --emit=${emit} -o "${base}" -MD -MF "${base}.d" ${options}
    DEPENDS ${depends} meshc::meshc
    DEPFILE "${base}.d"
    COMMENT "meshc: compiling ${stem}.mesh for ${target}"
    VERBATIM)

  add_library(${target} STATIC ${sources})
  target_include_directories(${target} PUBLIC "${out_dir}" PRIVATE "${main_dir}")
  target_compile_features(${target} PUBLIC cxx_std_20)
  set_target_properties(${target} PROPERTIES POSITION_INDEPENDENT_CODE ON)
  if(ARG_BACKEND STREQUAL "cuda")
    target_link_libraries(${target} PUBLIC meshc::cuda_runtime)
    _meshc_cuda_program_properties(${target})
  else()
    target_link_libraries(${target} PUBLIC meshc::runtime)
    # target_precompile_headers is CMake 3.16's: older ones build without it.
    if(ARG_PRECOMPILE_PRELUDE AND NOT CMAKE_VERSION VERSION_LESS 3.16)
      target_precompile_headers(${target} PRIVATE <meshc/GeneratedPrelude.h>)
    endif()
  endif()
endfunction()

# C++20 and the GPU architectures of a BACKEND cuda library.
function(_meshc_cuda_program_properties target)
  if("cuda_std_20" IN_LIST CMAKE_CUDA_COMPILE_FEATURES)
    target_compile_features(${target} PUBLIC cuda_std_20)
  else()
    # CMake before 3.26 does not know nvcc's C++20 flag (nvcc 12+ has it; the last -std wins).
    target_compile_options(${target} PUBLIC $<$<COMPILE_LANGUAGE:CUDA>:-std=c++20>)
  endif()
  # After enable_language(CUDA) CMAKE_CUDA_ARCHITECTURES always has a value: CMake's detected
  # default (a cache entry with the help string "CUDA architectures") unless the caller set it
  # (a variable, -D on the command line, or the CUDAARCHS environment variable).
  get_property(help CACHE CMAKE_CUDA_ARCHITECTURES PROPERTY HELPSTRING)
  if(help STREQUAL "CUDA architectures" AND "$ENV{CUDAARCHS}" STREQUAL ""
     AND "${CMAKE_CUDA_ARCHITECTURES}" STREQUAL "$CACHE{CMAKE_CUDA_ARCHITECTURES}")
    set(architectures ${MESHC_CUDA_ARCHITECTURES})
  else()
    set(architectures ${CMAKE_CUDA_ARCHITECTURES})
  endif()
  set_target_properties(${target} PROPERTIES CUDA_ARCHITECTURES "${architectures}")
endfunction()
