// The kernel IR's verifier (VerifyKernels.h).
#include "codegen/VerifyKernels.h"

#include <fmt/format.h>
#include <llvm/ADT/STLExtras.h>

#include <algorithm>
#include <map>

namespace meshc::kir {
namespace {

class Verifier {
public:
  explicit Verifier(const KernelFunction& fn) : fn(fn) {}

  std::string run() {
    defined.assign(fn.buffers.size(), false);
    for (size_t id = 0; id < fn.buffers.size(); ++id) {
      Storage storage = fn.buffers[id].storage;
      defined[id] = storage == Storage::Input || storage == Storage::Param;
      if (fn.buffers[id].elements <= 0) return fmt::format("buffer {} has no elements", id);
    }
    if (std::string problem = subroutines(); !problem.empty()) return problem;
    if (std::string problem = microbatchLoop(); !problem.empty()) return problem;
    for (size_t k = 0; k < fn.init.size() && error.empty(); ++k)
      statement(fn.init[k], fmt::format("init[{}]", k), true);
    // Outlined code is checked where it runs: each call's body over its arguments.
    body = fn.inlinedBody();
    for (size_t k = 0; k < body.size() && error.empty(); ++k)
      statement(body[k], fmt::format("run[{}]", k), false);
    if (!error.empty()) return error;
    if (!pending.empty())
      return fmt::format("collective request #{} is never waited for", pending.begin()->first);
    for (BufferId id : fn.outputs)
      if (!valid(id) || !defined[size_t(id)]) return fmt::format("output {} is never written", id);
    for (const KernelFunction::Update& update : fn.updates)
      if (!valid(update.value) || !defined[size_t(update.value)] ||
          update.param >= fn.params.size())
        return fmt::format("update of param {} is not a written buffer", update.param);
    return overlaps();
  }

private:
  /// Subroutines refer only to their own parameters; calls pass one buffer of the same size,
  /// dtype and kind (keep mask or not) per parameter, and nothing outside run() calls them.
  std::string subroutines() const {
    for (size_t s = 0; s < fn.subroutines.size(); ++s) {
      const Subroutine& sub = fn.subroutines[s];
      for (size_t k = 0; k < sub.parameters.size(); ++k) {
        BufferId id = sub.parameters[k];
        if (!valid(id) || fn.buffers[size_t(id)].storage != Storage::Argument ||
            fn.buffers[size_t(id)].index != int64_t(k))
          return fmt::format("{}: parameter {} is not its argument buffer", sub.name, k);
      }
      for (Stmt stmt : sub.body) {
        bool foreign = std::holds_alternative<Invoke>(stmt.node);
        forEachBuffer(stmt, [&](BufferId& id) {
          foreign = foreign || !llvm::is_contained(sub.parameters, id);
        });
        if (foreign)
          return fmt::format("{}: a statement refers to a buffer it is not passed", sub.name);
      }
    }
    for (const Stmt& stmt : fn.init)
      if (std::holds_alternative<Invoke>(stmt.node)) return "the constructor calls a subroutine";
    for (size_t k = 0; k < fn.body.size(); ++k) {
      const Invoke* invoke = std::get_if<Invoke>(&fn.body[k].node);
      if (!invoke) continue;
      if (invoke->subroutine < 0 || size_t(invoke->subroutine) >= fn.subroutines.size())
        return fmt::format("run[{}]: a call of a subroutine that does not exist", k);
      const Subroutine& sub = fn.subroutines[size_t(invoke->subroutine)];
      if (invoke->arguments.size() != sub.parameters.size())
        return fmt::format("run[{}]: {} arguments for the {} parameters of {}", k,
                           invoke->arguments.size(), sub.parameters.size(), sub.name);
      for (size_t a = 0; a < invoke->arguments.size(); ++a) {
        BufferId id = invoke->arguments[a];
        const Buffer& parameter = fn.buffers[size_t(sub.parameters[a])];
        if (!valid(id) || fn.buffers[size_t(id)].storage == Storage::Argument ||
            fn.buffers[size_t(id)].elements != parameter.elements ||
            fn.buffers[size_t(id)].dtype != parameter.dtype ||
            fn.buffers[size_t(id)].keepMask != parameter.keepMask)
          return fmt::format("run[{}]: argument {} of {} does not match its parameter", k, a,
                             sub.name);
      }
    }
    return "";
  }

