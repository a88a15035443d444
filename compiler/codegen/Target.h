// The code generation targets: where the printed C++ (CPU) and CUDA differ. Both print the same
// kernel IR (KernelIR.h) through the shared statement printer (KernelPrinter.h); a target prints
// what only it knows how to run (loop nests, GEMMs) and names its support namespace, which the
// generated code reaches through the alias `support` (meshc::gen or meshc::cuda).
#pragma once

#include "codegen/CppEmitter.h"
#include "codegen/KernelIR.h"

#include <memory>
#include <string>

namespace meshc::codegen {

class FileScope;

class Target {
public:
  virtual ~Target() = default;
  /// The support namespace the alias `support` names.
  virtual const char* supportNamespace() const = 0;
  /// The header defining it.
  virtual const char* supportHeader() const = 0;
  /// What the files hold, for their first comment ("SPMD C++ over meshrt").
  virtual const char* description() const = 0;
  /// A fused loop nest, as a block of statements; `invariants` declares the loop's invariant
  /// values (`inv0`, `inv1`, ...) and goes first in the block. The target may define the nest
  /// as a function of `file` and call it.
  virtual std::string loop(const kir::Loop& loop, const kir::KernelFunction& fn,
                           const std::string& invariants, FileScope& file) const = 0;
  /// A GEMM; the target may keep its plan in `file`.
  virtual std::string gemm(const kir::Gemm& gemm, const kir::KernelFunction& fn,
                           FileScope& file) const = 0;
  /// The first statement of every generated constructor body and run() ("" for none).
  virtual std::string prologue() const = 0;

  // The runner main.
  virtual const char* launchInclude() const = 0;
  /// Declares `launchOptions` from argc/argv.
  virtual const char* launchOptions() const = 0;
  virtual const char* launchFunction() const = 0;
  /// The backend note of the runner's first comment, and the usage's backend option.
  virtual const char* backendNote() const = 0;
  virtual const char* backendUsage() const = 0;
};

std::unique_ptr<Target> makeCpuTarget();

/// The emitter with an explicit target (emitCpp uses the CPU target).
llvm::Expected<CppOutput> emitWithTarget(const ir::Module& module,
                                         const std::vector<plan::PlannedFunction>& plans,
                                         const CppOptions& options, const Target& target);

} // namespace meshc::codegen
