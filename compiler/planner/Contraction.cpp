// The pairwise contraction order of an einsum (Contraction.h).
#include "planner/Contraction.h"

#include <algorithm>
#include <limits>

namespace meshc::plan {
namespace {

using Dims = std::vector<int64_t>;

bool contains(const Dims& dims, int64_t d) {
  return std::find(dims.begin(), dims.end(), d) != dims.end();
}

class Planner {
public:
  Planner(const std::vector<Dims>& operands, const Dims& output, const Dims& sizes)
      : terms_(operands), output_(output), sizes_(sizes) {
    for (int64_t d : output)
      if (sizes[size_t(d)] != 1 &&
          std::none_of(operands.begin(), operands.end(),
                       [&](const Dims& operand) { return contains(operand, d); }))
        broadcast_.push_back(d);
    for (int64_t d : output)
      if (!contains(broadcast_, d)) product_.push_back(d);
  }

  Contraction plan() {
    std::vector<size_t> live(terms_.size());
    for (size_t t = 0; t < live.size(); ++t)
      live[t] = t;
    Contraction result;
    if (terms_.size() <= kOptimalOperands) {
      double best = std::numeric_limits<double>::infinity();
      std::vector<ContractionStep> steps;
      search(live, steps, 0, best, result.steps);
    } else {
      greedy(live, result.steps);
    }
    result.broadcast = broadcast_;
    for (const ContractionStep& step : result.steps)
      result.flops += step.flops;
    return result;
  }

private:
  /// The step contracting live terms `a` and `b` (the others still to come).
  ContractionStep contract(const std::vector<size_t>& live, size_t a, size_t b) const {
    const Dims &left = terms_[a], &right = terms_[b];
    ContractionStep step{.left = a, .right = b};
    if (live.size() == 2) {
      step.dims = product_;
    } else {
      auto needed = [&](int64_t d) {
        if (contains(output_, d)) return true;
        return std::any_of(live.begin(), live.end(),
                           [&](size_t t) { return t != a && t != b && contains(terms_[t], d); });
      };
      for (int64_t d : left)
        if (contains(right, d) && needed(d)) step.dims.push_back(d);
      for (int64_t d : left)
        if (!contains(right, d) && needed(d)) step.dims.push_back(d);
      for (int64_t d : right)
        if (!contains(left, d) && needed(d)) step.dims.push_back(d);
    }
    double points = 1, m = 1, n = 1, k = 1, batches = 1;
    auto visit = [&](int64_t d, bool inLeft, bool inRight) {
      double size = double(sizes_[size_t(d)]);
      points *= size;
      bool kept = contains(step.dims, d);
      if (inLeft && inRight && kept) batches *= size;
      if (inLeft && inRight && !kept) k *= size;
      if (inLeft && !inRight && kept) m *= size;
      if (inRight && !inLeft && kept) n *= size;
    };
    for (int64_t d : left)
      visit(d, true, contains(right, d));
    for (int64_t d : right)
      if (!contains(left, d)) visit(d, false, true);
    step.flops = 2 * points;
    step.smallest = std::min({m, n, k});
    step.batches = batches;
    step.elements = elementsOf(step.dims);
    step.leftElements = elementsOf(left);
    step.rightElements = elementsOf(right);
    return step;
  }

  int64_t elementsOf(const Dims& dims) const {
    int64_t elements = 1;
    for (int64_t d : dims)
      elements *= sizes_[size_t(d)];
    return elements;
  }

  /// `live` less a and b, plus the new term (appended to terms_ by the caller).
  static std::vector<size_t> after(const std::vector<size_t>& live, size_t a, size_t b,
                                   size_t into) {
    std::vector<size_t> next;
    for (size_t t : live)
      if (t != a && t != b) next.push_back(t);
    next.push_back(into);
    return next;
  }

  /// Every order (depth first, pairs in index order; the first of equal cost wins).
  void search(const std::vector<size_t>& live, std::vector<ContractionStep>& steps, double cost,
              double& best, std::vector<ContractionStep>& bestSteps) {
    if (live.size() == 1) {
      if (cost < best) {
        best = cost;
        bestSteps = steps;
      }
      return;
    }
    for (size_t i = 0; i < live.size(); ++i)
      for (size_t j = i + 1; j < live.size(); ++j) {
        ContractionStep step = contract(live, live[i], live[j]);
        if (cost + step.flops >= best) continue;
        size_t into = terms_.size();
        terms_.push_back(step.dims);
        steps.push_back(step);
        search(after(live, live[i], live[j], into), steps, cost + step.flops, best, bestSteps);
        steps.pop_back();
        terms_.pop_back();
      }
  }

