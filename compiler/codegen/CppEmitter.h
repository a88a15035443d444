// C++ code generation: turns the SPMD IR of every planned function into one header and one
// source defining a class per program / train block. The class's constructor takes the rank's
// meshrt::Communicator (and a seed), creates the subgroups it needs and initializes this rank's
// parameter shards with the layout-invariant RNG; run() computes on local shards through
// compiler/codegen/support/meshc/GeneratedSupport.h (einsum through OpenBLAS), its temporaries in
// one arena per object at offsets assigned here by liveness. Optionally also a runner main that
// runs every function on the threads backend and writes the gathered outputs.
#pragma once

#include "ir/IR.h"
#include "planner/PlanReport.h"

#include <llvm/Support/Error.h>

#include <string>
#include <vector>

namespace meshc::codegen {

struct CppOptions {
  /// How the source includes the header (its file name, e.g. "mlp.h").
  std::string headerInclude = "generated.h";
  /// The C++ namespace of the generated classes.
  std::string cppNamespace = "meshc_generated";
  /// Also emit a runner main (CppOutput::runner).
  bool runner = false;
};

struct CppOutput {
  std::string header;
  std::string source;
  std::string runner; // empty unless CppOptions::runner
};

/// Emits the classes of every planned function of `module`, formatted by clang-format (LLVM
/// style). Fails (with a message naming the op and its .mesh location) on an op the generator
/// does not support.
llvm::Expected<CppOutput> emitCpp(const ir::Module& module,
                                  const std::vector<plan::PlannedFunction>& plans,
                                  const CppOptions& options);

} // namespace meshc::codegen
