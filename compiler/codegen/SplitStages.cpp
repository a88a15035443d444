// Pass split-stages (SplitStages.h).
#include "codegen/SplitStages.h"

#include <llvm/ADT/STLExtras.h>
#include <llvm/ADT/StringRef.h>

#include <fmt/format.h>

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
    if (i < 0) continue;
    stages[k] = int(i * spmd.stages.count / iterations);
    // The plan's split: the stage whose consecutive layers include iteration i.
    for (int64_t s = 0, first = 0; s < int64_t(spmd.stages.layers.size()); ++s) {
      first += spmd.stages.layers[size_t(s)];
      if (i < first) {
        stages[k] = int(s);
        break;
      }
    }
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
    placeStatements(/*updates=*/false);
    paramHolders(/*fromReaders=*/true);
    reduced = reducedAccumulators();
    placeStatements(/*updates=*/true);
    paramHolders(/*fromReaders=*/false);
    insertTransfers();
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
  /// The update and what follows the microbatch loop: placed once the params' stages are known.
  bool inUpdates(size_t k) const { return body[k].phase == plan::Phase::Update || afterLoop(k); }
  uint64_t paramMask(size_t param) const {
    return param < fn.paramStages.size() && fn.paramStages[param] ? fn.paramStages[param] : every;
  }

  /// Every statement's stageMask (see SplitStages.h for the rules): the forward and backward
  /// statements first (`updates` false), then, with the params' stages known, the update's.
  void placeStatements(bool updates) {
    // The stages that hold each value once the transfers placed so far are made (a value of a
    // statement not yet placed: every stage, as it will run wherever it is read).
    std::vector<uint64_t> holders(fn.buffers.size(), every);
    for (size_t k = 0; k < fn.params.size(); ++k)
      holders[size_t(fn.params[k])] = paramMask(k);
    std::vector<bool> pending(body.size(), false), backwardWrote(fn.buffers.size(), false);
    for (size_t k = 0; k < body.size(); ++k) {
      bool mine = inUpdates(k) == updates;
      if (mine)
        pending.insert(pending.begin() + std::ptrdiff_t(k), splitCollective(k, holders), false);
      // A sum over the stages' scalars in the update, or, without a microbatch loop (nothing to
      // pipeline), in a statement of no layer's.
      if (mine && (updates || (loopBegin == kNone && body[k].stage < 0)))
        if (auto [now, before] = stagePartialSums(k, holders); now > 0) {
          pending.insert(pending.begin() + std::ptrdiff_t(k), now - before, false);
          backwardWrote.resize(fn.buffers.size(), false); // the stages' sum may be new
          for (size_t placed = k; placed < k + now; ++placed)
            if (isBackward(body[placed], backwardWrote))
              for (BufferId id : writesOf(body[placed]))
                backwardWrote[size_t(id)] = true;
          k += now - 1; // placed, with the holders of what they write
          continue;
        }
      Stmt& stmt = body[k];
      if (mine && updates) {
        // With the params on their stages, a statement of the update runs on every stage that
        // holds all it reads (a layer's update on its stage, a shared param's on each holder),
        // else on the stage holding most of its elements (a moment's update on its param's
        // stage, which the clip scale is sent to; the global norm's sum of scalars on one).
        auto [common, bound] = stagesOfReads(stmt, holders);
        std::vector<int64_t> elements(size_t(fn.stages.count), 0);
        for (BufferId id : readsOf(stmt))
          for (int64_t s = 0; s < fn.stages.count && holders[size_t(id)] != every; ++s)
            if ((holders[size_t(id)] >> s) & 1)
              elements[size_t(s)] += fn.buffers[size_t(id)].elements;
        if (bound == 0) {
          pending[k] = true;
        } else if (common) {
          stmt.stageMask = common;
        } else {
          size_t most = 0;
          for (size_t s = 1; s < elements.size(); ++s)
            if (elements[s] >= elements[most]) most = s;
          stmt.stageMask = uint64_t(1) << most;
        }
      } else if (mine && stmt.stage >= 0) {
        stmt.stageMask = uint64_t(1) << stmt.stage;
      } else if (mine) {
        // Where everything it reads is already (else where its stage-bound inputs are), the
        // latest such stage in forward, the earliest in backward: values then flow to later
        // stages in forward and to earlier ones in backward, as 1F1B's message order needs.
        auto [common, bound] = stagesOfReads(stmt, holders);
        uint64_t candidates = common ? common : bound;
        if (bound == 0) { // nothing it reads is bound to a stage
          pending[k] = true;
        } else {
          int stage = isBackward(stmt, backwardWrote) ? std::countr_zero(candidates)
                                                      : 63 - std::countl_zero(candidates);
          stmt.stageMask = uint64_t(1) << stage;
        }
      } else if (!updates) {
        pending[k] = true; // placed in the second round: holds nothing yet
        stmt.stageMask = 0;
      }
      if (isBackward(stmt, backwardWrote))
        for (BufferId id : writesOf(stmt))
          backwardWrote[size_t(id)] = true;
      uint64_t runs = pending[k] ? every : stmt.stageMask;
      if (!pending[k])
        for (BufferId id : readsOf(stmt))
          holders[size_t(id)] |= runs;
      for (BufferId id : writesOf(stmt))
        holders[size_t(id)] = runs;
      if (loopBegin != kNone && k == loopEnd) // the all-reduce over the stages follows
        for (BufferId id : reduced)
          holders[size_t(id)] = every;
    }
    // What reads no stage's value runs on the stages that read its result (back to front, so
    // that the readers are placed first); a result the caller sees, on every stage (a param's
    // update, on the param's stages).
    for (size_t k = body.size(); k-- > 0;) {
      if (!pending[k] || inUpdates(k) != updates) continue;
      uint64_t mask = 0;
      for (BufferId id : writesOf(body[k])) {
        mask |= resultStages(id);
        for (size_t r = k + 1; r < body.size(); ++r) {
          if (llvm::is_contained(readsOf(body[r]), id)) mask |= body[r].stageMask;
          if (llvm::is_contained(writesOf(body[r]), id)) break;
        }
      }
      body[k].stageMask = mask ? mask : every;
    }
  }

  /// The stages holding everything `stmt` reads, and those holding some stage-bound value of it
  /// (0: it reads nothing bound to a stage).
  std::pair<uint64_t, uint64_t> stagesOfReads(const Stmt& stmt,
                                              const std::vector<uint64_t>& holders) const {
    uint64_t common = every, bound = 0;
    for (BufferId id : readsOf(stmt)) {
      common &= holders[size_t(id)];
      if (holders[size_t(id)] != every) bound |= holders[size_t(id)];
    }
    return {common, bound};
  }

  /// Whether `stmt` is the backward's: made by autodiff, or reading what the backward wrote (a
  /// forward op fused into a gradient's loop keeps the forward's phase), as schedule-microbatches
  /// decides it.
  static bool isBackward(const Stmt& stmt, const std::vector<bool>& backwardWrote) {
    return stmt.phase != plan::Phase::Forward ||
           llvm::any_of(readsOf(stmt), [&](BufferId id) { return backwardWrote[size_t(id)]; });
  }

  /// The stages the caller reads `id` on after run(): every stage for an output, a param's own
  /// for its update, none for another value.
  uint64_t resultStages(BufferId id) const {
    uint64_t mask = llvm::is_contained(fn.outputs, id) ? every : 0;
    for (const KernelFunction::Update& update : fn.updates)
      if (update.value == id) mask |= paramMask(update.param);
    return mask;
  }

  /// A collective over buffers that live on different stages (a bucket of several layers'
  /// gradients) becomes one per stage group, each run where its buffers are. Returns how many
  /// statements it added.
  size_t splitCollective(size_t k, const std::vector<uint64_t>& holders) {
    Collective* collective = std::get_if<Collective>(&body[k].node);
    if (!collective || collective->axes == std::vector<std::string>{fn.stages.axis}) return 0;
    std::vector<uint64_t> groups;
    for (BufferId id : collective->buffers)
      if (!llvm::is_contained(groups, holders[size_t(id)])) groups.push_back(holders[size_t(id)]);
    if (groups.size() < 2) return 0;
    std::vector<Stmt> parts;
    for (uint64_t group : groups) {
      Stmt part = body[k];
      std::get<Collective>(part.node).buffers.clear();
      for (BufferId id : collective->buffers)
        if (holders[size_t(id)] == group) std::get<Collective>(part.node).buffers.push_back(id);
      parts.push_back(std::move(part));
    }
    body[k] = std::move(parts.front());
    body.insert(body.begin() + std::ptrdiff_t(k) + 1, std::make_move_iterator(parts.begin() + 1),
                std::make_move_iterator(parts.end()));
    if (loopBegin != kNone && k < loopBegin) loopBegin += parts.size() - 1;
    if (loopBegin != kNone && k <= loopEnd) loopEnd += parts.size() - 1;
    return parts.size() - 1;
  }

  /// A statement of the update summing scalars that no one stage holds all of (AdamW's global
  /// norm: each param's sum of squared gradients is on its stage), `a + b + c + ...` first in a
  /// loop over no dims, becomes: each stage sums the scalars it holds (a stage holding none: 0),
  /// one all-reduce over the stage axis adds the stages' sums (the partial sums' all-reduce over
  /// another axis, when one follows, also over the stage axis: one collective), and the rest of
  /// the statement runs on every stage, so what reads its result (the clip scale) needs no
  /// transfer either. The scalar collectives of a step do not grow with the stages. Returns the
  /// statements at k now and before (the all-reduce it extended), {0, 0} when `k` is no such sum.
  std::pair<size_t, size_t> stagePartialSums(size_t k, std::vector<uint64_t>& holders) {
    const Loop* loop = std::get_if<Loop>(&body[k].node);
    if (!loop || !llvm::all_of(loop->extents, [](int64_t extent) { return extent == 1; }))
      return {0, 0};
    // The sum: Load, Load, Add, then (Load, Add of the sum so far and that load) pairs.
    const std::vector<Scalar>& scalars = loop->body;
    auto load = [&](size_t i) {
      return i < scalars.size() && scalars[i].kind == Scalar::Kind::Load &&
             scalars[i].dtype == DType::F32;
    };
    auto add = [&](size_t i, size_t a, size_t b) {
      return i < scalars.size() && scalars[i].kind == Scalar::Kind::Compute &&
             scalars[i].op == ir::OpKind::Add && scalars[i].dtype == DType::F32 &&
             scalars[i].args == std::vector<int>{int(a), int(b)};
    };
    if (!load(0) || !load(1) || !add(2, 0, 1)) return {0, 0};
    size_t end = 3; // past the sum's last scalar
    while (load(end) && add(end + 1, end - 1, end))
      end += 2;
    std::vector<int> terms = {scalars[0].read};
    for (size_t i = 1; i < end; i += 2)
      terms.push_back(scalars[i].read);
    uint64_t common = every;
    for (int read : terms)
      common &= holders[size_t(loop->reads[size_t(read)].buffer)];
    if (common != 0) return {0, 0}; // one stage holds them all: it sums them
    // The rest reads the sum only of the chain, and otherwise what every stage holds.
    int sum = int(end) - 1;
    for (size_t i = end; i < scalars.size(); ++i) {
      if (llvm::any_of(scalars[i].args, [&](int arg) { return arg < sum; })) return {0, 0};
      if (scalars[i].kind == Scalar::Kind::Load &&
          holders[size_t(loop->reads[size_t(scalars[i].read)].buffer)] != every)
        return {0, 0};
    }
    for (const Store& store : loop->stores)
      if (store.value < sum) return {0, 0};
    bool whole = end == scalars.size() && loop->stores.size() == 1;

    Stmt original = body[k];
    const Loop& sums = std::get<Loop>(original.node);
    std::string what = original.sources.empty() ? "a sum" : original.sources.back();
    BufferId total = whole
                         ? sums.stores.front().at.buffer
                         : fn.addBuffer(Buffer{.name = fmt::format("stages_v{}", fn.buffers.size()),
                                               .what = "the stages' sums for " + what,
                                               .elements = 1});
    Shape scalarStrides(sums.extents.size(), 0);
    auto statement = [&](Loop node, uint64_t mask) {
      Stmt stmt = original;
      stmt.node = std::move(node);
      stmt.stage = -1;
      stmt.stageMask = mask;
      return stmt;
    };
    // Each stage's sum of the terms it holds (a term held by several: the first of them).
    std::vector<Stmt> out;
    uint64_t idle = every;
    for (int64_t s = 0; s < fn.stages.count; ++s) {
      Loop part{.dims = sums.dims, .extents = sums.extents};
      for (int read : terms) {
        if (std::countr_zero(holders[size_t(sums.reads[size_t(read)].buffer)]) != s) continue;
        part.body.push_back(Scalar{.kind = Scalar::Kind::Load, .read = int(part.reads.size())});
        part.reads.push_back(sums.reads[size_t(read)]);
        if (part.body.size() > 1)
          part.body.push_back(
              Scalar{.kind = Scalar::Kind::Compute,
                     .op = ir::OpKind::Add,
                     .args = {int(part.body.size()) - 2, int(part.body.size()) - 1}});
      }
      if (part.body.empty()) continue;
      part.stores = {Store{.at = Access{total, scalarStrides}, .value = int(part.body.size()) - 1}};
      out.push_back(statement(std::move(part), uint64_t(1) << s));
      idle &= ~(uint64_t(1) << s);
    }
    if (idle)
      out.push_back(
          statement(Loop{.dims = sums.dims,
                         .extents = sums.extents,
                         .stores = {Store{.at = Access{total, scalarStrides}, .value = 0}},
                         .body = {Scalar{.kind = Scalar::Kind::Const, .value = 0}}},
                    idle));
    // The all-reduce over the stages: the one that follows, over another axis, extended.
    size_t before = 1;
    Collective* next = k + 1 < body.size() ? std::get_if<Collective>(&body[k + 1].node) : nullptr;
    if (whole && next && next->kind == plan::CollectiveKind::AllReduceSum &&
        next->phase == Collective::Phase::Blocking && next->buffers == std::vector{total} &&
        !llvm::is_contained(next->axes, fn.stages.axis)) {
      Stmt merged = body[k + 1];
      std::get<Collective>(merged.node)
          .axes.insert(std::get<Collective>(merged.node).axes.begin(), fn.stages.axis);
      merged.stageMask = every;
      out.push_back(std::move(merged));
      before = 2;
    } else {
      out.push_back(Stmt{.node = Collective{.kind = plan::CollectiveKind::AllReduceSum,
                                            .axes = {fn.stages.axis},
                                            .buffers = {total}},
                         .sources = {"the stages' partial sums for " + what},
                         .phase = original.phase,
                         .stageMask = every});
    }
    holders.resize(fn.buffers.size(), every); // `total` may be new
    holders[size_t(total)] = every;
    if (!whole) { // the rest, on every stage, reading the total first
      Loop rest{
          .dims = sums.dims, .extents = sums.extents, .reads = {Access{total, scalarStrides}}};
      rest.body.push_back(Scalar{.kind = Scalar::Kind::Load, .read = 0});
      auto renumber = [&](int i) { return i == sum ? 0 : i - sum; };
      for (size_t i = end; i < scalars.size(); ++i) {
        Scalar scalar = sums.body[i];
        for (int& arg : scalar.args)
          arg = renumber(arg);
        if (scalar.kind == Scalar::Kind::Load) {
          scalar.read = int(rest.reads.size());
          rest.reads.push_back(sums.reads[size_t(sums.body[i].read)]);
        }
        rest.body.push_back(std::move(scalar));
      }
      for (const Store& store : sums.stores) {
        rest.stores.push_back(Store{.at = store.at, .value = renumber(store.value)});
        holders[size_t(store.at.buffer)] = every;
      }
      rest.invariants = sums.invariants;
      out.push_back(statement(std::move(rest), every));
    }
    size_t now = out.size();
    body.erase(body.begin() + std::ptrdiff_t(k), body.begin() + std::ptrdiff_t(k + before));
    body.insert(body.begin() + std::ptrdiff_t(k), std::make_move_iterator(out.begin()),
                std::make_move_iterator(out.end()));
    return {now, before};
  }

  /// Each param's stages: those of the forward and backward statements that read it
  /// (`fromReaders`), else, for what only the update reads (optimizer state), those of the
  /// statement that computes its new value. 0 until known.
  void paramHolders(bool fromReaders) {
    fn.paramStages.resize(fn.params.size(), 0);
    for (size_t p = 0; p < fn.params.size(); ++p) {
      if (fn.paramStages[p] != 0) continue;
      uint64_t mask = 0;
      for (size_t k = 0; k < body.size(); ++k) {
        if (fromReaders && !inUpdates(k) && llvm::is_contained(readsOf(body[k]), fn.params[p]))
          mask |= body[k].stageMask ? body[k].stageMask : every;
        if (!fromReaders && inUpdates(k))
          for (const KernelFunction::Update& update : fn.updates)
            if (update.param == p && llvm::is_contained(writesOf(body[k]), update.value))
              mask |= body[k].stageMask ? body[k].stageMask : every;
      }
      fn.paramStages[p] = mask;
    }
    if (!fromReaders) // every stage is spelled 0 (KernelFunction::paramStages)
      for (uint64_t& mask : fn.paramStages)
        if (mask == every) mask = 0;
  }

  /// Values computed in the microbatch loop on several stages but not all (a shared param's
  /// gradient) that the update reads, and the outputs computed on some stages (the loss and the
  /// metrics): all-reduced over the stage axis after the loop, so they are zeroed on every stage
  /// before it. A gradient computed on one stage stays there, for that stage's update.
  std::vector<BufferId> reducedAccumulators() {
    std::vector<BufferId> result;
    if (loopBegin == kNone) return result;
    // Per buffer: the stages of the loop's statements that write it on some stages only, and
    // whether one writes it on every stage (then every stage computes all of it).
    std::vector<uint64_t> partialWriters(fn.buffers.size(), 0);
    std::vector<bool> wholeWriter(fn.buffers.size(), false);
    for (size_t k = loopBegin; k <= loopEnd; ++k)
      for (BufferId id : writesOf(body[k])) {
        uint64_t runs = body[k].stageMask ? body[k].stageMask : every;
        if (runs == every)
          wholeWriter[size_t(id)] = true;
        else
          partialWriters[size_t(id)] |= runs;
      }
    auto consider = [&](BufferId id, bool everyStage) {
      uint64_t writers = partialWriters[size_t(id)];
      if (writers != 0 && !wholeWriter[size_t(id)] &&
          (everyStage || !std::has_single_bit(writers)) && !llvm::is_contained(result, id))
        result.push_back(id);
    };
    for (size_t k = loopEnd + 1; k < body.size(); ++k)
      for (BufferId id : readsOf(body[k]))
        consider(id, false);
    for (BufferId id : fn.outputs)
      consider(id, true);
    for (const KernelFunction::Update& update : fn.updates)
      consider(update.value, false);
    for (size_t k = 0; k < loopBegin; ++k)
      for (BufferId id : writesOf(body[k]))
        if (llvm::is_contained(result, id)) body[k].stageMask = every;
    return result;
  }

  /// StageTransfers after the writers of values read on other stages, and the accumulators'
  /// all-reduce after the loop.
  void insertTransfers() {
    std::vector<uint64_t> have(fn.buffers.size(), every);
    for (size_t p = 0; p < fn.params.size(); ++p)
      have[size_t(fn.params[p])] = paramMask(p);
    std::vector<size_t> writer(fn.buffers.size(), kNone);
    std::map<std::pair<size_t, BufferId>, uint64_t> sends; // (writer, value) -> stages to reach
    for (size_t k = 0; k < body.size(); ++k) {
      uint64_t runs = body[k].stageMask ? body[k].stageMask : every;
      // A collective over the stage axis reads each stage's own value (stagePartialSums).
      const Collective* collective = std::get_if<Collective>(&body[k].node);
      if (collective && llvm::is_contained(collective->axes, fn.stages.axis)) runs = 0;
      for (BufferId id : readsOf(body[k])) {
        uint64_t need = runs & ~have[size_t(id)];
        if (!need || writer[size_t(id)] == kNone) continue;
        sends[{writer[size_t(id)], id}] |= need;
        have[size_t(id)] |= need;
      }
      for (BufferId id : writesOf(body[k])) {
        have[size_t(id)] = runs ? runs : every;
        writer[size_t(id)] = k;
      }
      if (loopBegin != kNone && k == loopEnd) // the all-reduce over the stages follows
        for (BufferId id : reduced)
          have[size_t(id)] = every;
    }
    // The caller reads the outputs on every rank, a param's update on its stages.
    std::vector<BufferId> results = fn.outputs;
    for (const KernelFunction::Update& update : fn.updates)
      results.push_back(update.value);
    for (BufferId id : results)
      if (uint64_t need = resultStages(id) & ~have[size_t(id)];
          need && writer[size_t(id)] != kNone) {
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
  std::vector<BufferId> reduced; // all-reduced over the stages after the loop
};

} // namespace

void splitStages(KernelFunction& fn) {
  if (fn.stages.count <= 1) return;
  StageSplitter(fn).run();
}

} // namespace meshc::kir
