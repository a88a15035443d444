// Pass split-stages (SplitStages.h).
#include "codegen/SplitStages.h"

#include <llvm/ADT/STLExtras.h>
#include <llvm/ADT/StringRef.h>

#include <bit>
#include <map>

namespace meshc::kir {

std::vector<int> stagesOfOps(const ir::Function& irFn, const plan::SpmdFunction& spmd) {
  // The iteration of each inlined call: the first `[i]` of its path (`decoder/layer[2]/ffn`).
  std::vector<int64_t> iteration(irFn.calls.size(), -1);
  int64_t iterations = 0;
  for (size_t c = 0; c < irFn.calls.size(); ++c) {
    llvm::StringRef path = irFn.calls[c].path;
    size_t open = path.find('[');
    if (open == llvm::StringRef::npos) continue;
    int64_t i = 0;
    if (path.slice(open + 1, path.find(']', open)).getAsInteger(10, i)) continue;
    iteration[c] = i;
    iterations = std::max(iterations, i + 1);
  }
  std::vector<int> stages(spmd.ops.size(), -1);
  for (size_t k = 0; k < spmd.ops.size(); ++k) {
    const plan::SpmdOp& op = spmd.ops[k];
    uint32_t call = op.loc.call;
    if (op.phase == plan::Phase::Update || call == 0 || call > iteration.size()) continue;
    int64_t i = iteration[call - 1];
    if (i >= 0) stages[k] = int(i * spmd.stages.count / iterations);
  }
  return stages;
}

namespace {

class StageSplitter {
public:
  explicit StageSplitter(KernelFunction& fn)
      : fn(fn), body(fn.body),
        every(fn.stages.count >= 64 ? ~uint64_t(0) : (uint64_t(1) << fn.stages.count) - 1) {}

  void run() {
    findLoop();
    placeStatements();
    std::vector<BufferId> reduced = reducedAccumulators();
    insertTransfers(reduced);
  }

private:
  void findLoop() {
    for (size_t k = 0; k < body.size(); ++k)
      if (body[k].perMicrobatch) {
        loopBegin = std::min(loopBegin, k);
        loopEnd = k;
      }
  }
  bool afterLoop(size_t k) const { return loopBegin != kNone && k > loopEnd; }

  /// Every statement's stageMask (see SplitStages.h for the rules).
  void placeStatements() {
    // The stages that hold each value once the transfers placed so far are made (a value of a
    // statement not yet placed: every stage, as it will run wherever it is read).
    std::vector<uint64_t> holders(fn.buffers.size(), every);
    std::vector<bool> pending(body.size(), false);
    for (size_t k = 0; k < body.size(); ++k) {
      Stmt& stmt = body[k];
      if (stmt.phase == plan::Phase::Update || afterLoop(k)) {
        stmt.stageMask = every;
      } else if (stmt.stage >= 0) {
        stmt.stageMask = uint64_t(1) << stmt.stage;
      } else {
        // Where everything it reads is already (else where its stage-bound inputs are), the
        // latest such stage in forward, the earliest in backward: values then flow to later
        // stages in forward and to earlier ones in backward, as 1F1B's message order needs.
        uint64_t common = every, bound = 0;
        for (BufferId id : readsOf(stmt)) {
          common &= holders[size_t(id)];
          if (holders[size_t(id)] != every) bound |= holders[size_t(id)];
        }
        uint64_t candidates = common ? common : bound;
        if (candidates == every || candidates == 0) {
          pending[k] = true;
        } else {
          int stage = stmt.phase == plan::Phase::Backward ? std::countr_zero(candidates)
                                                          : 63 - std::countl_zero(candidates);
          stmt.stageMask = uint64_t(1) << stage;
        }
      }
      if (!pending[k])
        for (BufferId id : readsOf(stmt))
          holders[size_t(id)] |= stmt.stageMask;
      for (BufferId id : writesOf(stmt))
        holders[size_t(id)] = pending[k] ? every : stmt.stageMask;
    }
    // What reads no stage's value runs on the stages that read its result (back to front, so
    // that the readers are placed first); a result the caller sees, on every stage.
    for (size_t k = body.size(); k-- > 0;) {
      if (!pending[k]) continue;
      uint64_t mask = 0;
      for (BufferId id : writesOf(body[k])) {
        if (fn.isResult(id)) mask = every;
        for (size_t r = k + 1; r < body.size(); ++r) {
          if (llvm::is_contained(readsOf(body[r]), id)) mask |= body[r].stageMask;
          if (llvm::is_contained(writesOf(body[r]), id)) break;
        }
      }
      body[k].stageMask = mask ? mask : every;
    }
  }

