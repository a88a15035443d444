// `meshc run in.mesh`: runs the pipeline once, in-process (Pipeline.h): prints the plan, writes the
// program's C++ with its runner (what `meshc --emit=cpp --cpp-runner` writes), builds it with the
// system C++ compiler against the runtime (Toolchain.h) into a cache directory keyed by the
// generated code, runs it on the mesh's ranks (threads, or processes under mpirun), optionally
// compares its outputs with the reference interpreter's on the same module, and prints the
// timings of each step. With `--backend nccl` the program is compiled to CUDA (`--emit=cuda`)
// and built with nvcc instead, and runs on one GPU per rank (all in one process, or with
// `--processes` one process per GPU under mpirun).
#include "driver/CheckOutputs.h"
#include "driver/Driver.h"
#include "driver/Pipeline.h"
#include "driver/Profile.h"
#include "driver/Toolchain.h"
#include "interp/DtypePaths.h"
#include "interp/Tolerance.h"
#include "planner/PlanReport.h"

#include <fmt/format.h>
#include <llvm/ADT/SmallString.h>
#include <llvm/ADT/StringExtras.h>
#include <llvm/Support/CommandLine.h>
#include <llvm/Support/FileSystem.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/Path.h>
#include <llvm/Support/Process.h>
#include <llvm/Support/Program.h>
#include <llvm/Support/WithColor.h>
#include <llvm/Support/xxhash.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>

