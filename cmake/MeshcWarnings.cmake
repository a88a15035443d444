# Warnings on and clean for every meshc target: call meshc_warnings(<target>).
function(meshc_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wno-unused-parameter)
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    target_compile_options(${target} PRIVATE -Wshadow=local)
    # GCC before 14 warns on designated initializers that leave members to their defaults (the
    # kernel IR builds its nodes that way); later GCC and Clang do not.
    if(CMAKE_CXX_COMPILER_VERSION VERSION_LESS 14)
      target_compile_options(${target} PRIVATE -Wno-missing-field-initializers)
    endif()
  else()
    target_compile_options(${target} PRIVATE -Wshadow)
  endif()
endfunction()
