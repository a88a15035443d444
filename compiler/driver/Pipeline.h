// The compiler's pipeline, stage by stage; the driver (Driver.cpp) and `meshc run`
// (RunCommand.cpp) both run it in-process from here:
//   1. loadModule: sources -> parse -> sema -> IR (or an .ir file read back)
//   2. lowerTraining: train blocks -> autodiff, optimizer, param updates
//   3. planModule: layouts, SPMD IR, collectives (planner/Planner.h)
//   4. writeGeneratedCode: kernel IR -> kernel passes -> C++ or CUDA (codegen/Lower.h)
//   5. interpretModule: the reference interpreter on every selected function
// Each reports its own errors (located diagnostics, or `meshc: error:` lines).
#pragma once

#include "diag/Diagnostics.h"
#include "ir/IR.h"
#include "planner/Machine.h"
#include "planner/Planner.h"

#include <llvm/Support/CommandLine.h>
#include <llvm/Support/raw_ostream.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace meshc {

/// What one compilation is given: meshc's command line, or `meshc run`'s.
/// What a train block's `--steps` train on: a fresh synthetic batch per step (seed + step), or
/// step 0's batch every step (overfitting one batch shows that training learns).
enum class BatchMode { Fresh, Fixed };

struct PipelineOptions {
  std::string input;             // a .mesh file, or an .ir file
  std::vector<std::string> dims; // "name=size" overrides of declared dims
  std::string mesh, layout;      // overrides ("": the program's own)
  std::string machine = "cpu";   // a built-in machine or a JSON file
  std::string memoryBudget;      // "": the machine's memory
  int64_t devices = 0;           // > 0: also choose the mesh's axis sizes for this many devices
  std::vector<std::string> functions; // only these programs and train blocks (empty: all)
  bool verifyEach = false;            // run the IR verifier after sema, training and planning
  std::string injectFault; // a deliberate bug in the plans (planner/InjectFault.h); "": none
  std::string zero;        // --zero: "1", "2" or "3" (ZeRO stage of train blocks); "": none
  std::vector<std::string> recompute; // defs whose activations train blocks recompute
  /// "DIM=K": without pipeline stages, every selected train block runs K microbatches of DIM per
  /// step and accumulates their gradients before one update (planModule, Microbatches.h;
  /// docs/training.md); with stages, the pipeline's microbatches (PlanPipeline.h; "DIM=auto"
  /// searches K). "": one microbatch.
  std::string microbatches;
  /// A train block of which no layout fits the memory budget alone is planned by the joint
  /// search of stages, recompute, microbatches and ZeRO (JointSearch.h); false inside it.
  bool jointSearch = true;
  /// Threads of the joint search: with more than 1, its stage splits are planned on worker
  /// threads while the combinations are (the plans are the same as with 1); 0: one per core.
  int64_t planJobs = 0;
  std::string pipelineSchedule = "1f1b"; // gpipe | 1f1b (PlanPipeline.h)
  /// Planning one pipeline stage's mesh: the stages whose meshes share the machine's devices
  /// (plan::Machine::meshCopies); 1 otherwise.
  int64_t stageCopies = 1;
  /// Where the layout search starts (plan::PlannerOptions::searchStart): set by the pipeline
  /// search for the plans of one stage, which are alike; no option sets it, and the plans do not
  /// depend on it.
  std::optional<plan::Layout> searchStart;
  /// plan::PlannerOptions::skipIdleBounds: set with searchStart by the pipeline search, whose
  /// inner plans' counts of layouts costed are not printed.
  bool skipIdleBounds = false;
  /// plan::PlannerOptions::boundTally: set with skipIdleBounds by the pipeline search, shared by
  /// the inner plans of its microbatch counts.
  std::shared_ptr<plan::BoundTally> boundTally;
  // The interpreter (interpretModule):
  uint64_t seed = 0;
  int64_t steps = 0;                  // > 0: train blocks take this many steps
  BatchMode batch = BatchMode::Fresh; // what --steps train on
  std::string inputsFile;             // tensors named <function>.<input>; the rest synthesized
  std::string dumpOutputsFile;        // "": no dump
  bool roundToDtype = true;           // false: floats stay in double (--interp-in-double)
};

/// `--batch=fresh|fixed`, the option of `meshc --emit=run` and `meshc run`: what `--steps` trains
/// on. The values, for both options' declarations.
llvm::cl::ValuesClass batchModeValues();

