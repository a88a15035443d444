// The layout search: exact branch and bound over the searched dims while the space is small
// enough, coordinate descent from several starts with a reported gap bound beyond that. Both
// only propose legal layouts: a dim's axes divide its size, and no tensor maps two of its dims
// to one mesh axis (the rule sema enforces for written layouts).
#include "planner/LayoutSearch.h"

#include "planner/PlanReport.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <tuple>
#include <unordered_set>

namespace meshc::plan {

namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();
/// Costs within this relative distance are ties, broken by the layout itself.
constexpr double kTieTolerance = 1e-9;
/// The heuristic's extra random starts (deterministic seed) and its descent sweep cap.
constexpr int kRandomStarts = 4;
constexpr int kMaxSweeps = 32;
/// Cost evaluations (layouts and lower bounds) the branch and bound may spend before it stops
/// and reports its best layout with a gap bound, as the heuristic does. Counted, not timed, so
/// plans are reproducible.
constexpr size_t kMaxExactWork = 1'000'000;
/// SearchOptions::skipIdleBounds: a level is bounded no more once, after this many bounds, fewer
/// than one in kIdleRatio has cut. (The GPT-3-shaped block's stage splits, every bound computed:
/// the first two levels never cut, the next five 8%, 20%, 3%, 25% and 59% of their nodes; one
/// in ten, five, three or two as the ratio: 5.0%, 6.3%, 8.5% and 9.4% fewer instructions at 8
/// layers, more leaves walked each time, cheaper than the bounds they replace.)
constexpr size_t kIdleTries = 8;
constexpr size_t kIdleRatio = 2;

size_t splitAxisCount(const Layout& layout) {
  size_t count = 0;
  for (const auto& [dim, axes] : layout.axes)
    count += axes.size();
  return count;
}

/// The deterministic order of layouts: cheaper first; among ties, fewer split axes, then the
/// lexicographically smaller layout.
bool preferred(double seconds, const Layout& layout, double otherSeconds, const Layout& other) {
  if (seconds < otherSeconds * (1 - kTieTolerance)) return true;
  if (otherSeconds < seconds * (1 - kTieTolerance)) return false;
  size_t axes = splitAxisCount(layout), otherAxes = splitAxisCount(other);
  if (axes != otherAxes) return axes < otherAxes;
  return layout < other;
}

bool disjoint(const AxisList& a, const AxisList& b) {
  for (const std::string& axis : a)
    if (std::find(b.begin(), b.end(), axis) != b.end()) return false;
  return true;
}

size_t saturatingMultiply(size_t a, size_t b) {
  if (a != 0 && b > std::numeric_limits<size_t>::max() / a)
    return std::numeric_limits<size_t>::max();
  return a * b;
}

/// The searched dims, their legal options and which of them share a tensor.
struct SearchSpace {
  Layout base;                                // the pinned dims
  std::vector<std::string> dims;              // searched relevant dims, in search order
  std::vector<std::vector<AxisList>> options; // per searched dim; options[i][0] is replicated
  std::vector<std::vector<size_t>> conflicts; // per searched dim: searched dims sharing a tensor
  std::vector<std::string> fixedDims;         // relevant dims the search does not change
  size_t candidates = 1;

