# meshc_library(<name> SOURCES ... DEPS ...): a static library of one compiler phase.
function(meshc_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  add_library(${name} STATIC ${ARG_SOURCES})
  target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR}/compiler)
  target_link_libraries(${name} PUBLIC ${ARG_DEPS} meshc_llvm fmt::fmt)
  meshc_warnings(${name})
endfunction()