/// What a train block's --steps train on, said before the first step; `givenInputs`: some of its
/// inputs come from a data file.
std::string batchModeLine(const PipelineOptions& options, bool givenInputs);

/// "16GiB", "80 GB", "1.5e9", "1048576": bytes (K/M/G/T decimal, Ki/Mi/Gi/Ti binary); an
/// option error for anything else (false).
bool parseByteSize(llvm::StringRef text, double& bytes);

/// `meshc: error: <message>` for a bad option value; returns false.
bool optionError(const std::string& message);
/// --mesh's text ("data=2,model=4") as axes; nullopt when an item is not name=size with a
/// positive size, or there is none (reported as an option error when `report`).
std::optional<std::vector<ir::MeshAxis>> parseMeshOption(const std::string& text,
                                                         bool report = true);

/// 1. The sources loaded, parsed, checked and lowered to IR, or IR text read back (`.ir` files,
/// as --emit=ir prints them). `inputFiles` gets every file read (for -MD). With `printAst`,
/// prints the main file's syntax tree there instead and returns an empty module.
std::optional<ir::Module> loadModule(const PipelineOptions& options, DiagEngine& diag,
                                     const char* argv0, std::vector<std::string>& inputFiles,
                                     llvm::raw_ostream* printAst = nullptr);

/// 2. The training phase (autodiff, optimizer, param updates) on every train block; with
/// `verify`, the IR verifier after it. `forwardOps` (when given): per function, its op count
/// before the phase (SIZE_MAX: left as it was), for train::applyRecompute.
bool lowerTraining(ir::Module& module, DiagEngine& diag, bool verify = false,
                   std::vector<size_t>* forwardOps = nullptr);

/// 3. Every selected function planned for the machine. With --microbatches, the train blocks
/// are loaded again (`argv0` as for loadModule) with the dim at its microbatch size, trained and
/// planned so; `codeModule` is then the module the code is generated from (those train blocks,
/// the other functions as loaded), while the interpreter keeps running the loaded one.
struct PlannedModule {
  plan::Machine machine;
  std::vector<plan::PlannedFunction> plans;
  std::optional<ir::Module> codeModule;
  const ir::Module& codeModuleOr(const ir::Module& loaded) const {
    return codeModule ? *codeModule : loaded;
  }
};
std::optional<PlannedModule> planModule(const ir::Module& module, const PipelineOptions& options,
                                        DiagEngine& diag, const char* argv0 = nullptr);

/// What planModule does to its plans last: --inject-fault, then --verify-each's check of the
/// SPMD IR. False after reporting an error.
bool finishPlans(std::vector<plan::PlannedFunction>& plans, const PipelineOptions& options);

/// 4. The generated code: <base>.h and <base>.cpp or .cu (with the runner, <base>.main.cpp or
/// .main.cu), each written only when all were generated; base "-": to `os`, one after another.
struct GenerateOptions {
  std::string base = "-";
  bool runner = false;
  bool cuda = false;
  std::string cudaMath = "fp32";
  std::vector<std::string> disabledPasses;
  /// C++ only: the source split into this many files (codegen::CppOptions::sourceParts):
  /// <base>.cpp, <base>.part2.cpp ... <base>.part<N>.cpp and their header <base>.parts.h.
  size_t sourceParts = 1;
};
/// The source files (and the parts' header) writeGeneratedCode writes for `base` split into
/// `parts` parts, as GenerateOptions::sourceParts names them; <base>.cpp first.
std::vector<std::string> sourcePartPaths(const std::string& base, size_t parts);
std::string partsHeaderPath(const std::string& base);
/// Whether every name of --disable-kernel-pass (meshc's, or meshc run's) is a kernel pass; an
/// option error listing the passes for the first that is not.
bool checkKernelPasses(const std::vector<std::string>& disabledPasses);
/// kExitOk; kExitInputError when the code generator refuses the program; kExitInternalError
/// when a file cannot be written.
int writeGeneratedCode(const ir::Module& module, const PlannedModule& planned,
                       const GenerateOptions& options, llvm::raw_ostream& os);

/// 5. Every selected function run by the reference interpreter on synthesized (or given) inputs
/// and summarized on `os`; train blocks take `steps` steps when it is > 0.
bool interpretModule(const ir::Module& module, const PipelineOptions& options,
                     llvm::raw_ostream& os, const char* argv0);

} // namespace meshc
