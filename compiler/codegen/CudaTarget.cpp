// The CPU and CUDA targets of the emitter (codegen/Target.h).
#include "codegen/CudaEmitter.h"
#include "codegen/Target.h"

#include <fmt/format.h>

namespace meshc::codegen {
namespace {

void replaceAll(std::string& text, const std::string& from, const std::string& to) {
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size()))
    text.replace(at, from.size(), to);
}

class CpuTarget : public Target {
public:
  std::string contiguousLoop(const std::string& resultVar, const std::vector<std::string>&,
                             const std::string& body) const override {
    return fmt::format("for (size_t i = 0; i < {}.size(); ++i) {{\n{}}}\n", resultVar, body);
  }
  std::string stridedLoop(size_t n, const std::string& sizes,
                          const std::vector<std::string>& strideLists,
                          const std::vector<std::string>&, const std::string& body) const override {
    return fmt::format("meshc::gen::forEach<{0}>({1}, {{{{{2}}}}}, {{}}, [&](const "
                       "std::array<int64_t, {0}>& at) {{\n{3}}});\n",
                       n, sizes, fmt::join(strideLists, ", "), body);
  }
  bool einsumPlans() const override { return true; }
  std::string prologue() const override { return ""; }
  void finish(CppOutput&) const override {}
};

class CudaTarget : public Target {
public:
  explicit CudaTarget(std::string math) : math_(std::move(math)) {}

  /// The device lambda's captures: every buffer as a device span, by value.
  static std::string captures(const std::vector<std::string>& views) {
    std::string text = "=";
    for (const std::string& view : views)
      text += fmt::format(", {0} = meshc::gen::view({0})", view);
    return text;
  }
  std::string contiguousLoop(const std::string& resultVar, const std::vector<std::string>& views,
                             const std::string& body) const override {
    return fmt::format(
        "meshc::gen::forEachIndex({}.size(), [{}] __device__(int64_t i) {{\n{}}});\n", resultVar,
        captures(views), body);
  }
  std::string stridedLoop(size_t n, const std::string& sizes,
                          const std::vector<std::string>& strideLists,
                          const std::vector<std::string>& views,
                          const std::string& body) const override {
    return fmt::format("meshc::gen::forEach<{0}>({1}, {{{{{2}}}}}, {{}}, [{3}] __device__(const "
                       "std::array<int64_t, {0}>& at) {{\n{4}}});\n",
                       n, sizes, fmt::join(strideLists, ", "), captures(views), body);
  }
  bool einsumPlans() const override { return false; }
  std::string prologue() const override {
    const char* mode = math_ == "tf32" ? "TF32" : math_ == "bf16" ? "BF16" : "FP32";
    return fmt::format("meshc::cuda::Scope cudaScope(world_, meshc::cuda::MathMode::{});\n", mode);
  }
  void finish(CppOutput& output) const override {
    for (std::string* text : {&output.header, &output.source}) {
      replaceAll(*text, "meshc/GeneratedSupport.h", "meshc/CudaSupport.h");
      replaceAll(*text, "SPMD C++ over meshrt", "SPMD CUDA over meshrt (meshrt_cuda, NCCL)");
      replaceAll(*text, "meshc::gen::", "meshc::cuda::");
      // Random fills run on the host and are copied to the device (same values as the CPU).
      for (const char* fill : {"fillParam(", "fillRandomNormal(", "fillRandomUniform("})
        replaceAll(*text, std::string("meshrt::kernels::") + fill,
                   std::string("meshc::cuda::") + fill);
    }
    if (!output.runner.empty()) {
      // The runner launches through meshrt::launch (threads | MPI); on GPUs, meshrt::nccl's.
      replaceAll(output.runner, "#include \"meshrt/Launch.h\"", "#include \"meshrt/Nccl.h\"");
      replaceAll(
          output.runner,
          "meshrt::LaunchOptions launchOptions = meshrt::LaunchOptions::fromArgs(argc, argv);",
          "meshrt::nccl::NcclOptions launchOptions;");
      replaceAll(output.runner, "meshrt::launch(", "meshrt::nccl::launch(");
      replaceAll(
          output.runner,
          "The backend is chosen at run time: threads, or MPI under mpirun (meshrt/Launch.h)",
          "It runs on the nccl backend, one GPU per rank (meshrt/Nccl.h)");
      replaceAll(output.runner, "[--backend threads|mpi] ", "");
    }
  }

private:
  std::string math_;
};

} // namespace

std::unique_ptr<Target> makeCpuTarget() {
  return std::make_unique<CpuTarget>();
}

bool isCudaMathMode(const std::string& math) {
  return math == "fp32" || math == "tf32" || math == "bf16";
}

llvm::Expected<CppOutput> emitCuda(const ir::Module& module,
                                   const std::vector<plan::PlannedFunction>& plans,
                                   const CudaOptions& options) {
  if (!isCudaMathMode(options.math))
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   "unknown CUDA math mode '%s' (fp32, tf32 or bf16)",
                                   options.math.c_str());
  CudaTarget target(options.math);
  return emitWithTarget(module, plans, options.cpp, target);
}

} // namespace meshc::codegen
