# Warnings on and clean for every meshc target: call meshc_warnings(<target>).
function(meshc_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wshadow=local
                         -Wno-unused-parameter)
endfunction()
