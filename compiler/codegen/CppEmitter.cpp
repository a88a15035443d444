// The C++ emitter. One FunctionEmitter per planned function writes its class declaration (into
// the header) and definitions (into the source) around its kernel IR, whose statements the
// shared StatementPrinter prints (KernelPrinter.h); the module emitter wraps them, adds the
// runner main when asked, and formats everything with clang-format. What each op computes on
// local shards is LowerToKernels.cpp's.
#include "codegen/CppEmitter.h"
#include "codegen/FormMicrobatchLoop.h"
#include "codegen/KernelPrinter.h"
#include "codegen/Lower.h"
#include "codegen/Target.h"

#include <clang/Format/Format.h>
#include <clang/Tooling/Core/Replacement.h>
#include <fmt/format.h>
#include <llvm/ADT/STLExtras.h>

#include <algorithm>
#include <cassert>
#include <deque>
#include <numeric>
#include <optional>
#include <set>

namespace meshc::codegen {
namespace {

using ir::DType;
using ir::OpKind;
using ir::TensorType;
using plan::SpmdValueId;
using Shape = std::vector<int64_t>;

std::string list(const Shape& values) {
  return fmt::format("{{{}}}", fmt::join(values, ", "));
}

std::string stringList(const std::vector<std::string>& values) {
  std::vector<std::string> quoted;
  for (const std::string& v : values)
    quoted.push_back(fmt::format("\"{}\"", v));
  return fmt::format("{{{}}}", fmt::join(quoted, ", "));
}

std::string quote(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

/// A C++ identifier from a name or path ("block[2]/attn/w_q" -> "block_2_attn_w_q").
std::string identifier(const std::string& name) {
  std::string out;
  for (char c : name) {
    char mapped = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
    // No "__": identifiers containing it are reserved in C++.
    if (mapped == '_' && !out.empty() && out.back() == '_') continue;
    out += mapped;
  }
  while (!out.empty() && out.back() == '_')
    out.pop_back();
  if (out.empty() || std::isdigit(static_cast<unsigned char>(out[0]))) out = "_" + out;
  // .mesh names may be C++ keywords (an input called `new` or `default`): suffix them.
  static const std::set<std::string> keywords = {
      "alignas",   "alignof",   "and",       "asm",      "auto",     "bool",     "break",
      "case",      "catch",     "char",      "class",    "concept",  "const",    "consteval",
      "constexpr", "continue",  "decltype",  "default",  "delete",   "do",       "double",
      "else",      "enum",      "explicit",  "export",   "extern",   "false",    "float",
      "for",       "friend",    "goto",      "if",       "inline",   "int",      "long",
      "mutable",   "namespace", "new",       "noexcept", "not",      "nullptr",  "operator",
      "or",        "private",   "protected", "public",   "register", "requires", "return",
      "short",     "signed",    "sizeof",    "static",   "struct",   "switch",   "template",
      "this",      "throw",     "true",      "try",      "typedef",  "typeid",   "typename",
      "union",     "unsigned",  "using",     "virtual",  "void",     "volatile", "while",
      "xor",       "inputs",    "outputs"};
  if (keywords.count(out)) out += "_";
  return out;
}

/// "mlp_train" -> "MlpTrain".
std::string className(const std::string& name) {
  std::string out;
  bool upper = true;
  for (char c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c))) {
      upper = true;
      continue;
    }
    out += upper ? char(std::toupper(static_cast<unsigned char>(c))) : c;
    upper = false;
  }
  if (out.empty() || std::isdigit(static_cast<unsigned char>(out[0]))) out = "P" + out;
  return out;
}

using kir::rowMajorStrides;
using kir::sizesOf;
using kir::valueTypeEnum;

//===------------------------------------------------------------------------------------------===//
// One function: the class around its kernel IR
//===------------------------------------------------------------------------------------------===//

/// run()'s statements per member function (see FunctionEmitter::emit).
constexpr size_t kStatementsPerPart = 24;

class FunctionEmitter {
public:
  FunctionEmitter(const ir::Function& irFunction, const plan::SpmdFunction& spmd,
                  const kir::KernelFunction& kernels, const Target& target, FileScope& file)
      : name(className(spmd.name)), irFn(irFunction), fn(spmd), kernels(kernels), target(&target),
        file(&file) {}

  llvm::Error emit();

  std::string declaration; // into the header
  // The definitions, into the source: `head` (the constructor, run() and what comes before
  // it), `pieces` (each a run() part or a subroutine), then `tail` (the other members). A split
  // source (CppOptions::sourceParts) keeps head and tail together and spreads the pieces.
  std::string head, tail;
  std::vector<std::string> pieces;
  std::string definition() const {
    std::string out = head;
    for (const std::string& piece : pieces)
      out += piece;
    return out + tail;
  }
  const std::string name;

  /// The runner's part for this function: runs it through meshrt::launch and records outputs.
  std::string runnerBody() const;
  /// The runner's `inputs` of the step `step` (a C++ expression): each input from the inputs
  /// file when it holds `<function>.<input>` (batch `step` mod k of its k batches), else
  /// synthesized from seed + step.
  std::string inputsOfStep(const std::string& step) const;

private:
  const TensorType& local(SpmdValueId id) const { return fn.values[id].localType; }
  const TensorType& global(SpmdValueId id) const { return fn.values[id].globalType; }
  const plan::TensorLayout& layout(SpmdValueId id) const { return fn.values[id].layout; }

  /// Per dim of `id`'s local type: the expression of this rank's shard start.
  std::vector<std::string> shardStarts(SpmdValueId id) const;
  std::string shardStart(SpmdValueId id, const std::string& dim) const;
  /// This rank's shard of `id` as meshrt::kernels::Shard (global shape, offsets, local shape),
  /// for the kernels' RNG fills, which key every element by its global index.
  /// `const meshrt::kernels::Shard shard{...};`: the value's global extents, this rank's starts
  /// and its local extents, as the fills take them. A statement of its own: clang::format
  /// searches line breaks through one call's nested braces at great cost (80% of --emit=cpp).
  std::string shardDeclaration(SpmdValueId id) const;

  std::string paramMember(size_t k) const {
    return fmt::format("param{}_{}", k, identifier(irFn.params[k].path));
  }
  /// Pipeline stages: param k's stages (KernelFunction::paramStages; 0: every rank).
  uint64_t paramStages(size_t k) const {
    return k < kernels.paramStages.size() ? kernels.paramStages[k] : 0;
  }
  /// Wraps `code` in the guard of param k's stages (as is when every rank holds it).
  std::string onParamStages(size_t k, const std::string& code) const {
    std::string guard = stageGuard(kernels, paramStages(k));
    return guard.empty() ? code : guard + code + "}\n";
  }
  /// The namespace-scope table of the params' ParamSpecs (paramTable()), "" without params.
  std::string paramSpecs() const;
  std::string paramTable() const { return "k" + name + "Params"; }
  /// `support::Buffer* const data[] = {&param0_..., ...};`: the params' members, in order.
  std::string paramData() const;
  void emitConstructor(std::string& out, const std::string& hoisted);
  void emitHelpers(std::string& out);
  /// step(), paramNames(), isOptimizerState(), paramShards(), getParam() and setParam().
  void emitParamAccess(std::string& out);
  /// save(dir) / load(dir) through meshrt's checkpoints: declarations into `h`, definitions
  /// into `s`.
  void emitCheckpointApi(std::string& h, std::string& s) const;
  bool hasUpdates() const { return !fn.updates.empty(); }
  /// A train block's metrics: its outputs besides the loss (the first output).
  std::vector<std::string> metricNames() const {
    std::vector<std::string> names;
    for (size_t k = 1; k < fn.outputs.size() && fn.kind == ir::Function::Kind::Train; ++k)
      names.push_back(fn.outputs[k].first);
    return names;
  }
  std::string stepDeclaration() const;
  std::string stepDefinition() const;
  std::string stepLoop() const;
  /// The runner's line of param bytes per rank under pipeline stages ("" without stages).
  std::string stageParamBytes() const;
  std::string oneFOneBSchedule(const std::vector<int>& partLoop) const;

