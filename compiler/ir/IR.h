// The named-dim IR: a typed SSA graph of tensor ops whose dims have names. It is the single
// input to every later phase (interpreter, autodiff, planner, codegen). `def` blocks are
// inlined by sema, so a Function is flat; each inlined call site owns its parameters, which
// are named by their call path (e.g. `block[2]/attn/w_q`).
#pragma once

#include <llvm/Support/SMLoc.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace meshc::ir {

enum class DType { F32, BF16, F16, I32 };
const char* dtypeName(DType dtype);
bool isFloat(DType dtype);

/// A named dim with its (global, program-wide) size.
struct Dim {
  std::string name;
  int64_t size = 0;
  bool operator==(const Dim&) const = default;
};

/// A tensor type: dtype plus an ordered list of named dims (the order is the storage order;
/// the dims are a set by name). No dims: a scalar.
struct TensorType {
  DType dtype = DType::F32;
  std::vector<Dim> dims;
  int64_t numElements() const;
  /// Index of the dim called `name`, or -1.
  int findDim(const std::string& name) const;
  bool hasDim(const std::string& name) const { return findDim(name) >= 0; }
  bool operator==(const TensorType&) const = default;
};

enum class OpKind {
#define OP(Name, Spelling, Arity, Result, Linear, Gradient, Traits, Attrs, Description) Name,
#include "ir/OpKinds.def"
#undef OP
};
const char* opSpelling(OpKind kind);
const char* opDescription(OpKind kind);

/// Attribute values: numbers, integers, strings and lists of dim names.
using AttrValue = std::variant<double, int64_t, std::string, std::vector<std::string>>;

/// Location of an op in the .mesh source: both the SMLoc (for diagnostics) and its printable
/// form (file base name, line, column) so that the IR stands alone.
struct Location {
  llvm::SMLoc loc;
  std::string file;
  unsigned line = 0, col = 0;
  /// The inlined def call the op comes from, as an index + 1 into Function::calls (0: the
  /// function body). Like a debugger's inlined-at chain, it travels with the location: ops that
  /// autodiff derives from a forward op take its call too. Not printed (IR read back has none).
  uint32_t call = 0;
};

using ValueId = uint32_t;

struct Op {
  OpKind kind;
  std::vector<ValueId> operands;
  ValueId result = 0;
  /// Attributes, in the order they print. See OpKinds.def for which op reads which.
  std::vector<std::pair<std::string, AttrValue>> attrs;
  Location loc;

  const AttrValue* attr(const std::string& name) const;
  double number(const std::string& name, double fallback = 0) const;
  int64_t integer(const std::string& name, int64_t fallback = 0) const;
  std::string string(const std::string& name) const;
  std::vector<std::string> dims(const std::string& name) const;
  void setAttr(const std::string& name, AttrValue value);
};

struct Value {
  TensorType type;
  std::string name; // the let/input name it was bound to, for readable dumps ("" if none)
  uint32_t definingOp = 0;
};

/// How a Param is initialized. The kind names the RNG distribution or constant; the numbers are
/// its keyword arguments (stddev, mean, min, max, value).
struct Initializer {
  std::string kind; // zeros | ones | constant | normal | truncated_normal | uniform | orthogonal
  std::vector<std::pair<std::string, double>> args;
  double arg(const std::string& name, double fallback) const;
};

/// What a Param holds: a weight declared in the program, or a slot of optimizer state that the
/// training phase adds for a weight. A state slot is zeros-initialized, not trainable, and named
/// `<weight path>@<slot>` (`ffn/w_in@m`); its dims are a subset of its weight's, so the layout
/// (a function of dim names) shards it like its weight. A step state (`state mem: ...` in a train
/// block) is not trainable and gets no gradient; its update, added by sema, is the value the
/// user wrote with `next mem = ...`: a forward value of the step.
enum class ParamRole { Weight, OptimizerState, StepState };

struct ParamInfo {
  std::string path; // call path: `ffn/w_in`, `block[3]/attn/w_q`
  TensorType type;
  Initializer init;
  bool trainable = true; // `const` declarations are not
  Location loc;
  ValueId value = 0; // the Param op's result
  ParamRole role = ParamRole::Weight;
};

struct InputInfo {
  std::string name;
  TensorType type;
  /// For i32 inputs used as indices by gather/one_hot: the smallest indexed dim size, which the
  /// interpreter's input synthesizer uses as the exclusive upper bound. 0 if not an index.
  int64_t indexBound = 0;
  Location loc;
  ValueId value = 0;
};

