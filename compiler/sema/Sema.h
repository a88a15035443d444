// Semantic analysis: resolves names, checks dims, shapes, dtypes and layouts, inlines defs
// (each call site owning its parameters) and lowers the program to the named-dim IR.
#pragma once

#include "diag/Diagnostics.h"
#include "frontend/SourceLoader.h"
#include "ir/IR.h"

#include <optional>

namespace meshc {

/// Checks every file of `sources` and lowers every program and train block of them to IR.
/// Reports as many errors as it can find; returns nullopt if there was any.
std::optional<ir::Module> analyze(const SourceSet& sources, DiagEngine& diag);

} // namespace meshc