  SearchSpace(const ir::Module& module, const ir::Function& fn, const Mesh& mesh,
              const Layout& pinned, const std::vector<std::string>& toSearch,
              const std::vector<std::string>& relevant) {
    base = pinned;
    // Which dims appear together in one tensor, and where each dim first appears (the search
    // order: dims in the order the program first uses them, so that the ops at the top of the
    // function have all their dims assigned early, their layouts known, and the lower bound
    // counts their exact cost and that of everything downstream; in decreasing order of the
    // data they touch instead, a late input dim (vit's image height) left every op unknown
    // until the last levels and nothing was pruned).
    std::map<std::string, std::set<std::string>> together;
    std::map<std::string, size_t> firstUse;
    std::map<std::string, int64_t> sizes(module.dims.begin(), module.dims.end());
    // Values with the dims of one before add nothing to `together` or `firstUse` (a search is
    // made per block planned: 40,000 values at 96 layers, a few dozen distinct lists of dims).
    std::unordered_set<AxisList, AxisListHash> seenDims;
    AxisList names;
    const ir::TensorType* previous = nullptr;
    for (const ir::Value& value : fn.values) {
      // The dims (names and sizes) of the value before: the same writes and lookups again (most
      // values of a block are the one before's type, or one like it).
      if (previous && previous->dims == value.type.dims) continue;
      previous = &value.type;
      names.clear();
      for (const ir::Dim& dim : value.type.dims) {
        sizes[dim.name] = dim.size;
        names.push_back(dim.name);
      }
      if (!seenDims.insert(names).second) continue;
      for (const ir::Dim& dim : value.type.dims) {
        firstUse.try_emplace(dim.name, firstUse.size());
        for (const ir::Dim& other : value.type.dims)
          if (other.name != dim.name) together[dim.name].insert(other.name);
      }
    }
    std::set<std::string> wanted(toSearch.begin(), toSearch.end());
    for (const std::string& dim : relevant) {
      if (wanted.count(dim) && !pinned.axes.count(dim))
        dims.push_back(dim);
      else
        fixedDims.push_back(dim);
    }
    std::stable_sort(dims.begin(), dims.end(), [&](const std::string& a, const std::string& b) {
      return firstUse[a] < firstUse[b];
    });
    for (const std::string& dim : dims) {
      std::vector<AxisList> legal;
      for (AxisList& axes : layoutOptions(sizes[dim], mesh)) {
        bool clash = false;
        for (const std::string& other : together[dim]) {
          auto it = pinned.axes.find(other);
          if (it != pinned.axes.end() && !disjoint(axes, it->second)) clash = true;
        }
        if (!clash) legal.push_back(std::move(axes));
      }
      candidates = saturatingMultiply(candidates, legal.size());
      options.push_back(std::move(legal));
    }
    conflicts.resize(dims.size());
    for (size_t i = 0; i < dims.size(); ++i)
      for (size_t j = 0; j < dims.size(); ++j)
        if (i != j && together[dims[i]].count(dims[j])) conflicts[i].push_back(j);
  }

  /// The number of legal layouts (what the exact search would enumerate without pruning), or
  /// any number above `limit` once it is known to exceed it. The product of the option counts
  /// overstates it badly when many dims share tensors (vit: 18 dims, few legal combinations).
  size_t legalCount(size_t limit) const {
    if (candidates <= limit) return candidates; // an upper bound, enough to decide
    size_t count = 0;
    std::vector<int> choice(dims.size(), -1);
    countInto(0, choice, limit, count);
    return count;
  }

  /// Whether option `option` of dim `i` shares no axis with the assigned dims it meets.
  bool legal(size_t i, size_t option, const std::vector<int>& choice) const {
    for (size_t j : conflicts[i])
      if (choice[j] >= 0 && !disjoint(options[i][option], options[j][choice[j]])) return false;
    return true;
  }

  void countInto(size_t i, std::vector<int>& choice, size_t limit, size_t& count) const {
    if (count > limit) return;
    if (i == dims.size()) {
      ++count;
      return;
    }
    for (size_t o = 0; o < options[i].size() && count <= limit; ++o) {
      if (!legal(i, o, choice)) continue;
      choice[i] = static_cast<int>(o);
      countInto(i + 1, choice, limit, count);
      choice[i] = -1;
    }
  }

  /// The choice closest to `layout`: each searched dim takes its axes there when they are one of
  /// its options and legal with the dims before it, else replicated.
  std::vector<int> choiceOf(const Layout& layout) const {
    std::vector<int> choice(dims.size(), -1);
    for (size_t i = 0; i < dims.size(); ++i) {
      choice[i] = 0;
      auto it = layout.axes.find(dims[i]);
      if (it == layout.axes.end()) continue;
      for (size_t o = 0; o < options[i].size(); ++o)
        if (options[i][o] == it->second && legal(i, o, choice)) {
          choice[i] = static_cast<int>(o);
          break;
        }
    }
    return choice;
  }

