#include "interp/DtypePaths.h"

#include <algorithm>
#include <map>

namespace meshc::interp {
namespace {

/// Float dtypes ordered by their rounding: a larger rank rounds coarser (unit roundoff 2^-24,
/// 2^-11, 2^-8). Integers carry none of their own.
int roundingRank(ir::DType dtype) {
  switch (dtype) {
  case ir::DType::F32:
    return 1;
  case ir::DType::F16:
    return 2;
  case ir::DType::BF16:
    return 3;
  case ir::DType::I32:
    return 0;
  }
  return 0;
}

const char* rankName(int rank) {
  static const char* const names[] = {"", "f32", "f16", "bf16"};
  return names[rank];
}

} // namespace

std::vector<std::pair<std::string, std::string>> pathDtypes(const ir::Function& fn) {
  // The coarsest rank of each param's value over all steps, grown to a fixed point: an update
  // that reads a coarser value makes the param coarser from the next step on.
  std::map<ir::ValueId, size_t> paramOfValue;
  std::vector<int> paramRank(fn.params.size(), 0);
  for (size_t i = 0; i < fn.params.size(); ++i)
    paramOfValue[fn.params[i].value] = i;
  std::vector<int> rank(fn.values.size(), 0);
  for (bool changed = true; changed;) {
    for (const ir::Op& op : fn.ops) { // topological order: operands first
      int r = roundingRank(fn.typeOf(op.result).dtype);
      for (ir::ValueId operand : op.operands)
        r = std::max(r, rank[operand]);
      if (auto param = paramOfValue.find(op.result); param != paramOfValue.end())
        r = std::max(r, paramRank[param->second]);
      rank[op.result] = r;
    }
    changed = false;
    for (const ir::ParamUpdate& update : fn.updates)
      if (rank[update.value] > paramRank[update.param]) {
        paramRank[update.param] = rank[update.value];
        changed = true;
      }
  }
  std::vector<std::pair<std::string, std::string>> result;
  for (const ir::OutputInfo& output : fn.outputs)
    result.emplace_back(fn.name + "." + output.name, rankName(rank[output.value]));
  if (fn.kind == ir::Function::Kind::Train)
    for (size_t i = 0; i < fn.params.size(); ++i)
      result.emplace_back(fn.name + ".param." + fn.params[i].path,
                          rankName(std::max(paramRank[i], rank[fn.params[i].value])));
  return result;
}

} // namespace meshc::interp
