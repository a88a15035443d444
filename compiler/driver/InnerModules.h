// The modules of the stage splits' inner plans (PlanPipeline.h), loaded once: a plan of one or
// two layers is made at every microbatch count of every split, with and without recomputation
// (168 plans for the GPT-3-shaped train block), and loading each (parse, sema, autodiff) cost
// more than its module's copy. What another load would make is derived instead, exactly:
//  - on another mesh: sema reads the mesh only to check the layout's axes (none named here, a
//    condition of the derivation) and to set the module's axes, which the copy takes;
//  - with recomputation: the same module without it with the calls marked and the activations
//    recomputed (train::applyRecompute).
#pragma once

#include "driver/Pipeline.h"

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace meshc {

/// A loaded and trained module, with its functions' op counts before training
/// (lowerTraining's: what train::applyRecompute needs).
struct InnerModule {
  std::shared_ptr<const ir::Module> module;
  std::vector<size_t> forwardOps;
};

/// The modules loaded or derived so far, by every option loading reads but the mesh.
struct InnerModules {
  std::map<std::string, InnerModule> byOptions;
};

/// Whether modules loaded with `options` may be derived from one another (moveToMesh,
/// train::applyRecompute): not from an IR file (it keeps its own mesh, and sema, which marks
/// recomputed calls, does not read it), nor under --verify-each (which verifies what it loads).
bool modulesDerivable(const PipelineOptions& options);

/// `module`, loaded on another mesh, as loading it on `meshOption` (--mesh's text) makes it;
/// false (then load it) when its layout names an axis, or sema would report the mesh.
bool moveToMesh(ir::Module& module, const std::string& meshOption);

/// The module of `options` (one function: innerOptions' of PlanPipeline.cpp), loaded and
/// trained, or derived from one in `known` (when given) as loading it would make it; kept in
/// `known`. Nullopt after an error reported through `diag`.
std::optional<InnerModule> innerModule(const PipelineOptions& options, InnerModules* known,
                                       DiagEngine& diag, const char* argv0);

} // namespace meshc
