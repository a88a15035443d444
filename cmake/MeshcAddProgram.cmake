# meshc_add_program(<target> SOURCES <main.mesh> [<imported.mesh>...]
#                   [MESH "data=2,model=4"] [LAYOUT "batch:data;d_ff:model"] [MACHINE <name|file>]
#                   [BACKEND cpu|cuda] [HEADERS <user header>...] [FUNCTION <name>...]
#                   [DIMS <name=size>...])
#
# Compiles <main.mesh> with meshc into <target>.meshc/<stem>.h and <stem>.cpp in the current
# binary directory (one custom command, in the manner of Halide's add_halide_library and
# protobuf_generate) and adds the static library <target> holding the generated classes. The
# library carries the generated header's directory as its include directory and links
# meshc::runtime (meshrt, its kernels and OpenBLAS). meshc writes a depfile (-MD -MF) listing
# every imported .mesh file and user C++ header, so Ninja and Makefiles regenerate the code when
# any of them changes; SOURCES after the first and HEADERS are listed as dependencies too.
# The main file's directory is a private include directory, for the user kernels' headers.
# LAYOUT items are separated by ',' (a ';' would split the CMake list), e.g. "batch:data,d_ff:model".
# Works in meshc's own tree and through find_package(meshc CONFIG).
include_guard(GLOBAL)

function(meshc_add_program target)
  cmake_parse_arguments(ARG "" "MESH;LAYOUT;MACHINE;BACKEND" "SOURCES;HEADERS;FUNCTION;DIMS"
                        ${ARGN})
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
  if(ARG_BACKEND STREQUAL "cuda")
    set(emit cuda)
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

  set(sources "${base}.cpp" "${base}.h")
  file(MAKE_DIRECTORY "${out_dir}")
  # The depfile names <base>.cpp as its target: the first output.
  add_custom_command(
    OUTPUT ${sources}
    COMMAND meshc::meshc "${main}" --emit=${emit} -o "${base}" -MD -MF "${base}.d" ${options}
    DEPENDS ${depends} meshc::meshc
    DEPFILE "${base}.d"
    COMMENT "meshc: compiling ${stem}.mesh for ${target}"
    VERBATIM)

  add_library(${target} STATIC ${sources})
  target_include_directories(${target} PUBLIC "${out_dir}" PRIVATE "${main_dir}")
  target_link_libraries(${target} PUBLIC meshc::runtime)
  target_compile_features(${target} PUBLIC cxx_std_20)
  set_target_properties(${target} PROPERTIES POSITION_INDEPENDENT_CODE ON)
endfunction()
