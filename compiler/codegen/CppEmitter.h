// C++ code generation: lowers every planned function to kernel IR (codegen/Lower.h) and prints
// one header and one source defining a class per program / train block. The class's constructor
// takes the rank's meshrt::Communicator (and a seed), creates the subgroups it needs, initializes
// this rank's parameter shards with the layout-invariant RNG and computes the values the
// hoist-invariants pass moved out of run(); run() is the printed kernel IR: fused loops over
// compile-time extents, GEMMs, meshrt's kernels (compiler/codegen/support/meshc/
// GeneratedSupport.h) and collectives, its temporaries in one arena per object at offsets the
// plan-buffers pass assigned. Optionally also a runner main that runs every function through
// meshrt::launch and writes the gathered outputs.
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
  /// Kernel passes to skip (codegen/Lower.h), to measure what each gives.
  std::vector<std::string> disabledPasses;
  /// Into how many source files to split the definitions (1: one), so that a build compiles
  /// them in parallel. The first is CppOutput::source, the others CppOutput::moreSources; with
  /// more than one, each includes the parts' header (CppOutput::partsHeader, included as
  /// `partsHeaderInclude`), which declares what they share. Only as many parts as the code's
  /// size pays for are used (kMinPartBytes each, the fixed cost of a translation unit): the rest
  /// are files with a comment only, so that the set of files is known before the code is.
  size_t sourceParts = 1;
  std::string partsHeaderInclude = "generated.parts.h";
};

/// The least source text a part of a split source holds (CppOptions::sourceParts): below it,
/// a part's own compile costs more than it takes off the others' (bench/README.md, "Build time
/// of the generated code").
constexpr size_t kMinPartBytes = 64 * 1024;

struct CppOutput {
  std::string header;
  std::string source;
  std::string runner; // empty unless CppOptions::runner
  /// With CppOptions::sourceParts > 1: the parts after the first (sourceParts - 1 files) and
  /// the header they share.
  std::vector<std::string> moreSources;
  std::string partsHeader;
};

/// Emits the classes of every planned function of `module`, formatted by clang-format (LLVM
/// style). Fails (with a message naming the op and its .mesh location) on an op the generator
/// does not support.
llvm::Expected<CppOutput> emitCpp(const ir::Module& module,
                                  const std::vector<plan::PlannedFunction>& plans,
                                  const CppOptions& options);

} // namespace meshc::codegen
