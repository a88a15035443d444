// The CUDA target of the emitter (codegen/CudaEmitter.h) on the MLP example: the retargeted
// text (device support names, fused groups as __device__ lambdas, einsum through cuBLAS, the
// context prologue, the NCCL runner), the precision mode, and the train block (backward and
// optimizer updates on the device, the host param API and checkpoints through host copies).
#include "codegen/CudaEmitter.h"
#include "planner/Planner.h"
#include "sema/Sema.h"
#include "train/Optimizer.h"

#include <catch2/catch.hpp>

#include <regex>

using namespace meshc;

namespace {

struct Planned {
  llvm::SourceMgr sources;
  std::string errors;
  llvm::raw_string_ostream errorStream{errors};
  DiagEngine diag{sources, errorStream};
  std::optional<ir::Module> module;
  std::optional<std::vector<plan::PlannedFunction>> plans;

  explicit Planned(const std::string& example) {
    std::optional<SourceSet> set =
        loadSources(std::string(MESHC_SOURCE_DIR) + "/dsl-examples/" + example, diag);
    if (set) module = analyze(*set, diag);
    REQUIRE(module);
    // The training phase, as the driver runs it: train blocks get backward and updates.
    for (ir::Function& function : module->functions)
      REQUIRE(train::lowerTraining(function, diag));
    plans = plan::planModule(*module, plan::PlannerOptions{}, diag);
    REQUIRE(plans);
  }
};

/// Whether `result` holds a value (else fails with its error).
template <class T> bool succeeded(llvm::Expected<T>& result) {
  if (!result) FAIL(llvm::toString(result.takeError()));
  return true;
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1))
    ++n;
  return n;
}

/// The loop nests of C++ source: the inline ones (each starts with its scalar s0) and the calls
/// of the nests the file defines once as functions (`loop3(...)`; FileScope, KernelPrinter.h).
size_t cpuLoopNests(const std::string& source) {
  size_t functions = count(source, "static void loop");
  size_t calls = 0;
  static const std::regex call(R"((^|[^\w])loop\d+\()");
  for (auto it = std::sregex_iterator(source.begin(), source.end(), call);
       it != std::sregex_iterator(); ++it)
    ++calls;
  return count(source, "const float s0 = ") - functions + (calls - functions);
}

} // namespace

