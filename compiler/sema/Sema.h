// Semantic analysis: resolves names, checks dims, shapes, dtypes and layouts, inlines defs
// (each call site owning its parameters) and lowers the program to the named-dim IR.
#pragma once

#include "diag/Diagnostics.h"
#include "frontend/SourceLoader.h"
#include "ir/IR.h"

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace meshc {

/// An `extern def` as sema hands it to the user-kernel checker (the driver's, built on Clang).
struct ExternFunction {
  std::string name;
  size_t arity = 0;
  std::string header;     // as written in the declaration (for messages)
  std::string headerPath; // resolved against the declaring file's directory
  llvm::SMLoc nameLoc, headerLoc;
};

/// Command-line overrides (meshc --dim, --mesh, --layout) applied to the sources' declarations.
struct SemaOptions {
  /// New sizes of declared dims; naming an undeclared dim is an error.
  std::map<std::string, int64_t> dimSizes;
  /// Replaces the mesh's axes (the mesh keeps its declared name, or is called "mesh").
  std::optional<std::vector<ir::MeshAxis>> mesh;
  /// Replaces every layout declaration: the items of a layout statement separated by ',' or
  /// ';', e.g. "batch: data; heads: [data, model]; auto". Its errors point into this text.
  std::optional<std::string> layout;
  /// Defs whose calls in train blocks recompute their activations in backward, as if declared
  /// `recompute def` (meshc --recompute); naming no def, or one no train block calls, is an error.
  std::vector<std::string> recompute;
  /// Checks each `extern def` against its C++ header, reporting through the DiagEngine; returns
  /// false when it does not match. Unset: extern defs are taken on trust (unit tests).
  std::function<bool(const ExternFunction&, DiagEngine&)> checkExtern = nullptr;
};

/// Checks every file of `sources` and lowers every program and train block of them to IR.
/// Reports as many errors as it can find; returns nullopt if there was any.
std::optional<ir::Module> analyze(const SourceSet& sources, DiagEngine& diag,
                                  const SemaOptions& options = {});

} // namespace meshc
