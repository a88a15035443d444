// One compilation for the unit tests: .mesh text or a file through the loader and sema, with the
// diagnostics captured as text and the module (empty when either failed). Each test file derives
// its own accessors (the train block, a function by name).
#pragma once

#include "diag/Diagnostics.h"
#include "frontend/SourceLoader.h"
#include "sema/Sema.h"

#include <llvm/Support/SourceMgr.h>
#include <llvm/Support/raw_ostream.h>

#include <optional>
#include <string>

namespace meshc::testing {

struct CompiledSource {
  llvm::SourceMgr sources;
  std::string errors;
  llvm::raw_string_ostream errorStream{errors};
  DiagEngine diag{sources, errorStream};
  std::optional<ir::Module> module;

  /// `text` compiled as if it were the file `name`.
  CompiledSource(llvm::StringRef text, const SemaOptions& options = {},
                 const char* name = "t.mesh") {
    if (std::optional<SourceSet> set = loadSourcesFromBuffer(text, name, diag))
      module = analyze(*set, diag, options);
    errorStream.flush();
  }
  /// The file at `path` (and what it imports).
  CompiledSource(const std::string& path, const SemaOptions& options) {
    if (std::optional<SourceSet> set = loadSources(path, diag))
      module = analyze(*set, diag, options);
    errorStream.flush();
  }
};

} // namespace meshc::testing
