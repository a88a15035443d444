// SPMD lowering: given a layout for every dim, turns a named-dim IR function into the SPMD IR
// with local shapes and explicit collectives, placed where Mesh-TensorFlow's rules put them:
// contractions over split dims give lazy partial sums (resolved by all-reduce, or by
// reduce-scatter when the consumer wants a dim split); layout changes reshard by the cheapest
// sequence of collectives (a shortest path over layout states, Reshard.h); shift over a split
// dim is a collective permute; one_hot/gather over a split dim need no communication.
#pragma once

#include "diag/Diagnostics.h"
#include "planner/SpmdIR.h"

#include <limits>
#include <memory>
#include <optional>

namespace meshc::plan {

/// Lowers `fn` under `layout` on `mesh`/`machine`. Layout errors the program can't satisfy
/// (an uneven split, an unknown axis) are reported at their source location; returns nullopt
/// then. Never replicates silently: every forced replication is listed in the result.
std::optional<SpmdFunction> lowerToSpmd(const ir::Module& module, const ir::Function& fn,
                                        const Mesh& mesh, const Layout& layout,
                                        const Machine& machine, DiagEngine& diag);

/// Fast cost evaluation for the layout search: the predicted step time and memory of `fn` under
/// a layout, equal to what lowerToSpmd's summary would say, with per-op results memoized by the
/// layouts of the dims each op depends on (identical layers cost one evaluation).
class PlanEvaluator {
public:
  PlanEvaluator(const ir::Module& module, const ir::Function& fn, const Mesh& mesh,
                const Machine& machine);
  ~PlanEvaluator();
  PlanEvaluator(const PlanEvaluator&) = delete;
  PlanEvaluator& operator=(const PlanEvaluator&) = delete;

  /// Predicted step time; +infinity when the layout is illegal (uneven split, ...). When it is
  /// provably above `cutoff`, a lower bound above `cutoff` may be returned instead (the layout
  /// is then not lowered, which is most of an evaluation's cost). With `complete`, that bound
  /// comes from a walk of every op (never stopped at the cutoff), so that memory() of the same
  /// layout, asked next, needs no walk of its own.
  double stepSeconds(const Layout& layout, double cutoff = std::numeric_limits<double>::infinity(),
                     bool complete = false);
  MemoryEstimate memory(const Layout& layout);
  /// Bytes per device that memory(layout).total() is at least for every legal layout: each
  /// tensor split as far as its dims' sizes and the mesh's devices allow, in the params,
  /// optimizer state and gradients and in the activations live at once in the op order (no
  /// reshard temporaries). When it is over a budget no layout fits.
  double memoryLowerBound();
  /// lowerToSpmd(module, fn, mesh, layout, machine, diag) with this evaluator's memo tables (a
  /// search's final layout is lowered without building them again).
  std::optional<SpmdFunction> lower(const Layout& layout, DiagEngine& diag);
  /// Whether a walk replays a copy of a repeated op sequence (a layer, its backward, its
  /// updates) from a memoized walk of one alike (on by default), and a lower bound the known
  /// ops of such a copy; off, both walk every op. The results are the same bit for bit (tests
  /// compare).
  void setReplaySegments(bool replay);
  /// How many copies' known ops the lower bounds have replayed so far (for the tests).
  size_t boundCopiesReplayed() const;
  /// The dims whose layout can change the cost (the search enumerates only these).
  const std::vector<std::string>& relevantDims() const;
  /// A lower bound of stepSeconds over all layouts that agree with `partial` on the dims it
  /// assigns (for branch and bound); may be loose, never above the true minimum. With every
  /// relevant dim assigned it is stepSeconds(partial, cutoff).
  double lowerBound(const Layout& partial, const std::vector<std::string>& assignedDims,
                    double cutoff = std::numeric_limits<double>::infinity());

  struct Impl;

private:
  std::unique_ptr<Impl> impl_;
};

} // namespace meshc::plan
