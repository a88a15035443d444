#include "driver/Toolchain.h"

#include "driver/MeshcBuildConfig.h"

#include <llvm/ADT/SmallString.h>
#include <llvm/ADT/StringRef.h>
#include <llvm/Support/FileSystem.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/Path.h>
#include <llvm/Support/Process.h>
#include <llvm/Support/Program.h>
#include <llvm/Support/raw_ostream.h>

#include <fmt/format.h>

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <thread>

extern char** environ;

namespace meshc {

namespace {

std::vector<std::string> splitList(llvm::StringRef list) {
  llvm::SmallVector<llvm::StringRef, 8> items;
  list.split(items, ';', -1, /*KeepEmpty=*/false);
  return {items.begin(), items.end()};
}

std::string joined(llvm::StringRef a, llvm::StringRef b, llvm::StringRef c = "") {
  llvm::SmallString<256> path(a);
  // append() ends the path with a separator for an empty component: `lib/libmeshrt.a/` is no
  // file, and an installed meshc would not find its own runtime.
  llvm::sys::path::append(path, b);
  if (!c.empty()) llvm::sys::path::append(path, c);
  return path.str().str();
}

} // namespace

Toolchain findToolchain(const char* argv0) {
  static int anchor;
  Toolchain toolchain;
  toolchain.meshc = llvm::sys::fs::getMainExecutable(argv0, &anchor);
  toolchain.cxx = llvm::sys::Process::GetEnv("MESHC_CXX").getValueOr(MESHC_CXX_COMPILER);
  toolchain.sanitizeFlags = splitList(MESHC_SANITIZE_FLAGS);
  toolchain.clangResourceDir = MESHC_CLANG_RESOURCE_DIR;
  llvm::StringRef prefix =
      llvm::sys::path::parent_path(llvm::sys::path::parent_path(toolchain.meshc));
  std::string include = joined(prefix, MESHC_INSTALL_INCLUDEDIR);
  std::string lib = joined(prefix, MESHC_INSTALL_LIBDIR);
  toolchain.installed = llvm::sys::fs::exists(joined(include, "meshc", "GeneratedSupport.h")) &&
                        llvm::sys::fs::exists(joined(lib, "libmeshrt.a"));
  if (toolchain.installed) {
    toolchain.includeDirs = {include};
    // Link order: the kernels, the launcher (and the MPI backend with MPI, when installed), meshrt.
    toolchain.libraries = {joined(lib, "libmeshrt_kernels.a"), joined(lib, "libmeshrt_launch.a")};
    if (llvm::sys::fs::exists(joined(lib, "libmeshrt_mpi.a"))) {
      toolchain.libraries.push_back(joined(lib, "libmeshrt_mpi.a"));
      for (const std::string& mpi : splitList(MESHC_MPI_LIBRARIES))
        toolchain.libraries.push_back(mpi);
    }
    toolchain.libraries.push_back(joined(lib, "libmeshrt.a"));
  } else {
    toolchain.includeDirs = splitList(MESHC_BUILD_INCLUDE_DIRS);
    toolchain.libraries = splitList(MESHC_BUILD_LIBRARIES);
    toolchain.preludeDir = MESHC_BUILD_PRELUDE_DIR;
  }
  if (llvm::Optional<std::string> dir = llvm::sys::Process::GetEnv("MESHC_PRELUDE_DIR"))
    toolchain.preludeDir = *dir;
  if (!llvm::StringRef(MESHC_NVCC).empty()) {
    CudaToolchain cuda;
    cuda.nvcc = MESHC_NVCC;
    cuda.architecture = MESHC_CUDA_ARCHITECTURE;
    cuda.systemLibraries = splitList(MESHC_CUDA_SYSTEM_LIBRARIES);
    if (toolchain.installed) {
      // The headers are in the prefix's include directory with the others.
      cuda.libraries = {joined(lib, "libmeshrt_cuda.a"), joined(lib, "libmeshrt_nccl.a")};
    } else {
      cuda.includeDirs = splitList(MESHC_CUDA_BUILD_INCLUDE_DIRS);
      cuda.libraries = splitList(MESHC_CUDA_BUILD_LIBRARIES);
    }
    bool present = true;
    for (const std::string& library : cuda.libraries)
      present = present && llvm::sys::fs::exists(library);
    if (present) toolchain.cuda = std::move(cuda);
  }
  if (!llvm::StringRef(MESHC_BLAS_INCLUDE).empty())
    toolchain.includeDirs.push_back(MESHC_BLAS_INCLUDE);
  toolchain.libraries.push_back(MESHC_BLAS_LIBRARY);
  // oneDNN runs meshrt_kernels' GEMMs, threaded by OpenMP.
  for (const std::string& library : splitList(MESHC_DNNL_LIBRARIES))
    toolchain.libraries.push_back(library);
  return toolchain;
}

std::vector<std::string> cudaCompileOptions(const CudaToolchain& cuda) {
  std::vector<std::string> options = {"--extended-lambda", "--expt-relaxed-constexpr",
                                      "-fmad=false", "-arch=sm_" + cuda.architecture};
  for (const std::string& dir : cuda.includeDirs)
    options.insert(options.end(), {"-I", dir});
  return options;
}

std::vector<std::string> cudaLinkLibraries(const Toolchain& toolchain) {
  std::vector<std::string> libraries = toolchain.cuda->libraries;
  libraries.insert(libraries.end(), toolchain.libraries.begin(), toolchain.libraries.end());
  libraries.insert(libraries.end(), toolchain.cuda->systemLibraries.begin(),
                   toolchain.cuda->systemLibraries.end());
  for (std::string& library : libraries)
    if (llvm::StringRef(library).startswith("-f")) library = "-Xcompiler=" + library;
  return libraries;
}

std::vector<std::string> mpirunCommand(int ranks) {
  std::vector<std::string> command = {"mpirun", "--oversubscribe", "-np", std::to_string(ranks)};
  if (::geteuid() == 0) command.insert(command.begin() + 1, "--allow-run-as-root");
  return command;
}

std::string readFile(const std::string& path) {
  auto buffer = llvm::MemoryBuffer::getFile(path);
  return buffer ? (*buffer)->getBuffer().str() : std::string();
}

int execute(const std::vector<std::string>& args, const std::string& stdoutFile,
            const std::string& stderrFile, std::string& error,
            const std::vector<std::string>* extraEnv) {
  llvm::outs().flush();
  llvm::errs().flush();
  llvm::ErrorOr<std::string> program = llvm::sys::findProgramByName(args[0]);
  if (!program) {
    error = fmt::format("'{}' not found", args[0]);
    return -1;
  }
  for (const std::string& file : {stdoutFile, stderrFile})
    if (!file.empty()) llvm::sys::fs::remove(file);
  std::vector<llvm::StringRef> argv(args.begin(), args.end());
  llvm::Optional<llvm::StringRef> redirects[] = {
      llvm::None, stdoutFile.empty() ? llvm::None : llvm::Optional<llvm::StringRef>(stdoutFile),
      stderrFile.empty() ? llvm::None : llvm::Optional<llvm::StringRef>(stderrFile)};
  std::vector<std::string> envStrings;
  std::vector<llvm::StringRef> env;
  if (extraEnv) {
    for (char** e = environ; *e; ++e)
      envStrings.push_back(*e);
    envStrings.insert(envStrings.end(), extraEnv->begin(), extraEnv->end());
    env.assign(envStrings.begin(), envStrings.end());
  }
  return llvm::sys::ExecuteAndWait(
      *program, argv, extraEnv ? llvm::Optional<llvm::ArrayRef<llvm::StringRef>>(env) : llvm::None,
      redirects, 0, 0, &error);
}

std::vector<int> executeParallel(const std::vector<std::vector<std::string>>& commands,
                                 const std::vector<std::string>& logs, unsigned jobs,
                                 std::vector<std::string>& errors) {
  llvm::outs().flush(); // execute() flushes too: before the threads, so that none races on it
  llvm::errs().flush();
  std::vector<int> status(commands.size(), -1);
  errors.assign(commands.size(), "");
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t k = next++; k < commands.size(); k = next++)
      status[k] = execute(commands[k], logs[k], logs[k], errors[k]);
  };
  std::vector<std::thread> workers;
  for (unsigned j = 1; j < std::min<size_t>(std::max(jobs, 1u), commands.size()); ++j)
    workers.emplace_back(worker);
  worker();
  for (std::thread& thread : workers)
    thread.join();
  return status;
}

unsigned usableCores() {
  cpu_set_t set;
  if (::sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0)
    return unsigned(CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

std::string cacheDirectory() {
  if (auto dir = llvm::sys::Process::GetEnv("MESHC_CACHE_DIR")) return *dir;
  llvm::SmallString<256> path;
  if (auto xdg = llvm::sys::Process::GetEnv("XDG_CACHE_HOME")) {
    path = *xdg;
    llvm::sys::path::append(path, "meshc");
  } else if (llvm::sys::path::home_directory(path)) {
    llvm::sys::path::append(path, ".cache", "meshc");
  } else {
    llvm::sys::path::system_temp_directory(/*ErasedOnReboot=*/true, path);
    llvm::sys::path::append(path, "meshc-cache");
  }
  return path.str().str();
}

} // namespace meshc