struct OutputInfo {
  std::string name;
  ValueId value = 0;
  Location loc;
};

/// `minimize loss with optimizer(...)` of a train block; lowered by the training phase.
struct TrainInfo {
  ValueId loss = 0;
  std::string optimizer; // sgd | adamw | adafactor
  std::vector<std::pair<std::string, AttrValue>> options;
  Location loc;
};

/// A train step's write: after the step, `params[param]` takes the value `value` (same type).
/// Every update reads the step's old values; all are applied together when the step ends.
struct ParamUpdate {
  size_t param = 0;
  ValueId value = 0;
};

/// One call of a def, inlined by sema. Calls nest: `parent` is the call it was made from.
struct DefCall {
  std::string def;     // the def's name
  std::string path;    // its call path, `decoder/decoder_layer[2]`
  uint32_t parent = 0; // index + 1 into Function::calls; 0: made from the function body
  /// `recompute def`, --recompute names the def, or the driver chose it to fit a memory budget:
  /// in a train block, its activations are recomputed in backward instead of kept
  /// (train/Recompute.h).
  bool recompute = false;
};

/// The attribute of an op that recomputes a forward value for the backward pass (a copy that
/// train/Recompute.h inserts); its value is the call path of the recomputed def call. Passes that
/// merge or move equal computations leave such ops apart from the originals.
inline constexpr const char* kRecomputeAttr = "recompute";
/// The def a call path names: its last segment up to `#` or `[` (`dec/layer#1[2]` -> `layer`).
std::string defOfCallPath(const std::string& callPath);

/// A `repeat` whose count is a declared dim (`repeat layers { ... }`): pipeline stages split its
/// iterations (docs/planner.md, "Pipeline stages"). `carried`: the types of the values one
/// iteration hands to the next (the names of enclosing blocks it rebinds), what a stage sends.
struct RepeatInfo {
  std::string dim;
  std::vector<TensorType> carried;
};

struct Function {
  enum class Kind { Program, Train };
  Kind kind = Kind::Program;
  std::string name;
  Location loc;
  std::vector<Value> values;
  std::vector<Op> ops; // topological order
  std::vector<InputInfo> inputs;
  std::vector<ParamInfo> params;
  std::vector<OutputInfo> outputs; // for train: "loss", then the metrics (f32 scalars)
  std::optional<TrainInfo> train;
  std::vector<RepeatInfo> repeats; // from sema, in source order (not printed in IR text)
  /// One per step state (from sema, the `next` writes), then, filled by the training phase
  /// (autodiff + optimizer), one per trainable weight and optimizer-state slot. Empty for
  /// programs; see hasOptimizerUpdates for whether the training phase has run.
  std::vector<ParamUpdate> updates;
  /// Every def call sema inlined, outermost first (Location::call indexes it).
  std::vector<DefCall> calls;

  const Value& value(ValueId id) const { return values[id]; }
  const TensorType& typeOf(ValueId id) const { return values[id].type; }
  const Op& definingOp(ValueId id) const { return ops[values[id].definingOp]; }
  /// Appends an op producing a fresh value of `type`; returns the new value.
  ValueId addOp(Op op, TensorType type, std::string valueName = {});
};

/// Whether the training phase has added its updates to `fn` (every train block it accepts has a
/// trainable weight, so this is false before it and true after; step-state writes do not count).
bool hasOptimizerUpdates(const Function& fn);

struct MeshAxis {
  std::string name;
  int64_t size = 1;
};

/// A dim's placement: an ordered list of mesh axes (empty: replicated), or chosen by the planner.
struct DimLayout {
  std::string dim;
  std::vector<std::string> axes;
  bool isAuto = false;
  Location loc;
  /// A repeat's count over a stage axis with the layers of each stage pinned (`layers:
  /// stage(3, 1)`); empty: the planner balances them.
  std::vector<int64_t> split;
};

struct Module {
  std::string meshName; // "" when the program declares no mesh (one device)
  std::vector<MeshAxis> mesh;
  std::map<std::string, int64_t> dims; // every declared dim and its size
  std::vector<DimLayout> layout;       // pinned or auto entries, in source order
  bool autoLayout = false;             // the bare `auto`: unpinned dims are searched
  std::vector<Function> functions;

  const Function* findFunction(const std::string& name) const;
};

} // namespace meshc::ir
