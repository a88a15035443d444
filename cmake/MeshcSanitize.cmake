# Sanitizer builds (scripts/sanitize; docs/architecture.md, "Testing strategy"): with
# MESHC_SANITIZE=address,undefined or MESHC_SANITIZE=thread every target of the tree is
# instrumented, and tests/sanitize/ labels the tests that CI runs there (asan, tsan).
# MESHC_SANITIZE_FLAGS are the flags, compile and link, that code built outside CMake against this
# tree's meshrt needs too (an instrumented library links only into an instrumented program): the
# e2e scripts' generated programs (--cxx-flag) and `meshc run`'s (driver/Toolchain.cpp).
set(MESHC_SANITIZE "" CACHE STRING
    "Instrument every target with these sanitizers: address,undefined or thread (scripts/sanitize)")
set(MESHC_SANITIZE_FLAGS "")
if(MESHC_SANITIZE)
  if(MESHC_FUZZ)
    message(FATAL_ERROR "MESHC_SANITIZE and MESHC_FUZZ each choose the sanitizers: set one")
  endif()
  set(MESHC_SANITIZE_FLAGS -fsanitize=${MESHC_SANITIZE} -fno-omit-frame-pointer)
  # A UBSan finding ends the program with an error (a failed test), not a line in a log.
  if(MESHC_SANITIZE MATCHES "undefined")
    list(APPEND MESHC_SANITIZE_FLAGS -fno-sanitize-recover=all)
  endif()
  add_compile_options(${MESHC_SANITIZE_FLAGS})
  add_link_options(${MESHC_SANITIZE_FLAGS})
endif()