  const ir::Function& irFn;
  const plan::SpmdFunction& fn;
  const kir::KernelFunction& kernels;
  const Target* target;
  FileScope* file; // the source file's, shared by its classes
  std::set<plan::AxisList> groups;
};

/// run()'s microbatch loops under the 1F1B schedule (ScheduleMicrobatches.h): stage s runs
/// min(p - 1 - s, K) forwards, then one forward and one backward at a time, then the remaining
/// backwards; at most p - s microbatches' activations are in flight on it.
std::string FunctionEmitter::oneFOneBSchedule(const std::vector<int>& partLoop) const {
  std::string forward, backward;
  for (size_t k = 0; k < partLoop.size(); ++k)
    if (partLoop[k] >= 0)
      (partLoop[k] == 0 ? forward : backward) += fmt::format(" runPart{}(inputs);", k);
  int64_t count = kernels.microbatches.count;
  return fmt::format(
      "// The pipeline's 1F1B schedule: {0} microbatches along {1} over {2} stages.\n{{\n"
      "auto forward = [&](int64_t m) {{ microbatch_ = m;{3} }};\n"
      "auto backward = [&](int64_t m) {{ microbatch_ = m;{4} }};\n"
      "const int64_t warm = std::min<int64_t>({2} - 1 - stage_, {0});\n"
      "for (int64_t m = 0; m < warm; ++m) forward(m);\n"
      "for (int64_t m = warm; m < {0}; ++m) {{ forward(m); backward(m - warm); }}\n"
      "for (int64_t m = {0} - warm; m < {0}; ++m) backward(m);\n}}\n",
      count, kernels.microbatches.dim, kernels.stages.count, forward, backward);
}

std::string FunctionEmitter::shardStart(SpmdValueId id, const std::string& dim) const {
  const TensorType& type = local(id);
  int position = type.findDim(dim);
  if (position < 0) return "0";
  const plan::AxisList& axes = layout(id).dimAxes[size_t(position)];
  if (axes.empty()) return "0";
  return fmt::format("support::shardStart(world_, {}, {})", stringList(axes),
                     type.dims[size_t(position)].size);
}

std::vector<std::string> FunctionEmitter::shardStarts(SpmdValueId id) const {
  std::vector<std::string> starts;
  for (const ir::Dim& dim : local(id).dims)
    starts.push_back(shardStart(id, dim.name));
  return starts;
}

std::string FunctionEmitter::shardDeclaration(SpmdValueId id) const {
  auto sizes = [](const TensorType& type) {
    std::vector<int64_t> out;
    for (const ir::Dim& dim : type.dims)
      out.push_back(dim.size);
    return fmt::format("{{{}}}", fmt::join(out, ", "));
  };
  return fmt::format("const meshrt::kernels::Shard shard{{{}, {{{}}}, {}}};\n", sizes(global(id)),
                     fmt::join(shardStarts(id), ", "), sizes(local(id)));
}

