// Internal to the planner: the lowering rule of one op under one layout (Mesh-TensorFlow's rules,
// docs/planner.md "SPMD lowering"): the layouts its operands must have, its result's layout, the
// collectives it needs inside and its roofline cost. SpmdLowering.cpp's engine walks the ops and
// calls OpRules::plan for each; the rule is a pure function of the op's shape, its operands'
// layouts and the layouts of the dims it touches, which is what lets the evaluator memoize it.
#pragma once

#include "planner/CostModel.h"
#include "planner/Layout.h"
#include "planner/LoopNests.h"
#include "planner/Machine.h"
#include "planner/SpmdIR.h"

#include "ir/IR.h"

#include <cstdint>
#include <set>
#include <string>
#include <vector>

namespace meshc::plan {

struct DroppedAxes {
  std::string dim;
  AxisList axes;
  std::string reason;
};

struct PostCollective {
  Collective collective;
  std::string note;
};

/// What the lowering rule says about one op under one layout.
struct OpPlan {
  bool divisible = true;
  std::string badDim; // the first dim whose split does not divide it
  AxisList badAxes;
  std::vector<TensorLayout> required; // per operand
  TensorLayout result;
  std::vector<PostCollective> post; // collectives inside the op (softmax statistics, halos, ...)
  std::vector<DroppedAxes> drops;   // forced replications, reported with the op's location
  double flops = 0;                 // per device
  double bytes = 0;                 // per device, read + written
  double globalFlops = 0;
  double computeSeconds = 0;
  double postSeconds = 0;
  double idealSeconds = 0; // globalFlops at the peak of the op's dtype (for utilization)
  uint64_t usedAxes = 0;   // bit i: mesh axis i splits some dim the op touches
  std::string note;
  // Filled by the engine: interned ids of `required` and `result`, the result's local bytes.
  std::vector<int> requiredIds;
  int resultId = -1;
  int64_t resultBytes = 0;
};

/// What a walk reads of an op's plan, copied next to the op's key (OpKeyTable).
struct OpCost {
  bool divisible = true;
  int resultId = -1;
  int64_t resultBytes = 0;
  uint64_t usedAxes = 0;
  double computeSeconds = 0, postSeconds = 0, globalFlops = 0, idealSeconds = 0;

  // Not from a default OpPlan: an evaluator makes one per op (40,000 at 96 layers), and an
  // OpPlan's strings, vectors and layout were most of that.
  OpCost() = default;
  explicit OpCost(const OpPlan& plan)
      : divisible(plan.divisible), resultId(plan.resultId), resultBytes(plan.resultBytes),
        usedAxes(plan.usedAxes), computeSeconds(plan.computeSeconds), postSeconds(plan.postSeconds),
        globalFlops(plan.globalFlops), idealSeconds(plan.idealSeconds) {}
};

/// Mesh axes as "a, b", for notes and reports.
std::string axesText(const AxisList& axes);

/// A one-operand op the result is linear in (the op table's linear column). A cast is linear
/// only between float types: rounding to or from i32 is not.
bool isLinearUnary(const ir::Function& fn, const ir::Op& op);

/// The lowering rules of one op (Mesh-TensorFlow's, see docs/planner.md).
class OpRules {
public:
  OpRules(const ir::Function& fn, const Mesh& mesh, const Layout& layout, const Machine& machine,
          double oversubscription)
      : fn_(fn), mesh_(mesh), layout_(layout), machine_(machine),
        oversubscription_(oversubscription) {}

  /// Whether partial sums stay lazy through linear ops. Not in a train step's update: gradients
  /// are resolved as they leave the backward pass, where their reductions can be bucketed.
  void setLazyPartials(bool lazy) { lazyPartials_ = lazy; }
  /// Operand states whose partial sums are resolved here rather than kept lazy (see planOf).
  void setEagerOperands(std::set<const TensorLayout*> eager) { eager_ = std::move(eager); }
  /// A sum's partner: the partial-sum axes of the other operand of the add, sub or div that
  /// the sum's result goes into (see widenToPartner); empty when there is none.
  void setPartner(std::set<std::string> axes, bool isDiv);
  /// The op's part in the fused loop nests (LoopNests.h), which its cost depends on.
  void setLoopRole(const LoopRole& role) { loopRole_ = role; }

  /// The axes a sum's result is partial over by its own reduction (the axes of its reduced
  /// dims), as planReduction makes it; a partner planned later than the sum it pairs with.
  std::set<std::string> reducedAxesOf(const ir::Op& sum) const;

  OpPlan plan(const ir::Op& op, const std::vector<const TensorLayout*>& operands);

private:
  AxisList axesOf(const std::string& dim) const { return layout_.of(dim); }

  void checkDivisible(const ir::TensorType& type, OpPlan& out) const;