namespace meshc {

namespace {

namespace cl = llvm::cl;

cl::SubCommand runSubcommand("run", "compile, build and run a program on its mesh's ranks "
                                    "(see `meshc run --help`)");
cl::OptionCategory runCategory("meshc run options");

cl::opt<std::string> runInput(cl::Positional, cl::desc("<input.mesh>"), cl::Required,
                              cl::sub(runSubcommand), cl::cat(runCategory));
cl::opt<std::string> runMesh("mesh",
                             cl::desc("Replace the program's mesh, e.g. \"data=2,model=4\""),
                             cl::value_desc("axis=size,..."), cl::sub(runSubcommand),
                             cl::cat(runCategory));
cl::opt<std::string> runLayout("layout",
                               cl::desc("Replace the program's layout, e.g. \"batch:data;auto\""),
                               cl::value_desc("items"), cl::sub(runSubcommand),
                               cl::cat(runCategory));
cl::opt<std::string> runMachine("machine", cl::desc("The machine to plan for (default: cpu)"),
                                cl::value_desc("name|file"), cl::sub(runSubcommand),
                                cl::cat(runCategory));
cl::opt<std::string> runZero("zero",
                             cl::desc("ZeRO stage of train blocks: 1, 2 or 3 (see meshc --help)"),
                             cl::value_desc("stage"), cl::sub(runSubcommand), cl::cat(runCategory));
cl::opt<std::string> runMemoryBudget(
    "memory-budget",
    cl::desc(
        "Memory per device the plan must fit (e.g. 16GiB; default: the machine's); a train "
        "block no layout fits alone gets the joint search's stages, recompute, microbatches and "
        "ZeRO"),
    cl::value_desc("bytes"), cl::sub(runSubcommand), cl::cat(runCategory));
cl::list<std::string> runDims("dim", cl::desc("Set the size of a declared dim (repeatable)"),
                              cl::value_desc("name=size"), cl::sub(runSubcommand),
                              cl::cat(runCategory));
cl::list<std::string> runFunctions("function",
                                   cl::desc("Build and run only the named program or train "
                                            "block (repeatable)"),
                                   cl::value_desc("name"), cl::sub(runSubcommand),
                                   cl::cat(runCategory));
enum class Backend { Threads, Mpi, Nccl };
cl::opt<Backend> runBackend(
    "backend", cl::desc("How the ranks run"), cl::init(Backend::Threads),
    cl::values(clEnumValN(Backend::Threads, "threads", "threads of one process (default)"),
               clEnumValN(Backend::Mpi, "mpi", "processes launched by mpirun"),
               clEnumValN(Backend::Nccl, "nccl",
                          "one GPU per rank: the program compiled to CUDA, built with nvcc")),
    cl::sub(runSubcommand), cl::cat(runCategory));
cl::opt<std::string> runCudaMath("cuda-math",
                                 cl::desc("With --backend nccl: the einsum precision (fp32, "
                                          "tf32 or bf16; default fp32)"),
                                 cl::value_desc("mode"), cl::init("fp32"), cl::sub(runSubcommand),
                                 cl::cat(runCategory));
cl::opt<bool> runProcesses(
    "processes",
    cl::desc("With --backend nccl: one process per GPU under mpirun (NCCL bootstrapped over MPI, "
             "as on several hosts) instead of every rank in one process"),
    cl::sub(runSubcommand), cl::cat(runCategory));
cl::opt<bool> runCheck("check",
                       cl::desc("Compare the outputs with the reference interpreter's: every "
                                "element within atol + rtol |expected|, rtol per dtype, atol = "
                                "rtol x the tensor's RMS (docs/tool.md)"),
                       cl::sub(runSubcommand), cl::cat(runCategory));
cl::opt<double> runTolerance("tol",
                             cl::desc("Replaces the f32 rtol of --check (default 1024 x 2^-24 "
                                      "= 6.1e-5, times 1 + steps)"),
                             cl::sub(runSubcommand), cl::cat(runCategory));
cl::opt<std::string> runData("data",
                             cl::desc("Read the inputs from <file> (tensors named "
                                      "<function>.<input> in the format of --dump-outputs); "
                                      "inputs it lacks are synthesized from --seed"),
                             cl::value_desc("file"), cl::sub(runSubcommand), cl::cat(runCategory));
cl::opt<int64_t> runSteps("steps",
                          cl::desc("Train blocks take N training steps (forward, backward, "
                                   "update), printing each step's loss; --check then compares "
                                   "the losses and final params with N interpreter steps"),
                          cl::value_desc("N"), cl::init(0), cl::sub(runSubcommand),
                          cl::cat(runCategory));
cl::opt<std::string> runMicrobatches(
    "microbatches",
    cl::desc("Train blocks run K microbatches of DIM per step, accumulating gradients before one "
             "update (checked against the interpreter's whole batch), e.g. batch=4"),
    cl::value_desc("DIM=K"), cl::sub(runSubcommand), cl::cat(runCategory));
cl::opt<BatchMode> runBatch("batch", cl::desc("With --steps N: what the train blocks train on"),
                            batchModeValues(), cl::init(BatchMode::Fresh), cl::sub(runSubcommand),
                            cl::cat(runCategory));
cl::opt<uint64_t> runSeed("seed", cl::desc("Seed of inputs, parameters and dropout"), cl::init(0),
                          cl::sub(runSubcommand), cl::cat(runCategory));
cl::opt<std::string> runCxx("cxx",
                            cl::desc("The C++ compiler (default: $MESHC_CXX, else the one "
                                     "meshc was built with)"),
                            cl::value_desc("path"), cl::sub(runSubcommand), cl::cat(runCategory));
/// The default --opt: the one `meshc build-prelude` precompiles the prelude with.
constexpr const char* kDefaultOpt = "-O3 -march=native";
cl::opt<std::string> runOpt("opt",
                            cl::desc("The optimization flags of the build, separated by spaces "
                                     "(default \"-O3 -march=native\": the binary runs here)"),
                            cl::init(kDefaultOpt), cl::sub(runSubcommand), cl::cat(runCategory));
cl::opt<unsigned> runJobs("j",
                          cl::desc("Compile jobs of the C++ build, and parts of its source "
                                   "(default: $MESHC_BUILD_JOBS, else the cores this process may "
                                   "run on)"),
                          cl::value_desc("N"), cl::sub(runSubcommand), cl::cat(runCategory));
cl::alias runJobsLong("jobs", cl::desc("Alias for -j"), cl::aliasopt(runJobs),
                      cl::cat(runCategory));
cl::opt<std::string> runCacheDir("cache-dir",
                                 cl::desc("Where generated code and binaries are kept (default: "
                                          "$MESHC_CACHE_DIR or ~/.cache/meshc)"),
                                 cl::value_desc("dir"), cl::sub(runSubcommand),
                                 cl::cat(runCategory));
cl::opt<std::string> runTrace("trace",
                              cl::desc("Write a Chrome trace (Perfetto, chrome://tracing) of "
                                       "every rank's op groups and collectives to <file>"),
                              cl::value_desc("file"), cl::sub(runSubcommand), cl::cat(runCategory));
cl::opt<std::string> runSave("save",
                             cl::desc("The runner saves each program's and train block's "
                                      "checkpoint under <dir>/<name> at the end"),
                             cl::value_desc("dir"), cl::sub(runSubcommand), cl::cat(runCategory));
cl::opt<std::string> runLoad("load",
                             cl::desc("The runner loads each program's and train block's "
                                      "checkpoint from <dir>/<name> first (not with --check)"),
                             cl::value_desc("dir"), cl::sub(runSubcommand), cl::cat(runCategory));
cl::opt<bool> runProfile("profile",
                         cl::desc("Trace the run and print the predicted and measured time per "
                                  "source line and collective, and by phase (docs/tool.md)"),
                         cl::sub(runSubcommand), cl::cat(runCategory));
// The code generator's options, as meshc's (--emit=cpp) takes them: a build with and one without
// a pass, or with recomputation, need no other meshc.
cl::list<std::string> runDisabledPasses(
    "disable-kernel-pass",
    cl::desc("Skip the named kernel pass, as meshc's --disable-kernel-pass does; repeatable"),
    cl::value_desc("pass"), cl::sub(runSubcommand), cl::cat(runCategory));
cl::list<std::string> runRecompute(
    "recompute",
    cl::desc("In train blocks, recompute the activations of every call of these defs in backward "
             "instead of keeping them, as `recompute def` does"),
    cl::value_desc("def,..."), cl::CommaSeparated, cl::sub(runSubcommand), cl::cat(runCategory));
cl::opt<std::string> runPipelineSchedule(
    "pipeline-schedule",
    cl::desc("Pipeline stages: gpipe (every forward, then every backward) or 1f1b (default)"),
    cl::value_desc("schedule"), cl::init("1f1b"), cl::sub(runSubcommand), cl::cat(runCategory));
cl::opt<bool> runNoPlan("no-plan", cl::desc("Do not print the plan"), cl::sub(runSubcommand),
                        cl::cat(runCategory));

cl::SubCommand preludeSubcommand("build-prelude",
                                 "precompile the prelude of `meshc run`'s C++ builds into a "
                                 "directory (this meshc's build runs it: target meshc_prelude)");
cl::opt<std::string> preludeDir(cl::Positional, cl::desc("<dir>"), cl::Required,
                                cl::sub(preludeSubcommand));

using Clock = std::chrono::steady_clock;

/// Says on stderr which stage starts (a build can take a while; stdout keeps the results).
void stage(const std::string& what) {
  llvm::errs() << "meshc run: " << what << "\n";
  llvm::errs().flush();
}

double secondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

int fail(int code, const std::string& message) {
  llvm::outs().flush();
  llvm::WithColor::error(llvm::errs(), "meshc run") << message << "\n";
  return code;
}

std::string pathIn(llvm::StringRef dir, llvm::StringRef name) {
  llvm::SmallString<256> path(dir);
  llvm::sys::path::append(path, name);
  return path.str().str();
}

/// The pipeline's options from meshc run's: the program and its overrides.
PipelineOptions pipelineOptions() {
  PipelineOptions options;
  options.input = runInput;
  options.mesh = runMesh;
  options.layout = runLayout;
  if (runMachine.getNumOccurrences()) options.machine = runMachine;
  options.dims.assign(runDims.begin(), runDims.end());
  options.functions.assign(runFunctions.begin(), runFunctions.end());
  options.seed = runSeed;
  options.steps = runSteps;
  options.zero = runZero;
  options.memoryBudget = runMemoryBudget;
  options.microbatches = runMicrobatches;
  options.batch = runBatch;
  options.recompute.assign(runRecompute.begin(), runRecompute.end());
  options.pipelineSchedule = runPipelineSchedule;
  return options;
}

/// What the work directory is keyed by: the program and every option that changes its code.
std::string workKey(const PipelineOptions& options) {
  std::vector<std::string> parts = {options.mesh, options.layout, options.machine};
  if (!options.zero.empty()) parts.push_back("zero=" + options.zero);
  if (!options.memoryBudget.empty()) parts.push_back("memory-budget=" + options.memoryBudget);
  parts.insert(parts.end(), options.dims.begin(), options.dims.end());
  parts.push_back("functions");
  parts.insert(parts.end(), options.functions.begin(), options.functions.end());
  if (!options.microbatches.empty()) parts.push_back("microbatches " + options.microbatches);
  if (!options.recompute.empty())
    parts.push_back("recompute " + llvm::join(options.recompute, ","));
  parts.push_back("pipeline-schedule " + options.pipelineSchedule);
  parts.push_back("disabled passes");
  parts.insert(parts.end(), runDisabledPasses.begin(), runDisabledPasses.end());
  return llvm::join(parts, "\n");
}

/// Per compared tensor, the dtype whose rounding it carries: the coarsest float dtype on any path
/// into it (interp/DtypePaths.h), or bf16 / f16 for every float tensor when the CUDA einsums run
/// in bf16 / tf32 (tf32 keeps f16's 10 mantissa bits).
std::map<std::string, std::string> toleranceDtypes(const ir::Module& module) {
  bool onGpus = runBackend == Backend::Nccl;
  std::string cudaMath = onGpus && runCudaMath == "bf16"   ? "bf16"
                         : onGpus && runCudaMath == "tf32" ? "f16"
                                                           : "";
  std::map<std::string, std::string> dtypes;
  for (const ir::Function& fn : module.functions)
    for (const auto& [name, dtype] : interp::pathDtypes(fn))
      dtypes[name] = interp::toleranceDtype(dtype, cudaMath);
  return dtypes;
}

/// The modification times and sizes of the runtime's headers (`meshrt/`, `meshc/` under its
/// include directories) and libraries, for the build cache's key.
std::string runtimeStamp(const std::vector<std::string>& includeDirs,
                         const std::vector<std::string>& libraries) {
  std::string stamp;
  auto add = [&](const std::string& path) {
    llvm::sys::fs::file_status status;
    if (!llvm::sys::fs::status(path, status) && llvm::sys::fs::is_regular_file(status))
      stamp += fmt::format("{}:{}:{};", path,
                           status.getLastModificationTime().time_since_epoch().count(),
                           status.getSize());
  };
  // Only the runtime's own headers: an include directory may be a system one (BLAS's).
  for (const std::string& dir : includeDirs)
    for (const char* own : {"meshrt", "meshc"}) {
      std::error_code ec;
      for (llvm::sys::fs::recursive_directory_iterator it(pathIn(dir, own), ec), end;
           it != end && !ec; it.increment(ec))
        add(it->path());
    }
  for (const std::string& library : libraries)
    add(library);
  return stamp;
}

/// The prelude every generated C++ translation unit includes first (meshc/GeneratedPrelude.h,
/// the list tests/e2e precompiles too): this meshc's build precompiles it (`meshc build-prelude`,
/// target meshc_prelude) with exactly the flags of a C++ build at the default --opt, and each
/// such build includes it first (-include) instead of parsing the headers again.
constexpr const char* kPrelude = "// meshc run's precompiled prelude (RunCommand.cpp).\n"
                                 "#include \"meshc/GeneratedPrelude.h\"\n";

/// The compiler and the flags of building generated code (C++, or CUDA with nvcc) with
/// optimization flags `opt`: every flag but the program's own include directories, its sources
/// and the libraries.
std::vector<std::string> buildFlags(const Toolchain& toolchain, bool onGpus, llvm::StringRef opt) {
  std::vector<std::string> build = {onGpus ? toolchain.cuda->nvcc : toolchain.cxx};
  for (llvm::StringRef flag : llvm::split(opt, ' '))
    if (!flag.empty() && !(onGpus && flag.startswith("-march"))) build.push_back(flag.str());
  // Generated code never reads errno: without it the compiler vectorizes sqrt in fused loops.
  build.insert(build.end(), {"-std=c++20", "-w"});
  if (!onGpus) build.push_back("-fno-math-errno");
  if (!onGpus)
    build.insert(build.end(), toolchain.sanitizeFlags.begin(), toolchain.sanitizeFlags.end());
  if (onGpus) {
    std::vector<std::string> cudaOptions = cudaCompileOptions(*toolchain.cuda);
    build.insert(build.end(), cudaOptions.begin(), cudaOptions.end());
  }
  for (const std::string& dir : toolchain.includeDirs)
    build.insert(build.end(), {"-I", dir});
  return build;
}

/// The flags the prelude of a C++ build with `flags` is compiled with: those and the compile
/// flags among the libraries (OpenMP's -fopenmp defines _OPENMP, which the support header reads).
std::vector<std::string> preludeFlags(std::vector<std::string> flags,
                                      const std::vector<std::string>& libraries) {
  for (const std::string& library : libraries)
    if (llvm::StringRef(library).startswith("-f")) flags.push_back(library);
  return flags;
}

/// What a precompiled prelude is good for: the flags it was compiled with and the runtime
/// headers (their paths, times and sizes) it was compiled from.
std::string preludeKey(const std::vector<std::string>& flags,
                       const std::vector<std::string>& includeDirs) {
  return llvm::join(flags, " ") + "\n" + runtimeStamp(includeDirs, {}) + "\n";
}

/// The prelude header to include first (-include) in a C++ build with prelude flags `flags`:
/// the build tree's (Toolchain::preludeDir) when its key says it was compiled with exactly these
/// flags from the runtime headers as they are now; "" otherwise (another --opt or compiler, a
/// header changed since, an installed meshc, no such file): the build parses the headers.
std::string precompiledPrelude(const Toolchain& toolchain, const std::vector<std::string>& flags) {
  if (toolchain.preludeDir.empty()) return "";
  std::string header = pathIn(toolchain.preludeDir, "prelude.h");
  if (!llvm::sys::fs::exists(header + ".gch") ||
      readFile(pathIn(toolchain.preludeDir, "prelude.key")) !=
          preludeKey(flags, toolchain.includeDirs))
    return "";
  return header;
}

/// Writes `contents` to `path` through a file of its own, renamed: a concurrent reader sees the
/// old file or the new one.
bool writeAtomically(const std::string& path, llvm::StringRef contents) {
  std::string partial = fmt::format("{}.{}.tmp", path, ::getpid());
  {
    std::error_code ec;
    llvm::raw_fd_ostream out(partial, ec);
    if (ec) return false;
    out << contents;
  }
  return !llvm::sys::fs::rename(partial, path);
}

/// The compile jobs of a C++ build: -j, else $MESHC_BUILD_JOBS, else the usable cores.
unsigned buildJobs() {
  if (runJobs.getNumOccurrences() && runJobs > 0) return runJobs;
  if (auto env = llvm::sys::Process::GetEnv("MESHC_BUILD_JOBS")) {
    unsigned jobs = 0;
    if (!llvm::StringRef(*env).getAsInteger(10, jobs) && jobs > 0) return jobs;
  }
  return usableCores();
}

/// Builds `binary` from the C++ translation units `units`: each compiled with `build` (the
/// compiler and its flags; `-include prelude` first unless "") into an object, `jobs` at a
/// time, then linked with `libraries`. kExitOk, or kExitInternalError after printing the first
/// failing command and its output.
int buildUnits(std::vector<std::string> build, const std::string& prelude,
               const std::vector<std::string>& units, const std::vector<std::string>& libraries,
               const std::string& binary, const std::string& base, unsigned jobs) {
  std::vector<std::string> compile = build;
  if (!prelude.empty()) compile.insert(compile.end(), {"-include", prelude});
  std::vector<std::vector<std::string>> commands;
  std::vector<std::string> logs, objects;
  for (size_t k = 0; k < units.size(); ++k) {
    // Objects named by the binary (its hash): concurrent builds of other code never share one.
    objects.push_back(fmt::format("{}.{}.o", binary, k));
    logs.push_back(fmt::format("{}.build.{}.log", base, k));
    commands.push_back(compile);
    commands.back().insert(commands.back().end(), {"-c", units[k], "-o", objects.back()});
  }
  std::string partial = binary + ".tmp";
  std::vector<std::string> link = build;
  link.insert(link.end(), objects.begin(), objects.end());
  link.insert(link.end(), {"-o", partial});
  link.insert(link.end(), libraries.begin(), libraries.end());
  link.push_back("-lpthread");
  commands.push_back(link);
  logs.push_back(base + ".build.log");
  auto removeObjects = [&] {
    for (const std::string& object : objects)
      llvm::sys::fs::remove(object);
  };
  auto failed = [&](size_t k, int rc, const std::string& error) {
    removeObjects();
    std::string output = readFile(logs[k]);
    if (output.size() > 8000) output = "...\n" + output.substr(output.size() - 8000);
    return fail(kExitInternalError,
                fmt::format("the C++ compiler failed on the generated code ({}){}\n  command: "
                            "{}\n{}",
                            rc < 0 ? error : fmt::format("exit status {}", rc),
                            rc < 0 ? "" : "; its output (also in " + logs[k] + "):",
                            llvm::join(commands[k], " "), output));
  };
  std::vector<std::string> errors;
  std::vector<int> status =
      executeParallel({commands.begin(), commands.end() - 1}, logs, jobs, errors);
  for (size_t k = 0; k < status.size(); ++k)
    if (status[k] != 0) return failed(k, status[k], errors[k]);
  std::string error;
  int rc = execute(link, logs.back(), logs.back(), error);
  removeObjects();
  if (rc != 0) return failed(commands.size() - 1, rc, error);
  if (std::error_code ec = llvm::sys::fs::rename(partial, binary))
    return fail(kExitInternalError, fmt::format("cannot write '{}': {}", binary, ec.message()));
  return kExitOk;
}

/// The number of ranks of the (overridden) mesh.
int64_t rankCount(const PlannedModule& planned) {
  int64_t ranks = 1;
  if (!planned.plans.empty())
    for (const ir::MeshAxis& axis : planned.plans.front().spmd.mesh.axes)
      ranks *= axis.size;
  return ranks;
}

} // namespace

bool runCommandChosen() {
  return bool(runSubcommand);
}

void hideUnrelatedRunOptions() {
  cl::HideUnrelatedOptions(runCategory, runSubcommand);
}

bool buildPreludeCommandChosen() {
  return bool(preludeSubcommand);
}

int buildPreludeCommand(const char* argv0) {
  Toolchain toolchain = findToolchain(argv0);
  std::vector<std::string> flags =
      preludeFlags(buildFlags(toolchain, /*onGpus=*/false, kDefaultOpt), toolchain.libraries);
  std::string dir = preludeDir, header = pathIn(dir, "prelude.h"), key = pathIn(dir, "prelude.key");
  // The key goes first and comes back last: no meshc takes a half-written .gch for a good one.
  llvm::sys::fs::remove(key);
  if (std::error_code ec = llvm::sys::fs::create_directories(dir))
    return fail(kExitInternalError, fmt::format("cannot create '{}': {}", dir, ec.message()));
  if (!writeAtomically(header, kPrelude))
    return fail(kExitInternalError, fmt::format("cannot write '{}'", header));
  std::string partial = fmt::format("{}.gch.{}.tmp", header, ::getpid()), log = partial + ".log";
  std::vector<std::string> command = flags;
  command.insert(command.end(), {"-x", "c++-header", header, "-o", partial});
  std::string error;
  int rc = execute(command, log, log, error);
  std::string output = readFile(log);
  llvm::sys::fs::remove(log);
  if (rc != 0) {
    llvm::sys::fs::remove(partial);
    return fail(kExitInternalError,
                fmt::format("the C++ compiler failed on the prelude ({})\n  command: {}\n{}",
                            rc < 0 ? error : fmt::format("exit status {}", rc),
                            llvm::join(command, " "), output));
  }
  if (std::error_code ec = llvm::sys::fs::rename(partial, header + ".gch"))
    return fail(kExitInternalError, fmt::format("cannot write '{}.gch': {}", header, ec.message()));
  if (!writeAtomically(key, preludeKey(flags, toolchain.includeDirs)))
    return fail(kExitInternalError, fmt::format("cannot write '{}'", key));
  return kExitOk;
}

int runCommand(const char* argv0) {
  Toolchain toolchain = findToolchain(argv0);
  if (runCxx.getNumOccurrences()) toolchain.cxx = runCxx;
  if (!llvm::sys::fs::exists(runInput))
    return fail(kExitInputError, fmt::format("cannot open '{}'", std::string(runInput)));

  llvm::SmallString<256> absoluteData(runData);
  if (runData.getNumOccurrences()) {
    if (!llvm::sys::fs::exists(runData))
      return fail(kExitInputError, fmt::format("cannot open --data '{}'", std::string(runData)));
    llvm::sys::fs::make_absolute(absoluteData);
  }
  std::string dataPath = absoluteData.str().str();

  // One work directory per program and set of options; binaries are keyed by what they build.
  PipelineOptions options = pipelineOptions();
  std::string stem = llvm::sys::path::stem(runInput).str();
  llvm::SmallString<256> absoluteInput(runInput);
  llvm::sys::fs::make_absolute(absoluteInput);
  std::string key = absoluteInput.str().str() + "\n" + workKey(options);
  std::string cacheDir =
      runCacheDir.getNumOccurrences() ? std::string(runCacheDir) : cacheDirectory();
  std::string workDir =
      pathIn(pathIn(cacheDir, "run"), fmt::format("{}-{:016x}", stem, llvm::xxHash64(key)));
  if (std::error_code ec = llvm::sys::fs::create_directories(workDir))
    return fail(kExitInternalError, fmt::format("cannot create '{}': {}", workDir, ec.message()));
  std::string error;

  bool onGpus = runBackend == Backend::Nccl;
  if (runProcesses && !onGpus)
    return fail(kExitInputError, "--processes is an option of --backend nccl (--backend mpi "
                                 "runs a process per rank already)");
  // The interpreter starts from the initial params: a loaded run has nothing to be checked by.
  if (runLoad.getNumOccurrences() && runCheck)
    return fail(kExitInputError, "--check compares with the interpreter from the initial params, "
                                 "so it cannot check a run that --load starts from a checkpoint");
  if (!checkKernelPasses({runDisabledPasses.begin(), runDisabledPasses.end()}))
    return kExitInputError;
  if (onGpus && !toolchain.cuda)
    return fail(kExitInputError, "the nccl backend is not available: this meshc was built "
                                 "without CUDA (MESHC_CUDA=OFF); use --backend threads or mpi");

  // 1. compile, in this process, once: the module, its plans (printed), the generated classes
  // and their runner (C++, or CUDA for the GPUs). The interpreter's check runs on this module.
  stage(fmt::format("compiling {} to {}", std::string(runInput), onGpus ? "CUDA" : "C++"));
  auto start = Clock::now();
  llvm::SourceMgr sources;
  DiagEngine diag(sources);
  std::vector<std::string> inputFiles;
  std::optional<ir::Module> module = loadModule(options, diag, argv0, inputFiles);
  if (!module || !lowerTraining(*module, diag)) return kExitInputError;
  std::optional<PlannedModule> planned = planModule(*module, options, diag, argv0);
  if (!planned) return kExitInputError;
  if (!runNoPlan) {
    for (size_t k = 0; k < planned->plans.size(); ++k) {
      if (k > 0) llvm::outs() << "\n";
      plan::printPlan(planned->plans[k], planned->machine, llvm::outs());
    }
    llvm::outs().flush();
  }
  std::string base = pathIn(workDir, stem);
  std::string source = onGpus ? ".cu" : ".cpp";
  // With several compile jobs, the C++ source in as many parts (those its size pays for hold
  // code), each compiled on its own, in parallel, as is the runner. With one job, and for CUDA,
  // one translation unit of the source and the runner (two would parse the prelude twice).
  unsigned jobs = buildJobs();
  bool split = !onGpus && jobs > 1;
  GenerateOptions generate{base,
                           /*runner=*/true,
                           onGpus,
                           runCudaMath,
                           {runDisabledPasses.begin(), runDisabledPasses.end()},
                           split ? size_t(jobs) : 1};
  if (int status = writeGeneratedCode(*module, *planned, generate, llvm::outs()); status != kExitOk)
    return status;
  double compileSeconds = secondsSince(start);

  // 2. build, unless the cache has a binary of the same code, flags and user headers.
  start = Clock::now();
  std::string mainDir = llvm::sys::path::parent_path(absoluteInput).str();
  std::vector<std::string> build = buildFlags(toolchain, onGpus, runOpt);
  std::vector<std::string> libraries = onGpus ? cudaLinkLibraries(toolchain) : toolchain.libraries;
  std::string prelude = onGpus ? "" : precompiledPrelude(toolchain, preludeFlags(build, libraries));
  build.insert(build.end(), {"-I", workDir, "-I", mainDir});
  // Split: the translation units are the source's parts that hold code (a part without any
  // holds a comment only, no #include), then the runner.
  std::vector<std::string> units;
  if (split) {
    for (const std::string& part : sourcePartPaths(base, generate.sourceParts))
      if (llvm::StringRef(readFile(part)).contains("#include")) units.push_back(part);
    units.push_back(base + ".main.cpp");
  }
  std::string buildKey = llvm::join(build, " ") + llvm::join(libraries, " ");
  std::vector<std::string> generated = {base + ".h", base + ".main" + source};
  if (!split)
    generated.push_back(base + source);
  else
    generated.insert(generated.end(), units.begin(), units.end() - 1);
  if (split) generated.push_back(partsHeaderPath(base));
  for (const std::string& file : generated)
    buildKey += readFile(file);
  // So is the runtime it links, as installed now (a rebuilt meshrt must not run an old binary).
  buildKey += runtimeStamp(toolchain.includeDirs, libraries);
  // The user headers the generated code includes are part of what it builds.
  for (const std::string& file : generated)
    for (llvm::StringRef line : llvm::split(readFile(file), '\n'))
      if (line.consume_front("#include \"") && line.consume_back("\""))
        buildKey +=
            readFile(llvm::sys::path::is_absolute(line) ? line.str() : pathIn(mainDir, line));
  std::string binary = fmt::format("{}-{:016x}.bin", base, llvm::xxHash64(buildKey));
  bool cached = llvm::sys::fs::exists(binary);
  stage(cached   ? std::string("building: the cache has this binary")
        : !split ? fmt::format("building the generated code ({}{})", build.front(),
                               prelude.empty() ? "" : ", with the precompiled prelude")
                 : fmt::format("building the generated code ({}, {} files in {} job{}{})",
                               build.front(), units.size(), std::min<size_t>(jobs, units.size()),
                               std::min<size_t>(jobs, units.size()) == 1 ? "" : "s",
                               prelude.empty() ? "" : ", with the precompiled prelude"));
  if (!cached && split) {
    if (int status = buildUnits(build, prelude, units, libraries, binary, base, jobs);
        status != kExitOk)
      return status;
  } else if (!cached) {
    std::string unity = base + ".unity" + source;
    {
      std::error_code ec;
      llvm::raw_fd_ostream out(unity, ec);
      if (ec) return fail(kExitInternalError, fmt::format("cannot write '{}'", unity));
      out << "#include \"" << stem << source << "\"\n#include \"" << stem << ".main" << source
          << "\"\n";
    }
    std::string partial = binary + ".tmp", log = base + ".build.log";
    if (!prelude.empty()) build.insert(build.end(), {"-include", prelude});
    build.insert(build.end(), {unity, "-o", partial});
    build.insert(build.end(), libraries.begin(), libraries.end());
    build.push_back("-lpthread");
    int rc = execute(build, log, log, error);
    if (rc != 0) {
      std::string output = readFile(log);
      if (output.size() > 8000) output = "...\n" + output.substr(output.size() - 8000);
      return fail(
          kExitInternalError,
          fmt::format("the {} compiler failed on the generated code ({}){}\n  command: "
                      "{}\n{}",
                      onGpus ? "CUDA" : "C++", rc < 0 ? error : fmt::format("exit status {}", rc),
                      rc < 0 ? "" : "; its output (also in " + log + "):", llvm::join(build, " "),
                      output));
    }
    if (std::error_code ec = llvm::sys::fs::rename(partial, binary))
      return fail(kExitInternalError, fmt::format("cannot write '{}': {}", binary, ec.message()));
  }
  double buildSeconds = secondsSince(start);

  // 3. run on the mesh's ranks.
  std::string actual = base + ".actual";
  std::vector<std::string> run = {binary, actual, std::to_string(runSeed)};
  if (runData.getNumOccurrences()) run.push_back(dataPath);
  if (runSteps > 0) run.insert(run.end(), {"--steps", std::to_string(runSteps)});
  if (runSteps > 0 && runBatch == BatchMode::Fixed) run.push_back("--fixed-batch");
  for (auto [option, dir] : {std::pair{"--load", &runLoad}, std::pair{"--save", &runSave}})
    if (dir->getNumOccurrences()) {
      llvm::SmallString<256> absolute(dir->getValue());
      llvm::sys::fs::make_absolute(absolute);
      run.insert(run.end(), {option, absolute.str().str()});
    }
  // --profile traces into the work directory unless --trace names the file.
  std::string tracePath;
  if (runTrace.getNumOccurrences()) {
    llvm::SmallString<256> absoluteTrace(runTrace);
    llvm::sys::fs::make_absolute(absoluteTrace);
    tracePath = absoluteTrace.str().str();
  } else if (runProfile) {
    tracePath = base + ".trace.json";
  }
  if (!tracePath.empty()) {
    llvm::sys::fs::remove(tracePath); // no stale trace read if the run writes none
    run.insert(run.end(), {"--trace", tracePath});
  }
  std::vector<std::string> env;
  if (runBackend == Backend::Mpi) {
    // The generated runner chooses its communicator at run time (meshrt::launch, which reads
    // MESHRT_BACKEND); a runner without it runs on threads only.
    if (llvm::StringRef(readFile(base + ".main.cpp")).find("meshrt::launch") ==
        llvm::StringRef::npos)
      return fail(kExitInputError,
                  "the MPI backend is not available in this meshc (its generated runner has no "
                  "MPI launcher); use --backend threads");
    std::vector<std::string> mpirun = mpirunCommand(rankCount(*planned));
    run.insert(run.begin(), mpirun.begin(), mpirun.end());
    env.push_back("MESHRT_BACKEND=mpi");
  }
  // OpenMP's threads wait by sleeping unless the user says otherwise (docs/tool.md): spinning
  // ones take the cores the rank threads need. The runner would set it itself and start again.
  if (!llvm::sys::Process::GetEnv("OMP_WAIT_POLICY")) env.push_back("OMP_WAIT_POLICY=passive");
  bool perProcess = runBackend == Backend::Mpi || runProcesses;
  if (runProcesses) {
    // The CUDA runner launches through MPI when told (meshrt::nccl::NcclOptions::fromArgs).
    std::vector<std::string> mpirun = mpirunCommand(rankCount(*planned));
    run.insert(run.begin(), mpirun.begin(), mpirun.end());
    run.insert(run.end(), {"--launch", "mpi"});
  }
  stage(fmt::format("running on the {} backend{}",
                    runBackend == Backend::Mpi ? "mpi"
                    : onGpus                   ? "nccl"
                                               : "threads",
                    runProcesses ? ", one process per GPU (mpirun)" : ""));
  start = Clock::now();
  int rc = execute(run, "", "", error, env.empty() ? nullptr : &env);
  if (rc != 0)
    return fail(kExitInternalError,
                fmt::format("the generated program failed ({})",
                            rc < 0 ? error : fmt::format("exit status {}", rc)));
  double runSeconds = secondsSince(start);
  if (!tracePath.empty()) {
    // Under MPI each process wrote its ranks' file (meshrt/Trace.h): one file again.
    if (perProcess && !mergeRankTraces(tracePath, rankCount(*planned), error))
      return fail(kExitInternalError, error);
    stage(fmt::format("trace written to {}", tracePath));
  }
  if (runProfile && !printProfile(planned->plans, tracePath, llvm::outs(), error))
    return fail(kExitInternalError, error);

  // 4. check against the reference interpreter.
  double checkSeconds = 0;
  bool matches = true;
  if (runCheck) {
    stage("checking against the reference interpreter");
    start = Clock::now();
    std::string expected = base + ".expected", log = base + ".interp.log";
    PipelineOptions check = options;
    check.dumpOutputsFile = expected;
    if (runData.getNumOccurrences()) check.inputsFile = dataPath;
    std::string summary; // the interpreter's summary goes to the log, as the outputs' values
    llvm::raw_string_ostream summaryStream(summary);
    bool interpreted = interpretModule(*module, check, summaryStream, argv0);
    {
      std::error_code ec;
      llvm::raw_fd_ostream(log, ec) << summaryStream.str();
    }
    if (!interpreted) return kExitInputError;
    CheckRule rule{runSteps, {}, std::nullopt, toleranceDtypes(*module)};
    for (const ir::Function& fn : module->functions)
      if (fn.kind == ir::Function::Kind::Train) rule.trained.insert(fn.name);
    if (runTolerance.getNumOccurrences()) rule.f32Rtol = runTolerance;
    auto checks = compareOutputFiles(actual, expected, rule);
    if (!checks)
      return fail(kExitInternalError,
                  "malformed output files '" + actual + "' / '" + expected + "'");
    if (llvm::any_of(*checks, [](const TensorCheck& c) { return !c.pass(); })) {
      // Is a failing tensor determined by the program at all? The interpreter in double says.
      check.roundToDtype = false;
      check.dumpOutputsFile = base + ".expected-double";
      std::string unrounded;
      llvm::raw_string_ostream ignored(unrounded);
      if (!interpretModule(*module, check, ignored, argv0) ||
          !probeOracle(*checks, actual, expected, check.dumpOutputsFile, rule))
        return fail(kExitInternalError, "the interpreter in double failed");
    }
    checkSeconds = secondsSince(start);
    llvm::outs() << "check against the reference interpreter:\n";
    matches = printChecks(*checks, llvm::outs());
  }
  llvm::outs() << fmt::format("meshc run: compile {:.2f} s, build {:.2f} s{}, run {:.2f} s",
                              compileSeconds, buildSeconds, cached ? " (cached)" : "", runSeconds);
  if (runCheck) llvm::outs() << fmt::format(", check {:.2f} s", checkSeconds);
  llvm::outs() << "\n";
  llvm::outs().flush();
  if (!matches)
    return fail(kExitInternalError, "the outputs differ from the reference interpreter's");
  return kExitOk;
}

} // namespace meshc