llvm::Error FunctionEmitter::emit() {
  // The statements first: they name the subgroups the constructor creates.
  std::vector<std::string> paramMembers, inputFields;
  for (size_t k = 0; k < irFn.params.size(); ++k)
    paramMembers.push_back(paramMember(k));
  for (const ir::InputInfo& input : irFn.inputs)
    inputFields.push_back(identifier(input.name));
  StatementPrinter printer(kernels, *target, paramMembers, inputFields, *file);
  std::string hoisted = printer.print(kernels.init);
  printer.traced = true;
  // run()'s statements in parts, each a member function (compilers optimize many small
  // functions much faster than one long one); a part never ends inside a started collective,
  // and the microbatch loop's bounds are bounds of parts (the loop calls its parts).
  std::vector<std::string> parts;
  std::vector<int> partLoop; // per part: its microbatch loop (-1: none)
  std::vector<kir::Stmt> part;
  int inFlight = 0;
  for (size_t k = 0; k < kernels.body.size(); ++k) {
    part.push_back(kernels.body[k]);
    if (const auto* c = std::get_if<kir::Collective>(&kernels.body[k].node))
      inFlight += c->phase == kir::Collective::Phase::Start  ? 1
                  : c->phase == kir::Collective::Phase::Wait ? -1
                                                             : 0;
    bool loopBound = k + 1 < kernels.body.size() &&
                     (kernels.body[k + 1].perMicrobatch != kernels.body[k].perMicrobatch ||
                      kernels.body[k + 1].microbatchLoop != kernels.body[k].microbatchLoop);
    if ((part.size() >= kStatementsPerPart && inFlight == 0) || loopBound ||
        k + 1 == kernels.body.size()) {
      printer.newScope();
      parts.push_back(printer.print(part));
      partLoop.push_back(kernels.body[k].perMicrobatch ? kernels.body[k].microbatchLoop : -1);
      part.clear();
    }
  }
  // Outlined repeated code (a layer of a `repeat`), one member function each.
  std::vector<std::string> subroutineSignatures, subroutineBodies;
  for (const kir::Subroutine& sub : kernels.subroutines) {
    printer.newScope();
    subroutineSignatures.push_back(printer.signature(sub));
    subroutineBodies.push_back(printer.print(sub.body));
  }
  std::string body;
  bool oneFOneB =
      kernels.stages.count > 1 && kernels.stages.oneFOneB && llvm::is_contained(partLoop, 1);
  for (size_t k = 0; k < parts.size(); ++k) {
    if (oneFOneB && partLoop[k] >= 0) {
      if (k == 0 || partLoop[k - 1] < 0) body += oneFOneBSchedule(partLoop);
      continue;
    }
    if (partLoop[k] >= 0 && (k == 0 || partLoop[k - 1] != partLoop[k]))
      body += fmt::format("// {}: {} microbatches along {}, each its slice of the "
                          "inputs; gradients, loss and metrics averaged over them.\n"
                          "for (microbatch_ = 0; microbatch_ < {}; ++microbatch_) {{\n",
                          kernels.stages.count <= 1 ? "The microbatch loop"
                          : partLoop[k] == 0        ? "The pipeline's forwards"
                                                    : "The pipeline's backwards",
                          kernels.microbatches.count, kernels.microbatches.dim,
                          kernels.microbatches.count);
    body += fmt::format("runPart{}(inputs);\n", k);
    if (partLoop[k] >= 0 && (k + 1 == parts.size() || partLoop[k + 1] != partLoop[k]))
      body += "}\n";
  }
  // What run() itself reads after the parts: the outputs and the updates' new values.
  std::vector<kir::BufferId> results = kernels.outputs;
  for (const kir::KernelFunction::Update& update : kernels.updates)
    if (update.value != kernels.params[update.param]) results.push_back(update.value);
  printer.newScope();
  body += printer.declarations(results);
  groups = printer.groups;

  // Declaration.
  std::string& h = declaration;
  std::string kindWord = fn.kind == ir::Function::Kind::Train ? "train block" : "program";
  h += fmt::format(
      "/// The {} `{}` of {}, planned for the mesh {} with layout {}.\n", kindWord, fn.name,
      irFn.loc.file,
      "[" +
          [&] {
            std::vector<std::string> axes;
            for (const ir::MeshAxis& axis : fn.mesh.axes)
              axes.push_back(fmt::format("{}={}", axis.name, axis.size));
            return fmt::format("{}", fmt::join(axes, ", "));
          }() +
          "]",
      plan::layoutString(fn.layout));
  h += fmt::format("class {} {{\npublic:\n", name);
  h += "/// This rank's local shards of the inputs (row-major over the local shape).\n";
  h += "struct Inputs {\n";
  for (size_t k = 0; k < irFn.inputs.size(); ++k) {
    SpmdValueId id = fn.inputs[k];
    h += fmt::format("support::Tensor {}; // {} local {}\n", identifier(irFn.inputs[k].name),
                     plan::tensorLayoutString(global(id), layout(id)), list(sizesOf(local(id))));
  }
  h += "};\n/// This rank's local shards of the outputs.\nstruct Outputs {\n";
  for (const auto& [outName, id] : fn.outputs)
    h += fmt::format("support::Tensor {}; // {} local {}\n", identifier(outName),
                     plan::tensorLayoutString(global(id), layout(id)), list(sizesOf(local(id))));
  h += "};\n\n";
  h += "/// The mesh the plan was made for; the communicator must be over it.\n"
       "static meshrt::Mesh mesh();\n";
  h += "/// The names of the inputs and outputs, in declaration order.\n"
       "static std::vector<std::string> inputNames();\n"
       "static std::vector<std::string> outputNames();\n"
       "/// The global shape of the input `name` (what scatterInput takes).\n"
       "static support::Shape inputShape(const std::string& name);\n\n";
  h += fmt::format("/// Creates the subgroups this program uses and initializes this rank's "
                   "parameter shards from `seed` (the same global values on every mesh).\n"
                   "explicit {}(meshrt::Communicator& world, uint64_t seed = 0);\n\n",
                   name);
  h += "/// Runs on this rank's shards (a collective call: every rank of the mesh calls it).\n"
       "/// Throws std::invalid_argument when an input's local shape is wrong.\n"
       "Outputs run(const Inputs& inputs);\n\n";
  h += fmt::format(
      "/// The bytes of this object's arena: run()'s temporaries share it, placed by "
      "liveness.\nstatic constexpr size_t kArenaBytes = {};\n"
      "/// The bytes of all of run()'s temporaries together (one buffer each).\n"
      "static constexpr size_t kTemporaryBytes = {};\n"
      "/// The bytes of the values computed once, in the constructor (constants, masks).\n"
      "static constexpr size_t kPersistentBytes = {};\n\n",
      kernels.arenaBytes, kernels.temporaryBytes, kernels.persistentBytes);
  if (!kernels.stageArenaBytes.empty())
    h += fmt::format("/// Pipeline stages: the arena bytes of each stage's ranks (their own "
                     "temporaries only).\nstatic constexpr size_t kStageArenaBytes[] = {{{}}};\n\n",
                     fmt::join(kernels.stageArenaBytes, ", "));
  if (fn.kind == ir::Function::Kind::Train) {
    if (hasUpdates()) h += stepDeclaration();
    h += "/// The number of steps taken: keys this step's random ops and dropout masks (and, "
         "with an optimizer, its learning-rate schedule).\n"
         "int64_t stepCount() const { return step_; }\n"
         "void setStepCount(int64_t step) { step_ = step; }\n\n";
  }
  h += "/// The seed: keys the params' initial values and the random ops; load() restores the "
       "saved one.\nuint64_t seed() const { return seed_; }\n\n";
  h += "/// Every param's path: weights, consts and optimizer state (`<weight>@<slot>`), in "
       "declaration order.\nstatic std::vector<std::string> paramNames();\n"
       "/// Whether `path` is a slot of optimizer state (not a weight of the model).\n"
       "static bool isOptimizerState(const std::string& path);\n"
       "/// This rank's param shards with their global shapes and layouts (for checkpoints).\n"
       "std::vector<support::ParamShard> paramShards();\n"
       "/// The global value of param `path` (collective: every rank calls it and gets the "
       "whole tensor).\nsupport::Tensor getParam(const std::string& path);\n"
       "/// Sets param `path` from its global value (no communication: each rank keeps its "
       "shard). Throws std::invalid_argument on an unknown path or a wrong shape.\n"
       "void setParam(const std::string& path, const support::Tensor& global);\n\n";
  h += "/// This rank's local shards of the inputs the reference interpreter synthesizes for "
       "`seed` (keyed by global element index).\n"
       "Inputs synthesizeInputs(uint64_t seed) const;\n\n"
       "/// This rank's shard of the global input `name` (no communication).\n"
       "static support::Tensor scatterInput(meshrt::Communicator& world, const std::string& "
       "name, const support::Tensor& global);\n"
       "/// The global output `name` from every rank's shard (collective: every rank calls it "
       "and gets the whole tensor).\n"
       "static support::Tensor gatherOutput(meshrt::Communicator& world, const std::string& "
       "name, const support::Tensor& local);\n\n";
  std::string checkpointDefinitions;
  emitCheckpointApi(h, checkpointDefinitions);
  // Public only because CUDA's device lambdas need a public enclosing function (and one that
  // is not a constructor).
  h += "/// run()'s statements, in parts (run() calls them in order).\n";
  for (size_t k = 0; k < parts.size(); ++k)
    h += fmt::format("void runPart{}(const Inputs& inputs);\n", k);
  if (!subroutineSignatures.empty())
    h += "/// Code that repeats in run() (the layers of a `repeat`), called once per repetition.\n";
  for (const std::string& signature : subroutineSignatures)
    h += fmt::format("void {};\n", signature);
  if (!kernels.init.empty())
    h += "/// Computes the values run() reads that never change (the constructor calls it).\n"
         "void computeInvariants();\n";
  h += "\nprivate:\nmeshrt::Communicator& world_;\nuint64_t seed_;\n";
  if (fn.kind == ir::Function::Kind::Train) h += "int64_t step_ = 0;\n";
  if (kernels.microbatches.count > 1)
    h += "int64_t microbatch_ = 0; // the microbatch run() is at (its loop's index)\n";
  if (kernels.stages.count > 1)
    h += fmt::format("int stage_ = int(support::blockIndex(world_, {{\"{}\"}})); // this rank's "
                     "pipeline stage\n"
                     "std::deque<support::StageSend> stageSends_; // started, waited after the "
                     "microbatches\n",
                     kernels.stages.axis);
  for (const plan::AxisList& axes : groups)
    h += fmt::format("meshrt::Communicator& {}; // the ranks along {}\n", groupMember(axes),
                     fmt::join(axes, ", "));
  for (size_t k = 0; k < irFn.params.size(); ++k) {
    SpmdValueId id = fn.params[k];
    h +=
        fmt::format("support::Buffer {}; // {}: {} local {}\n", paramMember(k), irFn.params[k].path,
                    plan::tensorLayoutString(global(id), layout(id)), list(sizesOf(local(id))));
  }
  h += kernels.stageArenaBytes.empty()
           ? "support::Arena arena_{kArenaBytes}; // run()'s temporaries\n"
           : "support::Arena arena_{kStageArenaBytes[stage_]}; // run()'s temporaries on this "
             "rank's stage\n";
  h += "support::Arena persistent_{kPersistentBytes}; // computed in the constructor\n";
  h += "};\n\n";

  // Definitions.
  std::string& s = head;
  s += fmt::format("//===--- {} `{}` ---===//\n\n", kindWord, fn.name);
  {
    std::vector<std::string> axes;
    for (const ir::MeshAxis& axis : fn.mesh.axes)
      axes.push_back(fmt::format("{{\"{}\", {}}}", axis.name, axis.size));
    s += fmt::format("meshrt::Mesh {}::mesh() {{ return meshrt::Mesh({{{}}}); }}\n\n", name,
                     fmt::join(axes, ", "));
    std::vector<std::string> inputs, outputs;
    for (const ir::InputInfo& input : irFn.inputs)
      inputs.push_back(quote(input.name));
    for (const auto& output : fn.outputs)
      outputs.push_back(quote(output.first));
    s += fmt::format("std::vector<std::string> {}::inputNames() {{ return {{{}}}; }}\n", name,
                     fmt::join(inputs, ", "));
    s += fmt::format("std::vector<std::string> {}::outputNames() {{ return {{{}}}; }}\n\n", name,
                     fmt::join(outputs, ", "));
    s += fmt::format("support::Shape {}::inputShape(const std::string& name) {{\n", name);
    for (size_t k = 0; k < irFn.inputs.size(); ++k)
      s += fmt::format("if (name == {}) return {};\n", quote(irFn.inputs[k].name),
                       list(sizesOf(irFn.inputs[k].type)));
    s += fmt::format(
        "throw std::invalid_argument(\"{}: no input named '\" + name + \"'\");\n}}\n\n", fn.name);
  }
  s += paramSpecs();
  emitConstructor(s, hoisted);
  s += fmt::format("{0}::Outputs {0}::run(const Inputs& inputs) {{\n", name);
  s += target->prologue();
  // The run's event in a trace (meshrt/Trace.h): what `meshc run --profile` counts steps by.
  s += fmt::format("MESHRT_TRACE_RUN(world_, {});\n", quote(fn.name));
  s += fmt::format("// Arena: {} bytes for {} bytes of temporaries (placed by liveness).\n",
                   kernels.arenaBytes, kernels.temporaryBytes);
  for (size_t k = 0; k < irFn.inputs.size(); ++k)
    s += fmt::format("support::checkShape(\"input\", {}, inputs.{}, {});\n",
                     quote(irFn.inputs[k].name), identifier(irFn.inputs[k].name),
                     list(sizesOf(local(fn.inputs[k]))));
  s += body;
  std::string outputs = "\nOutputs outputs;\n";
  // Outputs leave the arena: the caller keeps them past the next run().
  for (size_t k = 0; k < fn.outputs.size(); ++k)
    outputs +=
        fmt::format("outputs.{0} = support::Tensor{{{1}, support::Buffer({2}.begin(), "
                    "{2}.end())}};\n",
                    identifier(fn.outputs[k].first), list(sizesOf(local(fn.outputs[k].second))),
                    kernels.buffers[size_t(kernels.outputs[k])].name);
  // An output that is a param's own storage (a metric reading a step state) is the value at the
  // start of the step: copy it out before the updates overwrite that storage.
  bool outputsFirst = false;
  for (const kir::KernelFunction::Update& update : kernels.updates)
    for (kir::BufferId output : kernels.outputs)
      outputsFirst = outputsFirst || (update.value != kernels.params[update.param] &&
                                      output == kernels.params[update.param]);
  if (outputsFirst) s += outputs;
  if (hasUpdates()) {
    // Every update read the step's old values; the new ones replace them now (those computed
    // in their param's storage already did).
    s += "\n// The step's updates.\n";
    for (const kir::KernelFunction::Update& update : kernels.updates)
      if (update.value != kernels.params[update.param])
        s += onParamStages(update.param,
                           fmt::format("support::copyValues({1}, {0}); // {2}\n",
                                       kernels.buffers[size_t(update.value)].name,
                                       paramMember(update.param), irFn.params[update.param].path));
    s += "++step_;\n";
  }
  if (!outputsFirst) s += outputs;
  s += "return outputs;\n}\n\n";
  for (size_t k = 0; k < parts.size(); ++k)
    pieces.push_back(fmt::format("void {}::runPart{}(const Inputs& inputs) {{\n(void)inputs;\n"
                                 "MESHRT_TRACE_SPAN(world_);\n{}}}\n\n",
                                 name, k, parts[k]));
  for (size_t k = 0; k < subroutineSignatures.size(); ++k)
    pieces.push_back(fmt::format("void {}::{} {{\nMESHRT_TRACE_SPAN(world_);\n{}}}\n\n", name,
                                 subroutineSignatures[k], subroutineBodies[k]));
  emitHelpers(tail);
  tail += checkpointDefinitions;
  return llvm::Error::success();
}

