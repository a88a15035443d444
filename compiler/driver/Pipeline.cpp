// The compiler's pipeline, stage by stage (Pipeline.h).
#include "driver/Pipeline.h"
#include "driver/PlanPipeline.h"
#include "driver/StagedCode.h"

#include "codegen/CppEmitter.h"
#include "codegen/CudaEmitter.h"
#include "codegen/Lower.h"
#include "driver/Driver.h"
#include "driver/JointSearch.h"
#include "driver/Microbatches.h"
#include "driver/Toolchain.h"
#include "frontend/ASTPrinter.h"
#include "frontend/SourceLoader.h"
#include "interp/Interpreter.h"
#include "interp/UserFunctions.h"
#include "ir/IRParser.h"
#include "ir/IRPrinter.h"
#include "kernels/KernelCheck.h"
#include "meshc/TensorFile.h"
#include "planner/InjectFault.h"
#include "planner/VerifySpmd.h"
#include "sema/Sema.h"
#include "train/Optimizer.h"

#include <cstdint>
#include <fmt/format.h>
#include <llvm/ADT/STLExtras.h>
#include <llvm/ADT/StringSwitch.h>
#include <llvm/Support/FileSystem.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/Path.h>
#include <llvm/Support/ToolOutputFile.h>
#include <llvm/Support/WithColor.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <mutex>
#include <set>

