// The user-kernel check: reads the C++ header named by an `extern def` with Clang (libtooling,
// AST matchers) and checks that a function of that name is declared at global scope with the
// declared arity and float/double parameters and result. Mismatches are reported at the .mesh
// declaration with a note at the C++ declaration (the header is added to the SourceMgr so the
// note shows its line and a caret). Kept in this one translation unit: Clang's headers are slow
// to compile.
#pragma once

#include "diag/Diagnostics.h"
#include "sema/Sema.h"

#include <string>

namespace meshc::kernels {

struct KernelCheckOptions {
  /// Clang's resource directory (its builtin headers), recorded when meshc was configured.
  std::string resourceDir;
  /// Extra compiler arguments for reading headers (e.g. -I for the header's own includes).
  std::vector<std::string> extraArgs;
};

/// Checks one extern def against its header; reports through `diag` and returns false on any
/// mismatch or when the header cannot be read or does not compile.
bool checkExternFunction(const ExternFunction& fn, DiagEngine& diag,
                         const KernelCheckOptions& options);

} // namespace meshc::kernels