  Layout layoutOf(const std::vector<int>& choice) const {
    Layout layout = base;
    for (size_t i = 0; i < dims.size(); ++i)
      if (choice[i] > 0) layout.axes[dims[i]] = options[i][choice[i]];
    return layout;
  }
};

/// The search itself, over one evaluator (its memo tables serve every candidate).
class LayoutSearcher {
public:
  LayoutSearcher(const SearchSpace& space, PlanEvaluator& evaluator, double budget,
                 bool skipIdleBounds, BoundTally* tally)
      : space_(space), eval_(evaluator), budget_(budget), skipIdleBounds_(skipIdleBounds),
        levelBounds_(space.dims.size(), 0), levelCuts_(space.dims.size(), 0), tally_(tally) {
    if (!skipIdleBounds_ || !tally_) return;
    for (size_t i = 0; i < space.dims.size(); ++i)
      if (auto known = tally_->byDim.find(space.dims[i]); known != tally_->byDim.end())
        std::tie(levelBounds_[i], levelCuts_[i]) = known->second;
  }

  /// The levels' counts back into the shared tally, for the next search.
  ~LayoutSearcher() {
    if (!skipIdleBounds_ || !tally_) return;
    for (size_t i = 0; i < space_.dims.size(); ++i)
      tally_->byDim[space_.dims[i]] = {levelBounds_[i], levelCuts_[i]};
  }

  /// Exact: branch and bound in the search order, its incumbent seeded by a coordinate descent
  /// from `start` (SearchOptions::start). Returns false when it ran out of work before proving
  /// its layout optimal.
  bool exact(std::vector<int> start) {
    descend(std::move(start));
    std::vector<int> choice(space_.dims.size(), -1);
    branch(0, choice);
    return !aborted_;
  }

  /// Coordinate descent from several starts: replicated, greedy in the search order, every dim
  /// split as far as it goes, and a few random legal starts.
  void heuristic() {
    size_t n = space_.dims.size();
    std::vector<std::vector<int>> starts;
    starts.push_back(std::vector<int>(n, 0));
    starts.push_back(greedyStart(/*widest=*/false));
    starts.push_back(greedyStart(/*widest=*/true));
    std::mt19937 rng(12345);
    for (int s = 0; s < kRandomStarts; ++s) {
      std::vector<int> choice(n, -1);
      for (size_t i = 0; i < n; ++i) {
        std::vector<int> legalOptions;
        for (size_t o = 0; o < space_.options[i].size(); ++o)
          if (space_.legal(i, o, choice)) legalOptions.push_back(static_cast<int>(o));
        choice[i] =
            legalOptions[std::uniform_int_distribution<size_t>(0, legalOptions.size() - 1)(rng)];
      }
      starts.push_back(choice);
    }
    for (std::vector<int>& start : starts)
      descend(std::move(start));
  }

  /// The smallest memory over the layouts costed. Exact when the branch and bound found no
  /// feasible layout: with no incumbent it cuts nothing, so it costed every legal layout.
  double smallestMemory() const { return smallestMemory_; }

  bool found() const { return std::isfinite(bestSeconds_); }
  const Layout& bestLayout() const { return best_; }
  double bestSeconds() const { return bestSeconds_; }
  size_t evaluated() const { return evaluated_; }
  size_t bounds() const { return bounds_; }

private:
  /// What a layout scored: memory over budget and seconds, which are exact, or when the seconds
  /// were above the cutoff asked for, possibly only a lower bound above it.
  struct Score {
    double excess = kInfinity, seconds = kInfinity;
    bool exact = true;
  };

  /// Scores a full assignment: (memory over budget, seconds); records it if it is the best. The
  /// caller needs the seconds only when they are at most `cutoff`; above it they may be a lower
  /// bound (above the cutoff too), so that most layouts are never lowered. Any layout that may
  /// tie with or beat the incumbent is costed exactly, so the search takes the same path.
  std::pair<double, double> score(const std::vector<int>& choice, double cutoff = kInfinity) {
    if (std::isfinite(bestSeconds_)) cutoff = std::max(cutoff, bestSeconds_ * (1 + kTieTolerance));
    // The descent and the branch and bound meet the same layouts again; each is costed once.
    auto [cached, inserted] = scores_.try_emplace(choice);
    Score& known = cached->second;
    if (inserted) ++evaluated_;
    if (inserted || (!known.exact && known.seconds <= cutoff)) known = evaluate(choice, cutoff);
    // Without an incumbent, a layout within budget becomes one: it needs its exact seconds.
    if (!known.exact && known.excess == 0 && !std::isfinite(bestSeconds_))
      known = evaluate(choice, kInfinity);
    return {known.excess, known.seconds};
  }

