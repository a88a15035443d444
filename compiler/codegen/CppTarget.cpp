// The C++ target (Target.h): loop nests as plain `for` loops over compile-time extents with one
// __restrict pointer per buffer (the compiler vectorizes the innermost loop), f32 GEMMs through
// meshrt::kernels::EinsumPlan with the folded scale as alpha.
#include "codegen/KernelPrinter.h"
#include "codegen/Target.h"
#include "meshrt/Random.h"

#include <fmt/format.h>
#include <llvm/ADT/STLExtras.h>

#include <algorithm>

namespace meshc::codegen {
namespace {

std::string list(const kir::Shape& values) {
  return fmt::format("{{{}}}", fmt::join(values, ", "));
}

class CpuTarget : public Target {
  /// Points from which a loop nest is split over OpenMP's threads (a few microseconds of work
  /// on one thread, against a parallel region's start of about one).
  static constexpr int64_t kParallelPoints = 1 << 15;
  /// Dropout masks are drawn in runs of at most this many points (a stack array each), from
  /// innermost extents of at least kMinMaskRun.
  static constexpr int64_t kMaskRun = 1024, kMinMaskRun = 16;

public:
  const char* supportNamespace() const override { return "meshc::gen"; }
  const char* supportHeader() const override { return "meshc/GeneratedSupport.h"; }
  const char* description() const override { return "SPMD C++ over meshrt"; }

  std::string loop(const kir::Loop& loop, const kir::KernelFunction& fn,
                   const std::string& invariants, FileScope& file) const override {
    CollapsedLoop collapsed = collapseLoop(loop);
    size_t depth = collapsed.extents.size();
    // One pointer per buffer (a buffer read and stored in place has one, writable): distinct
    // buffers never share bytes, so each pointer is __restrict.
    std::vector<kir::BufferId> buffers, stored;
    for (const kir::Store& store : loop.stores) {
      stored.push_back(store.at.buffer);
      if (!llvm::is_contained(buffers, store.at.buffer)) buffers.push_back(store.at.buffer);
    }
    for (const kir::Access& read : loop.reads)
      if (!llvm::is_contained(buffers, read.buffer)) buffers.push_back(read.buffer);
    bool parallel = depth > 0 && kir::pointCount(collapsed.extents) >= kParallelPoints &&
                    collapsed.extents[0] > 1 &&
                    llvm::all_of(collapsed.stores, [](const kir::Shape& s) { return s[0] != 0; });
    // A nest that reads nothing but its buffers is a function of the file, called here with the
    // buffers' data: the same nest over other buffers (another layer's, another param's of the
    // same shape) is then compiled once. Not a parallel one: its pointers must be declared
    // inside the parallel region to stay __restrict there.
    bool outlined = depth > 0 && !parallel && invariants.empty() && stepDeclaration(loop).empty();
    auto pointer = [&](kir::BufferId id) {
      return outlined ? fmt::format("p{}", llvm::find(buffers, id) - buffers.begin())
                      : fn.buffers[size_t(id)].name + "p";
    };
    // Dropout whose global index walks the innermost dim one by one draws the masks of a run
    // of points first, one Philox call per four of them, instead of one call per point.
    std::vector<size_t> drawn;
    if (depth > 0 && collapsed.extents.back() >= kMinMaskRun)
      for (size_t k = 0; k < loop.body.size(); ++k)
        if (loop.body[k].kind == kir::Scalar::Kind::Dropout && collapsed.scalars[k].back() == 1)
          drawn.push_back(k);
    // Points are independent (a buffer stored in place is read at the stored point only): a
    // large nest's outer dim is split over OpenMP's threads (those that run the GEMMs; one
    // unless the caller asks for more) when every outer index stores its own elements. The
    // pointers are declared inside the parallel region, so that they stay __restrict there.
    std::string out = outlined ? "" : "{\n" + invariants + stepDeclaration(loop);
    if (parallel) out += "#pragma omp parallel\n{\n";
    std::vector<std::string> parameters, arguments;
    for (kir::BufferId id : buffers) {
      // A keep mask's bytes through a byte pointer into its float slots (Buffer::keepMask).
      const kir::Buffer& buffer = fn.buffers[size_t(id)];
      std::string type = fmt::format("{}{}", llvm::is_contained(stored, id) ? "" : "const ",
                                     buffer.keepMask ? "uint8_t" : "float");
      std::string declaration = fmt::format("{}* __restrict {}", type, pointer(id));
      parameters.push_back(declaration);
      arguments.push_back(loopDataPointer(buffer, type.c_str()));
      if (!outlined) out += fmt::format("{} = {};\n", declaration, arguments.back());
    }
    // A read that no loop moves (a scalar: AdamW's step size and bias corrections) is loaded
    // once, before the loops: GCC does not take the __restrict of these local pointers as proof
    // that the loop's stores cannot change it, and does not vectorize a loop that reloads it per
    // point ("no vectype for stmt"; 4 ns per element of the update instead of 0.5). A row's
    // value (moved by an outer loop only) stays in the inner loop: hoisted, it kept GCC from
    // if-converting the row's compares there.
    std::vector<bool> isHoisted(loop.reads.size(), false);
    for (size_t r = 0; r < loop.reads.size(); ++r) {
      isHoisted[r] = depth > 0 && !llvm::is_contained(stored, loop.reads[r].buffer) &&
                     llvm::all_of(collapsed.reads[r], [](int64_t stride) { return stride == 0; });
      if (isHoisted[r])
        out += fmt::format("const float r{} = {}[0];\n", r, pointer(loop.reads[r].buffer));
    }
    int64_t run = 0;
    for (size_t d = 0; d < depth; ++d) {
      if (d == 0 && parallel) out += "#pragma omp for schedule(static)\n";
      int64_t extent = collapsed.extents[d];
      if (d + 1 < depth || drawn.empty()) {
        out += fmt::format("for (int64_t i{0} = 0; i{0} < {1}; ++i{0}) {{\n", d, extent);
        continue;
      }
      run = std::min(extent, kMaskRun);
      out += fmt::format("for (int64_t c{0} = 0; c{0} < {1}; c{0} += {2}) {{\n", d, extent, run);
      out += extent % run == 0
                 ? fmt::format("constexpr int64_t n{} = {};\n", d, run)
                 : fmt::format("const int64_t n{0} = std::min<int64_t>({1} - c{0}, {2});\n", d,
                               extent, run);
      for (size_t k : drawn) {
        const kir::Scalar& s = loop.body[k];
        out += fmt::format("uint32_t keep{}[{}];\n", k, run);
        out += fmt::format("{{\nconst int64_t i{0} = c{0};\nmeshrt::dropoutKeepMasks(inv{1}, "
                           "uint64_t(inv{2} + {3}), n{0}, {4}u, keep{5});\n}}\n",
                           d, s.read, s.read + 1, offsetExpression(collapsed.scalars[k]),
                           meshrt::dropoutThreshold(s.value), k);
      }
      out += fmt::format("for (int64_t i{0} = c{0}; i{0} < c{0} + n{0}; ++i{0}) {{\n", d);
    }
    out += loopBody(
        loop, collapsed,
        [&](size_t read, const std::string& offset) {
          if (isHoisted[read]) return fmt::format("r{}", read);
          return fmt::format("{}[{}]", pointer(loop.reads[read].buffer), offset);
        },
        [&](size_t store, const std::string& offset) {
          return fmt::format("{}[{}]", pointer(loop.stores[store].at.buffer), offset);
        },
        [&](size_t k, const std::string&) {
          return llvm::is_contained(drawn, k)
                     ? fmt::format("keep{}[i{} - c{}]", k, depth - 1, depth - 1)
                     : std::string();
        });
    for (size_t d = 0; d < depth; ++d)
      out += "}\n";
    if (run > 0) out += "}\n";
    if (parallel) out += "}\n";
    if (outlined)
      return fmt::format("{}({});\n",
                         file.function(fmt::format("{}", fmt::join(parameters, ", ")), out),
                         fmt::join(arguments, ", "));
    return out + "}\n";
  }

