#include "driver/Driver.h"

#include "driver/JointSearch.h"
#include "driver/Pipeline.h"
#include "driver/PlanPipeline.h"

#include "codegen/Lower.h"
#include "diag/Diagnostics.h"
#include "interp/DtypePaths.h"
#include "ir/IRPrinter.h"
#include "planner/PlanReport.h"

#include <fmt/format.h>
#include <llvm/ADT/STLExtras.h>
#include <llvm/Config/llvm-config.h>
#include <llvm/Support/CommandLine.h>
#include <llvm/Support/FileSystem.h>
#include <llvm/Support/ToolOutputFile.h>
#include <llvm/Support/WithColor.h>

namespace meshc {

namespace {

enum class Emit { AST, IR, TrainIR, Run, Dtypes, Plan, PlanJson, Spmd, Dot, Kernels, Cpp, Cuda };

llvm::cl::OptionCategory meshcCategory("meshc options");

llvm::cl::opt<std::string> inputPath(llvm::cl::Positional,
                                     llvm::cl::desc("<input.mesh | input.ir>"), llvm::cl::Required,
                                     llvm::cl::cat(meshcCategory));
llvm::cl::opt<std::string>
    outputPath("o", llvm::cl::desc("Write the output to <path> (default: stdout)"),
               llvm::cl::value_desc("path"), llvm::cl::init("-"), llvm::cl::cat(meshcCategory));
llvm::cl::opt<Emit> emitStage(
    "emit", llvm::cl::desc("The stage to print"), llvm::cl::init(Emit::IR),
    llvm::cl::values(
        clEnumValN(Emit::AST, "ast", "the syntax tree of the main file"),
        clEnumValN(Emit::IR, "ir", "the named-dim IR (default)"),
        clEnumValN(Emit::TrainIR, "train-ir",
                   "the IR after the training phase (autodiff, optimizer, param updates)"),
        clEnumValN(Emit::Run, "run",
                   "run every program and train block (forward) in the reference "
                   "interpreter and summarize the outputs"),
        clEnumValN(Emit::Dtypes, "tolerance-dtypes",
                   "per compared tensor (outputs; final params of train blocks), the coarsest "
                   "float dtype on any path into it, as JSON: the dtype whose tolerance its "
                   "comparison with the interpreter uses"),
        clEnumValN(Emit::Plan, "plan",
                   "the plan: layout, local shapes, collectives, memory, step time"),
        clEnumValN(Emit::PlanJson, "plan-json", "the plan as JSON"),
        clEnumValN(Emit::Spmd, "spmd", "the SPMD IR (local shapes, explicit collectives)"),
        clEnumValN(Emit::Dot, "dot", "the SPMD graph for Graphviz, collectives in red"),
        clEnumValN(Emit::Kernels, "kernels",
                   "the kernel IR after the kernel passes: buffers, fused loops, GEMMs, kernel "
                   "calls, collectives (docs/codegen.md)"),
        clEnumValN(Emit::Cpp, "cpp",
                   "SPMD C++ over meshrt: <o>.h and <o>.cpp (-o gives the base path)"),
        clEnumValN(Emit::Cuda, "cuda",
                   "SPMD CUDA over meshrt_cuda and NCCL: <o>.h and <o>.cu (sm_90; see "
                   "docs/cuda.md)")),
    llvm::cl::cat(meshcCategory));
llvm::cl::opt<bool> verifyEach(
    "verify-each",
    llvm::cl::desc("Run the IR verifier after sema, after the training phase and after planning; "
                   "a failure is an internal compiler error"),
    llvm::cl::cat(meshcCategory));
llvm::cl::list<std::string> disabledPasses(
    "disable-kernel-pass",
    llvm::cl::desc("Skip the named kernel pass (--emit=kernels, cpp, cuda; see --list-passes); "
                   "repeatable"),
    llvm::cl::value_desc("pass"), llvm::cl::cat(meshcCategory));
llvm::cl::opt<uint64_t> seed("seed",
                             llvm::cl::desc("Seed of inputs, parameters and dropout (--emit=run)"),
                             llvm::cl::init(0), llvm::cl::cat(meshcCategory));
llvm::cl::list<std::string> onlyFunctions(
    "function",
    llvm::cl::desc("Run only the named program or train block (--emit=run; repeatable)"),
    llvm::cl::value_desc("name"), llvm::cl::cat(meshcCategory));

llvm::cl::opt<int64_t> trainSteps(
    "steps",
    llvm::cl::desc("With --emit=run, run N train steps of every train block (one `step S loss L` "
                   "line each; --dump-outputs then also writes every final param)"),
    llvm::cl::value_desc("N"), llvm::cl::init(0), llvm::cl::cat(meshcCategory));

llvm::cl::opt<BatchMode> trainBatch("batch",
                                    llvm::cl::desc("With --emit=run --steps N: what the train "
                                                   "blocks train on"),
                                    batchModeValues(), llvm::cl::init(BatchMode::Fresh),
                                    llvm::cl::cat(meshcCategory));

llvm::cl::opt<bool> cppRunner(
    "cpp-runner",
    llvm::cl::desc("With --emit=cpp, also write <o>.main.cpp: a main that runs every function on "
                   "the threads backend and writes the gathered outputs (--emit=cuda: "
                   "<o>.main.cu, on the nccl backend, one GPU per rank)"),
    llvm::cl::init(false), llvm::cl::cat(meshcCategory));
llvm::cl::opt<unsigned> sourceParts(
    "source-parts",
    llvm::cl::desc("With --emit=cpp -o <o>: split the source into N files that compile in "
                   "parallel: <o>.cpp, <o>.part2.cpp ... <o>.part<N>.cpp and the header they "
                   "share, <o>.parts.h; parts the code is too small for hold a comment only "
                   "(default 1: <o>.cpp alone)"),
    llvm::cl::value_desc("N"), llvm::cl::init(1), llvm::cl::cat(meshcCategory));
llvm::cl::opt<std::string> cudaMath(
    "cuda-math",
    llvm::cl::desc("With --emit=cuda, the einsum precision: fp32 (strict, default), tf32 (TF32 "
                   "tensor cores) or bf16 (bf16 operands, fp32 accumulation and master weights)"),
    llvm::cl::value_desc("mode"), llvm::cl::init("fp32"), llvm::cl::cat(meshcCategory));
llvm::cl::opt<std::string> givenInputsPath(
    "inputs",
    llvm::cl::desc("With --emit=run, read inputs from <file> (the runner's binary format, "
                   "tensors named <function>.<input>); inputs it lacks are synthesized"),
    llvm::cl::value_desc("file"), llvm::cl::cat(meshcCategory));
llvm::cl::opt<bool> interpInDouble(
    "interp-in-double",
    llvm::cl::desc("With --emit=run, keep every float in double instead of rounding each op's "
                   "result to its dtype: how far the oracle's own rounding moves each output "
                   "(the tolerance rule's probe of ill-conditioned elements)"),
    llvm::cl::init(false), llvm::cl::cat(meshcCategory));
llvm::cl::opt<std::string> dumpOutputs(
    "dump-outputs",
    llvm::cl::desc("With --emit=run, also write every output to <file> in the generated "
                   "runner's binary format (for end-to-end comparison)"),
    llvm::cl::value_desc("file"), llvm::cl::cat(meshcCategory));

llvm::cl::opt<std::string> machineName(
    "machine",
    llvm::cl::desc(
        "The machine to plan for: a built-in (cpu, 8xh100, 8xh200, h100-cluster, a100-cluster, "
        "tpuv2-pod) or a JSON file (default: cpu)"),
    llvm::cl::value_desc("name|file"), llvm::cl::init("cpu"), llvm::cl::cat(meshcCategory));
llvm::cl::opt<std::string>
    memoryBudget("memory-budget",
                 llvm::cl::desc("Memory per device the plan must fit (e.g. 16GiB, 80GB, 1048576; "
                                "default: the machine's memory)"),
                 llvm::cl::value_desc("bytes"), llvm::cl::cat(meshcCategory));
llvm::cl::opt<std::string>
    meshOverride("mesh", llvm::cl::desc("Replace the program's mesh, e.g. \"data=2,model=4\""),
                 llvm::cl::value_desc("axis=size,..."), llvm::cl::cat(meshcCategory));
llvm::cl::opt<std::string> layoutOverride(
    "layout",
    llvm::cl::desc("Replace the program's layout, in the layout statement's syntax with "
                   "';' or ',' between items, e.g. \"batch:data;heads:[data,model];auto\""),
    llvm::cl::value_desc("items"), llvm::cl::cat(meshcCategory));
llvm::cl::opt<bool> writeDepfile(
    "MD",
    llvm::cl::desc("Also write a Makefile depfile listing every .mesh file read (-MF, or "
                   "<output>.d)"),
    llvm::cl::cat(meshcCategory));
llvm::cl::opt<std::string> depfilePath("MF", llvm::cl::desc("The depfile to write with -MD"),
                                       llvm::cl::value_desc("file"), llvm::cl::cat(meshcCategory));

llvm::cl::opt<int64_t> deviceCount(
    "devices",
    llvm::cl::desc("Also choose the mesh: plan every way of sizing the mesh's axes to this many "
                   "devices and keep the fastest (--emit=plan, plan-json, spmd, dot)"),
    llvm::cl::value_desc("n"), llvm::cl::init(0), llvm::cl::cat(meshcCategory));
llvm::cl::opt<std::string> zeroStage(
    "zero",
    llvm::cl::desc("ZeRO sharding of train blocks over each weight's data-parallel axes: 1 "
                   "optimizer state, 2 also gradients, 3 also params (FSDP); 0 none"),
    llvm::cl::value_desc("stage"), llvm::cl::cat(meshcCategory));
llvm::cl::list<std::string> dimOverrides(
    "dim", llvm::cl::desc("Set the size of a declared dim (repeatable), e.g. --dim d_ff=16384"),
    llvm::cl::value_desc("name=size"), llvm::cl::cat(meshcCategory));

// Testing the tests: a deliberate bug in the plan (planner/InjectFault.h), hidden from --help.
llvm::cl::list<std::string> recomputeDefs(
    "recompute",
    llvm::cl::desc("In train blocks, recompute the activations of every call of these defs in "
                   "backward instead of keeping them, as `recompute def` does"),
    llvm::cl::value_desc("def,..."), llvm::cl::CommaSeparated, llvm::cl::cat(meshcCategory));
llvm::cl::opt<std::string> injectFault(
    "inject-fault",
    llvm::cl::desc("Inject a deliberate bug into every train block's plan (testing the tests): "
                   "drop-grad-allreduce"),
    llvm::cl::value_desc("fault"), llvm::cl::Hidden, llvm::cl::cat(meshcCategory));

llvm::cl::opt<std::string> microbatches(
    "microbatches",
    llvm::cl::desc("Train blocks run K microbatches of DIM per step, accumulating gradients "
                   "before one update (K divides DIM's extent per device; docs/training.md); "
                   "with pipeline stages, the pipeline's microbatches, or DIM=auto to search K "
                   "(--emit=plan, plan-json; docs/planner.md)"),
    llvm::cl::value_desc("DIM=K"), llvm::cl::cat(meshcCategory));

llvm::cl::opt<int64_t> planJobs(
    "plan-jobs",
    llvm::cl::desc("Threads of the joint search under a memory budget: with more than 1, its "
                   "pipeline stage splits are planned on other threads while its other "
                   "combinations are; the plan is the same (default 0: one per core)"),
    llvm::cl::value_desc("n"), llvm::cl::init(0), llvm::cl::cat(meshcCategory));

llvm::cl::opt<std::string> pipelineSchedule(
    "pipeline-schedule",
    llvm::cl::desc("Pipeline stages: gpipe (every forward, then every backward) or 1f1b "
                   "(default: one forward, one backward, fewer microbatches in flight)"),
    llvm::cl::value_desc("schedule"), llvm::cl::init("1f1b"), llvm::cl::cat(meshcCategory));

/// Every file the compilation read, for the depfile: the main file and its imports.
std::vector<std::string> inputFiles;

bool planning() {
  return emitStage == Emit::Plan || emitStage == Emit::PlanJson || emitStage == Emit::Spmd ||
         emitStage == Emit::Dot || emitStage == Emit::Kernels || emitStage == Emit::Cpp ||
         emitStage == Emit::Cuda;
}

/// The command line as the pipeline's options.
PipelineOptions pipelineOptions() {
  PipelineOptions options;
  options.input = inputPath;
  options.dims.assign(dimOverrides.begin(), dimOverrides.end());
  options.mesh = meshOverride;
  options.layout = layoutOverride;
  options.machine = machineName;
  options.memoryBudget = memoryBudget;
  options.devices = deviceCount;
  options.functions.assign(onlyFunctions.begin(), onlyFunctions.end());
  options.seed = seed;
  options.steps = trainSteps;
  options.batch = trainBatch;
  options.inputsFile = givenInputsPath;
  options.dumpOutputsFile = dumpOutputs;
  options.roundToDtype = !interpInDouble;
  options.verifyEach = verifyEach;
  options.injectFault = injectFault;
  options.zero = zeroStage;
  options.recompute.assign(recomputeDefs.begin(), recomputeDefs.end());
  options.microbatches = microbatches;
  options.pipelineSchedule = pipelineSchedule;
  options.planJobs = planJobs;
  return options;
}

/// Prints the stage asked for (a report, the kernel IR or the generated code) of `planned`, the
/// plans of `module`. Returns the exit status.
int printPlanned(const ir::Module& module, const PlannedModule& planned, llvm::raw_ostream& os) {
  std::vector<std::string> disabled(disabledPasses.begin(), disabledPasses.end());
  if (emitStage == Emit::Cpp || emitStage == Emit::Cuda)
    return writeGeneratedCode(module, planned,
                              GenerateOptions{outputPath, cppRunner, emitStage == Emit::Cuda,
                                              cudaMath, disabled, sourceParts},
                              os);
  if (emitStage == Emit::Kernels) {
    llvm::Expected<kir::KernelModule> kernels =
        kir::lowerModule(planned.codeModuleOr(module), planned.plans, kir::LowerOptions{disabled});
    if (!kernels) {
      llvm::WithColor::error(llvm::errs(), "meshc") << llvm::toString(kernels.takeError()) << "\n";
      return kExitInputError;
    }
    os << kir::printKernels(*kernels);
    return kExitOk;
  }
  const plan::Machine& machine = planned.machine;
  if (emitStage == Emit::PlanJson) os << "[\n";
  for (size_t i = 0; i < planned.plans.size(); ++i) {
    const plan::PlannedFunction& plan = planned.plans[i];
    if (i > 0) os << (emitStage == Emit::PlanJson ? ",\n" : "\n");
    switch (emitStage) {
    case Emit::PlanJson:
      plan::printPlanJson(plan, machine, os);
      break;
    case Emit::Spmd:
      plan::printSpmd(plan.spmd, os);
      break;
    case Emit::Dot:
      plan::printDot(plan.spmd, os);
      break;
    default:
      plan::printPlan(plan, machine, os);
      break;
    }
  }
  if (emitStage == Emit::PlanJson) os << "]\n";
  return kExitOk;
}

/// Plans every selected function and prints the stage asked for (a report, the kernel IR or the
/// generated code). Returns the exit status.
int planAndPrint(const ir::Module& module, const PipelineOptions& options, DiagEngine& diag,
                 llvm::raw_ostream& os, const char* argv0) {
  std::optional<PlannedModule> planned = planModule(module, options, diag, argv0);
  if (!planned) return kExitInputError;
  return printPlanned(module, *planned, os);
}

/// Plans and prints; a layout that asks for pipeline stages goes to PlanPipeline.h instead (only
/// the plan reports take it; planModule refuses it for the other stages).
int planOrPipeline(const ir::Module& module, const PipelineOptions& options, DiagEngine& diag,
                   const char* argv0, llvm::raw_ostream& os) {
  bool ok = true;
  const ir::DimLayout* stages = stageLayoutOf(module, options, diag, ok);
  if (!ok) return kExitInputError;
  bool json = emitStage == Emit::PlanJson;
  if (emitStage != Emit::Plan && !json) return planAndPrint(module, options, diag, os, argv0);
  if (stages) return planPipelines(module, *stages, options, diag, argv0, json, os);
  if (!jointSearchApplies(module, options)) return planAndPrint(module, options, diag, os, argv0);
  // The joint search may choose stages, reported as a stage layout's plan is.
  std::optional<JointStages> staged;
  std::optional<PlannedModule> planned = planJointly(module, options, diag, argv0, &staged);
  if (!planned) return kExitInputError;
  if (staged)
    return planPipelines(staged->module, staged->stage, staged->options, diag, argv0, json, os,
                         &staged->report, staged->plans.get());
  return printPlanned(module, *planned, os);
}

/// --emit=tolerance-dtypes: one JSON object, compared tensor name -> dtype (interp/DtypePaths.h).
void printToleranceDtypes(const ir::Module& module, const PipelineOptions& options,
                          llvm::raw_ostream& os) {
  std::vector<std::string> entries;
  for (const ir::Function& fn : module.functions)
    if (options.functions.empty() || llvm::is_contained(options.functions, fn.name))
      for (const auto& [name, dtype] : interp::pathDtypes(fn))
        entries.push_back(fmt::format("  \"{}\": \"{}\"", name, dtype));
  os << "{\n"
     << fmt::format("{}", fmt::join(entries, ",\n")) << (entries.empty() ? "" : "\n") << "}\n";
}

/// A path as Make reads it in a rule: spaces, '#' and '$' escaped.
std::string makeEscaped(llvm::StringRef path) {
  std::string out;
  for (char c : path) {
    if (c == ' ' || c == '#') out += '\\';
    if (c == '$') out += '$';
    out += c;
  }
  return out;
}

/// -MD: `<target>: <every input file>` in -MF's file or `<target>.d`, written atomically.
int emitDepfile(const std::string& target) {
  std::string path = depfilePath.getNumOccurrences() ? std::string(depfilePath) : target + ".d";
  std::error_code ec;
  llvm::ToolOutputFile out(path, ec, llvm::sys::fs::OF_Text);
  if (ec) {
    llvm::WithColor::error(llvm::errs(), "meshc")
        << "cannot open '" << path << "': " << ec.message() << "\n";
    return kExitInternalError;
  }
  out.os() << makeEscaped(target) << ":";
  for (const std::string& file : inputFiles)
    out.os() << " \\\n  " << makeEscaped(file);
  out.os() << "\n";
  out.keep();
  return kExitOk;
}

void printVersion(llvm::raw_ostream& os) {
  os << "meshc " << MESHC_VERSION << " (LLVM " << LLVM_VERSION_STRING << ")\n";
}

} // namespace

int runMeshc(int argc, char** argv) {
  llvm::cl::HideUnrelatedOptions(meshcCategory);
  hideUnrelatedRunOptions();
  hideUnrelatedCalibrateOptions();
  llvm::cl::SetVersionPrinter(printVersion);
  llvm::cl::ParseCommandLineOptions(argc, argv,
                                    "meshc: a compiler for named-dim tensor programs on meshes\n");
  if (runCommandChosen()) return runCommand(argv[0]);
  if (calibrateCommandChosen()) return calibrateCommand(argv[0]);
  if (buildPreludeCommandChosen()) return buildPreludeCommand(argv[0]);
  if (writeDepfile && outputPath == "-" && !depfilePath.getNumOccurrences()) {
    llvm::WithColor::error(llvm::errs(), "meshc") << "-MD needs -o <output> or -MF <depfile>\n";
    return kExitInputError;
  }
  if (trainSteps < 0) {
    optionError("--steps must be a non-negative number of train steps");
    return kExitInputError;
  }
  if (planJobs < 0) {
    optionError("--plan-jobs must be a non-negative number of threads (0: one per core)");
    return kExitInputError;
  }
  if (!checkKernelPasses({disabledPasses.begin(), disabledPasses.end()})) return kExitInputError;

  llvm::SourceMgr sources;
  DiagEngine diag(sources);

  // The pipeline, in order (Pipeline.h): sources -> AST -> IR -> the stage asked for.
  PipelineOptions options = pipelineOptions();
  std::string text;
  llvm::raw_string_ostream os(text);
  std::optional<ir::Module> module =
      loadModule(options, diag, argv[0], inputFiles, emitStage == Emit::AST ? &os : nullptr);
  if (!module) return kExitInputError;
  // The training phase (autodiff, optimizer) on train blocks, for every stage after the IR.
  if (emitStage != Emit::AST && emitStage != Emit::IR &&
      !lowerTraining(*module, diag, options.verifyEach))
    return kExitInputError;
  if (emitStage == Emit::IR || emitStage == Emit::TrainIR)
    ir::printModule(*module, os);
  else if (emitStage == Emit::Run && !interpretModule(*module, options, os, argv[0]))
    return kExitInputError;
  else if (emitStage == Emit::Dtypes)
    printToleranceDtypes(*module, options, os);
  else if (planning())
    if (int status = planOrPipeline(*module, options, diag, argv[0], os); status != kExitOk)
      return status;

  // --emit=cpp with -o wrote its own files.
  if ((emitStage == Emit::Cpp || emitStage == Emit::Cuda) && outputPath != "-")
    return writeDepfile ? emitDepfile(outputPath + (emitStage == Emit::Cuda ? ".cu" : ".cpp"))
                        : kExitOk;

  // Written only once everything succeeded, so a failed run leaves no partial output file.
  std::error_code ec;
  llvm::ToolOutputFile out(outputPath, ec, llvm::sys::fs::OF_Text);
  if (ec) {
    llvm::WithColor::error(llvm::errs(), "meshc")
        << "cannot open '" << outputPath << "': " << ec.message() << "\n";
    return kExitInternalError;
  }
  out.os() << os.str();
  out.keep();
  return writeDepfile ? emitDepfile(outputPath) : kExitOk;
}

} // namespace meshc