  /// The statements marked perMicrobatch are one stretch of run() (none in the constructor or
  /// in subroutines), there when the function has microbatches, and no collective is started on
  /// one side of the loop's bounds and waited for on the other.
  std::string microbatchLoop() const {
    size_t begin = fn.body.size(), end = 0;
    for (size_t k = 0; k < fn.body.size(); ++k)
      if (fn.body[k].perMicrobatch) {
        begin = std::min(begin, k);
        end = k + 1;
      }
    for (size_t k = begin; k < end; ++k)
      if (!fn.body[k].perMicrobatch)
        return fmt::format("run[{}]: outside the microbatch loop, between its statements", k);
    if ((begin < end) != (fn.microbatches.count > 1))
      return fmt::format("{} microbatches, and {} statements in the microbatch loop",
                         fn.microbatches.count, end > begin ? end - begin : 0);
    for (const Stmt& stmt : fn.init)
      if (stmt.perMicrobatch) return "the constructor has a statement of the microbatch loop";
    for (const Subroutine& sub : fn.subroutines)
      for (const Stmt& stmt : sub.body)
        if (stmt.perMicrobatch) return sub.name + ": a statement marked for the microbatch loop";
    // Pipeline schedules (ScheduleMicrobatches.h): the forwards' loop, then the backwards'.
    for (size_t k = begin; k + 1 < end; ++k)
      if (fn.body[k + 1].microbatchLoop < fn.body[k].microbatchLoop)
        return fmt::format("run[{}]: a statement of microbatch loop {} after loop {}", k + 1,
                           fn.body[k + 1].microbatchLoop, fn.body[k].microbatchLoop);
    // 1F1B (ScheduleMicrobatches.h): messages between two stages have no tags, so each
    // direction may carry one loop's values only: activations forward, gradients back. (Under
    // GPipe every stage runs the loops in the same order, so messages match in that order.)
    for (size_t k = begin; fn.stages.oneFOneB && k < end; ++k) {
      const Call* call = std::get_if<Call>(&fn.body[k].node);
      if (!call || call->callee != Callee::StageTransferStarted || call->args.size() < 4) continue;
      auto from = uint64_t(call->args[2].value), to = uint64_t(call->args[3].value);
      uint64_t below = (uint64_t(1) << from) - 1;
      bool backwards = fn.body[k].microbatchLoop == 1;
      if ((to & (backwards ? ~below : below)) != 0)
        return fmt::format("run[{}]: under 1F1B, a value of the {} loop sent from stage {} to "
                           "stages {:#x}",
                           k, backwards ? "backwards'" : "forwards'", from, to);
    }
    std::map<int, const Stmt*> started; // request -> the statement that started it
    for (size_t k = 0; k < fn.body.size(); ++k) {
      const Collective* c = std::get_if<Collective>(&fn.body[k].node);
      if (!c || c->phase == Collective::Phase::Blocking) continue;
      if (c->phase == Collective::Phase::Start) started[c->request] = &fn.body[k];
      auto it = started.find(c->request);
      if (c->phase != Collective::Phase::Wait || it == started.end()) continue;
      const Stmt& start = *it->second;
      if (start.perMicrobatch != fn.body[k].perMicrobatch ||
          start.microbatchLoop != fn.body[k].microbatchLoop)
        return fmt::format("run[{}]: request #{} is started and waited for on two sides of the "
                           "microbatch loop's bounds",
                           k, c->request);
      if (start.stageMask != fn.body[k].stageMask)
        return fmt::format("run[{}]: request #{} is waited for on other pipeline stages than "
                           "started it",
                           k, c->request);
    }
    return "";
  }

