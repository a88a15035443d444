// The stage splits' inner modules, loaded once (InnerModules.h).
#include "driver/InnerModules.h"

#include "train/Recompute.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <llvm/ADT/STLExtras.h>
#include <llvm/ADT/StringRef.h>

#include <cstdint>
#include <set>

namespace meshc {
namespace {

/// Every option loadModule and lowerTraining read but the mesh.
std::string moduleKey(const PipelineOptions& options) {
  return fmt::format("{}\n{}\n{}\n{}\n{}", options.input, options.layout,
                     fmt::join(options.dims, ","), fmt::join(options.recompute, ","),
                     fmt::join(options.functions, ","));
}

/// A copy of `from` on `options`' mesh, with `defs` recomputed when given; nullopt when it
/// cannot be derived.
std::optional<InnerModule> derive(const InnerModule& from, const PipelineOptions& options,
                                  const std::vector<std::string>& defs) {
  InnerModule derived{nullptr, from.forwardOps};
  ir::Module module = *from.module;
  if (!moveToMesh(module, options.mesh)) return std::nullopt;
  if (!defs.empty() && !train::applyRecompute(module, defs, from.forwardOps)) return std::nullopt;
  derived.module = std::make_shared<const ir::Module>(std::move(module));
  return derived;
}

} // namespace

bool modulesDerivable(const PipelineOptions& options) {
  return !options.verifyEach && !llvm::StringRef(options.input).endswith(".ir");
}

bool moveToMesh(ir::Module& module, const std::string& meshOption) {
  // Sema checks a layout entry's axes against the mesh (known, not twice, their product
  // dividing the dim); an entry naming none (auto, or []) it checks against nothing of it.
  if (llvm::any_of(module.layout, [](const ir::DimLayout& entry) { return !entry.axes.empty(); }))
    return false;
  // The mesh as semaOptions parses --mesh, and sema's checks of it (ModuleLowerer::
  // applyOptions): no axis twice, at most 2^31 devices.
  std::optional<std::vector<ir::MeshAxis>> axes = parseMeshOption(meshOption, /*report=*/false);
  if (!axes) return false;
  std::set<std::string> names;
  int64_t devices = 1;
  for (const ir::MeshAxis& axis : *axes)
    if (!names.insert(axis.name).second || __builtin_mul_overflow(devices, axis.size, &devices) ||
        devices > (int64_t(1) << 31))
      return false;
  if (module.meshName.empty()) return false;
  module.mesh = std::move(*axes);
  return true;
}

std::optional<InnerModule> innerModule(const PipelineOptions& options, InnerModules* known,
                                       DiagEngine& diag, const char* argv0) {
  std::string key = known ? moduleKey(options) : "";
  bool derivable = known && modulesDerivable(options);
  if (derivable) {
    if (auto same = known->byOptions.find(key); same != known->byOptions.end())
      if (std::optional<InnerModule> derived = derive(same->second, options, {})) return derived;
    if (!options.recompute.empty()) {
      PipelineOptions plainOptions = options;
      plainOptions.recompute.clear();
      if (auto plain = known->byOptions.find(moduleKey(plainOptions));
          plain != known->byOptions.end())
        if (std::optional<InnerModule> derived =
                derive(plain->second, options, options.recompute)) {
          known->byOptions.try_emplace(key, *derived);
          return derived;
        }
    }
  }
  std::vector<std::string> files;
  std::optional<ir::Module> module = loadModule(options, diag, argv0, files);
  InnerModule loaded;
  if (!module || !lowerTraining(*module, diag, options.verifyEach, &loaded.forwardOps))
    return std::nullopt;
  loaded.module = std::make_shared<const ir::Module>(std::move(*module));
  if (derivable) known->byOptions.try_emplace(key, loaded);
  return loaded;
}

} // namespace meshc
