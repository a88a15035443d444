// The CUDA target (Target.h, CudaEmitter.h): loop nests as one `__device__` lambda launched over
// every point (meshc::cuda::forEachIndex), GEMMs through cuBLAS (meshc::cuda::einsum2), the
// runner on the nccl backend, one GPU per rank (in one process, or one process per GPU under
// mpirun).
#include "codegen/CudaEmitter.h"
#include "codegen/KernelPrinter.h"
#include "codegen/Target.h"

#include <fmt/format.h>
#include <llvm/ADT/STLExtras.h>

namespace meshc::codegen {
namespace {

class CudaTarget : public Target {
public:
  explicit CudaTarget(std::string math) : math_(std::move(math)) {}

  const char* supportNamespace() const override { return "meshc::cuda"; }
  const char* supportHeader() const override { return "meshc/CudaSupport.h"; }
  const char* description() const override { return "SPMD CUDA over meshrt (meshrt_cuda, NCCL)"; }

  std::string loop(const kir::Loop& loop, const kir::KernelFunction& fn,
                   const std::string& invariants, FileScope&) const override {
    CollapsedLoop collapsed = collapseLoop(loop);
    // The lambda captures every buffer as a device span, by value.
    std::vector<kir::BufferId> buffers;
    for (const kir::Store& store : loop.stores)
      if (!llvm::is_contained(buffers, store.at.buffer)) buffers.push_back(store.at.buffer);
    for (const kir::Access& read : loop.reads)
      if (!llvm::is_contained(buffers, read.buffer)) buffers.push_back(read.buffer);
    std::string captures = "=";
    for (kir::BufferId id : buffers)
      captures += fmt::format(", {0} = support::view({0})", fn.buffers[size_t(id)].name);
    std::string out = "{\n" + invariants + stepDeclaration(loop);
    out += fmt::format("support::forEachIndex({}, [{}] __device__(int64_t i) {{\n",
                       kir::pointCount(collapsed.extents), captures);
    // The point's index per collapsed dim, innermost fastest.
    std::string rest = "i";
    for (size_t d = collapsed.extents.size(); d-- > 0;) {
      if (d == 0) {
        out += fmt::format("const int64_t i0 = {};\n", rest);
        break;
      }
      out += fmt::format("const int64_t i{0} = {1} % {2};\nconst int64_t rest{0} = {1} / {2};\n", d,
                         rest, collapsed.extents[d]);
      rest = fmt::format("rest{}", d);
    }
    // A keep mask's bytes through a byte pointer into its float slots (Buffer::keepMask).
    auto element = [&](kir::BufferId id, const char* type, const std::string& offset) {
      const kir::Buffer& buffer = fn.buffers[size_t(id)];
      return buffer.keepMask ? fmt::format("{}[{}]", loopDataPointer(buffer, type), offset)
                             : fmt::format("{}[{}]", buffer.name, offset);
    };
    out += loopBody(
        loop, collapsed,
        [&](size_t read, const std::string& offset) {
          return element(loop.reads[read].buffer, "const uint8_t", offset);
        },
        [&](size_t store, const std::string& offset) {
          return element(loop.stores[store].at.buffer, "uint8_t", offset);
        });
    return out + "});\n}\n";
  }

  std::string gemm(const kir::Gemm& gemm, const kir::KernelFunction& fn,
                   FileScope&) const override {
    auto name = [&](kir::BufferId buffer) { return fn.buffers[size_t(buffer)].name; };
    std::string dims = gemmDims(gemm), out;
    if (!dims.empty())
      out = fmt::format("support::{}({}.data(), {}.data(), {}.data(), {});\n",
                        gemm.dtype == ir::DType::F32 ? "einsum2" : "einsum2Double", name(gemm.out),
                        name(gemm.operands[0]), name(gemm.operands[1]), dims);
    else
      out = fmt::format("support::einsumGeneric({}.data(), {});\n", name(gemm.out),
                        einsumGenericArgs(gemm, fn));
    if (gemm.alpha != 1)
      out +=
          fmt::format("support::scaleValues({}, {});\n", name(gemm.out), floatLiteral(gemm.alpha));
    if (gemm.bias != kir::kNoBuffer)
      out += fmt::format("support::biasActivation({}, {}, {});\n", name(gemm.out), name(gemm.bias),
                         gemm.gelu ? "true" : "false");
    return out;
  }

  std::string prologue() const override {
    const char* mode = math_ == "tf32" ? "TF32" : math_ == "bf16" ? "BF16" : "FP32";
    return fmt::format("meshc::cuda::Scope cudaScope(world_, meshc::cuda::MathMode::{});\n", mode);
  }
  const char* launchInclude() const override { return "meshrt/Nccl.h"; }
  // All ranks in one process by default; one process per GPU under mpirun (or --launch mpi),
  // so that the same binary spans hosts.
  const char* launchOptions() const override {
    return "meshrt::nccl::NcclOptions launchOptions = meshrt::nccl::NcclOptions::fromArgs(argc, "
           "argv);";
  }
  const char* launchFunction() const override { return "meshrt::nccl::launch"; }
  const char* backendNote() const override {
    return "It runs on the nccl backend, one GPU per rank (meshrt/Nccl.h): every rank in this "
           "process, or one process per GPU under mpirun (--launch mpi), on one host or several";
  }
  const char* backendUsage() const override { return "[--launch threads|mpi] "; }

private:
  std::string math_;
};

} // namespace

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