  bool valid(BufferId id) const { return id >= 0 && size_t(id) < fn.buffers.size(); }
  void fail(const std::string& where, const std::string& what) {
    if (error.empty()) error = fmt::format("{}: {}", where, what);
  }
  void read(BufferId id, const std::string& where, bool init) {
    if (!valid(id)) return fail(where, fmt::format("reads buffer {} that does not exist", id));
    if (init && fn.buffers[size_t(id)].storage != Storage::Persistent)
      return fail(where, fmt::format("a constructor statement reads {}, which is not computed "
                                     "in the constructor",
                                     fn.buffers[size_t(id)].name));
    if (!defined[size_t(id)])
      fail(where,
           fmt::format("reads {} before any statement writes it", fn.buffers[size_t(id)].name));
  }
  void write(BufferId id, const std::string& where, bool init) {
    if (!valid(id)) return fail(where, fmt::format("writes buffer {} that does not exist", id));
    Storage storage = fn.buffers[size_t(id)].storage;
    if (storage == Storage::Input) return fail(where, "writes an input");
    if (init != (storage == Storage::Persistent))
      return fail(where, fmt::format("writes {} ({}) from the {}", fn.buffers[size_t(id)].name,
                                     storageName(storage), init ? "constructor" : "run()"));
    defined[size_t(id)] = true;
  }
  /// The largest element offset of `access` over `extents` must fall inside its buffer.
  void bounds(const Access& access, const Shape& extents, const std::string& where) {
    if (!valid(access.buffer)) return fail(where, "an access to a buffer that does not exist");
    if (access.strides.size() != extents.size())
      return fail(where, fmt::format("an access to {} with {} strides in a {}-dim loop",
                                     fn.buffers[size_t(access.buffer)].name, access.strides.size(),
                                     extents.size()));
    int64_t last = 0;
    for (size_t d = 0; d < extents.size(); ++d) {
      if (extents[d] <= 0 || access.strides[d] < 0) return fail(where, "a bad extent or stride");
      last += (extents[d] - 1) * access.strides[d];
    }
    const Buffer& buffer = fn.buffers[size_t(access.buffer)];
    if (last >= accessibleElements(buffer))
      fail(where, fmt::format("reaches element {} of {}, which has {}", last, buffer.name,
                              accessibleElements(buffer)));
  }

  /// Whether scalar `arg` of `loop`, used by scalar k, loads a keep mask.
  bool loadsKeepMask(const Loop& loop, int arg, size_t k) const {
    if (arg < 0 || size_t(arg) >= k || loop.body[size_t(arg)].kind != Scalar::Kind::Load)
      return false;
    int read = loop.body[size_t(arg)].read;
    return read >= 0 && size_t(read) < loop.reads.size() &&
           valid(loop.reads[size_t(read)].buffer) &&
           fn.buffers[size_t(loop.reads[size_t(read)].buffer)].keepMask;
  }