  Score evaluate(const std::vector<int>& choice, double cutoff) {
    Layout layout = space_.layoutOf(choice);
    // Without an incumbent the memory is asked for next (below), from a complete walk: the
    // seconds come from that walk too rather than from one of their own stopped at the cutoff.
    // The bound is then larger, never above the exact seconds, and only ever compared with
    // cutoffs it passes or not as the smaller one did: the same layouts are costed exactly.
    double seconds = eval_.stepSeconds(layout, cutoff, /*complete=*/!std::isfinite(bestSeconds_));
    if (!std::isfinite(seconds)) return {};
    // Above the cutoff the seconds are a lower bound, from a walk that may have stopped before
    // the memory was known: the layout cannot be taken, and its excess counts as none (a lower
    // bound too; score() evaluates it again where that matters). Without an incumbent, whether
    // the layout fits is what score() and the descent decide by: its memory comes from a
    // complete walk, still without lowering it, and its seconds stay a bound, exact only where a
    // comparison could take the layout (score(), descend()). When no layout fits, every one is
    // costed: lowering each was half of the GPT-3-shaped train block's joint search.
    if (seconds > cutoff && std::isfinite(bestSeconds_)) return {0, seconds, false};
    double memory = eval_.memory(layout).total();
    if (!std::isfinite(memory)) return {}; // illegal past where a walk above the cutoff stopped
    smallestMemory_ = std::min(smallestMemory_, memory);
    double excess = std::max(0.0, memory - budget_);
    if (seconds > cutoff) return {excess, seconds, false};
    if (excess == 0 && preferred(seconds, layout, bestSeconds_, best_)) {
      bestSeconds_ = seconds;
      best_ = std::move(layout);
    }
    return {excess, seconds, true};
  }

  void branch(size_t i, std::vector<int>& choice) {
    if (aborted_ || evaluated_ + bounds_ > kMaxExactWork) {
      aborted_ = true;
      return;
    }
    if (i == space_.dims.size()) {
      score(choice, -kInfinity); // only a layout that may beat the incumbent is costed exactly
      return;
    }
    for (size_t o = 0; o < space_.options[i].size(); ++o) {
      if (!space_.legal(i, o, choice)) continue;
      choice[i] = static_cast<int>(o);
      if (i + 1 < space_.dims.size() && std::isfinite(bestSeconds_) && worthBounding(i)) {
        std::vector<std::string> assigned = space_.fixedDims;
        for (size_t j = 0; j <= i; ++j)
          assigned.push_back(space_.dims[j]);
        Layout partial = space_.layoutOf(choice);
        ++bounds_;
        ++levelBounds_[i];
        double cutoff = bestSeconds_ * (1 + kTieTolerance);
        if (eval_.lowerBound(partial, assigned, cutoff) > cutoff) {
          ++levelCuts_[i];
          choice[i] = -1;
          continue;
        }
      }
      branch(i + 1, choice);
      choice[i] = -1;
    }
  }

  /// Whether a node of level `i` is bounded (SearchOptions::skipIdleBounds): always, unless the
  /// level's bounds have cut too seldom to pay for their walks. Once off, a level stays off.
  bool worthBounding(size_t i) const {
    return !skipIdleBounds_ || levelBounds_[i] < kIdleTries ||
           levelCuts_[i] * kIdleRatio >= levelBounds_[i];
  }

  /// Dims in the search order, each taking its best legal option given the earlier ones (the
  /// later ones replicated), or its widest legal split.
  std::vector<int> greedyStart(bool widest) {
    size_t n = space_.dims.size();
    std::vector<int> choice(n, -1);
    for (size_t i = 0; i < n; ++i) {
      int pick = 0;
      std::pair<double, double> pickScore{kInfinity, kInfinity};
      size_t pickWidth = 0;
      for (size_t o = 0; o < space_.options[i].size(); ++o) {
        if (!space_.legal(i, o, choice)) continue;
        if (widest) {
          if (space_.options[i][o].size() > pickWidth) {
            pickWidth = space_.options[i][o].size();
            pick = static_cast<int>(o);
          }
          continue;
        }
        std::vector<int> trial = choice;
        trial[i] = static_cast<int>(o);
        for (int& c : trial)
          c = std::max(c, 0);
        std::pair<double, double> s = score(trial);
        if (s < pickScore) {
          pickScore = s;
          pick = static_cast<int>(o);
        }
      }
      choice[i] = pick;
    }
    return choice;
  }

