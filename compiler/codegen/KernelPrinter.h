// The statement printer both targets share: kernel IR statements as C++ statements (kernel
// calls, collectives, copies, buffer declarations), with the target printing loop nests and
// GEMMs; and the pieces of a loop nest's text both targets build on (scalar expressions, dim
// collapsing, access offsets, the GEMM classification).
#pragma once

#include "codegen/KernelIR.h"

#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace meshc::codegen {

class Target;

/// A loop nest with adjacent dims merged where every access walks them as one (a contiguous
/// nest becomes one flat loop, which the C++ compiler vectorizes).
struct CollapsedLoop {
  kir::Shape extents;
  std::vector<kir::Shape> reads, stores; // strides per read / per store
  std::vector<kir::Shape> scalars;       // per body scalar: its strides (dropout's global index)
};
CollapsedLoop collapseLoop(const kir::Loop& loop);

/// `i0 * 128 + i1` over the loop indices i0, i1, ... ("0" when every stride is 0).
std::string offsetExpression(const kir::Shape& strides);

/// A loop's pointer to `buffer`'s data: `name.data()`, or for a keep mask (Buffer::keepMask) a
/// `byteType` pointer ("uint8_t", "const uint8_t") to the bytes in its float slots.
std::string loopDataPointer(const kir::Buffer& buffer, const char* byteType);

/// A loop body: one `const float sK = ...;` per scalar (a load reads `element(read, offset)`;
/// a dropout's keep word is `mK` before it), then the stores (`element` of `store(store,
/// offset)` = the scalar, or a keep store's byte). A keep mask's element (Buffer::keepMask) must
/// be spelled as a byte by `element` and `store`.
/// `keepMask(k, offset)`, when given and not empty, spells dropout scalar k's keep mask (a
/// target that draws the masks of a run of points before the loop body); else each point draws
/// its own, or reads the kept one.
using ElementText = std::function<std::string(size_t, const std::string&)>;
std::string loopBody(const kir::Loop& loop, const CollapsedLoop& collapsed,
                     const ElementText& element, const ElementText& store,
                     const ElementText& keepMask = nullptr);

/// `const float stepValue = float(step_);` when the loop reads the step counter (device lambdas
/// capture it by value), else "".
std::string stepDeclaration(const kir::Loop& loop);

/// The integers an i32 scalar of a loop body can hold, when its operands bound them: i32
/// literals, comparisons (0 or 1) and the sums, differences, products, negations, absolute
/// values, maxima, minima and selects of such values. Kept only when every integer in the range
/// is exact in f32 (|x| <= 2^24).
struct IntegerRange {
  double lo = 0, hi = 0;
};
std::vector<std::optional<IntegerRange>> integerRanges(const kir::Loop& loop);

/// The C++ expression of one scalar of a loop body over its argument scalars' names.
/// `exactInF32`: the scalar is an i32 whose operands and result are integers f32 holds exactly
/// (integerRanges), so the interpreter's i32 arithmetic (in double, then wrapped) is f32's:
/// printed without support::wrapI32, whose branches keep the C++ compiler from vectorizing the
/// loop (the loss gradient's `one_hot` mask products).
std::string scalarExpression(const kir::Scalar& scalar, const std::vector<std::string>& args,
                             const std::vector<ir::DType>& argTypes, bool exactInF32 = false);

/// A two-operand GEMM's dims as meshc::gen::GemmDims' designated initializer ("{.batch = ...}"),
/// or "" when it is not a GEMM (a dim summed within one operand, or another operand count).
std::string gemmDims(const kir::Gemm& gemm);
/// The arguments of meshc::gen::einsumGeneric for `gemm` after its output pointer.
std::string einsumGenericArgs(const kir::Gemm& gemm, const kir::KernelFunction& fn);

/// An f32 literal holding `value` rounded to f32 ("0.125f"; INFINITY / NAN spelled so).
std::string floatLiteral(double value);
/// The support enumerator of a dtype ("support::DType::F32").
const char* dtypeEnum(ir::DType dtype);
/// A double as a C++ literal that round-trips (INFINITY / NAN spelled so).
std::string doubleLiteral(double value);
/// The subgroup member for `axes` ("group_data_model").
std::string groupMember(const std::vector<std::string>& axes);
/// Pipeline stages: `if ((uint64_t(mask) >> stage_) & 1) {` when `mask` names some of `fn`'s
/// stages but not all (the caller closes the brace), else "".
std::string stageGuard(const kir::KernelFunction& fn, uint64_t mask);

