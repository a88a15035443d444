// Where meshc finds what generated code builds against (the runtime's headers and libraries,
// OpenBLAS, the C++ compiler, Clang's resource directory): next to the executable when meshc is
// installed (<prefix>/bin/meshc, <prefix>/include, <prefix>/lib), else the build tree's paths
// recorded at configure time (MeshcBuildConfig.h). Also the cache directory of `meshc run`.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace meshc {

/// What generated CUDA builds with (`meshc run --backend nccl`), when meshc was built with CUDA.
struct CudaToolchain {
  std::string nvcc;
  std::string architecture;                 // "90": nvcc -arch=sm_90
  std::vector<std::string> includeDirs;     // meshrt_cuda's and meshrt_nccl's (beside the C++ ones)
  std::vector<std::string> libraries;       // meshrt_cuda, meshrt_nccl: before the C++ libraries
  std::vector<std::string> systemLibraries; // cuBLAS, NCCL (and MPI's C++ libraries): after
};

struct Toolchain {
  std::string meshc; // this executable
  std::string cxx;   // $MESHC_CXX, else the compiler meshc was built with
  // A sanitizer build's flags (cmake/MeshcSanitize.cmake): its meshrt links only into a program
  // instrumented the same way. Empty otherwise.
  std::vector<std::string> sanitizeFlags;
  std::vector<std::string> includeDirs;
  std::vector<std::string> libraries; // link order: kernels, runtime, OpenBLAS
  std::string clangResourceDir;
  // Where this meshc's build precompiled the prelude of `meshc run`'s C++ builds (prelude.h,
  // prelude.h.gch, prelude.key: the target meshc_prelude); $MESHC_PRELUDE_DIR replaces it. Empty
  // for an installed meshc, whose builds parse the prelude.
  std::string preludeDir;
  bool installed = false;
  std::optional<CudaToolchain> cuda; // absent: meshc was built without CUDA
};

/// The toolchain of the running meshc (`argv0` locates the executable).
Toolchain findToolchain(const char* argv0);

/// nvcc's options for generated CUDA and the calibration probe (the flags docs/cuda.md gives:
/// device lambdas, constexpr on the device, no FMA contraction so that the scalar bodies round
/// as on the CPU), the architecture, and the CUDA runtime's include directories.
std::vector<std::string> cudaCompileOptions(const CudaToolchain& cuda);

/// What a program built with nvcc links, in order: meshrt_cuda and meshrt_nccl, the C++
/// libraries, then cuBLAS, NCCL and MPI; host compiler flags (OpenMP's -fopenmp) go through
/// nvcc's -Xcompiler.
std::vector<std::string> cudaLinkLibraries(const Toolchain& toolchain);

/// The launcher prefix of `ranks` MPI processes on this host: mpirun --oversubscribe -np N (and
/// --allow-run-as-root as root: OpenMPI refuses root unless told, and containers run as root).
std::vector<std::string> mpirunCommand(int ranks);

/// Runs `args` (args[0] the program, found on PATH when not a path); stdout to `stdoutFile` and
/// stderr to `stderrFile` when given (replaced: the redirections themselves do not truncate),
/// else inherited; `extraEnv` entries are added to this process's environment. Returns the exit
/// status (-1: could not start, with `error` set).
int execute(const std::vector<std::string>& args, const std::string& stdoutFile,
            const std::string& stderrFile, std::string& error,
            const std::vector<std::string>* extraEnv = nullptr);

/// Runs `commands` (each as execute() runs one, its stdout and stderr both to its `logs` entry)
/// with at most `jobs` of them at a time, each started as soon as a slot is free, in order.
/// Returns per command its exit status (-1: could not start, with errors[k] set).
std::vector<int> executeParallel(const std::vector<std::vector<std::string>>& commands,
                                 const std::vector<std::string>& logs, unsigned jobs,
                                 std::vector<std::string>& errors);

/// The cores this process may run on (its affinity mask; at least 1).
unsigned usableCores();

/// The file's contents, or "" when it cannot be read.
std::string readFile(const std::string& path);

/// $MESHC_CACHE_DIR, else $XDG_CACHE_HOME/meshc, else ~/.cache/meshc, else <tmp>/meshc-cache.
std::string cacheDirectory();

} // namespace meshc
