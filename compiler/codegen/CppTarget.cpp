// The C++ target (Target.h): loop nests as plain `for` loops over compile-time extents with one
// __restrict pointer per buffer (the compiler vectorizes the innermost loop), f32 GEMMs through
// meshrt::kernels::EinsumPlan with the folded scale as alpha.
#include "codegen/KernelPrinter.h"
#include "codegen/Target.h"

#include <fmt/format.h>
#include <llvm/ADT/STLExtras.h>

namespace meshc::codegen {
namespace {

std::string list(const kir::Shape& values) {
  return fmt::format("{{{}}}", fmt::join(values, ", "));
}

class CpuTarget : public Target {
public:
  const char* supportNamespace() const override { return "meshc::gen"; }
  const char* supportHeader() const override { return "meshc/GeneratedSupport.h"; }
  const char* description() const override { return "SPMD C++ over meshrt"; }

  std::string loop(const kir::Loop& loop, const kir::KernelFunction& fn,
                   const std::string& invariants) const override {
    CollapsedLoop collapsed = collapseLoop(loop);
    // One pointer per buffer (a buffer read and stored in place has one, writable): distinct
    // buffers never share bytes, so each pointer is __restrict.
    std::vector<kir::BufferId> buffers, stored;
    for (const kir::Store& store : loop.stores) {
      stored.push_back(store.at.buffer);
      if (!llvm::is_contained(buffers, store.at.buffer)) buffers.push_back(store.at.buffer);
    }
    for (const kir::Access& read : loop.reads)
      if (!llvm::is_contained(buffers, read.buffer)) buffers.push_back(read.buffer);
    auto pointer = [&](kir::BufferId id) { return fn.buffers[size_t(id)].name + "p"; };
    std::string out = "{\n" + invariants + stepDeclaration(loop);
    for (kir::BufferId id : buffers)
      out += fmt::format("{}float* __restrict {} = {}.data();\n",
                         llvm::is_contained(stored, id) ? "" : "const ", pointer(id),
                         fn.buffers[size_t(id)].name);
    for (size_t d = 0; d < collapsed.extents.size(); ++d)
      out +=
          fmt::format("for (int64_t i{0} = 0; i{0} < {1}; ++i{0}) {{\n", d, collapsed.extents[d]);
    out += loopBody(
        loop, collapsed,
        [&](size_t read, const std::string& offset) {
          return fmt::format("{}[{}]", pointer(loop.reads[read].buffer), offset);
        },
        [&](size_t store, const std::string& offset) {
          return fmt::format("{}[{}]", pointer(loop.stores[store].at.buffer), offset);
        });
    for (size_t d = 0; d < collapsed.extents.size(); ++d)
      out += "}\n";
    return out + "}\n";
  }

  std::string gemm(const kir::Gemm& gemm, const kir::KernelFunction& fn, size_t id) const override {
    auto name = [&](kir::BufferId buffer) { return fn.buffers[size_t(buffer)].name; };
    if (gemm.dtype == ir::DType::F32) {
      // meshrt's kernels: classified once (a function-local static, shared by the ranks: every
      // rank of this class has the same local shapes), then GEMMs with transposes folded in.
      std::vector<std::string> operands, pointers;
      for (size_t k = 0; k < gemm.operands.size(); ++k) {
        operands.push_back(fmt::format("{{{}, {{}}}}", list(gemm.operandDims[k])));
        pointers.push_back(name(gemm.operands[k]) + ".data()");
      }
      std::string plan = fmt::format("einsumPlan{}", id);
      std::string out = fmt::format("// dims: {}\n", fmt::join(gemm.dims, ", "));
      out += fmt::format(
          "static const meshrt::kernels::EinsumPlan {}({{{}, {{{}}}, {{{}, {{}}}}}});\n", plan,
          list(gemm.sizes), fmt::join(operands, ", "), list(gemm.outDims));
      std::string tail = fmt::format("{}.data(), {}, {}", name(gemm.out), floatLiteral(gemm.alpha),
                                     floatLiteral(gemm.beta));
      if (gemm.operands.size() == 2)
        return out + fmt::format("{}.run({}, {}, {});\n", plan, pointers[0], pointers[1], tail);
      return out +
             fmt::format("const float* {0}Operands[] = {{{1}}};\n{0}.run({0}Operands, {2});\n",
                         plan, fmt::join(pointers, ", "), tail);
    }
    std::string dims = gemmDims(gemm);
    if (!dims.empty())
      return fmt::format("support::einsum2Double({}.data(), {}.data(), {}.data(), {});\n",
                         name(gemm.out), name(gemm.operands[0]), name(gemm.operands[1]), dims);
    return fmt::format("support::einsumGeneric({}.data(), {});\n", name(gemm.out),
                       einsumGenericArgs(gemm, fn));
  }

  std::string prologue() const override { return ""; }
  const char* launchInclude() const override { return "meshrt/Launch.h"; }
  const char* launchOptions() const override {
    return "meshrt::LaunchOptions launchOptions = meshrt::LaunchOptions::fromArgs(argc, argv);";
  }
  const char* launchFunction() const override { return "meshrt::launch"; }
  const char* backendNote() const override {
    return "The backend is chosen at run time: threads, or MPI under mpirun (meshrt/Launch.h)";
  }
  const char* backendUsage() const override { return "[--backend threads|mpi] "; }
};

} // namespace

std::unique_ptr<Target> makeCpuTarget() {
  return std::make_unique<CpuTarget>();
}

} // namespace meshc::codegen