void FunctionEmitter::emitConstructor(std::string& s, const std::string& hoisted) {
  // The mesh is checked first; subgroups are created up front, in a fixed order, on every rank.
  s += fmt::format("{0}::{0}(meshrt::Communicator& world, uint64_t seed)\n: "
                   "world_(support::checkedWorld(world, mesh(), {1})), seed_(seed)",
                   name, quote(fn.name));
  for (const plan::AxisList& axes : groups)
    s += fmt::format(",\n{}(world_.subgroup(std::vector<std::string>{}))", groupMember(axes),
                     stringList(axes));
  s += " {\n";
  s += target->prologue();
  if (!irFn.params.empty()) {
    // One loop over constant tables (support::initParams): a block of code per param took
    // seconds to compile in the larger examples.
    std::vector<std::string> inits;
    for (size_t k = 0; k < irFn.params.size(); ++k) {
      const ir::ParamInfo& param = irFn.params[k];
      // Sema gives every initializer at most two keyword arguments (ParamInit's slots).
      std::vector<std::string> args;
      for (const auto& [key, value] : param.init.args)
        args.push_back(fmt::format("{{{}, {}}}", quote(key), doubleLiteral(value)));
      assert(args.size() <= 2 && "an initializer with more than two arguments");
      inits.push_back(fmt::format("// {} ({}:{})\n{{{}, {}, {{{}}}}}", param.path, param.loc.file,
                                  param.loc.line, quote(param.init.kind),
                                  dtypeEnum(local(fn.params[k]).dtype), fmt::join(args, ", ")));
    }
    s += fmt::format("static constexpr support::ParamInit inits[] = {{\n{}}};\n{}"
                     "support::initParams(world_, seed, {}, {}, inits, data);\n",
                     fmt::join(inits, ",\n"), paramData(),
                     kernels.stages.count > 1 ? "stage_" : "-1", paramTable());
  }
  if (!hoisted.empty()) s += "computeInvariants();\n";
  s += "}\n\n";
  if (!hoisted.empty())
    s += fmt::format("void {}::computeInvariants() {{\n{}{}}}\n\n", name, target->prologue(),
                     hoisted);
}

void FunctionEmitter::emitHelpers(std::string& s) {
  // synthesizeInputs
  s += fmt::format("{0}::Inputs {0}::synthesizeInputs(uint64_t seed) const {{\nInputs inputs;\n",
                   name);
  for (size_t k = 0; k < irFn.inputs.size(); ++k) {
    const ir::InputInfo& input = irFn.inputs[k];
    SpmdValueId id = fn.inputs[k];
    std::string member = "inputs." + identifier(input.name);
    s += fmt::format("{}.shape = {};\n{}.data.resize({});\n", member, list(sizesOf(local(id))),
                     member, local(id).numElements());
    s += "{\n" + shardDeclaration(id);
    if (input.type.dtype == DType::I32) // i32 values are held in float buffers (exact to 2^24)
      s += fmt::format("std::vector<int32_t> ids({0}.data.size());\n"
                       "meshrt::kernels::fillInput(ids.data(), shard, seed, {1}, {2});\n"
                       "std::copy(ids.begin(), ids.end(), {0}.data.begin());\n",
                       member, quote(input.name), input.indexBound);
    else
      s += fmt::format("meshrt::kernels::fillInput({}.data.data(), shard, seed, {}, {});\n", member,
                       quote(input.name), valueTypeEnum(input.type.dtype));
    s += "}\n";
  }
  s += "return inputs;\n}\n\n";

  // scatterInput / gatherOutput: the same shard geometry, from any rank's coordinates.
  auto startsOfRank = [&](SpmdValueId id, const std::string& meshExpr, const std::string& rank) {
    std::vector<std::string> starts;
    const TensorType& type = local(id);
    for (size_t d = 0; d < type.dims.size(); ++d) {
      const plan::AxisList& axes = layout(id).dimAxes[d];
      starts.push_back(axes.empty() ? "0"
                                    : fmt::format("support::shardStartOf({}, {}, {}, {})", meshExpr,
                                                  rank, stringList(axes), type.dims[d].size));
    }
    return fmt::format("support::Shape{{{}}}", fmt::join(starts, ", "));
  };
  s += fmt::format("support::Tensor {}::scatterInput(meshrt::Communicator& world, const "
                   "std::string& name, const support::Tensor& global) {{\n",
                   name);
  for (size_t k = 0; k < irFn.inputs.size(); ++k) {
    SpmdValueId id = fn.inputs[k];
    s += fmt::format("if (name == {0}) {{\nsupport::checkShape(\"global input\", name, global, "
                     "{1});\nreturn support::Tensor{{{2}, support::sliceShard(global.data, "
                     "{2}, {3}, {4})}};\n}}\n",
                     quote(irFn.inputs[k].name), list(sizesOf(global(id))),
                     list(sizesOf(local(id))), list(rowMajorStrides(global(id))),
                     startsOfRank(id, "world.mesh()", "world.rank()"));
  }
  s += fmt::format("throw std::invalid_argument(\"{}: no input named '\" + name + \"'\");\n}}\n\n",
                   fn.name);
  s += fmt::format("support::Tensor {}::gatherOutput(meshrt::Communicator& world, const "
                   "std::string& name, const support::Tensor& local) {{\n",
                   name);
  for (const auto& [outName, id] : fn.outputs) {
    s += fmt::format("if (name == {0}) {{\nsupport::checkShape(\"local output\", name, local, "
                     "{1});\nreturn support::Tensor{{{2}, support::gatherShards(world, "
                     "local.data, {1}, {2}, [&](int rank) {{ return {3}; }})}};\n}}\n",
                     quote(outName), list(sizesOf(local(id))), list(sizesOf(global(id))),
                     startsOfRank(id, "world.mesh()", "rank"));
  }
  s += fmt::format("throw std::invalid_argument(\"{}: no output named '\" + name + \"'\");\n}}\n\n",
                   fn.name);
  emitParamAccess(s);
}