  /// The value's layout under the program layout; an axis already used by an earlier dim of the
  /// same value is dropped from the later dim and recorded.
  TensorLayout desired(const ir::TensorType& type, OpPlan* out, const std::string& what) const;

  /// `type`'s dims laid out as in `source` (matched by dim name), replicated where absent.
  static TensorLayout alignTo(const ir::TensorType& type, const ir::TensorType& sourceType,
                              const TensorLayout& source);

  static std::set<std::string> usedAxes(const TensorLayout& layout);

  static bool disjoint(const std::set<std::string>& a, const std::set<std::string>& b);

  static bool isPartialSum(const TensorLayout& layout);

  /// Keeps `operand`'s partial sum lazy through a linear op when it does not clash with the
  /// axes of the layouts involved: `required` and `result` become partial too.
  bool passPartial(const TensorLayout& operand, TensorLayout& required, TensorLayout& result) const;

  void planElementwise(const ir::Op& op, const std::vector<const TensorLayout*>& operands,
                       OpPlan& out);

  void planEinsum(const ir::Op& op, const std::vector<const TensorLayout*>& operands, OpPlan& out);

  void planReduction(const ir::Op& op, const std::vector<const TensorLayout*>& operands,
                     OpPlan& out);

  /// A sum whose partner (setPartner) is partial over more axes is made partial over them
  /// too, exactly: each rank of the extra axes sums its own slice of a reduced dim they do not
  /// split (a local slice, no communication). The add then stays a lazy partial sum, and a div
  /// resolves both operands over one group (one merged all-reduce) instead of two.
  void widenToPartner(const ir::TensorType& operandType, const ir::TensorType& resultType,
                      OpPlan& out) const;

  /// softmax, log_softmax, layer_norm, cumsum and shift: the result has the operand's dims.
  void planAlongDims(const ir::Op& op, const std::vector<const TensorLayout*>& operands,
                     OpPlan& out);

  void planRename(const ir::Op& op, const std::vector<const TensorLayout*>& operands, OpPlan& out);

  void planReshape(const ir::Op& op, const std::vector<const TensorLayout*>& operands, OpPlan& out);

  /// slice, pad, concat: the windowed dim is gathered whole; each rank computes its own slice of
  /// the result.
  void planWindow(const ir::Op& op, const std::vector<const TensorLayout*>& operands, OpPlan& out);

  void planGather(const ir::Op& op, const std::vector<const TensorLayout*>& operands, OpPlan& out);

  /// top_k needs each row whole: the selected dim is replicated in the operand (the reshard
  /// all-gathers it when split, and is costed as such) and the new dim in the result. A
  /// local top-k per shard merged over the group would move less for small k; not done yet.
  void planTopK(const ir::Op& op, OpPlan& out);

  void addPost(OpPlan& out, CollectiveKind kind, const AxisList& axes, const std::string& dim,
               int64_t bytes, std::string note);

  /// FLOPs per element of each op class (docs/planner.md).
  static double flopsPerElement(ir::OpKind kind);

  /// A two-operand einsum's GEMM shape from the local sizes of its dims: the smallest of m
  /// (dims of the first operand and the result only), n (the second's and the result's) and k
  /// (both operands', summed), per batch element, and the batch (dims of all three).
  struct GemmShape {
    double smallest = 0, batches = 1;
  };
  GemmShape gemmShape(const ir::Op& op,
                      const std::map<std::string, std::pair<int64_t, int64_t>>& sizes) const;

  /// The rows a softmax-like kernel walks: the result's elements over the lane's local size
  /// (logsumexp's result is one element per row).
  double softmaxRows(const ir::Op& op, const OpPlan& out, double elements) const;

  /// An op other than a GEMM as the generated code runs it (machines that model loops): a share
  /// of a fused loop nest, a row-wise kernel, or another kernel call (CostModel.h).
  double kernelSeconds(const ir::Op& op, const OpPlan& out) const;

  void cost(const ir::Op& op, const std::vector<const TensorLayout*>& operands, OpPlan& out);
  /// An einsum that code generation runs as a gather or a scatter-add (Contraction.h's
  /// oneHotProduct; operand x the one-hot tensor): the kernel's bytes (set in `out`) at the
  /// stream bandwidth, plus its call's fixed cost.
  double oneHotProductSeconds(const ir::Op& op, size_t x, OneHotProduct kind, OpPlan& out) const;

  const ir::Function& fn_;
  const Mesh& mesh_;
  const Layout& layout_;
  const Machine& machine_;
  double oversubscription_;
  bool lazyPartials_ = true;
  std::set<const TensorLayout*> eager_;
  std::set<std::string> partnerAxes_;
  bool partnerIsDiv_ = false;
  LoopRole loopRole_;
};

} // namespace meshc::plan
