#include "driver/Driver.h"

#include "codegen/CppEmitter.h"
#include "codegen/CudaEmitter.h"
#include "codegen/Lower.h"
#include "diag/Diagnostics.h"
#include "driver/Toolchain.h"
#include "frontend/ASTPrinter.h"
#include "frontend/SourceLoader.h"
#include "interp/Interpreter.h"
#include "interp/UserFunctions.h"
#include "ir/IRParser.h"
#include "ir/IRPrinter.h"
#include "kernels/KernelCheck.h"
#include "planner/Planner.h"
#include "sema/Sema.h"
#include "train/Optimizer.h"

#include <fmt/format.h>
#include <llvm/ADT/STLExtras.h>
#include <llvm/ADT/StringSwitch.h>
#include <llvm/Config/llvm-config.h>
#include <llvm/Support/CommandLine.h>
#include <llvm/Support/FileSystem.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/Path.h>
#include <llvm/Support/ToolOutputFile.h>
#include <llvm/Support/WithColor.h>

#include <chrono>
#include <cmath>
#include <cstring>

namespace meshc {

namespace {

enum class Emit { AST, IR, TrainIR, Run, Plan, PlanJson, Spmd, Dot, Kernels, Cpp, Cuda };

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

llvm::cl::opt<bool> cppRunner(
    "cpp-runner",
    llvm::cl::desc("With --emit=cpp, also write <o>.main.cpp: a main that runs every function on "
                   "the threads backend and writes the gathered outputs (--emit=cuda: "
                   "<o>.main.cu, on the nccl backend, one GPU per rank)"),
    llvm::cl::init(false), llvm::cl::cat(meshcCategory));
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
llvm::cl::opt<std::string> dumpOutputs(
    "dump-outputs",
    llvm::cl::desc("With --emit=run, also write every output to <file> in the generated "
                   "runner's binary format (for end-to-end comparison)"),
    llvm::cl::value_desc("file"), llvm::cl::cat(meshcCategory));

llvm::cl::opt<std::string> machineName(
    "machine",
    llvm::cl::desc("The machine to plan for: a built-in (cpu, 8xh100, 8xh200, h100-cluster, "
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
llvm::cl::list<std::string> dimOverrides(
    "dim", llvm::cl::desc("Set the size of a declared dim (repeatable), e.g. --dim d_ff=16384"),
    llvm::cl::value_desc("name=size"), llvm::cl::cat(meshcCategory));

/// Every file the compilation read, for the depfile: the main file and its imports.
std::vector<std::string> inputFiles;

/// A command-line value that does not parse; reported as `meshc: error: ...`.
bool optionError(const std::string& message) {
  llvm::WithColor::error(llvm::errs(), "meshc") << message << "\n";
  return false;
}

/// "16GiB", "80 GB", "1.5e9", "1048576": bytes (K/M/G/T decimal, Ki/Mi/Gi/Ti binary).
bool parseByteSize(llvm::StringRef text, double& bytes) {
  llvm::StringRef rest = text.trim();
  size_t numberEnd = 0;
  while (numberEnd < rest.size() &&
         (llvm::isDigit(rest[numberEnd]) || rest[numberEnd] == '.' ||
          ((rest[numberEnd] == 'e' || rest[numberEnd] == 'E') && numberEnd > 0 &&
           numberEnd + 1 < rest.size() && llvm::isDigit(rest[numberEnd + 1]))))
    ++numberEnd;
  double number = 0;
  if (numberEnd == 0 || rest.take_front(numberEnd).getAsDouble(number))
    return optionError(fmt::format(
        "--memory-budget '{}' is not a byte size (e.g. 16GiB, 80GB, 1048576)", text.str()));
  std::string unit = rest.drop_front(numberEnd).trim().lower();
  double scale = llvm::StringSwitch<double>(unit)
                     .Cases("", "b", 1)
                     .Cases("k", "kb", 1e3)
                     .Cases("m", "mb", 1e6)
                     .Cases("g", "gb", 1e9)
                     .Cases("t", "tb", 1e12)
                     .Case("kib", 0x1p10)
                     .Case("mib", 0x1p20)
                     .Case("gib", 0x1p30)
                     .Case("tib", 0x1p40)
                     .Default(0);
  bytes = number * scale;
  if (bytes > 0) return true;
  return optionError(fmt::format("--memory-budget '{}' is not a positive byte size (e.g. 16GiB, "
                                 "80GB, 1048576)",
                                 text.str()));
}

/// "name=size": one entry of --mesh or --dim.
bool parseNameSize(llvm::StringRef item, const char* option, std::string& name, int64_t& size) {
  auto [left, right] = item.split('=');
  left = left.trim();
  right = right.trim();
  bool identifier = !left.empty() && (llvm::isAlpha(left[0]) || left[0] == '_') &&
                    llvm::all_of(left, [](char c) { return llvm::isAlnum(c) || c == '_'; });
  if (!identifier || right.getAsInteger(10, size) || size <= 0)
    return optionError(
        fmt::format("{} '{}' is not of the form name=size (a positive size)", option, item.str()));
  name = left.str();
  return true;
}

/// The command-line overrides of the program's dims, mesh and layout, for sema to apply.
bool semaOptions(SemaOptions& options) {
  for (const std::string& item : dimOverrides) {
    std::string name;
    int64_t size = 0;
    if (!parseNameSize(item, "--dim", name, size)) return false;
    options.dimSizes[name] = size;
  }
  if (meshOverride.getNumOccurrences()) {
    std::vector<ir::MeshAxis> axes;
    llvm::SmallVector<llvm::StringRef, 4> items;
    llvm::StringRef(meshOverride).split(items, ',', -1, /*KeepEmpty=*/false);
    for (llvm::StringRef item : items) {
      ir::MeshAxis axis;
      if (!parseNameSize(item, "--mesh", axis.name, axis.size)) return false;
      axes.push_back(axis);
    }
    if (axes.empty()) return optionError("--mesh needs at least one axis, e.g. \"data=2,model=4\"");
    options.mesh = std::move(axes);
  }
  if (layoutOverride.getNumOccurrences()) options.layout = layoutOverride;
  return true;
}

bool planning() {
  return emitStage == Emit::Plan || emitStage == Emit::PlanJson || emitStage == Emit::Spmd ||
         emitStage == Emit::Dot || emitStage == Emit::Kernels || emitStage == Emit::Cpp ||
         emitStage == Emit::Cuda;
}

/// --emit=cpp: <o>.h, <o>.cpp (and <o>.main.cpp with --cpp-runner), each written only when all
/// were generated; with -o - (the default) the files go to `os` one after the other.
/// Set when an output file cannot be written: exit status 2 (internal error), not 1.
bool outputError = false;

bool emitCppFiles(const ir::Module& module, const std::vector<plan::PlannedFunction>& plans,
                  llvm::raw_ostream& os) {
  codegen::CppOptions options;
  std::string base = outputPath == "-" ? std::string("generated") : std::string(outputPath);
  std::string stem = llvm::sys::path::filename(base).str();
  options.headerInclude = stem + ".h";
  options.runner = cppRunner;
  options.cppNamespace = "meshc_generated";
  options.disabledPasses.assign(disabledPasses.begin(), disabledPasses.end());
  bool cuda = emitStage == Emit::Cuda; // <o>.cu and <o>.main.cu, retargeted to the GPU
  if (cuda && !codegen::isCudaMathMode(cudaMath))
    return optionError("--cuda-math must be fp32, tf32 or bf16, not '" + cudaMath + "'");
  llvm::Expected<codegen::CppOutput> output =
      cuda ? codegen::emitCuda(module, plans, codegen::CudaOptions{options, cudaMath})
           : codegen::emitCpp(module, plans, options);
  if (!output) {
    llvm::WithColor::error(llvm::errs(), "meshc") << llvm::toString(output.takeError()) << "\n";
    return false;
  }
  std::vector<std::pair<std::string, const std::string*>> files = {
      {base + ".h", &output->header}, {base + (cuda ? ".cu" : ".cpp"), &output->source}};
  if (cppRunner) files.push_back({base + (cuda ? ".main.cu" : ".main.cpp"), &output->runner});
  if (outputPath == "-") {
    for (const auto& [path, text] : files)
      os << "// ---- " << path << "\n" << *text;
    return true;
  }
  std::vector<std::unique_ptr<llvm::ToolOutputFile>> outs;
  for (const auto& [path, text] : files) {
    std::error_code ec;
    auto out = std::make_unique<llvm::ToolOutputFile>(path, ec, llvm::sys::fs::OF_Text);
    if (ec) {
      llvm::WithColor::error(llvm::errs(), "meshc")
          << "cannot open '" << path << "': " << ec.message() << "\n";
      outputError = true;
      return false;
    }
    out->os() << *text;
    outs.push_back(std::move(out));
  }
  for (auto& out : outs)
    out->keep();
  return true;
}

/// Plans every selected function and prints the report asked for.
bool planAndPrint(const ir::Module& module, DiagEngine& diag, llvm::raw_ostream& os) {
  plan::PlannerOptions options;
  options.machine = machineName;
  if (memoryBudget.getNumOccurrences() && !parseByteSize(memoryBudget, options.memoryBudgetBytes))
    return false;
  options.functions.assign(onlyFunctions.begin(), onlyFunctions.end());
  if (deviceCount < 0) return optionError("--devices must be a positive number of devices");
  options.devices = deviceCount;
  llvm::Expected<plan::Machine> machine = plan::loadMachine(machineName);
  if (!machine) return optionError(llvm::toString(machine.takeError()));
  std::optional<std::vector<plan::PlannedFunction>> plans =
      plan::planModule(module, *machine, options, diag);
  if (!plans) return false;
  if (emitStage == Emit::Cpp || emitStage == Emit::Cuda) return emitCppFiles(module, *plans, os);
  if (emitStage == Emit::Kernels) {
    llvm::Expected<kir::KernelModule> kernels = kir::lowerModule(
        module, *plans,
        kir::LowerOptions{std::vector<std::string>(disabledPasses.begin(), disabledPasses.end())});
    if (!kernels) {
      llvm::WithColor::error(llvm::errs(), "meshc") << llvm::toString(kernels.takeError()) << "\n";
      return false;
    }
    os << kir::printKernels(*kernels);
    return true;
  }
  if (emitStage == Emit::PlanJson) os << "[\n";
  for (size_t i = 0; i < plans->size(); ++i) {
    const plan::PlannedFunction& planned = (*plans)[i];
    if (i > 0) os << (emitStage == Emit::PlanJson ? ",\n" : "\n");
    switch (emitStage) {
    case Emit::PlanJson:
      plan::printPlanJson(planned, *machine, os);
      break;
    case Emit::Spmd:
      plan::printSpmd(planned.spmd, os);
      break;
    case Emit::Dot:
      plan::printDot(planned.spmd, os);
      break;
    default:
      plan::printPlan(planned, *machine, os);
      break;
    }
  }
  if (emitStage == Emit::PlanJson) os << "]\n";
  return true;
}

/// One line per output: shape, mean, standard deviation, range and the first values. The
/// statistics are in double so the summary is stable across runs.
void summarizeTensor(const std::string& name, const interp::Tensor& t, llvm::raw_ostream& os) {
  double sum = 0, sumSq = 0, lo = INFINITY, hi = -INFINITY;
  for (double v : t.data) {
    sum += v;
    sumSq += v * v;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  double n = std::max<double>(1, static_cast<double>(t.data.size()));
  double mean = sum / n;
  double stddev = std::sqrt(std::max(0.0, sumSq / n - mean * mean));
  std::vector<std::string> head;
  for (size_t i = 0; i < std::min<size_t>(4, t.data.size()); ++i)
    head.push_back(fmt::format("{:.6g}", t.data[i]));
  std::string type;
  llvm::raw_string_ostream typeOs(type);
  ir::printType(t.type, typeOs);
  os << fmt::format("  {} : {}  mean {:.6g}  std {:.6g}  min {:.6g}  max {:.6g}  first [{}]\n",
                    name, typeOs.str(), mean, stddev, lo, hi, fmt::join(head, ", "));
}

bool wanted(const ir::Function& fn) {
  if (onlyFunctions.empty()) return true;
  return std::find(onlyFunctions.begin(), onlyFunctions.end(), fn.name) != onlyFunctions.end();
}

/// Appends one tensor to the --dump-outputs buffer: "tensor <name> <dtype> <rank> <sizes>\n"
/// followed by its values as float64s.
void dumpTensor(const std::string& name, const interp::Tensor& tensor, std::string& dump) {
  std::vector<std::string> sizes;
  for (const ir::Dim& dim : tensor.type.dims)
    sizes.push_back(std::to_string(dim.size));
  dump += fmt::format("tensor {} {} {}{}{}\n", name, ir::dtypeName(tensor.type.dtype), sizes.size(),
                      sizes.empty() ? "" : " ", fmt::join(sizes, " "));
  dump.append(reinterpret_cast<const char*>(tensor.data.data()),
              tensor.data.size() * sizeof(double));
}

/// The inputs of `fn` at train step `step` (0 outside training). An input given in --inputs as
/// `<fn>.<input>` holds k >= 1 batches of the input's shape stacked along its first dim, and step
/// s reads batch s mod k (as the generated runner does); the others are synthesized from
/// seed + step. False, with a message, when a given tensor does not fit.
bool inputsOfStep(const ir::Function& fn, const std::map<std::string, interp::Tensor>& givenInputs,
                  int64_t step, interp::TensorMap& inputs) {
  for (const ir::InputInfo& input : fn.inputs) {
    auto given = givenInputs.find(fn.name + "." + input.name);
    if (given == givenInputs.end()) {
      inputs[input.name] = interp::synthesizeInput(input, seed + uint64_t(step));
      continue;
    }
    size_t batch = size_t(input.type.numElements()), count = given->second.data.size();
    if (given->second.type.dims.size() != input.type.dims.size() || count == 0 ||
        count % batch != 0) {
      llvm::WithColor::error(llvm::errs(), "meshc")
          << "--inputs: " << given->first << " has " << count << " values in "
          << given->second.type.dims.size() << " dims, not one or more batches of the input's "
          << "shape\n";
      return false;
    }
    size_t first = size_t(step) % (count / batch) * batch;
    interp::Tensor tensor{input.type,
                          std::vector<double>(given->second.data.begin() + first,
                                              given->second.data.begin() + first + batch)};
    if (input.type.dtype == ir::DType::F32) // as the generated code holds them
      for (double& v : tensor.data)
        v = double(float(v));
    inputs[input.name] = std::move(tensor);
  }
  return true;
}

/// --steps N on a train block: N interpreter train steps on the inputs of each step
/// (inputsOfStep), one `step S loss L` line each. The dump gets the last loss (`<fn>.loss`) and
/// every param's final value (`<fn>.param.<path>`, weights and optimizer state).
bool trainFunction(const ir::Function& fn, llvm::raw_ostream& os, std::string& dump,
                   const interp::UserFunctions* userFunctions,
                   const std::map<std::string, interp::Tensor>& givenInputs) {
  interp::TensorMap state;
  interp::Tensor loss{ir::TensorType{}, {0.0}};
  os << fmt::format("train {}: {} steps in the interpreter\n", fn.name, int64_t(trainSteps));
  for (int64_t step = 0; step < trainSteps; ++step) {
    interp::Options opts;
    opts.seed = seed;
    opts.step = uint64_t(step);
    opts.userFunctions = userFunctions;
    interp::TensorMap inputs;
    if (!inputsOfStep(fn, givenInputs, step, inputs)) return false;
    llvm::Expected<double> value = interp::trainStep(fn, inputs, opts, state);
    if (!value) {
      llvm::WithColor::error(llvm::errs(), "meshc")
          << fn.name << ": step " << step << ": " << llvm::toString(value.takeError()) << "\n";
      return false;
    }
    os << fmt::format("step {} loss {:.9g}\n", step, *value);
    loss.data[0] = *value;
  }
  dumpTensor(fn.name + ".loss", loss, dump);
  for (const ir::ParamInfo& param : fn.params)
    dumpTensor(fn.name + ".param." + param.path, state.at(param.path), dump);
  return true;
}

/// Reads a file in the runner's output format ("tensor <name> <dtype> <rank> <sizes...>\n" and
/// float64 values); the dims of each tensor are named d0, d1, ...
bool readTensorFile(const std::string& path, std::map<std::string, interp::Tensor>& tensors) {
  auto buffer = llvm::MemoryBuffer::getFile(path, /*IsText=*/false);
  if (!buffer)
    return optionError(fmt::format("cannot open '{}': {}", path, buffer.getError().message()));
  llvm::StringRef data = (*buffer)->getBuffer();
  while (!data.empty()) {
    auto [line, rest] = data.split('\n');
    llvm::SmallVector<llvm::StringRef, 8> fields;
    line.split(fields, ' ', -1, /*KeepEmpty=*/false);
    size_t rank = 0;
    if (fields.size() < 4 || fields[0] != "tensor" || fields[3].getAsInteger(10, rank) ||
        fields.size() != 4 + rank)
      return optionError(fmt::format("'{}' is not a tensor file (at '{}')", path, line.str()));
    interp::Tensor tensor;
    size_t count = 1;
    for (size_t i = 0; i < rank; ++i) {
      int64_t size = 0;
      if (fields[4 + i].getAsInteger(10, size) || size < 0)
        return optionError(fmt::format("'{}': bad size in '{}'", path, line.str()));
      tensor.type.dims.push_back({"d" + std::to_string(i), size});
      count *= size_t(size);
    }
    if (rest.size() < count * sizeof(double))
      return optionError(fmt::format("'{}': '{}' is cut short", path, line.str()));
    tensor.data.resize(count);
    std::memcpy(tensor.data.data(), rest.data(), count * sizeof(double));
    tensors[fields[1].str()] = std::move(tensor);
    data = rest.drop_front(count * sizeof(double));
  }
  return true;
}

/// Interprets every selected function on synthesized inputs; returns false on a runtime error.
bool runModule(const ir::Module& module, llvm::raw_ostream& os, const char* argv0) {
  // The user's C++ functions (extern def), compiled into a shared library of wrappers.
  interp::UserFunctionBuild build;
  build.cxx = findToolchain(argv0).cxx;
  build.headerDir = llvm::sys::path::parent_path(inputPath).str();
  build.cacheDir = cacheDirectory();
  llvm::Expected<interp::UserFunctions> userFunctions = interp::loadUserFunctions(module, build);
  if (!userFunctions) {
    llvm::WithColor::error(llvm::errs(), "meshc")
        << llvm::toString(userFunctions.takeError()) << "\n";
    return false;
  }
  // --inputs: tensors by "<function>.<input>"; their dims stay unnamed until matched.
  std::map<std::string, interp::Tensor> givenInputs;
  if (givenInputsPath.getNumOccurrences() && !readTensorFile(givenInputsPath, givenInputs))
    return false;
  std::string dump; // --dump-outputs: "tensor <fn>.<name> <dtype> <rank> <sizes>\n" + float64s
  for (const ir::Function& fn : module.functions) {
    if (!wanted(fn)) continue;
    if (fn.kind == ir::Function::Kind::Train && trainSteps > 0) {
      if (!trainFunction(fn, os, dump, &*userFunctions, givenInputs)) return false;
      continue;
    }
    interp::Options opts;
    opts.seed = seed;
    opts.training = fn.kind == ir::Function::Kind::Train; // dropout is active in train blocks
    opts.userFunctions = &*userFunctions;
    interp::TensorMap inputs;
    if (!inputsOfStep(fn, givenInputs, 0, inputs)) return false;
    auto start = std::chrono::steady_clock::now();
    llvm::Expected<interp::TensorMap> outputs = interp::run(fn, inputs, opts);
    double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (!outputs) {
      llvm::WithColor::error(llvm::errs(), "meshc")
          << fn.name << ": " << llvm::toString(outputs.takeError()) << "\n";
      return false;
    }
    int64_t paramCount = 0;
    for (const ir::ParamInfo& p : fn.params)
      paramCount += p.type.numElements();
    os << fmt::format("{} {}: {} ops, {} params ({} values), interpreted in {:.1f} ms\n",
                      fn.kind == ir::Function::Kind::Train ? "train" : "program", fn.name,
                      fn.ops.size(), fn.params.size(), paramCount, ms);
    for (const ir::OutputInfo& out : fn.outputs) {
      const interp::Tensor& tensor = outputs->at(out.name);
      summarizeTensor(out.name, tensor, os);
      dumpTensor(fn.name + "." + out.name, tensor, dump);
    }
  }
  if (dumpOutputs.getNumOccurrences()) {
    std::error_code ec;
    llvm::ToolOutputFile out(dumpOutputs, ec, llvm::sys::fs::OF_None);
    if (ec) {
      llvm::WithColor::error(llvm::errs(), "meshc")
          << "cannot open '" << dumpOutputs << "': " << ec.message() << "\n";
      return false;
    }
    out.os() << dump;
    out.keep();
  }
  return true;
}

/// The front half of the pipeline: load and parse the sources, check them and lower them to IR,
/// or read IR text directly (`.ir` files, as printed by --emit=ir). Prints --emit=ast itself.
std::optional<ir::Module> loadModule(DiagEngine& diag, llvm::raw_ostream& os, const char* argv0) {
  if (llvm::StringRef(inputPath).endswith(".ir")) {
    auto buffer = llvm::MemoryBuffer::getFile(inputPath);
    if (!buffer) {
      diag.report(llvm::SMLoc(), Diag::ErrCannotOpen, inputPath, buffer.getError().message());
      return std::nullopt;
    }
    inputFiles = {inputPath};
    llvm::Expected<ir::Module> module = ir::parseModule((*buffer)->getBuffer(), inputPath);
    if (!module) {
      llvm::WithColor::error(llvm::errs()) << llvm::toString(module.takeError()) << "\n";
      return std::nullopt;
    }
    return std::move(*module);
  }
  std::optional<SourceSet> files = loadSources(inputPath, diag);
  if (!files) return std::nullopt;
  for (const auto& file : files->files)
    inputFiles.push_back(file->path);
  if (emitStage == Emit::AST) {
    printAST(files->mainFile(), diag.sources(), os);
    return ir::Module();
  }
  SemaOptions options;
  if (!semaOptions(options)) return std::nullopt;
  kernels::KernelCheckOptions kernelOptions;
  kernelOptions.resourceDir = findToolchain(argv0).clangResourceDir;
  options.checkExtern = [&](const ExternFunction& fn, DiagEngine& engine) {
    inputFiles.push_back(fn.headerPath); // -MD lists the user's headers too
    return kernels::checkExternFunction(fn, engine, kernelOptions);
  };
  return analyze(*files, diag, options);
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
  llvm::cl::SetVersionPrinter(printVersion);
  llvm::cl::ParseCommandLineOptions(argc, argv,
                                    "meshc: a compiler for named-dim tensor programs on meshes\n");
  if (runCommandChosen()) return runCommand(argv[0]);
  if (writeDepfile && outputPath == "-" && !depfilePath.getNumOccurrences()) {
    llvm::WithColor::error(llvm::errs(), "meshc") << "-MD needs -o <output> or -MF <depfile>\n";
    return kExitInputError;
  }
  if (trainSteps < 0) {
    optionError("--steps must be a non-negative number of train steps");
    return kExitInputError;
  }
  for (const std::string& pass : disabledPasses)
    if (llvm::none_of(kir::kernelPasses(),
                      [&](const kir::KernelPass& known) { return pass == known.name; })) {
      std::string known;
      for (const kir::KernelPass& each : kir::kernelPasses())
        known += fmt::format("\n  {}: {}", each.name, each.description);
      optionError("--disable-kernel-pass: no kernel pass named '" + pass +
                  "'; the passes, in "
                  "order:" +
                  known);
      return kExitInputError;
    }

  llvm::SourceMgr sources;
  DiagEngine diag(sources);

  // The pipeline, in order: sources -> AST -> IR -> the stage asked for.
  std::string text;
  llvm::raw_string_ostream os(text);
  std::optional<ir::Module> module = loadModule(diag, os, argv[0]);
  if (!module) return kExitInputError;
  // The training phase (autodiff, optimizer) on train blocks, for every stage after the IR.
  if (emitStage != Emit::AST && emitStage != Emit::IR)
    for (ir::Function& fn : module->functions)
      if (!train::lowerTraining(fn, diag)) return kExitInputError;
  if (emitStage == Emit::IR || emitStage == Emit::TrainIR)
    ir::printModule(*module, os);
  else if (emitStage == Emit::Run && !runModule(*module, os, argv[0]))
    return kExitInputError;
  else if (planning() && !planAndPrint(*module, diag, os))
    return outputError ? kExitInternalError : kExitInputError;

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