void FunctionEmitter::emitParamAccess(std::string& s) {
  if (hasUpdates()) {
    s += stepDefinition();
  }
  std::vector<std::string> paths, states;
  for (const ir::ParamInfo& param : irFn.params) {
    paths.push_back(quote(param.path));
    if (param.role == ir::ParamRole::OptimizerState) states.push_back(quote(param.path));
  }
  // Tables of literals: a braced list of std::string temporaries compiles slowly (each element
  // constructed, and destroyed again on unwinding).
  if (paths.empty())
    s += fmt::format("std::vector<std::string> {}::paramNames() {{ return {{}}; }}\n\n", name);
  else
    s += fmt::format("std::vector<std::string> {}::paramNames() {{\nstatic constexpr const char* "
                     "names[] = {{{}}};\nreturn {{std::begin(names), std::end(names)}};\n}}\n\n",
                     name, fmt::join(paths, ", "));
  s += fmt::format("bool {}::isOptimizerState(const std::string& path) {{\n", name);
  if (states.empty())
    s += "(void)path;\nreturn false;\n}\n\n";
  else
    s += fmt::format("static constexpr std::string_view states[] = {{{}}};\nreturn "
                     "std::find(std::begin(states), std::end(states), std::string_view(path)) != "
                     "std::end(states);\n}}\n\n",
                     fmt::join(states, ", "));
  s += fmt::format("std::vector<support::ParamShard> {}::paramShards() {{\n", name);
  if (irFn.params.empty())
    s += "return {};\n}\n\n";
  else
    s += fmt::format("{}return support::paramShardsOf<support::ParamShard>({}, data);\n}}\n\n",
                     paramData(), paramTable());
  s += fmt::format("support::Tensor {0}::getParam(const std::string& path) {{\nauto shards = "
                   "paramShards();\nreturn support::gatherParam(world_, "
                   "support::findParamShard(shards, path, {1}));\n}}\n\n",
                   name, quote(fn.name));
  s += fmt::format("void {0}::setParam(const std::string& path, const support::Tensor& global) "
                   "{{\nauto shards = paramShards();\nsupport::scatterParam(world_, "
                   "support::findParamShard(shards, path, {1}), global);\n}}\n\n",
                   name, quote(fn.name));
}

std::string FunctionEmitter::paramSpecs() const {
  // A constant table and one loop (ParamShard initializers cost seconds of compile time).
  std::vector<std::string> specs;
  for (size_t k = 0; k < irFn.params.size(); ++k) {
    const ir::ParamInfo& param = irFn.params[k];
    SpmdValueId id = fn.params[k];
    std::vector<std::string> dims;
    for (size_t d = 0; d < global(id).dims.size(); ++d)
      dims.push_back(fmt::format("{}:{}:{}:{}", global(id).dims[d].name, global(id).dims[d].size,
                                 local(id).dims[d].size, fmt::join(layout(id).dimAxes[d], "+")));
    // Pipeline stages: the stages holding it (its buffer is empty on the others).
    std::string stages =
        paramStages(k) ? fmt::format(", {:#x}, {}", paramStages(k), quote(kernels.stages.axis))
                       : "";
    specs.push_back(fmt::format("{{{}, {}, {}, {}{}}}", quote(param.path),
                                param.role == ir::ParamRole::OptimizerState ? "true" : "false",
                                quote(ir::dtypeName(param.type.dtype)),
                                quote(fmt::format("{}", fmt::join(dims, " "))), stages));
  }
  if (specs.empty()) return "";
  return fmt::format(
      "/// `{}`'s params: paths, dims and layouts (its constructor and paramShards() "
      "read it).\nstatic constexpr support::ParamSpec {}[] = {{\n{}}};\n\n",
      fn.name, paramTable(), fmt::join(specs, ",\n"));
}

std::string FunctionEmitter::paramData() const {
  std::vector<std::string> data;
  for (size_t k = 0; k < irFn.params.size(); ++k)
    data.push_back("&" + paramMember(k));
  return fmt::format("support::Buffer* const data[] = {{{}}};\n", fmt::join(data, ", "));
}

void FunctionEmitter::emitCheckpointApi(std::string& h, std::string& s) const {
  bool train = fn.kind == ir::Function::Kind::Train;
  h += "/// Saves every param (optimizer state included), the step count and the seed as a new "
       "checkpoint under `dir` (collective: every rank calls it). Atomic: a crash during the "
       "save leaves the previous checkpoint the one that loads.\n"
       "void save(const std::string& dir);\n"
       "/// Loads the latest complete checkpoint under `dir` into the params, the step count and "
       "the seed (collective). It may have been saved on any mesh and layout: each rank reads "
       "what covers its shards. Throws meshrt::CheckpointError on a missing param, a shape or "
       "dtype mismatch or a checksum error.\n"
       "void load(const std::string& dir);\n\n";
  // The params come from paramShards() (paths, global dims, layouts, this rank's buffers).
  s += fmt::format("void {}::save(const std::string& dir) {{\nauto shards = paramShards();\n"
                   "support::saveParams(world_, dir, shards, "
                   "{{{}, {{{{\"program\", {}}}, {{\"seed\", std::to_string(seed_)}}, {{\"mesh\", "
                   "mesh().str()}}}}}});\n}}\n\n",
                   name, train ? "step_" : "0", quote(fn.name));
  s += fmt::format("void {}::load(const std::string& dir) {{\nauto shards = paramShards();\n"
                   "meshrt::CheckpointInfo info = support::loadParams(world_, dir, shards);\n",
                   name);
  s += train ? "step_ = info.step;\n" : "(void)info.step; // a program keeps no step count\n";
  s += "if (auto seed = info.metadata.find(\"seed\"); seed != info.metadata.end()) seed_ = "
       "std::stoull(seed->second);\n}\n\n";
}

// The runner runs on the host on every target: its own values are meshc::gen's host types.
std::string FunctionEmitter::inputsOfStep(const std::string& step) const {
  std::string s =
      // program.seed(), not the command line's: after --load, the saved run's seed, so a resumed
      // run trains on the batches the uninterrupted one would have.
      fmt::format("auto inputs = program.synthesizeInputs(program.seed() + uint64_t({}));\n", step);
  for (const ir::InputInfo& input : irFn.inputs)
    s += fmt::format("if (auto given = givenInputs.find({0}); given != givenInputs.end())\n"
                     "inputs.{1} = {2}::scatterInput(world, {3}, meshc::gen::batchOfStep({0}, "
                     "given->second, {2}::inputShape({3}), {4}));\n",
                     quote(fn.name + "." + input.name), identifier(input.name), name,
                     quote(input.name), step);
  return s;
}

std::string FunctionEmitter::stepDeclaration() const {
  std::string h =
      "/// One training step on this rank's shards (collective): forward, backward and the "
      "optimizer's update, applied to the params; increments the step counter. Returns "
      "the global loss (every rank gets it)";
  std::vector<std::string> metrics = metricNames();
  if (metrics.empty())
    return h +
           ". run() is the same step, returning the outputs.\nfloat step(const Inputs& inputs);\n";
  // With metrics, a struct that still converts to the loss, so `float loss = step(...)` works.
  h += " and the metrics, computed from the params before the update. run() is the same step, "
       "returning the outputs.\nstruct StepResult {\nfloat loss = 0;\n";
  for (const std::string& metric : metrics)
    h += fmt::format("float {} = 0;\n", identifier(metric));
  return h +
         "operator float() const { return loss; }\n};\nStepResult step(const Inputs& inputs);\n";
}