  /// Repeated sweeps: each dim in turn takes its best legal option given the others.
  void descend(std::vector<int> choice) {
    std::pair<double, double> current = score(choice);
    for (int sweep = 0; sweep < kMaxSweeps; ++sweep) {
      bool improved = false;
      for (size_t i = 0; i < space_.dims.size(); ++i) {
        int keep = choice[i];
        choice[i] = -1;
        int pick = keep;
        for (size_t o = 0; o < space_.options[i].size(); ++o) {
          if (static_cast<int>(o) == keep || !space_.legal(i, o, choice)) continue;
          choice[i] = static_cast<int>(o);
          // Seconds above the current ones (less the tolerance) cannot be taken.
          std::pair<double, double> s = score(choice, current.second * (1 - kTieTolerance));
          if (s.first < current.first) s = score(choice); // taken: its seconds become current
          choice[i] = -1;
          if (s.first < current.first ||
              (s.first == current.first && s.second < current.second * (1 - kTieTolerance))) {
            current = s;
            pick = static_cast<int>(o);
            improved = true;
          }
        }
        choice[i] = pick;
      }
      if (!improved) break;
    }
  }

  const SearchSpace& space_;
  PlanEvaluator& eval_;
  double budget_;
  Layout best_;
  double bestSeconds_ = kInfinity;
  double smallestMemory_ = kInfinity;
  size_t evaluated_ = 0;
  size_t bounds_ = 0;
  bool aborted_ = false;
  bool skipIdleBounds_;
  std::vector<size_t> levelBounds_, levelCuts_; // per level: bounds computed, and those that cut
  BoundTally* tally_; // SearchOptions::boundTally, or null
  std::map<std::vector<int>, Score> scores_;
};

double budgetFor(const SearchOptions& options, const Machine& machine) {
  if (options.memoryBudgetBytes > 0) return options.memoryBudgetBytes;
  return machine.memoryBytes > 0 ? machine.memoryBytes : kInfinity;
}

const char* kindName(const ir::Function& fn) {
  return fn.kind == ir::Function::Kind::Train ? "train block" : "program";
}

} // namespace

std::vector<AxisList> layoutOptions(int64_t dimSize, const Mesh& mesh) {
  std::vector<AxisList> options{{}};
  // Axes of size 1 split nothing; leaving them out keeps equivalent layouts from multiplying.
  std::vector<const ir::MeshAxis*> axes;
  for (const ir::MeshAxis& axis : mesh.axes)
    if (axis.size > 1) axes.push_back(&axis);
  // Breadth first: shorter lists first, each extended by every unused axis in mesh order.
  std::vector<std::pair<AxisList, int64_t>> frontier{{{}, 1}};
  while (!frontier.empty()) {
    std::vector<std::pair<AxisList, int64_t>> next;
    for (const auto& [list, product] : frontier) {
      for (const ir::MeshAxis* axis : axes) {
        if (std::find(list.begin(), list.end(), axis->name) != list.end()) continue;
        int64_t extended = product * axis->size;
        if (dimSize <= 0 || dimSize % extended != 0) continue;
        AxisList longer = list;
        longer.push_back(axis->name);
        options.push_back(longer);
        next.emplace_back(std::move(longer), extended);
      }
    }
    frontier = std::move(next);
  }
  return options;
}

std::optional<SearchResult> searchLayout(const ir::Module& module, const ir::Function& fn,
                                         const Mesh& mesh, const Machine& machine,
                                         const Layout& pinned,
                                         const std::vector<std::string>& toSearch,
                                         const SearchOptions& options, DiagEngine& diag) {
  PlanEvaluator evaluator(module, fn, mesh, machine);
  return searchLayout(evaluator, module, fn, mesh, machine, pinned, toSearch, options, diag);
}