  void statement(const Stmt& stmt, const std::string& where, bool init) {
    // A keep mask's bytes mean nothing to a GEMM, a kernel, a collective or a copy.
    if (!std::holds_alternative<Loop>(stmt.node) && !std::holds_alternative<Invoke>(stmt.node))
      for (const std::vector<BufferId>& ids : {readsOf(stmt), writesOf(stmt)})
        for (BufferId id : ids)
          if (valid(id) && fn.buffers[size_t(id)].keepMask)
            fail(where,
                 fmt::format("a statement other than a loop or call touches the keep mask {}",
                             fn.buffers[size_t(id)].name));
    if (const Loop* loop = std::get_if<Loop>(&stmt.node)) {
      if (loop->stores.empty()) fail(where, "a loop that stores nothing");
      for (const Access& access : loop->reads)
        bounds(access, loop->extents, where);
      for (const Store& store : loop->stores) {
        bounds(store.at, loop->extents, where);
        if (store.value < 0 || size_t(store.value) >= loop->body.size())
          fail(where, "a store of a scalar that does not exist");
        else if (valid(store.at.buffer) &&
                 (store.keepBit != fn.buffers[size_t(store.at.buffer)].keepMask ||
                  (store.keepBit && loop->body[size_t(store.value)].kind != Scalar::Kind::Dropout)))
          fail(where, fmt::format("a store into {} that is not a dropout's keep bit into a "
                                  "keep mask",
                                  fn.buffers[size_t(store.at.buffer)].name));
      }
      for (size_t k = 0; k < loop->body.size(); ++k) {
        const Scalar& s = loop->body[k];
        if (s.kind == Scalar::Kind::Load && (s.read < 0 || size_t(s.read) >= loop->reads.size()))
          fail(where, fmt::format("scalar %{} loads a read that does not exist", k));
        for (int arg : s.args)
          if (arg < 0 || size_t(arg) >= k)
            fail(where, fmt::format("scalar %{} uses %{}, not defined before it", k, arg));
        if (s.kind == Scalar::Kind::Step && init)
          fail(where, "the step counter in the constructor");
        if (s.kind == Scalar::Kind::Dropout && s.args.size() == 2 &&
            !loadsKeepMask(*loop, s.args[1], k))
          fail(where, fmt::format("dropout scalar %{} keeps by %{}, not a load of a keep mask", k,
                                  s.args[1]));
        else if (s.kind == Scalar::Kind::Dropout && s.args.size() != 2 &&
                 (s.args.size() != 1 || s.read < 0 ||
                  size_t(s.read) + 1 >= loop->invariants.size() ||
                  s.strides.size() != loop->extents.size()))
          fail(where, fmt::format("dropout scalar %{} without its key, base or strides", k));
      }
    } else if (const Gemm* gemm = std::get_if<Gemm>(&stmt.node)) {
      if (gemm->operands.size() != gemm->operandDims.size() || gemm->operands.empty())
        fail(where, "a GEMM whose operands and their dims disagree");
      auto elements = [&](const std::vector<int64_t>& dims) {
        int64_t n = 1;
        for (int64_t d : dims) {
          if (d < 0 || size_t(d) >= gemm->sizes.size()) return int64_t(-1);
          n *= gemm->sizes[size_t(d)];
        }
        return n;
      };
      for (size_t k = 0; k < gemm->operands.size() && k < gemm->operandDims.size(); ++k)
        if (!valid(gemm->operands[k]) ||
            elements(gemm->operandDims[k]) != fn.buffers[size_t(gemm->operands[k])].elements)
          fail(where, fmt::format("GEMM operand {} does not match its buffer", k));
      if (!valid(gemm->out) || elements(gemm->outDims) != fn.buffers[size_t(gemm->out)].elements)
        fail(where, "GEMM result does not match its buffer");
      if ((gemm->bias != kNoBuffer || gemm->gelu) &&
          (gemm->alpha != 1 || gemm->beta != 0 || gemm->dtype != DType::F32 ||
           gemm->outDims.empty() || !valid(gemm->bias) || gemm->bias == gemm->out ||
           fn.buffers[size_t(gemm->bias)].elements != elements({gemm->outDims.back()})))
        fail(where, "a GEMM epilogue without alpha 1, beta 0, f32 and a bias along its last dim");
      if (gemm->causal.kind != Gemm::Causal::Kind::None) {
        const Gemm::Causal& c = gemm->causal;
        auto has = [&](const std::vector<int64_t>& dims, int64_t d) {
          return std::find(dims.begin(), dims.end(), d) != dims.end();
        };
        bool scores = c.kind == Gemm::Causal::Kind::Scores;
        // Scores keep both dims, Context contracts the key positions, KeyGradient the queries.
        bool rowOut = c.kind != Gemm::Causal::Kind::KeyGradient,
             colOut = c.kind != Gemm::Causal::Kind::Context;
        bool shaped = c.row >= 0 && size_t(c.row) < gemm->sizes.size() && c.col >= 0 &&
                      size_t(c.col) < gemm->sizes.size() && c.row != c.col && c.block > 0 &&
                      gemm->sizes[size_t(c.row)] == gemm->sizes[size_t(c.col)] &&
                      gemm->sizes[size_t(c.row)] % c.block == 0 && gemm->operands.size() == 2 &&
                      gemm->beta == 0 && gemm->bias == kNoBuffer && gemm->dtype == DType::F32 &&
                      has(gemm->outDims, c.row) == rowOut && has(gemm->outDims, c.col) == colOut &&
                      (scores || (c.weights >= 0 && c.weights < 2 &&
                                  has(gemm->operandDims[size_t(c.weights)], c.row) &&
                                  has(gemm->operandDims[size_t(c.weights)], c.col) &&
                                  !(c.knownZeros && c.uniformTails)));
        if (!shaped)
          fail(where, "a causal GEMM whose rows, cols, block or weights do not fit its dims");
      }
    } else if (const Collective* c = std::get_if<Collective>(&stmt.node)) {
      if (c->axes.empty() || c->buffers.empty()) fail(where, "a collective over nothing");
      if (c->phase == Collective::Phase::Start) {
        if (pending.count(c->request)) fail(where, "a request started twice");
        pending[c->request] = c->buffers;
      } else if (c->phase == Collective::Phase::Wait) {
        auto it = pending.find(c->request);
        if (it == pending.end() || it->second != c->buffers)
          fail(where, fmt::format("a wait for request #{} that was not started", c->request));
        else
          pending.erase(it);
      }
    }
    // Nothing may touch the buffers of a collective in flight.
    for (const auto& [request, buffers] : pending) {
      const Collective* c = std::get_if<Collective>(&stmt.node);
      if (c && c->request == request) continue;
      for (BufferId id : readsOf(stmt))
        if (llvm::is_contained(buffers, id))
          fail(where, fmt::format("touches a buffer of request #{} in flight", request));
      for (BufferId id : writesOf(stmt))
        if (llvm::is_contained(buffers, id))
          fail(where, fmt::format("touches a buffer of request #{} in flight", request));
    }
    for (BufferId id : readsOf(stmt))
      read(id, where, init);
    for (BufferId id : writesOf(stmt))
      write(id, where, init);
  }