std::string FunctionEmitter::stepDefinition() const {
  // The loss and the metrics are scalars, resolved (replicated): every rank holds the global value.
  auto loss = llvm::find_if(fn.outputs, [](const auto& output) { return output.first == "loss"; });
  std::string lossField =
      loss == fn.outputs.end() ? identifier(fn.outputs.front().first) : identifier(loss->first);
  std::vector<std::string> metrics = metricNames();
  if (metrics.empty())
    return fmt::format(
        "float {0}::step(const Inputs& inputs) {{\nreturn run(inputs).{1}.data.at(0);"
        "\n}}\n\n",
        name, lossField);
  std::string s =
      fmt::format("{0}::StepResult {0}::step(const Inputs& inputs) {{\nauto outputs = "
                  "run(inputs);\nStepResult result;\nresult.loss = outputs.{1}.data.at(0);\n",
                  name, lossField);
  for (const std::string& metric : metrics)
    s += fmt::format("result.{0} = outputs.{0}.data.at(0);\n", identifier(metric));
  return s + "return result;\n}\n\n";
}

std::string FunctionEmitter::stepLoop() const {
  // Each step's line gives the loss and the metrics (as the interpreter prints them); the results
  // get the last step's loss and metrics as <fn>.loss and <fn>.<metric>. step() returns a float
  // without metrics and a StepResult that converts to it with them.
  std::vector<std::string> metrics = metricNames();
  std::string result = metrics.empty() ? "float" : name + "::StepResult";
  std::string format = "step %lld loss %.9g", args, keep;
  for (const std::string& metric : metrics) {
    format += fmt::format(" {} %.9g", metric);
    args += fmt::format(", double(result.{})", identifier(metric));
    keep += fmt::format(
        "if (world.rank() == 0) results.push_back({{{}, \"f32\", {{}}, {{last.{}}}}});\n",
        quote(fn.name + "." + metric), identifier(metric));
  }
  return fmt::format(
      "if (steps > 0) {{\n{0} last{{}};\nif (world.rank() == 0) std::printf(\"train %s: %lld "
      "steps, %s\\n\", {8}, (long long)steps, fixedBatch ? \"each on the same batch (step 0's; "
      "--fixed-batch)\" : \"each on a new batch (step s's: synthetic from seed + s, or batch s mod "
      "k of the data file; --fixed-batch repeats step 0's)\");\nfor (int64_t first = "
      "program.stepCount(), s = first; s < first + steps; ++s) {{\n{1}auto result = "
      "program.step(inputs);\nif (world.rank() == 0) "
      "std::printf(\"{2}\\n\", (long long)s, double(float(result)){3});\nlast = result;\n}}\n"
      "if (world.rank() == 0) results.push_back({{{4}, \"f32\", {{}}, {{float(last)}}}});\n{5}{9}"
      "for (const auto& shard : program.paramShards()) {{\n"
      "auto global = program.getParam(shard.path);\nif (world.rank() == 0) "
      "results.push_back({{{6} + shard.path, shard.dtype, std::move(global.shape), "
      "std::move(global.data)}});\n}}\nif (!saveDir.empty()) program.save(saveDir + {7});\n"
      "return;\n}}\n",
      result, inputsOfStep("fixedBatch ? 0 : s"), format, args, quote(fn.name + ".loss"), keep,
      quote(fn.name + ".param."), quote("/" + fn.name), quote(fn.name), stageParamBytes());
}

std::string FunctionEmitter::stageParamBytes() const {
  if (kernels.stages.count <= 1) return "";
  // Pipeline stages: each stage holds its layers' params and optimizer state only.
  return fmt::format(
      "{{\nstd::vector<double> held(size_t(world.size()));\ndouble all = 0;\n"
      "for (const auto& shard : program.paramShards()) {{\n"
      "held[size_t(world.rank())] += double(shard.data->size()) * sizeof(float);\n"
      "all += double(meshc::gen::product(shard.globalShape)) * sizeof(float);\n}}\n"
      "world.allReduce(held.data(), held.size(), meshrt::ReduceOp::Sum);\n"
      "if (world.rank() == 0) std::printf(\"pipeline stages over {0}: params and optimizer state "
      "held per rank: %.0f bytes at most, %.0f at least, of %.0f in all\\n\", "
      "*std::max_element(held.begin(), held.end()), *std::min_element(held.begin(), held.end()), "
      "all);\n"
      "if (world.rank() == 0) std::printf(\"pipeline stages over {0}: run()'s arena per stage: "
      "{1} bytes\\n\");\n}}\n",
      kernels.stages.axis, fmt::join(kernels.stageArenaBytes, ", "));
}

std::string FunctionEmitter::runnerBody() const {
  std::string s;
  std::string kindWord = fn.kind == ir::Function::Kind::Train ? "train" : "program";
  // Warm-up runs, then kTimedRuns timed ones; the time of a run is its slowest rank's (a max
  // all-reduce, so that it also holds when the ranks are processes), and its span, from the first
  // rank's start to the last rank's end (the threads backend's ranks share one clock): a rank
  // that shares its core starts its clock only once the core is its own, so with no collective
  // between them the slowest rank leaves out its core-mates' work.
  s += fmt::format("{{\n// {} {}\nstd::vector<double> milliseconds, spans;\nconst char* backend = "
                   "\"\";\nmeshc::gen::BackToBack backToBack;\n",
                   kindWord, fn.name);
  s += fmt::format("lead = {}({}::mesh(), launchOptions, [&](meshrt::Communicator& "
                   "world) {{\n",
                   target->launchFunction(), name);
  s += fmt::format("{} program(world, seed);\n", name);
  // --load DIR / --save DIR: this function's checkpoints are DIR/<function name>.
  std::string checkpointDir = quote("/" + fn.name);
  s += fmt::format("if (!loadDir.empty()) program.load(loadDir + {});\n", checkpointDir);
  if (hasUpdates()) {
    // --steps N: N training steps on the inputs of steps 0..N-1 (inputsOfStep), the loss of each
    // printed as the interpreter prints it; then the last loss and every final param, named as
    // `meshc --emit=run --steps N --dump-outputs` names them (<fn>.loss, <fn>.param.<path>).
    s += stepLoop();
  }
  // A train step's outputs are step 0's (the first run); later runs are timed only.
  s += inputsOfStep("0") + "auto outputs = program.run(inputs);\n";
  // Then warm-up runs, so that the timed ones see the steady state (support::warmUp).
  s += "meshc::gen::warmUp(world, [&] { program.run(inputs); });\n";
  s += fmt::format(
      "std::vector<double> runs(kTimedRuns), ends(2 * kTimedRuns);\nusing Ms = "
      "std::chrono::duration<double, std::milli>;\nfor (int i = 0; i < kTimedRuns; ++i) "
      "{{\nworld.barrier();\nauto start = std::chrono::steady_clock::now();\n"
      "{}program.run(inputs);\nauto end = std::chrono::steady_clock::now();\n"
      "runs[size_t(i)] = Ms(end - start).count();\n"
      "ends[size_t(2 * i)] = -Ms(start.time_since_epoch()).count();\n"
      "ends[size_t(2 * i + 1)] = Ms(end.time_since_epoch()).count();\n}}\n"
      "world.allReduce(runs.data(), runs.size(), meshrt::ReduceOp::Max);\n"
      "world.allReduce(ends.data(), ends.size(), meshrt::ReduceOp::Max);\n"
      "if (world.rank() == 0) {{\nmilliseconds = runs;\nbackend = world.backend();\n"
      "for (int i = 0; i < kTimedRuns; ++i)\nspans.push_back(ends[size_t(2 * i)] + "
      "ends[size_t(2 * i + 1)]);\n}}\n",
      hasUpdates() ? "" : "outputs = ");
  // Then runs back to back after one barrier, as a training loop's steps follow each other: the
  // ranks' wake-up after a barrier (microseconds per rank a core holds) is then paid once a
  // window of runs, not per run (support::timeBackToBack: the median of a few windows; every
  // rank gets the same figures, rank 0 keeps them).
  s += fmt::format("auto steady = meshc::gen::timeBackToBack(world, runs, [&] {{ "
                   "{}program.run(inputs); }});\nif (world.rank() == 0) backToBack = steady;\n",
                   hasUpdates() ? "" : "outputs = ");
  for (const auto& [outName, id] : fn.outputs) {
    std::string field = identifier(outName), gathered = "gathered_" + field;
    s += fmt::format("auto {} = {}::gatherOutput(world, {}, outputs.{});\n", gathered, name,
                     quote(outName), field);
    s += fmt::format("if (world.rank() == 0) results.push_back({{{}, {}, std::move({}.shape), "
                     "std::move({}.data)}});\n",
                     quote(fn.name + "." + outName), quote(ir::dtypeName(global(id).dtype)),
                     gathered, gathered);
  }
  s += fmt::format("if (!saveDir.empty()) program.save(saveDir + {});\n", checkpointDir);
  s += "});\n";
  s += fmt::format("if (lead{}) report({}, {}::mesh().size(), backend, milliseconds, spans, "
                   "backToBack);\n}}\n",
                   hasUpdates() ? " && steps == 0" : "", quote(kindWord + " " + fn.name), name);
  return s;
}

