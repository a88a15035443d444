// Pass eliminate-common-subexpressions (EliminateCommonSubexpressions.h).
#include "codegen/EliminateCommonSubexpressions.h"

#include <map>

namespace meshc::kir {

void eliminateCommonSubexpressions(KernelFunction& fn) {
  std::vector<int> writers = fn.writerCounts();
  // Candidates by (node kind, buffers read): only the same reads can give the same value.
  std::map<std::pair<size_t, std::vector<BufferId>>, std::vector<size_t>> seen;
  for (size_t k = 0; k < fn.body.size(); ++k) {
    Stmt& stmt = fn.body[k];
    std::vector<BufferId> writes = writesOf(stmt), reads = readsOf(stmt);
    if (!isPure(stmt) || writes.size() != 1 || writers[size_t(writes[0])] != 1 ||
        fn.buffers[size_t(writes[0])].storage != Storage::Arena || fn.isResult(writes[0]))
      continue;
    // Every read must be a value that is never rewritten (its one writer ran before).
    bool stable = true;
    for (BufferId id : reads)
      stable = stable && writers[size_t(id)] <= 1 && id != writes[0];
    if (!stable) continue;
    auto& candidates = seen[{stmt.node.index(), reads}];
    bool merged = false;
    for (size_t earlier : candidates) {
      if (stmt.recomputed && !fn.body[earlier].recomputed) continue; // keep the activation dead
      Stmt renamed = fn.body[earlier];
      BufferId kept = writesOf(renamed)[0];
      replaceBuffer(renamed, kept, writes[0]);
      // (Never across the microbatch loop's bounds: a value of the loop changes per microbatch.)
      if (renamed.node == stmt.node && renamed.zeroFirst == stmt.zeroFirst &&
          renamed.perMicrobatch == stmt.perMicrobatch &&
          fn.buffers[size_t(kept)].elements == fn.buffers[size_t(writes[0])].elements) {
        fn.body[earlier].sources.insert(fn.body[earlier].sources.end(), stmt.sources.begin(),
                                        stmt.sources.end());
        BufferId dropped = writes[0];
        fn.body.erase(fn.body.begin() + std::ptrdiff_t(k));
        replaceBufferFrom(fn, k, dropped, kept);
        --k;
        merged = true;
        break;
      }
    }
    if (!merged) candidates.push_back(k);
  }
}

} // namespace meshc::kir