  /// The arena bytes of a buffer: all its copies (Buffer::copies).
  static size_t slotBytes(const Buffer& buffer) {
    if (buffer.copies > 1) return copyStride(buffer) * size_t(buffer.copies);
    return size_t(buffer.elements) * sizeof(float);
  }

  /// Planned arena slots of buffers alive at the same time on the same stage must not share
  /// bytes; a buffer held on some stages only (Buffer::stages) is touched there only and lies
  /// in each one's arena.
  std::string overlaps() const {
    auto [first, last] = liveRanges(fn, body);
    std::vector<uint64_t> touched = bufferStages(fn, body);
    std::vector<size_t> placed;
    for (size_t id = 0; id < fn.buffers.size(); ++id) {
      const Buffer& buffer = fn.buffers[id];
      if (buffer.storage != Storage::Arena || buffer.offset < 0 || first[id] == ~size_t(0))
        continue;
      size_t bytes = slotBytes(buffer);
      if (size_t(buffer.offset) % kArenaAlignment || size_t(buffer.offset) + bytes > fn.arenaBytes)
        return fmt::format("{} is placed outside the arena", buffer.name);
      if (buffer.stages != 0 && (touched[id] & ~buffer.stages))
        return fmt::format("{} is held on stages {:#x} but touched on stages {:#x}", buffer.name,
                           buffer.stages, touched[id]);
      for (size_t s = 0; s < fn.stageArenaBytes.size(); ++s)
        if ((buffer.stages == 0 || ((buffer.stages >> s) & 1)) &&
            size_t(buffer.offset) + bytes > fn.stageArenaBytes[s])
          return fmt::format("{} is placed outside stage {}'s arena", buffer.name, s);
      for (size_t other : placed) {
        const Buffer& b = fn.buffers[other];
        bool together = first[id] <= last[other] && first[other] <= last[id] &&
                        (buffer.stages == 0 || b.stages == 0 || (buffer.stages & b.stages));
        bool share = size_t(buffer.offset) < size_t(b.offset) + slotBytes(b) &&
                     size_t(b.offset) < size_t(buffer.offset) + bytes;
        if (together && share)
          return fmt::format("{} and {} are alive together and share arena bytes", buffer.name,
                             b.name);
      }
      placed.push_back(id);
    }
    return "";
  }

  const KernelFunction& fn;
  std::vector<Stmt> body; // run()'s, subroutines inlined
  std::vector<bool> defined;
  std::map<int, std::vector<BufferId>> pending;
  std::string error;
};

} // namespace

std::string verifyKernels(const KernelFunction& function) {
  return Verifier(function).run();
}

} // namespace meshc::kir
