// Automatic layout search: chooses the axes of every dim the program leaves to the planner
// (`auto`), minimizing the predicted step time under a per-device memory budget. Exact
// (exhaustive with branch-and-bound pruning over the relevant dims) while the space is small
// enough; beyond that a heuristic that reports its gap to a lower bound.
#pragma once

#include "diag/Diagnostics.h"
#include "planner/SpmdLowering.h"

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace meshc::plan {

/// Per searched dim, the lower bounds computed at its level and those that cut, summed over the
/// searches that share it (SearchOptions::boundTally).
struct BoundTally {
  std::map<std::string, std::pair<size_t, size_t>> byDim;
};

struct SearchOptions {
  double memoryBudgetBytes = 0;   // 0: the machine's memory per device
  size_t exactLimit = 20'000'000; // candidate layouts beyond which the heuristic is used
  /// When no layout fits, the error names the smallest need, exact when the search was
  /// exhaustive. Without (a caller that only asks whether one fits), the search stops at once
  /// when PlanEvaluator::memoryLowerBound is over the budget and names that bound instead.
  bool exactNeed = true;
  /// Where the exact search's coordinate descent starts (its dims' axes; a dim it leaves out or
  /// gives an option the space does not have, or one that clashes with the dims before it, is
  /// replicated); nullopt: the replicated layout. The descent only seeds the branch and bound's
  /// incumbent, so the layout found is the same from any start: a caller that knows a similar
  /// function's layout (the same block at another microbatch count, with one layer more)
  /// passes it, and the search lowers fewer layouts on its way to the best (each layout the
  /// descent takes is costed exactly). The heuristic search ignores it.
  std::optional<Layout> start;
  /// The exact search stops bounding a level of its tree (the searched dims assigned down to one)
  /// once fewer than half of that level's lower bounds, eight or more, have cut: a bound that
  /// does not cut walks every op it knows, while a leaf that loses stops its walk early (at the
  /// incumbent, with the rooflines of the ops left), and the stage splits' searches bound levels
  /// that never or seldom cut (their blocks' early dims leave most ops unknown). The branch and
  /// bound is exact with any subset of its bounds (each cuts only a subtree with no layout
  /// preferred to the incumbent), so the layout found is the same; what changes is the work, and
  /// the layouts costed (`candidatesEvaluated`): for callers that do not print them.
  bool skipIdleBounds = false;
  /// With skipIdleBounds: the tally the levels' counts start from and are added to (by the
  /// level's dim), shared by searches of alike blocks in one order (a pipeline search's inner
  /// plans: 168 searches of one- and two-layer blocks for the GPT-3-shaped train block, whose
  /// levels cut alike), so that a level found idle in one search is not bounded eight more
  /// times in each of the next. Exact as skipIdleBounds is: any subset of the bounds finds the
  /// same layout.
  std::shared_ptr<BoundTally> boundTally;
};

struct SearchResult {
  Layout layout; // pinned dims as given, searched dims chosen
  double stepSeconds = 0;
  MemoryEstimate memory;
  bool exact = true;
  double gapBound = 0; // heuristic only: (found - lowerBound) / lowerBound
  size_t candidatesEvaluated = 0;
  size_t boundsComputed = 0; // the exact search's lower bounds (not printed)
  std::vector<std::string> searchedDims;
};

/// The options for one dim: replicated, or an ordered list of distinct mesh axes whose product
/// divides the dim's size.
std::vector<AxisList> layoutOptions(int64_t dimSize, const Mesh& mesh);

/// Searches the dims of `toSearch` (the rest are fixed by `pinned`). A memory budget no layout
/// can meet is an error reported at `budgetLoc` (or without a location), returning nullopt.
std::optional<SearchResult> searchLayout(const ir::Module& module, const ir::Function& fn,
                                         const Mesh& mesh, const Machine& machine,
                                         const Layout& pinned,
                                         const std::vector<std::string>& toSearch,
                                         const SearchOptions& options, DiagEngine& diag);

/// The same, costing layouts with `evaluator` (of `fn` on `mesh` and `machine`), which the
/// caller may then use to lower the layout found (PlanEvaluator::lower).
std::optional<SearchResult> searchLayout(PlanEvaluator& evaluator, const ir::Module& module,
                                         const ir::Function& fn, const Mesh& mesh,
                                         const Machine& machine, const Layout& pinned,
                                         const std::vector<std::string>& toSearch,
                                         const SearchOptions& options, DiagEngine& diag);

/// Brute force over the same space, without pruning or memoization: the oracle of the tests.
SearchResult bruteForceLayout(const ir::Module& module, const ir::Function& fn, const Mesh& mesh,
                              const Machine& machine, const Layout& pinned,
                              const std::vector<std::string>& toSearch,
                              const SearchOptions& options);

} // namespace meshc::plan