std::string formatCpp(const std::string& code, const std::string& fileName) {
  clang::format::FormatStyle style = clang::format::getLLVMStyle();
  style.ColumnLimit = 100;
  std::vector<clang::tooling::Range> ranges{clang::tooling::Range(0, unsigned(code.size()))};
  clang::tooling::Replacements replacements =
      clang::format::reformat(style, code, ranges, fileName);
  llvm::Expected<std::string> formatted = clang::tooling::applyAllReplacements(code, replacements);
  if (!formatted) {
    llvm::consumeError(formatted.takeError());
    return code;
  }
  return *formatted;
}

/// The definitions of a source split into parts (CppOptions::sourceParts).
struct SplitSource {
  struct Part {
    std::string fileScope; // in the file scope's namespace (FileScope::declarations)
    std::string classes;   // the classes' members
  };
  std::vector<Part> parts;
};

/// The definitions of `scope` and `emitters` spread over as many of `wanted` parts as the code's
/// size pays for (kMinPartBytes each), balanced by size: whole pieces (a loop nest, a run()
/// part, a subroutine, the rest of a class) go, largest first, to the part holding the least
/// so far, and each part keeps its pieces in the one-file order. Nothing when that is one part.
std::optional<SplitSource>
splitSource(const FileScope& scope, const std::vector<std::unique_ptr<FunctionEmitter>>& emitters,
            size_t wanted) {
  struct Piece {
    std::string text;
    bool fileScope;
  };
  std::vector<Piece> pieces;
  // The constants first, in the first part (no initializer reads another part's).
  pieces.push_back({scope.constantDefinitions(), true});
  // Every class's members but run()'s parts and the subroutines, together and in the first
  // part: a class's read the namespace-scope table of its params (paramSpecs), and all call the
  // same support functions (checkpoints, gathers, shape checks), which every translation unit
  // calling one compiles again.
  std::string members;
  for (const auto& emitter : emitters)
    members += emitter->head + emitter->tail;
  pieces.push_back({members, false});
  for (size_t k = 0; k < scope.functionCount(); ++k)
    pieces.push_back({scope.functionDefinition(k), true});
  for (const auto& emitter : emitters)
    for (const std::string& piece : emitter->pieces)
      pieces.push_back({piece, false});
  const size_t pinned = 2; // the constants and the members: in the first part
  size_t bytes = 0;
  for (const Piece& piece : pieces)
    bytes += piece.text.size();
  size_t parts = std::min(wanted, std::max<size_t>(1, bytes / kMinPartBytes));
  if (parts <= 1) return std::nullopt;
  std::vector<size_t> order(pieces.size()), partOf(pieces.size()), load(parts, 0);
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin() + pinned, order.end(), [&](size_t a, size_t b) {
    return pieces[a].text.size() > pieces[b].text.size();
  });
  for (size_t k : order) {
    size_t part =
        k < pinned ? 0 : size_t(std::min_element(load.begin(), load.end()) - load.begin());
    partOf[k] = part;
    load[part] += pieces[k].text.size();
  }
  SplitSource split;
  split.parts.resize(parts);
  for (size_t k = 0; k < pieces.size(); ++k)
    (pieces[k].fileScope ? split.parts[partOf[k]].fileScope : split.parts[partOf[k]].classes) +=
        pieces[k].text;
  return split;
}

} // namespace

llvm::Expected<CppOutput> emitCpp(const ir::Module& module,
                                  const std::vector<plan::PlannedFunction>& plans,
                                  const CppOptions& options) {
  return emitWithTarget(module, plans, options, *makeCpuTarget());
}