/// What one source file defines once, at namespace scope, for all of its classes: the shapes
/// its kernel calls take, its einsums' plans and the loop nests its targets outline, one
/// definition per distinct one. All are there for the compiler's sake. A `static` Shape or
/// EinsumPlan local per call cost a guard, an initializer and its unwinding per call site (a
/// quarter of t5's build: 753 calls, 47 shapes; 100 GEMMs, 33 einsums);
/// the same loop nest over other buffers (a layer's forward in the program and in the train
/// block, the update of every param of one shape) was compiled once per occurrence (t5: 268
/// nests, 62 distinct).
class FileScope {
public:
  /// The constant holding `values` ("kShape3"), added when new.
  std::string shape(const kir::Shape& values);
  /// The einsum of `spec` (meshrt::kernels::EinsumSpec's initializer) as a
  /// `support::SharedEinsum` ("kEinsum2"), added when new.
  std::string einsum(const std::string& spec);
  /// A causal attention GEMM (Gemm::Causal) of `args` (support::CausalEinsum's constructor
  /// arguments) as a `support::CausalEinsum` ("kCausal0"), added when new.
  std::string causalEinsum(const std::string& args);
  /// The function `static void <name>(<parameters>) {<body>}` ("loop3"), added when no
  /// function of the same parameters and body is there yet.
  std::string function(const std::string& parameters, const std::string& body);
  /// The definitions, in order of first use: shapes, einsums, then functions.
  std::string definitions() const;

  // A source split into several files (CppOptions::sourceParts): the same names, declared in
  // the parts' shared header and defined once, with external linkage, in one of the parts.
  /// `extern` declarations of the shapes and einsums and the functions' prototypes.
  std::string declarations() const;
  /// The shapes' and einsums' definitions (for the first part).
  std::string constantDefinitions() const;
  size_t functionCount() const { return functions.size(); }
  /// Function k's definition (external linkage: the other parts call it).
  std::string functionDefinition(size_t k) const;

private:
  /// The shapes' and einsums' definitions, each line starting with `linkage` ("static " or "").
  std::string constants(const char* linkage) const;

  std::map<kir::Shape, size_t> shapeIndex;
  std::vector<kir::Shape> shapes;
  std::map<std::string, size_t> einsumIndex;
  std::vector<std::string> einsums;
  std::map<std::string, size_t> causalIndex;
  std::vector<std::string> causals;
  std::map<std::pair<std::string, std::string>, size_t> functionIndex;
  std::vector<std::pair<std::string, std::string>> functions; // parameters, body
};

/// Prints statements of one function (run()'s body or the constructor's hoisted part),
/// declaring each buffer before its first use.
class StatementPrinter {
public:
  /// `paramMembers`: per param, its member; `inputFields`: per input, its field of Inputs;
  /// `file`: the source file's namespace-scope definitions, which the statements name.
  StatementPrinter(const kir::KernelFunction& fn, const Target& target,
                   std::vector<std::string> paramMembers, std::vector<std::string> inputFields,
                   FileScope& file)
      : fn(fn), target(target), paramMembers(std::move(paramMembers)),
        inputFields(std::move(inputFields)), file(file), writers(fn.writerCounts()) {}

  std::string print(const std::vector<kir::Stmt>& stmts);
  /// Starts a new C++ scope (the constructor, then run()): nothing is declared in it yet.
  void newScope() { declared.assign(fn.buffers.size(), false); }

  /// `name(support::View a0, support::ConstView a1, ...)`: a subroutine's name and parameters
  /// (views of the buffers it writes, read-only views of the others).
  std::string signature(const kir::Subroutine& sub) const;

  /// Declarations of `ids` not yet declared in the current scope.
  std::string declarations(const std::vector<kir::BufferId>& ids);

  /// The subgroups the printed statements use.
  std::set<std::vector<std::string>> groups;
  /// Print a trace probe before each statement (meshrt/Trace.h): in run()'s parts and the
  /// subroutines, which declare the Span `trace_`; not in the constructor.
  bool traced = false;

private:
  std::string statement(const kir::Stmt& stmt, size_t index);
  std::string call(const kir::Call& call);
  std::string argument(const kir::Arg& arg);
  std::string collective(const kir::Collective& c);
  std::string copy(const kir::Copy& copy);
  /// The trace probe of `stmt`: one line naming its kind, source location and phase.
  std::string traceProbe(const kir::Stmt& stmt);
  /// `if (<this rank's stage runs it>) {` for a statement of some pipeline stages, else "".
  std::string stageGuard(const kir::Stmt& stmt) const;
  /// Declares `id` when it is not yet (arena slots zeroed when `zero`).
  std::string declare(kir::BufferId id, bool zero);
  std::string name(kir::BufferId id) const { return fn.buffers[size_t(id)].name; }

  const kir::KernelFunction& fn;
  const Target& target;
  std::vector<std::string> paramMembers, inputFields;
  FileScope& file;
  std::vector<bool> declared;
  std::vector<int> writers;
  /// Per started collective's request: its location, which names its wait's probe too.
  std::map<int, std::string> startLocations;
};

} // namespace meshc::codegen