  /// The cheapest pair first, until one term is left.
  void greedy(std::vector<size_t> live, std::vector<ContractionStep>& steps) {
    while (live.size() > 1) {
      ContractionStep best;
      best.flops = std::numeric_limits<double>::infinity();
      for (size_t i = 0; i < live.size(); ++i)
        for (size_t j = i + 1; j < live.size(); ++j)
          if (ContractionStep step = contract(live, live[i], live[j]); step.flops < best.flops)
            best = step;
      size_t into = terms_.size();
      terms_.push_back(best.dims);
      live = after(live, best.left, best.right, into);
      steps.push_back(std::move(best));
    }
  }

  std::vector<Dims> terms_;
  const Dims& output_;
  const Dims& sizes_;
  Dims broadcast_, product_;
};

} // namespace

Contraction planContraction(const std::vector<std::vector<int64_t>>& operands,
                            const std::vector<int64_t>& output, const std::vector<int64_t>& sizes) {
  return Planner(operands, output, sizes).plan();
}

namespace {

/// Dim names numbered in order of first sight, with each one's size.
struct DimIds {
  std::vector<std::string> names;
  std::vector<int64_t> sizes;
  int64_t of(const std::string& name, const std::function<int64_t(const std::string&)>& size) {
    auto at = std::find(names.begin(), names.end(), name);
    if (at != names.end()) return int64_t(at - names.begin());
    names.push_back(name);
    sizes.push_back(size ? size(name) : 0);
    return int64_t(names.size() - 1);
  }
  Dims of(const ir::TensorType& type, const std::function<int64_t(const std::string&)>& size) {
    Dims ids;
    for (const ir::Dim& dim : type.dims)
      ids.push_back(of(dim.name, size));
    return ids;
  }
};

} // namespace

Contraction planContraction(const ir::Function& fn, const ir::Op& op,
                            const std::function<int64_t(const std::string&)>& size) {
  DimIds ids;
  std::vector<std::vector<int64_t>> operands;
  for (ir::ValueId operand : op.operands)
    operands.push_back(ids.of(fn.typeOf(operand), size));
  Dims output = ids.of(fn.typeOf(op.result), size);
  return planContraction(operands, output, ids.sizes);
}

OneHotProduct oneHotProduct(const std::vector<int64_t>& oneHot, int64_t dim,
                            const std::vector<int64_t>& other, const std::vector<int64_t>& output) {
  if (!contains(oneHot, dim)) return OneHotProduct::None;
  if (!contains(output, dim)) { // summed: each point of the output is one row of T
    if (!contains(other, dim)) return OneHotProduct::None;
    for (const std::vector<int64_t>* dims : {&oneHot, &other})
      for (int64_t d : *dims)
        if (d != dim && !contains(output, d)) return OneHotProduct::None;
    return OneHotProduct::Gather;
  }
  if (contains(other, dim)) return OneHotProduct::None;
  for (int64_t d : oneHot)
    if (d != dim && !contains(output, d) && !contains(other, d)) return OneHotProduct::None;
  for (int64_t d : other)
    if (!contains(output, d) && !contains(oneHot, d)) return OneHotProduct::None;
  return OneHotProduct::ScatterAdd;
}

OneHotProduct oneHotProduct(const ir::Function& fn, const ir::Op& op, size_t* oneHotOperand) {
  if (op.kind != ir::OpKind::Einsum || op.operands.size() != 2 ||
      op.operands[0] == op.operands[1] || fn.typeOf(op.result).dtype != ir::DType::F32)
    return OneHotProduct::None;
  for (size_t x = 0; x < 2; ++x) {
    const ir::Op& producer = fn.definingOp(op.operands[x]);
    if (producer.kind != ir::OpKind::OneHot ||
        fn.typeOf(op.operands[1 - x]).dtype != ir::DType::F32 ||
        fn.typeOf(op.operands[x]).dtype != ir::DType::F32)
      continue;
    DimIds ids;
    Dims oneHot = ids.of(fn.typeOf(op.operands[x]), nullptr);
    Dims rest = ids.of(fn.typeOf(op.operands[1 - x]), nullptr);
    Dims output = ids.of(fn.typeOf(op.result), nullptr);
    OneHotProduct kind =
        oneHotProduct(oneHot, ids.of(producer.string("dim"), nullptr), rest, output);
    if (kind != OneHotProduct::None) {
      *oneHotOperand = x;
      return kind;
    }
  }
  return OneHotProduct::None;
}

} // namespace meshc::plan
