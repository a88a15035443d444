// Loads a .mesh file and, transitively, the files it imports, into the SourceMgr.
#pragma once

#include "diag/Diagnostics.h"
#include "frontend/AST.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace meshc {

/// The parsed files of one compilation: every import before its importer, the main file last.
/// Each file appears once even when imported several times.
struct SourceSet {
  std::vector<std::unique_ptr<ast::File>> files;
  const ast::File& mainFile() const { return *files.back(); }
};

/// Reads `mainPath` and its imports (paths relative to the importing file). Missing files and
/// import cycles are reported at the import declaration. Returns nullopt when any file could not
/// be read or parsed without errors.
std::optional<SourceSet> loadSources(const std::string& mainPath, DiagEngine& diag);

/// The same for a main file already in memory (tests, fuzzing); imports resolve against `dir`.
std::optional<SourceSet> loadSourcesFromBuffer(llvm::StringRef text, llvm::StringRef name,
                                               DiagEngine& diag);

} // namespace meshc
