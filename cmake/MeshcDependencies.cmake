# Finds what meshc builds against. scripts/install-deps installs all of it; the LLVM version is
# pinned there and passed here as MESHC_LLVM_VERSION.
set(MESHC_LLVM_VERSION 14 CACHE STRING "LLVM/Clang major version")
find_package(LLVM ${MESHC_LLVM_VERSION} REQUIRED CONFIG
             HINTS /usr/lib/llvm-${MESHC_LLVM_VERSION}/lib/cmake/llvm)
find_package(Clang REQUIRED CONFIG HINTS /usr/lib/llvm-${MESHC_LLVM_VERSION}/lib/cmake/clang)
find_package(fmt REQUIRED)
find_package(Catch2 2 REQUIRED)
message(STATUS "meshc: LLVM ${LLVM_PACKAGE_VERSION} at ${LLVM_DIR}")

# One interface target for LLVM Support through the shared libLLVM (linking the static
# component libraries is slow on small machines).
add_library(meshc_llvm INTERFACE)
target_include_directories(meshc_llvm SYSTEM INTERFACE ${LLVM_INCLUDE_DIRS})
target_compile_definitions(meshc_llvm INTERFACE ${LLVM_DEFINITIONS})
target_link_libraries(meshc_llvm INTERFACE LLVM)