TEST_CASE("the CUDA target retargets the one emitter's output", "[cuda][codegen]") {
  Planned mlp("mlp.mesh");
  codegen::CudaOptions options;
  options.cpp.headerInclude = "mlp.h";
  options.cpp.runner = true;
  llvm::Expected<codegen::CppOutput> cuda = codegen::emitCuda(*mlp.module, *mlp.plans, options);
  REQUIRE(succeeded(cuda));
  llvm::Expected<codegen::CppOutput> cpu = codegen::emitCpp(*mlp.module, *mlp.plans, options.cpp);
  REQUIRE(succeeded(cpu));

  // The generated code names its support through the alias `support`: the device support
  // header and namespace here, no CPU support name; the NCCL runner.
  for (const std::string* text : {&cuda->header, &cuda->source})
    REQUIRE(count(*text, "meshc::gen") == 0);
  REQUIRE(count(cuda->header, "#include \"meshc/CudaSupport.h\"") == 1);
  REQUIRE(count(cuda->header, "namespace support = meshc::cuda;") == 1);
  REQUIRE(count(cpu->header, "namespace support = meshc::gen;") == 1);
  REQUIRE(count(cuda->header, "support::Buffer param") ==
          count(cpu->header, "support::Buffer param"));
  REQUIRE(count(cuda->runner, "meshrt::nccl::launch(") == 2);
  REQUIRE(count(cuda->runner, "meshrt::launch(") == 0);
  REQUIRE(count(cuda->runner, "meshrt::LaunchOptions") == 0);
  // The launch (all ranks in this process, or one process per GPU under mpirun) is read from
  // the command line and the environment.
  REQUIRE(count(cuda->runner, "meshrt::nccl::NcclOptions::fromArgs(argc, argv)") == 1);
  REQUIRE(count(cuda->runner, "--launch threads|mpi") >= 1);
  // The host param API and checkpoints on both targets, over the target's shards.
  for (const char* api : {"paramShards()", "getParam(", "setParam(", "void save(", "void load("})
    REQUIRE(count(cuda->header, api) == count(cpu->header, api));
  REQUIRE(count(cuda->source, "support::saveParams(") == mlp.plans->size());
  REQUIRE(count(cuda->source, "std::vector<support::ParamShard>") == mlp.plans->size());

  // Every loop nest of the kernel IR is one device lambda (each starts with its scalar s0);
  // f32 einsums go to cuBLAS (einsum2).
  size_t cpuLoops = cpuLoopNests(cpu->source);
  REQUIRE(cpuLoops > 0);
  REQUIRE(count(cuda->source, "const float s0 = ") == cpuLoops);
  REQUIRE(count(cuda->source, "__device__(int64_t i)") == cpuLoops);
  REQUIRE(count(cuda->source, "support::einsum2(") == count(cpu->source, ".plan().run("));
  REQUIRE(count(cuda->source, "meshrt::kernels::EinsumPlan") == 0);
  REQUIRE(count(cuda->source, "SharedEinsum") == 0);
  // The parameters' init runs through the target's initParams (on CUDA: host fills, then device).
  REQUIRE(count(cpu->source, "support::initParams(") == mlp.plans->size());
  REQUIRE(count(cuda->source, "support::initParams(") == mlp.plans->size());
  // One context prologue per constructor and per run(), in the default precision.
  REQUIRE(
      count(cuda->source, "meshc::cuda::Scope cudaScope(world_, meshc::cuda::MathMode::FP32)") ==
      2 * mlp.plans->size());

  options.math = "bf16";
  llvm::Expected<codegen::CppOutput> bf16 = codegen::emitCuda(*mlp.module, *mlp.plans, options);
  REQUIRE(succeeded(bf16));
  REQUIRE(count(bf16->source, "MathMode::BF16") == 2 * mlp.plans->size());

  options.math = "fp8";
  llvm::Expected<codegen::CppOutput> bad = codegen::emitCuda(*mlp.module, *mlp.plans, options);
  REQUIRE(!static_cast<bool>(bad));
  REQUIRE(llvm::toString(bad.takeError()).find("unknown CUDA math mode 'fp8'") !=
          std::string::npos);
}

TEST_CASE("the CUDA target emits train blocks: backward, updates and step() on the device",
          "[cuda][codegen]") {
  Planned mlp("mlp.mesh");
  const ir::Function* train = nullptr;
  for (const ir::Function& function : mlp.module->functions)
    if (function.kind == ir::Function::Kind::Train) train = &function;
  REQUIRE(train);
  REQUIRE(!train->updates.empty());
  codegen::CudaOptions options;
  llvm::Expected<codegen::CppOutput> cuda = codegen::emitCuda(*mlp.module, *mlp.plans, options);
  REQUIRE(succeeded(cuda));
  llvm::Expected<codegen::CppOutput> cpu = codegen::emitCpp(*mlp.module, *mlp.plans, options.cpp);
  REQUIRE(succeeded(cpu));
  REQUIRE(count(cuda->header, "float step(const Inputs &inputs);") == 1);
  // Updates not computed in place are device copies (never a host std::copy of device memory).
  REQUIRE(count(cuda->source, "support::copyValues(") ==
          count(cpu->source, "support::copyValues("));
  REQUIRE(count(cuda->source, "std::copy(") == count(cpu->source, "std::copy("));
  REQUIRE(count(cuda->source, "++step_;") == 1);
  // The backward's fused loops are device lambdas too.
  size_t cpuLoops = cpuLoopNests(cpu->source);
  REQUIRE(count(cuda->source, "__device__(int64_t i)") == cpuLoops);
}