namespace meshc {

llvm::cl::ValuesClass batchModeValues() {
  return llvm::cl::values(
      clEnumValN(BatchMode::Fresh, "fresh",
                 "each step trains on a new synthetic batch (seed + step; default)"),
      clEnumValN(BatchMode::Fixed, "fixed",
                 "every step trains on step 0's batch (overfitting it shows learning)"));
}

std::string batchModeLine(const PipelineOptions& options, bool givenInputs) {
  bool fixed = options.batch == BatchMode::Fixed;
  std::string from = givenInputs ? "the given data's batch" : "a synthetic batch";
  if (fixed) return fmt::format("each on the same batch ({} of step 0; --batch=fixed)", from);
  return fmt::format("each on a new batch ({} of step s{}; --batch=fixed repeats step 0's)", from,
                     givenInputs ? " mod k" : ", seed + s");
}

bool optionError(const std::string& message) {
  llvm::WithColor::error(llvm::errs(), "meshc") << message << "\n";
  return false;
}

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

namespace {

/// "name=size": one entry of --mesh or --dim (an option error when `report`).
bool parseNameSize(llvm::StringRef item, const char* option, std::string& name, int64_t& size,
                   bool report = true) {
  auto [left, right] = item.split('=');
  left = left.trim();
  right = right.trim();
  bool identifier = !left.empty() && (llvm::isAlpha(left[0]) || left[0] == '_') &&
                    llvm::all_of(left, [](char c) { return llvm::isAlnum(c) || c == '_'; });
  if (!identifier || right.getAsInteger(10, size) || size <= 0)
    return report &&
           optionError(fmt::format("{} '{}' is not of the form name=size (a positive size)", option,
                                   item.str()));
  name = left.str();
  return true;
}

} // namespace

std::optional<std::vector<ir::MeshAxis>> parseMeshOption(const std::string& text, bool report) {
  std::vector<ir::MeshAxis> axes;
  llvm::SmallVector<llvm::StringRef, 4> items;
  llvm::StringRef(text).split(items, ',', -1, /*KeepEmpty=*/false);
  for (llvm::StringRef item : items) {
    ir::MeshAxis axis;
    if (!parseNameSize(item, "--mesh", axis.name, axis.size, report)) return std::nullopt;
    axes.push_back(axis);
  }
  if (axes.empty()) {
    if (report) optionError("--mesh needs at least one axis, e.g. \"data=2,model=4\"");
    return std::nullopt;
  }
  return axes;
}

namespace {

/// The command-line overrides of the program's dims, mesh and layout, for sema to apply.
bool semaOptions(const PipelineOptions& given, SemaOptions& options) {
  for (const std::string& item : given.dims) {
    std::string name;
    int64_t size = 0;
    if (!parseNameSize(item, "--dim", name, size)) return false;
    options.dimSizes[name] = size;
  }
  if (!given.mesh.empty()) {
    options.mesh = parseMeshOption(given.mesh);
    if (!options.mesh) return false;
  }
  if (!given.layout.empty()) options.layout = given.layout;
  options.recompute = given.recompute;
  return true;
}

/// --verify-each: the IR verifier's findings after `phase` as internal errors (a phase broke an
/// invariant of the IR); false when there are any.
bool reportVerifierErrors(const std::vector<ir::VerifierError>& errors, const char* phase) {
  for (const ir::VerifierError& error : errors)
    llvm::WithColor::error(llvm::errs(), "meshc")
        << "internal compiler error: IR verifier after " << phase << ": " << error.format() << "\n";
  return errors.empty();
}

/// --function names programs or train blocks of the module: a name that is neither (a typo, a
/// def) would select nothing, and the command would succeed having done nothing.
std::optional<ir::Module> checkSelection(std::optional<ir::Module> module,
                                         const PipelineOptions& given, DiagEngine& diag) {
  if (!module) return module;
  std::vector<std::string> names;
  for (const ir::Function& fn : module->functions)
    names.push_back(fn.name);
  bool ok = true;
  for (const std::string& name : given.functions)
    if (!llvm::is_contained(names, name)) {
      diag.report(llvm::SMLoc(), Diag::ErrUnknownFunctionOption, name,
                  names.empty() ? std::string(": there are none")
                                : fmt::format(" (the file has {})", fmt::join(names, ", ")));
      ok = false;
    }
  if (!ok) return std::nullopt;
  return module;
}

} // namespace

std::optional<ir::Module> loadModule(const PipelineOptions& given, DiagEngine& diag,
                                     const char* argv0, std::vector<std::string>& inputFiles,
                                     llvm::raw_ostream* printAst) {
  // The joint search's threads load modules into one SourceMgr (DiagEngine::sourcesMutex).
  std::lock_guard<std::recursive_mutex> lock(DiagEngine::sourcesMutex());
  if (llvm::StringRef(given.input).endswith(".ir")) {
    auto buffer = llvm::MemoryBuffer::getFile(given.input);
    if (!buffer) {
      diag.report(llvm::SMLoc(), Diag::ErrCannotOpen, given.input, buffer.getError().message());
      return std::nullopt;
    }
    inputFiles = {given.input};
    llvm::Expected<ir::Module> module = ir::parseModule((*buffer)->getBuffer(), given.input);
    if (!module) {
      llvm::WithColor::error(llvm::errs()) << llvm::toString(module.takeError()) << "\n";
      return std::nullopt;
    }
    if (given.verifyEach && !reportVerifierErrors(ir::verifyModule(*module), "reading IR"))
      return std::nullopt;
    return checkSelection(std::move(*module), given, diag);
  }
  std::optional<SourceSet> files = loadSources(given.input, diag);
  if (!files) return std::nullopt;
  for (const auto& file : files->files)
    inputFiles.push_back(file->path);
  if (printAst) {
    printAST(files->mainFile(), diag.sources(), *printAst);
    return ir::Module();
  }
  SemaOptions options;
  if (!semaOptions(given, options)) return std::nullopt;
  kernels::KernelCheckOptions kernelOptions;
  kernelOptions.resourceDir = findToolchain(argv0).clangResourceDir;
  options.checkExtern = [&](const ExternFunction& fn, DiagEngine& engine) {
    inputFiles.push_back(fn.headerPath); // -MD lists the user's headers too
    return kernels::checkExternFunction(fn, engine, kernelOptions);
  };
  std::optional<ir::Module> module = analyze(*files, diag, options);
  if (module && given.verifyEach && !reportVerifierErrors(ir::verifyModule(*module), "sema"))
    return std::nullopt;
  return checkSelection(std::move(module), given, diag);
}

bool lowerTraining(ir::Module& module, DiagEngine& diag, bool verify,
                   std::vector<size_t>* forwardOps) {
  std::set<std::string> splitDims = train::pinnedDims(module);
  if (forwardOps) forwardOps->assign(module.functions.size(), SIZE_MAX);
  for (size_t f = 0; f < module.functions.size(); ++f)
    if (!train::lowerTraining(module.functions[f], diag, splitDims,
                              forwardOps ? &(*forwardOps)[f] : nullptr))
      return false;
  return !verify || reportVerifierErrors(ir::verifyModule(module), "the training phase");
}

namespace {

/// --inject-fault: the fault in every planned train block, each change noted on stderr; an error
/// when the fault is unknown or changes nothing (a test asking for a fault must get one).
bool injectFaults(std::vector<plan::PlannedFunction>& plans, const std::string& fault) {
  bool injected = false;
  for (plan::PlannedFunction& planned : plans) {
    llvm::Expected<std::string> what = plan::injectFault(planned.spmd, fault);
    if (!what) return optionError(llvm::toString(what.takeError()));
    if (what->empty()) continue;
    llvm::WithColor::note(llvm::errs(), "meshc")
        << "fault injected in " << planned.spmd.name << ": " << *what << " dropped\n";
    injected = true;
  }
  return injected || optionError("--inject-fault=" + fault + ": nothing to inject it into");
}

} // namespace

std::optional<PlannedModule> planModule(const ir::Module& module, const PipelineOptions& given,
                                        DiagEngine& diag, const char* argv0) {
  bool stagesOk = true;
  if (const ir::DimLayout* stages = stageLayoutOf(module, given, diag, stagesOk))
    return planStaged(module, *stages, given, diag, argv0);
  if (!stagesOk) return std::nullopt;
  if (jointSearchApplies(module, given)) {
    std::optional<JointStages> staged;
    std::optional<PlannedModule> planned = planJointly(module, given, diag, argv0, &staged);
    if (!planned || !staged) return planned;
    // The pipeline's fit was checked by its model; the plan of one stage's mesh holds every
    // layer (StagedCode.h), so it is not held to the budget again.
    staged->options.memoryBudget.clear();
    return planStaged(staged->module, staged->stage, staged->options, diag, argv0);
  }
  if (!given.microbatches.empty()) return planMicrobatched(module, given, diag, argv0);
  plan::PlannerOptions options;
  options.machine = given.machine;
  if (!given.memoryBudget.empty() && !parseByteSize(given.memoryBudget, options.memoryBudgetBytes))
    return std::nullopt;
  options.functions = given.functions;
  if (given.devices < 0) {
    optionError("--devices must be a positive number of devices");
    return std::nullopt;
  }
  options.devices = given.devices;
  options.searchStart = given.searchStart;
  options.skipIdleBounds = given.skipIdleBounds;
  options.boundTally = given.boundTally;
  if (!given.zero.empty()) {
    llvm::StringRef stage = llvm::StringRef(given.zero).trim();
    if (stage.getAsInteger(10, options.zeroStage) || options.zeroStage < 0 ||
        options.zeroStage > 3) {
      optionError("--zero must be 0, 1, 2 or 3 (the ZeRO stage), not '" + given.zero + "'");
      return std::nullopt;
    }
  }
  llvm::Expected<plan::Machine> machine = plan::loadMachine(given.machine);
  if (!machine) {
    optionError(llvm::toString(machine.takeError()));
    return std::nullopt;
  }
  machine->meshCopies = given.stageCopies;
  std::optional<std::vector<plan::PlannedFunction>> plans =
      plan::planModule(module, *machine, options, diag);
  if (!plans || !finishPlans(*plans, given)) return std::nullopt;
  return PlannedModule{std::move(*machine), std::move(*plans), std::nullopt};
}

bool finishPlans(std::vector<plan::PlannedFunction>& plans, const PipelineOptions& given) {
  if (!given.injectFault.empty() && !injectFaults(plans, given.injectFault)) return false;
  if (!given.verifyEach) return true;
  bool ok = true;
  for (const plan::PlannedFunction& planned : plans)
    ok = reportVerifierErrors(plan::verifySpmdFunction(planned.spmd), "planning") && ok;
  return ok;
}

bool checkKernelPasses(const std::vector<std::string>& disabledPasses) {
  for (const std::string& pass : disabledPasses)
    if (llvm::none_of(kir::kernelPasses(),
                      [&](const kir::KernelPass& known) { return pass == known.name; })) {
      std::string known;
      for (const kir::KernelPass& each : kir::kernelPasses())
        known += fmt::format("\n  {}: {}", each.name, each.description);
      return optionError("--disable-kernel-pass: no kernel pass named '" + pass +
                         "'; the passes, in order:" + known);
    }
  return true;
}

std::vector<std::string> sourcePartPaths(const std::string& base, size_t parts) {
  std::vector<std::string> paths = {base + ".cpp"};
  for (size_t k = 2; k <= parts; ++k)
    paths.push_back(fmt::format("{}.part{}.cpp", base, k));
  return paths;
}

std::string partsHeaderPath(const std::string& base) {
  return base + ".parts.h";
}

int writeGeneratedCode(const ir::Module& loaded, const PlannedModule& planned,
                       const GenerateOptions& given, llvm::raw_ostream& os) {
  const ir::Module& module = planned.codeModuleOr(loaded);
  const std::vector<plan::PlannedFunction>& plans = planned.plans;
  codegen::CppOptions options;
  std::string base = given.base == "-" ? std::string("generated") : given.base;
  std::string stem = llvm::sys::path::filename(base).str();
  options.headerInclude = stem + ".h";
  options.runner = given.runner;
  options.cppNamespace = "meshc_generated";
  options.disabledPasses = given.disabledPasses;
  options.sourceParts = std::max<size_t>(1, given.sourceParts);
  options.partsHeaderInclude = llvm::sys::path::filename(partsHeaderPath(base)).str();
  bool cuda = given.cuda; // <o>.cu and <o>.main.cu, retargeted to the GPU
  if (cuda && options.sourceParts > 1)
    return optionError("--source-parts splits C++ (--emit=cpp); the CUDA source is one file"),
           kExitInputError;
  if (cuda && !codegen::isCudaMathMode(given.cudaMath))
    return optionError("--cuda-math must be fp32, tf32 or bf16, not '" + given.cudaMath + "'"),
           kExitInputError;
  llvm::Expected<codegen::CppOutput> output =
      cuda ? codegen::emitCuda(module, plans, codegen::CudaOptions{options, given.cudaMath})
           : codegen::emitCpp(module, plans, options);
  if (!output) {
    llvm::WithColor::error(llvm::errs(), "meshc") << llvm::toString(output.takeError()) << "\n";
    return kExitInputError;
  }
  std::vector<std::pair<std::string, const std::string*>> files = {
      {base + ".h", &output->header}, {base + (cuda ? ".cu" : ".cpp"), &output->source}};
  if (options.sourceParts > 1) {
    std::vector<std::string> paths = sourcePartPaths(base, options.sourceParts);
    for (size_t k = 1; k < paths.size(); ++k)
      files.push_back({paths[k], &output->moreSources[k - 1]});
    files.push_back({partsHeaderPath(base), &output->partsHeader});
  }
  if (given.runner) files.push_back({base + (cuda ? ".main.cu" : ".main.cpp"), &output->runner});
  if (given.base == "-") {
    for (const auto& [path, text] : files)
      os << "// ---- " << path << "\n" << *text;
    return kExitOk;
  }
  std::vector<std::unique_ptr<llvm::ToolOutputFile>> outs;
  for (const auto& [path, text] : files) {
    std::error_code ec;
    auto out = std::make_unique<llvm::ToolOutputFile>(path, ec, llvm::sys::fs::OF_Text);
    if (ec) {
      llvm::WithColor::error(llvm::errs(), "meshc")
          << "cannot open '" << path << "': " << ec.message() << "\n";
      return kExitInternalError;
    }
    out->os() << *text;
    outs.push_back(std::move(out));
  }
  for (auto& out : outs)
    out->keep();
  return kExitOk;
}

namespace {

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

bool wanted(const PipelineOptions& options, const ir::Function& fn) {
  return options.functions.empty() || llvm::is_contained(options.functions, fn.name);
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
/// seed + step. With --batch=fixed every step reads step 0's. False, with a message, when a
/// given tensor does not fit.
bool inputsOfStep(const PipelineOptions& options, const ir::Function& fn,
                  const std::map<std::string, interp::Tensor>& givenInputs, int64_t step,
                  interp::TensorMap& inputs) {
  int64_t batchStep = options.batch == BatchMode::Fixed ? 0 : step;
  for (const ir::InputInfo& input : fn.inputs) {
    auto given = givenInputs.find(fn.name + "." + input.name);
    if (given == givenInputs.end()) {
      inputs[input.name] = interp::synthesizeInput(input, options.seed + uint64_t(batchStep));
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
    size_t first = size_t(batchStep) % (count / batch) * batch;
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

/// ` accuracy 0.5 ...`: a train step's metrics (its outputs after the loss), as the generated
/// runner prints them.
std::string metricsText(const ir::Function& fn, const interp::TensorMap& outputs) {
  std::string text;
  for (size_t k = 1; k < fn.outputs.size(); ++k)
    text +=
        fmt::format(" {} {:.9g}", fn.outputs[k].name, outputs.at(fn.outputs[k].name).data.at(0));
  return text;
}

/// --steps N on a train block: N interpreter train steps on the inputs of each step
/// (inputsOfStep), one `step S loss L` line each. The dump gets the last loss (`<fn>.loss`) and
/// every param's final value (`<fn>.param.<path>`, weights and optimizer state).
bool trainFunction(const PipelineOptions& options, const ir::Function& fn, llvm::raw_ostream& os,
                   std::string& dump, const interp::UserFunctions* userFunctions,
                   const std::map<std::string, interp::Tensor>& givenInputs) {
  interp::TensorMap state, lastOutputs;
  interp::Tensor loss{ir::TensorType{}, {0.0}};
  os << fmt::format("train {}: {} steps in the interpreter, {}\n", fn.name, options.steps,
                    batchModeLine(options, llvm::any_of(fn.inputs, [&](const ir::InputInfo& in) {
                                    return givenInputs.count(fn.name + "." + in.name) > 0;
                                  })));
  for (int64_t step = 0; step < options.steps; ++step) {
    interp::Options opts;
    opts.seed = options.seed;
    opts.step = uint64_t(step);
    opts.userFunctions = userFunctions;
    opts.roundToDtype = options.roundToDtype;
    interp::TensorMap inputs;
    if (!inputsOfStep(options, fn, givenInputs, step, inputs)) return false;
    interp::TensorMap outputs;
    llvm::Expected<double> value = interp::trainStep(fn, inputs, opts, state, &outputs);
    if (!value) {
      llvm::WithColor::error(llvm::errs(), "meshc")
          << fn.name << ": step " << step << ": " << llvm::toString(value.takeError()) << "\n";
      return false;
    }
    os << fmt::format("step {} loss {:.9g}{}\n", step, *value, metricsText(fn, outputs));
    loss.data[0] = *value;
    lastOutputs = std::move(outputs);
  }
  dumpTensor(fn.name + ".loss", loss, dump);
  for (size_t k = 1; k < fn.outputs.size() && options.steps > 0; ++k)
    dumpTensor(fn.name + "." + fn.outputs[k].name, lastOutputs.at(fn.outputs[k].name), dump);
  for (const ir::ParamInfo& param : fn.params)
    dumpTensor(fn.name + ".param." + param.path, state.at(param.path), dump);
  return true;
}

/// Reads a file in the runner's output format (meshc/TensorFile.h); the dims of each tensor are
/// named d0, d1, ...
bool readTensorFile(const std::string& path, std::map<std::string, interp::Tensor>& tensors) {
  auto buffer = llvm::MemoryBuffer::getFile(path, /*IsText=*/false);
  if (!buffer)
    return optionError(fmt::format("cannot open '{}': {}", path, buffer.getError().message()));
  llvm::StringRef data = (*buffer)->getBuffer();
  try {
    for (const meshc::gen::TensorFileEntry& entry :
         meshc::gen::parseTensorFile({data.data(), data.size()}, path)) {
      interp::Tensor tensor;
      for (size_t i = 0; i < entry.shape.size(); ++i)
        tensor.type.dims.push_back({"d" + std::to_string(i), entry.shape[i]});
      tensor.data.resize(entry.count());
      for (size_t i = 0; i < entry.count(); ++i)
        tensor.data[i] = entry.value(i);
      tensors[entry.name] = std::move(tensor);
    }
  } catch (const std::runtime_error& error) {
    return optionError(error.what());
  }
  return true;
}

} // namespace

bool interpretModule(const ir::Module& module, const PipelineOptions& options,
                     llvm::raw_ostream& os, const char* argv0) {
  // The user's C++ functions (extern def), compiled into a shared library of wrappers.
  interp::UserFunctionBuild build;
  build.cxx = findToolchain(argv0).cxx;
  build.headerDir = llvm::sys::path::parent_path(options.input).str();
  build.cacheDir = cacheDirectory();
  llvm::Expected<interp::UserFunctions> userFunctions = interp::loadUserFunctions(module, build);
  if (!userFunctions) {
    llvm::WithColor::error(llvm::errs(), "meshc")
        << llvm::toString(userFunctions.takeError()) << "\n";
    return false;
  }
  // --inputs: tensors by "<function>.<input>"; their dims stay unnamed until matched.
  std::map<std::string, interp::Tensor> givenInputs;
  if (!options.inputsFile.empty() && !readTensorFile(options.inputsFile, givenInputs)) return false;
  std::string dump; // --dump-outputs: "tensor <fn>.<name> <dtype> <rank> <sizes>\n" + float64s
  for (const ir::Function& fn : module.functions) {
    if (!wanted(options, fn)) continue;
    if (fn.kind == ir::Function::Kind::Train && options.steps > 0) {
      if (!trainFunction(options, fn, os, dump, &*userFunctions, givenInputs)) return false;
      continue;
    }
    interp::Options opts;
    opts.seed = options.seed;
    opts.training = fn.kind == ir::Function::Kind::Train; // dropout is active in train blocks
    opts.userFunctions = &*userFunctions;
    opts.roundToDtype = options.roundToDtype;
    interp::TensorMap inputs;
    if (!inputsOfStep(options, fn, givenInputs, 0, inputs)) return false;
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
  if (!options.dumpOutputsFile.empty()) {
    std::error_code ec;
    llvm::ToolOutputFile out(options.dumpOutputsFile, ec, llvm::sys::fs::OF_None);
    if (ec) {
      llvm::WithColor::error(llvm::errs(), "meshc")
          << "cannot open '" << options.dumpOutputsFile << "': " << ec.message() << "\n";
      return false;
    }
    out.os() << dump;
    out.keep();
  }
  return true;
}

} // namespace meshc