std::optional<SearchResult> searchLayout(PlanEvaluator& evaluator, const ir::Module& module,
                                         const ir::Function& fn, const Mesh& mesh,
                                         const Machine& machine, const Layout& pinned,
                                         const std::vector<std::string>& toSearch,
                                         const SearchOptions& options, DiagEngine& diag) {
  double budget = budgetFor(options, machine);
  // No layout can fit: without an incumbent the search would walk every legal layout to the end
  // to learn that (the joint search's first, on the GPT-3-shaped block, 1.6 of its 13 CPU s).
  if (!options.exactNeed) {
    double least = evaluator.memoryLowerBound();
    if (least > budget) {
      diag.report(fn.loc.loc, Diag::ErrNoLayoutFitsBudget, kindName(fn), fn.name,
                  bytesString(budget), bytesString(least));
      return std::nullopt;
    }
  }
  SearchSpace space(module, fn, mesh, pinned, toSearch, evaluator.relevantDims());
  LayoutSearcher searcher(space, evaluator, budget, options.skipIdleBounds,
                          options.boundTally.get());
  bool exact = space.legalCount(options.exactLimit) <= options.exactLimit;
  if (exact)
    exact = searcher.exact(options.start ? space.choiceOf(*options.start)
                                         : std::vector<int>(space.dims.size(), 0));
  else
    searcher.heuristic();
  if (!searcher.found()) {
    double smallest = searcher.smallestMemory();
    if (space.dims.empty())
      diag.report(fn.loc.loc, Diag::ErrLayoutOverBudget, kindName(fn), fn.name,
                  bytesString(smallest), bytesString(budget));
    else
      diag.report(fn.loc.loc, Diag::ErrNoLayoutFitsBudget, kindName(fn), fn.name,
                  bytesString(budget), bytesString(smallest));
    return std::nullopt;
  }
  SearchResult result;
  result.layout = searcher.bestLayout();
  result.stepSeconds = searcher.bestSeconds();
  result.memory = evaluator.memory(result.layout);
  result.exact = exact;
  result.candidatesEvaluated = searcher.evaluated();
  result.boundsComputed = searcher.bounds();
  result.searchedDims = space.dims;
  if (!exact) {
    double bound = evaluator.lowerBound(space.base, space.fixedDims);
    result.gapBound = bound > 0 ? (result.stepSeconds - bound) / bound : kInfinity;
  }
  return result;
}

SearchResult bruteForceLayout(const ir::Module& module, const ir::Function& fn, const Mesh& mesh,
                              const Machine& machine, const Layout& pinned,
                              const std::vector<std::string>& toSearch,
                              const SearchOptions& options) {
  PlanEvaluator evaluator(module, fn, mesh, machine);
  SearchSpace space(module, fn, mesh, pinned, toSearch, evaluator.relevantDims());
  double budget = budgetFor(options, machine);
  SearchResult result;
  result.stepSeconds = kInfinity;
  result.searchedDims = space.dims;
  // Plain odometer over every combination; illegal ones (an axis twice in a tensor) skipped.
  size_t n = space.dims.size();
  std::vector<int> choice(n, 0);
  while (true) {
    bool legal = true;
    std::vector<int> partial(n, -1);
    for (size_t i = 0; i < n && legal; ++i) {
      legal = space.legal(i, choice[i], partial);
      partial[i] = choice[i];
    }
    if (legal) {
      Layout layout = space.layoutOf(choice);
      ++result.candidatesEvaluated;
      double seconds = evaluator.stepSeconds(layout);
      if (std::isfinite(seconds) && evaluator.memory(layout).total() <= budget &&
          preferred(seconds, layout, result.stepSeconds, result.layout)) {
        result.stepSeconds = seconds;
        result.layout = std::move(layout);
      }
    }
    size_t i = 0;
    for (; i < n; ++i) {
      if (++choice[i] < static_cast<int>(space.options[i].size())) break;
      choice[i] = 0;
    }
    if (i == n) break;
  }
  if (std::isfinite(result.stepSeconds)) result.memory = evaluator.memory(result.layout);
  return result;
}

} // namespace meshc::plan