  std::string gemm(const kir::Gemm& gemm, const kir::KernelFunction& fn,
                   FileScope& file) const override {
    auto name = [&](kir::BufferId buffer) { return fn.buffers[size_t(buffer)].name; };
    if (ir::isFloat(gemm.dtype)) {
      // meshrt's kernels: classified once (on first use, shared by the ranks and the call
      // sites of the same einsum: they have the same local shapes), then GEMMs with transposes
      // folded in. A bf16/f16 GEMM runs in f32 too (the products of narrow operands are exact
      // in f32; the sum is rounded to the dtype by the call lowering adds after it): where the
      // f32 sum lands across a rounding boundary from the interpreter's double one, the result
      // is one narrow ulp off, inside the rule (docs/architecture.md, "bf16 / f16").
      std::vector<std::string> operands, pointers;
      for (size_t k = 0; k < gemm.operands.size(); ++k) {
        operands.push_back(fmt::format("{{{}, {{}}}}", list(gemm.operandDims[k])));
        pointers.push_back(name(gemm.operands[k]) + ".data()");
      }
      std::string spec = fmt::format("{{{}, {{{}}}, {{{}, {{}}}}}}", list(gemm.sizes),
                                     fmt::join(operands, ", "), list(gemm.outDims));
      std::string out = fmt::format("// dims: {}\n", fmt::join(gemm.dims, ", "));
      if (gemm.causal.kind != kir::Gemm::Causal::Kind::None) {
        // Over the lower triangle of blocks (causal-attention-blocks).
        const kir::Gemm::Causal& c = gemm.causal;
        bool scores = c.kind == kir::Gemm::Causal::Kind::Scores;
        std::string blocks = c.kind == kir::Gemm::Causal::Kind::Context ? "Queries" : "Keys";
        std::string check = scores || c.knownZeros ? "None" : c.uniformTails ? "Tails" : "Every";
        std::string causal = file.causalEinsum(
            fmt::format("{}, {}, {}, {}, support::CausalEinsum::Blocks::{}, {}, "
                        "support::CausalEinsum::Check::{}{}",
                        spec, c.row, c.col, c.block, blocks, scores ? -1 : c.weights, check,
                        scores ? fmt::format(", {}, {}", floatLiteral(c.fill), c.fillAbove) : ""));
        return out + fmt::format("{}.run({}, {}, {}.data(), {});\n", causal, pointers[0],
                                 pointers[1], name(gemm.out), floatLiteral(gemm.alpha));
      }
      std::string plan = file.einsum(spec) + ".plan()";
      if (gemm.bias != kir::kNoBuffer) // the bias and GELU as the GEMM's post-ops
        return out + fmt::format("{}.runBiasActivation({}, {}, {}.data(), {}.data(), {});\n", plan,
                                 pointers[0], pointers[1], name(gemm.bias), name(gemm.out),
                                 gemm.gelu ? "true" : "false");
      std::string tail = fmt::format("{}.data(), {}, {}", name(gemm.out), floatLiteral(gemm.alpha),
                                     floatLiteral(gemm.beta));
      if (gemm.operands.size() == 2)
        return out + fmt::format("{}.run({}, {}, {});\n", plan, pointers[0], pointers[1], tail);
      return out +
             fmt::format("{{\nconst float* operands[] = {{{1}}};\n{0}.run(operands, {2});\n}}\n",
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