llvm::Expected<CppOutput> emitWithTarget(const ir::Module& module,
                                         const std::vector<plan::PlannedFunction>& plans,
                                         const CppOptions& options, const Target& target) {
  llvm::Expected<kir::KernelModule> kernels =
      kir::lowerModule(module, plans, kir::LowerOptions{options.disabledPasses});
  if (!kernels) return kernels.takeError();
  std::vector<std::unique_ptr<FunctionEmitter>> emitters;
  FileScope scope;
  // A microbatched train block's class takes the whole step's inputs (its plan and kernel IR are
  // one microbatch's): it is emitted from copies with the inputs widened.
  std::deque<std::pair<ir::Function, plan::SpmdFunction>> widened;
  for (size_t k = 0; k < plans.size(); ++k) {
    const ir::Function* irFn = module.findFunction(plans[k].spmd.name);
    const plan::SpmdFunction* spmd = &plans[k].spmd;
    if (spmd->microbatching.count > 1) {
      widened.emplace_back(*irFn, *spmd);
      kir::widenInputsToStep(widened.back().first, widened.back().second);
      irFn = &widened.back().first;
      spmd = &widened.back().second;
    }
    auto emitter =
        std::make_unique<FunctionEmitter>(*irFn, *spmd, kernels->functions[k], target, scope);
    if (auto error = emitter->emit()) return error;
    emitters.push_back(std::move(emitter));
  }
  std::string file = module.functions.empty() ? std::string() : module.functions.front().loc.file;
  CppOutput output;
  std::string& h = output.header;
  h += fmt::format("// Generated by meshc from {}: {}. Do not edit.\n", file, target.description());
  h += fmt::format("#pragma once\n\n#include \"{}\"\n\n#include <cstdint>\n"
                   "#include <string>\n#include <vector>\n\n",
                   target.supportHeader());
  h += fmt::format("namespace {} {{\n\n", options.cppNamespace);
  h += fmt::format(
      "/// The support code this target's generated code calls.\nnamespace support = {};\n\n",
      target.supportNamespace());
  for (const auto& emitter : emitters)
    h += emitter->declaration;
  h += fmt::format("}} // namespace {}\n", options.cppNamespace);

  // The headers of the user's functions (`call` ops), relative to the main .mesh file's directory.
  std::string includes;
  std::set<std::string> userHeaders;
  for (const ir::Function& irFn : module.functions)
    for (const ir::Op& op : irFn.ops)
      if (op.kind == OpKind::Call && userHeaders.insert(op.string("header")).second)
        includes += fmt::format("#include \"{}\"\n", op.string("header"));
  includes += "#include <cmath>\n\n";
  if (std::optional<SplitSource> split = splitSource(scope, emitters, options.sourceParts)) {
    // The parts' shared header: the includes, and what the file scope defines once for all the
    // parts, in a namespace of this model's own (two models' parts may be linked together).
    std::string detail =
        identifier(llvm::StringRef(options.headerInclude).rsplit('.').first.str()) + "_parts";
    std::string& p = output.partsHeader;
    p += fmt::format("// Generated by meshc from {}: what the {} parts of the source of {} share. "
                     "Do not edit.\n#pragma once\n\n#include \"{}\"\n\n",
                     file, split->parts.size(), options.headerInclude, options.headerInclude);
    p += includes + fmt::format("namespace {} {{\n\n", options.cppNamespace);
    p += fmt::format("/// The shapes the kernel calls take and the loop nests the classes share, "
                     "each defined in one part.\nnamespace {0} {{\n{1}}} // namespace {0}\n"
                     "using namespace {0};\n\n",
                     detail, scope.declarations());
    p += fmt::format("}} // namespace {}\n", options.cppNamespace);
    for (size_t k = 0; k < split->parts.size(); ++k) {
      std::string part = fmt::format(
          "// Generated by meshc from {}: {}; part {} of {} of the source of {}. Do not edit.\n"
          "#include \"{}\"\n\nnamespace {} {{\n\n",
          file, target.description(), k + 1, split->parts.size(), options.headerInclude,
          options.partsHeaderInclude, options.cppNamespace);
      if (!split->parts[k].fileScope.empty())
        part += fmt::format("namespace {0} {{\n\n{1}}} // namespace {0}\n\n", detail,
                            split->parts[k].fileScope);
      part += split->parts[k].classes + fmt::format("}} // namespace {}\n", options.cppNamespace);
      (k == 0 ? output.source : output.moreSources.emplace_back()) = std::move(part);
    }
  } else {
    std::string& s = output.source;
    s += fmt::format("// Generated by meshc from {}: {}. Do not edit.\n", file,
                     target.description());
    s += fmt::format("#include \"{}\"\n\n", options.headerInclude);
    s += includes;
    s += fmt::format("namespace {} {{\n\n", options.cppNamespace);
    if (std::string definitions = scope.definitions(); !definitions.empty())
      s += "// The shapes the kernel calls take and the loop nests the classes share.\n" +
           definitions + "\n";
    for (const auto& emitter : emitters)
      s += emitter->definition();
    s += fmt::format("}} // namespace {}\n", options.cppNamespace);
  }
  // The parts that the code's size does not pay for (CppOptions::sourceParts).
  for (size_t k = output.moreSources.size() + 1; k < options.sourceParts; ++k)
    output.moreSources.push_back(fmt::format(
        "// Generated by meshc from {}: part {} of the source of {}: empty (the code is too "
        "small to split this far).\n",
        file, k + 1, options.headerInclude));
  if (options.sourceParts > 1 && output.partsHeader.empty())
    output.partsHeader = fmt::format(
        "// Generated by meshc from {}: the source of {} is one file (too small to split); "
        "nothing to share.\n#pragma once\n",
        file, options.headerInclude);

  if (options.runner) {
    std::string& r = output.runner;
    r += fmt::format(
        "// Generated by meshc from {}: runs every program and train block with the inputs the "
        "reference interpreter synthesizes, and writes the gathered outputs. {}.\n// Usage: "
        "<binary> {}<outputs-file> [seed] [inputs-file] [--steps N] [--fixed-batch] [--load DIR] "
        "[--save DIR] "
        "[--trace FILE]\n// --trace FILE: writes a Chrome trace of every rank (meshrt/Trace.h).\n"
        "// --steps N: train blocks take N training steps instead, printing each step's loss, and "
        "write their final params.\n// --fixed-batch: with --steps, every step trains on step 0's "
        "inputs (else each on its own).\n// --load DIR / --save DIR: each program and train block "
        "loads its checkpoint from DIR/<name> first / saves one there at the end (on any mesh).\n",
        file, target.backendNote(), target.backendUsage());
    r += fmt::format("#include \"{}\"\n\n#include \"{}\"\n\n#include <algorithm>\n"
                     "#include <chrono>\n#include <cstdio>\n#include <cstdlib>\n#include "
                     "<exception>\n\n",
                     options.headerInclude, target.launchInclude());
    r += fmt::format("using namespace {};\n\n", options.cppNamespace);
    r += "struct Result {\nstd::string name, dtype;\nmeshc::gen::Shape shape;\nmeshc::gen::Buffer "
         "data;\n};\n\n";
    // Four decimals (0.1 us): a program of a microsecond (t5.mesh's position_buckets) read as 0
    // at three, which bench/fidelity.py then counted as a miss.
    r += "constexpr int kTimedRuns = 5;\n\n"
         "/// Prints the median and best of the timed runs (each: its slowest rank) and, on the "
         "threads backend\n/// with several ranks, of their spans (the first rank's start to the "
         "last rank's end); then\n/// the time a run of the runs timed back to back (the median "
         "window).\n"
         "void report(const char* what, int ranks, const char* backend, std::vector<double> runs, "
         "std::vector<double> spans, meshc::gen::BackToBack backToBack) {\n"
         "std::sort(runs.begin(), runs.end());\n"
         "std::printf(\"%s: %d ranks, run %.4f ms median, %.4f ms best of %d (slowest rank; "
         "after %.0f ms of warm-up runs; %s backend)\\n\", what, ranks, runs[runs.size() / 2], "
         "runs.front(), kTimedRuns, meshc::gen::kWarmUpMilliseconds, backend);\nbool spanned = "
         "ranks > 1 && std::string(backend) "
         "== \"threads\";\nif (spanned) {\nstd::sort(spans.begin(), spans.end());\n"
         "std::printf(\"%s: span %.4f ms median, %.4f ms best (the first rank's start to the last "
         "rank's end)\\n\", what, spans[spans.size() / 2], spans.front());\n}\n"
         "std::printf(\"%s: back to back %.6f ms a run (the median of %d windows of %d runs, "
         "each after one barrier, %s)\\n\", what, backToBack.milliseconds, backToBack.windows, "
         "backToBack.runs, spanned ? \"the first rank's start to the last rank's end\" : "
         "\"slowest rank\");\n}\n\n";
    // Under MPI every process runs main; only the one holding world rank 0 (`lead`) reports and
    // writes the outputs.
    r +=
        fmt::format("int main(int argc, char** argv) {{\nmeshc::gen::usePassiveOpenMPWaits(argv);\n"
                    "std::vector<Result> results;\nbool lead = true;\n"
                    "std::vector<std::string> positional;\nint64_t steps = 0;\nbool fixedBatch = "
                    "false;\nstd::string loadDir, "
                    "saveDir;\ntry {{\n{}\n",
                    target.launchOptions());
    r +=
        "for (int i = 1; i < argc; ++i) {\n"
        "if (std::string(argv[i]) == \"--steps\" && i + 1 < argc)\n"
        "steps = std::strtoll(argv[++i], nullptr, 10);\n"
        "else if (std::string(argv[i]) == \"--load\" && i + 1 < argc)\nloadDir = argv[++i];\n"
        "else if (std::string(argv[i]) == \"--save\" && i + 1 < argc)\nsaveDir = argv[++i];\n"
        "else if (std::string(argv[i]) == \"--fixed-batch\")\nfixedBatch = true;\n"
        "else if (std::string(argv[i]) == \"--trace\" && i + 1 < argc)\n"
        "meshrt::trace::enable(argv[++i]);\n"
        "else\npositional.push_back(argv[i]);\n}\n"
        "if (positional.empty()) {\nstd::fprintf(stderr, \"usage: %s " +
        std::string(target.backendUsage()) +
        "<outputs-file> [seed] [inputs-file] [--steps N] [--fixed-batch] [--load DIR] [--save "
        "DIR]\\n\", "
        "argv[0]);\nreturn "
        "2;\n}\n"
        "uint64_t seed = positional.size() > 1 ? std::strtoull(positional[1].c_str(), nullptr, 10) "
        ": 0;\n(void)steps;\n(void)fixedBatch;\nmeshc::gen::useSingleThreadedBlas();\n"
        "// Inputs from a file (`meshc run --data`) replace the synthesized ones, by name.\n"
        "const std::map<std::string, meshc::gen::Tensor> givenInputs = positional.size() > 2 ? "
        "meshc::gen::readTensors(positional[2]) : std::map<std::string, meshc::gen::Tensor>();\n";
    for (const auto& emitter : emitters)
      r += emitter->runnerBody();
    r += "} catch (const std::exception& error) {\nstd::fprintf(stderr, \"error: %s\\n\", "
         "error.what());\nreturn 1;\n}\n";
    r += "if (!lead) return 0;\n";
    r += "std::FILE* file = std::fopen(positional[0].c_str(), \"wb\");\nif (!file) {\n"
         "std::fprintf(stderr, \"error: cannot open '%s'\\n\", positional[0].c_str());\nreturn "
         "2;\n}\n"
         "for (const Result& result : results)\nmeshc::gen::writeTensor(file, result.name, "
         "result.dtype.c_str(), result.shape, result.data);\nstd::fclose(file);\nreturn 0;\n}\n";
  }
  if (options.runner) output.runner = formatCpp(output.runner, "runner.cpp");
  output.header = formatCpp(output.header, "generated.h");
  output.source = formatCpp(output.source, "generated.cpp");
  output.partsHeader = formatCpp(output.partsHeader, "generated.parts.h");
  for (std::string& part : output.moreSources)
    part = formatCpp(part, "generated.cpp");
  return output;
}

} // namespace meshc::codegen