  /// Values computed in the microbatch loop on some stages that the update or the caller reads
  /// (the accumulators): all-reduced over the stage axis after the loop, so they are zeroed on
  /// every stage before it.
  std::vector<BufferId> reducedAccumulators() {
    std::vector<BufferId> reduced;
    if (loopBegin == kNone) return reduced;
    std::vector<uint64_t> loopWriters(fn.buffers.size(), 0);
    for (size_t k = loopBegin; k <= loopEnd; ++k)
      for (BufferId id : writesOf(body[k]))
        loopWriters[size_t(id)] |= body[k].stageMask;
    auto consider = [&](BufferId id) {
      uint64_t writers = loopWriters[size_t(id)];
      if (writers != 0 && writers != every && !llvm::is_contained(reduced, id))
        reduced.push_back(id);
    };
    for (size_t k = loopEnd + 1; k < body.size(); ++k)
      for (BufferId id : readsOf(body[k]))
        consider(id);
    for (BufferId id : fn.outputs)
      consider(id);
    for (const KernelFunction::Update& update : fn.updates)
      consider(update.value);
    for (size_t k = 0; k < loopBegin; ++k)
      for (BufferId id : writesOf(body[k]))
        if (llvm::is_contained(reduced, id)) body[k].stageMask = every;
    return reduced;
  }

  /// StageTransfers after the writers of values read on other stages, and the accumulators'
  /// all-reduce after the loop.
  void insertTransfers(const std::vector<BufferId>& reduced) {
    std::vector<uint64_t> have(fn.buffers.size(), every);
    std::vector<size_t> writer(fn.buffers.size(), kNone);
    std::map<std::pair<size_t, BufferId>, uint64_t> sends; // (writer, value) -> stages to reach
    for (size_t k = 0; k < body.size(); ++k) {
      uint64_t runs = body[k].stageMask ? body[k].stageMask : every;
      for (BufferId id : readsOf(body[k])) {
        uint64_t need = runs & ~have[size_t(id)];
        if (!need || writer[size_t(id)] == kNone) continue;
        sends[{writer[size_t(id)], id}] |= need;
        have[size_t(id)] |= need;
      }
      for (BufferId id : writesOf(body[k])) {
        have[size_t(id)] = runs;
        writer[size_t(id)] = k;
      }
      if (loopBegin != kNone && k == loopEnd) // the all-reduce over the stages follows
        for (BufferId id : reduced)
          have[size_t(id)] = every;
    }
    // The caller reads the outputs and the updates on every rank.
    std::vector<BufferId> results = fn.outputs;
    for (const KernelFunction::Update& update : fn.updates)
      results.push_back(update.value);
    for (BufferId id : results)
      if (uint64_t need = every & ~have[size_t(id)]; need && writer[size_t(id)] != kNone) {
        sends[{writer[size_t(id)], id}] |= need;
        have[size_t(id)] |= need;
      }
    std::vector<Stmt> out;
    auto transfersAfter = [&](size_t k) {
      for (auto it = sends.lower_bound({k, kNoBuffer}); it != sends.end() && it->first.first == k;
           ++it) {
        const Stmt& from = body[k];
        BufferId id = it->first.second;
        uint64_t source = from.stageMask ? from.stageMask : every;
        Stmt transfer{.node =
                          Call{.callee = Callee::StageTransfer,
                               .args = {Arg{.kind = Arg::Kind::Group, .names = {fn.stages.axis}},
                                        Arg{.kind = Arg::Kind::View, .buffer = id},
                                        Arg{.kind = Arg::Kind::Int,
                                            .value = double(std::countr_zero(source))},
                                        Arg{.kind = Arg::Kind::Int, .value = double(it->second)}},
                               .reads = {id}},
                      .sources = {"to the stages that read " + (fn.buffers[size_t(id)].what.empty()
                                                                    ? fn.buffers[size_t(id)].name
                                                                    : fn.buffers[size_t(id)].what)},
                      .phase = from.phase,
                      .perMicrobatch = from.perMicrobatch};
        transfer.stageMask = 0; // every rank calls it; the stages involved communicate
        out.push_back(std::move(transfer));
      }
    };
    for (size_t k = 0; k < body.size(); ++k) {
      out.push_back(std::move(body[k]));
      transfersAfter(k);
      if (loopBegin != kNone && k == loopEnd && !reduced.empty())
        out.push_back(Stmt{.node = Collective{.kind = plan::CollectiveKind::AllReduceSum,
                                              .axes = {fn.stages.axis},
                                              .buffers = reduced},
                           .sources = {"the accumulated values of every stage"},
                           .phase = plan::Phase::Backward});
    }
    body = std::move(out);
  }

  static constexpr size_t kNone = ~size_t(0);
  KernelFunction& fn;
  std::vector<Stmt>& body;
  uint64_t every;
  size_t loopBegin = kNone, loopEnd = 0;
};

} // namespace

void splitStages(KernelFunction& fn) {
  if (fn.stages.count <= 1) return;
  StageSplitter(fn).run();
}

} // namespace meshc::kir
