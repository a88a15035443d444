// meshc --microbatches (Microbatches.h).
#include "driver/Microbatches.h"

#include "planner/Microbatching.h"

#include <fmt/format.h>
#include <llvm/ADT/STLExtras.h>
#include <llvm/ADT/StringExtras.h>

namespace meshc {
namespace {

bool fail(const std::string& message) {
  return optionError("--microbatches " + message);
}

/// "dim=count" with a positive count.
bool parseOption(llvm::StringRef text, std::string& dim, int64_t& count) {
  auto [left, right] = text.split('=');
  dim = left.trim().str();
  if (dim.empty() || right.trim().getAsInteger(10, count) || count <= 0)
    return fail(fmt::format("'{}' is not of the form dim=count (a positive count)", text.str()));
  return true;
}

/// The dim's size per device under the module's layout (the dim's size when the planner
/// chooses its axes: then only layouts whose split leaves K whole microbatches can be planned).
bool checkExtent(const ir::Module& module, const std::string& dim, int64_t count) {
  int64_t size = module.dims.at(dim), devices = 1;
  std::vector<std::string> axes;
  for (const ir::DimLayout& entry : module.layout)
    if (entry.dim == dim && !entry.isAuto) axes = entry.axes;
  for (const std::string& axis : axes)
    for (const ir::MeshAxis& meshAxis : module.mesh)
      if (meshAxis.name == axis) devices *= meshAxis.size;
  int64_t extent = size / devices;
  if (extent % count == 0) return true;
  return fail(fmt::format("{}={}: {} does not divide the extent of '{}' per device, {} ({} of "
                          "size {} split over {} device{})",
                          dim, count, count, dim, extent, dim, size, devices,
                          devices == 1 ? "" : "s"));
}

} // namespace

std::optional<PlannedModule> planMicrobatched(const ir::Module& module,
                                              const PipelineOptions& options, DiagEngine& diag,
                                              const char* argv0) {
  std::string dim;
  int64_t count = 0;
  if (!parseOption(options.microbatches, dim, count)) return std::nullopt;
  if (!module.dims.count(dim))
    return fail(fmt::format("{}={}: no dim named '{}'", dim, count, dim)), std::nullopt;

  // The train blocks are microbatched; the other selected functions are planned as they are.
  std::vector<std::string> trainBlocks, others;
  for (const ir::Function& fn : module.functions) {
    bool selected = options.functions.empty() || llvm::is_contained(options.functions, fn.name);
    if (!selected) continue;
    if (fn.kind != ir::Function::Kind::Train && !options.functions.empty())
      return fail(fmt::format("applies to train blocks, and '{}' is a program", fn.name)),
             std::nullopt;
    (fn.kind == ir::Function::Kind::Train ? trainBlocks : others).push_back(fn.name);
    if (fn.kind == ir::Function::Kind::Train &&
        llvm::none_of(fn.inputs,
                      [&](const ir::InputInfo& input) { return input.type.hasDim(dim); }))
      return fail(fmt::format("{}={}: no input of train block '{}' has the dim '{}'", dim, count,
                              fn.name, dim)),
             std::nullopt;
    for (const ir::ParamInfo& param : fn.params)
      if (fn.kind == ir::Function::Kind::Train && param.type.hasDim(dim))
        return fail(fmt::format("{}={}: param '{}' of train block '{}' has the dim '{}' (a "
                                "microbatch would hold a part of it)",
                                dim, count, param.path, fn.name, dim)),
               std::nullopt;
  }
  if (trainBlocks.empty())
    return fail("applies to train blocks, and none is selected"), std::nullopt;
  if (!checkExtent(module, dim, count)) return std::nullopt;

  PipelineOptions plain = options;
  plain.microbatches.clear();
  if (count == 1) return planModule(module, plain, diag, argv0);

  // The train blocks at one microbatch's size, through sema, training and planning.
  std::optional<ir::Module> microModule =
      loadMicrobatchModule(module, plain, trainBlocks, dim, count, diag, argv0);
  if (!microModule) return std::nullopt;
  PipelineOptions micro = plain;
  micro.functions = trainBlocks;
  std::optional<PlannedModule> planned = planModule(*microModule, micro, diag, argv0);
  if (!planned) return std::nullopt;
  for (plan::PlannedFunction& fn : planned->plans)
    if (llvm::Error error = plan::applyMicrobatching(fn.spmd, dim, count, planned->machine)) {
      optionError(llvm::toString(std::move(error)));
      return std::nullopt;
    }
  if (!others.empty()) {
    PipelineOptions rest = plain;
    rest.functions = others;
    rest.injectFault.clear(); // a fault goes into train blocks
    std::optional<PlannedModule> restPlanned = planModule(module, rest, diag, argv0);
    if (!restPlanned) return std::nullopt;
    for (plan::PlannedFunction& fn : restPlanned->plans)
      planned->plans.push_back(std::move(fn));
  }
  // Plans and the code module in the loaded module's order.
  std::vector<const ir::Function*> replacements;
  for (const std::string& name : trainBlocks)
    replacements.push_back(microModule->findFunction(name));
  ir::Module code = codeModuleWith(module, replacements);
  std::vector<plan::PlannedFunction> ordered;
  for (ir::Function& fn : code.functions)
    for (plan::PlannedFunction& plannedFn : planned->plans)
      if (plannedFn.spmd.name == fn.name) ordered.push_back(std::move(plannedFn));
  planned->plans = std::move(ordered);
  planned->codeModule = std::move(code);
  return planned;
}

std::optional<ir::Module> loadMicrobatchModule(const ir::Module& module,
                                               const PipelineOptions& options,
                                               const std::vector<std::string>& trainBlocks,
                                               const std::string& dim, int64_t count,
                                               DiagEngine& diag, const char* argv0,
                                               std::vector<size_t>* forwardOps) {
  PipelineOptions micro = options;
  micro.microbatches.clear();
  micro.dims.push_back(fmt::format("{}={}", dim, module.dims.at(dim) / count));
  micro.functions = trainBlocks;
  std::vector<std::string> files;
  std::optional<ir::Module> microModule = loadModule(micro, diag, argv0, files);
  if (!microModule || !lowerTraining(*microModule, diag, micro.verifyEach, forwardOps))
    return std::nullopt;
  return microModule;
}

ir::Module codeModuleWith(const ir::Module& module,
                          const std::vector<const ir::Function*>& replacements) {
  ir::Module code = module;
  for (ir::Function& fn : code.functions)
    for (const ir::Function* replacement : replacements)
      if (replacement && replacement->name == fn.name) fn = *replacement;
  return code;
}

} // namespace meshc
