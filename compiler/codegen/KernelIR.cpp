// The kernel IR's tables, def-use queries and its printed form (--emit=kernels).
#include "codegen/KernelIR.h"

#include <fmt/format.h>
#include <llvm/ADT/STLExtras.h>

namespace meshc::kir {

const char* storageName(Storage storage) {
  switch (storage) {
  case Storage::Input:
    return "input";
  case Storage::Param:
    return "param";
  case Storage::Arena:
    return "arena";
  case Storage::Persistent:
    return "persistent";
  case Storage::Argument:
    return "argument";
  }
  return "?";
}

namespace {

struct CalleeInfo {
  const char* spelling;
  unsigned traits;
  const char* description;
};

const CalleeInfo& info(Callee callee) {
  static const CalleeInfo table[] = {
#define KERNEL(Name, Spelling, Traits, Description) {Spelling, Traits, Description},
#include "codegen/KernelCalls.def"
#undef KERNEL
  };
  return table[size_t(callee)];
}

} // namespace

const char* calleeSpelling(Callee callee) {
  return info(callee).spelling;
}
unsigned calleeTraits(Callee callee) {
  return info(callee).traits;
}
const char* calleeDescription(Callee callee) {
  return info(callee).description;
}

std::vector<BufferId> readsOf(const Stmt& stmt) {
  struct Visitor {
    std::vector<BufferId> operator()(const Loop& loop) const {
      std::vector<BufferId> reads;
      for (const Access& access : loop.reads)
        reads.push_back(access.buffer);
      return reads;
    }
    std::vector<BufferId> operator()(const Gemm& gemm) const {
      std::vector<BufferId> reads = gemm.operands;
      if (gemm.beta != 0) reads.push_back(gemm.out);
      if (gemm.bias != kNoBuffer) reads.push_back(gemm.bias);
      return reads;
    }
    std::vector<BufferId> operator()(const Call& call) const { return call.reads; }
    std::vector<BufferId> operator()(const Collective& c) const { return c.buffers; }
    std::vector<BufferId> operator()(const Copy& copy) const { return {copy.from}; }
    std::vector<BufferId> operator()(const Invoke& invoke) const { return invoke.reads; }
  };
  return std::visit(Visitor{}, stmt.node);
}

std::vector<BufferId> writesOf(const Stmt& stmt) {
  struct Visitor {
    std::vector<BufferId> operator()(const Loop& loop) const {
      std::vector<BufferId> writes;
      for (const Store& store : loop.stores)
        writes.push_back(store.at.buffer);
      return writes;
    }
    std::vector<BufferId> operator()(const Gemm& gemm) const { return {gemm.out}; }
    std::vector<BufferId> operator()(const Call& call) const {
      if (call.out == kNoBuffer) return call.reads; // in place
      std::vector<BufferId> writes{call.out};
      writes.insert(writes.end(), call.alsoWrites.begin(), call.alsoWrites.end());
      return writes;
    }
    std::vector<BufferId> operator()(const Collective& c) const {
      if (c.phase == Collective::Phase::Start) return {}; // the Wait completes the writes
      return c.buffers;
    }
    std::vector<BufferId> operator()(const Copy& copy) const { return {copy.to}; }
    std::vector<BufferId> operator()(const Invoke& invoke) const { return invoke.writes; }
  };
  return std::visit(Visitor{}, stmt.node);
}

void forEachStream(Stmt& stmt, const std::function<void(Arg&)>& visit) {
  std::vector<Arg>* args = nullptr;
  if (Loop* loop = std::get_if<Loop>(&stmt.node)) args = &loop->invariants;
  if (Call* call = std::get_if<Call>(&stmt.node)) args = &call->args;
  if (args)
    for (Arg& arg : *args)
      if (arg.kind == Arg::Kind::Stream || arg.kind == Arg::Kind::StreamKey) visit(arg);
}

void replaceBuffer(Stmt& stmt, BufferId from, BufferId to) {
  forEachBuffer(stmt, [&](BufferId& id) {
    if (id == from) id = to;
  });
}

const char* valueTypeEnum(DType dtype) {
  switch (dtype) {
  case DType::F32:
    return "meshrt::kernels::ValueType::F32";
  case DType::BF16:
    return "meshrt::kernels::ValueType::BF16";
  case DType::F16:
    return "meshrt::kernels::ValueType::F16";
  case DType::I32:
    return "meshrt::kernels::ValueType::I32";
  }
  return "meshrt::kernels::ValueType::F32";
}

Shape sizesOf(const std::vector<ir::Dim>& dims) {
  Shape sizes;
  for (const ir::Dim& dim : dims)
    sizes.push_back(dim.size);
  return sizes;
}

Shape sizesOf(const ir::TensorType& type) {
  return sizesOf(type.dims);
}

int64_t pointCount(const Shape& extents) {
  int64_t points = 1;
  for (int64_t extent : extents)
    points *= extent;
  return points;
}

Shape rowMajorStrides(const Shape& sizes) {
  Shape strides(sizes.size());
  int64_t stride = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= sizes[i];
  }
  return strides;
}

Shape rowMajorStrides(const ir::TensorType& type) {
  return rowMajorStrides(sizesOf(type));
}

std::vector<std::vector<size_t>> readerLists(const std::vector<Stmt>& stmts, size_t buffers) {
  std::vector<std::vector<size_t>> lists(buffers);
  for (size_t k = 0; k < stmts.size(); ++k)
    for (BufferId id : readsOf(stmts[k]))
      if (lists[size_t(id)].empty() || lists[size_t(id)].back() != k)
        lists[size_t(id)].push_back(k);
  return lists;
}

void replaceBufferFrom(KernelFunction& fn, size_t first, BufferId from, BufferId to) {
  for (size_t k = first; k < fn.body.size(); ++k)
    replaceBuffer(fn.body[k], from, to);
  for (BufferId& id : fn.outputs)
    if (id == from) id = to;
  for (KernelFunction::Update& update : fn.updates)
    if (update.value == from) update.value = to;
}

bool isPure(const Stmt& stmt) {
  if (std::holds_alternative<Loop>(stmt.node) || std::holds_alternative<Gemm>(stmt.node))
    return true;
  const Call* call = std::get_if<Call>(&stmt.node);
  if (!call) return false;
  unsigned traits = calleeTraits(call->callee);
  if (!(traits & kPure) || (traits & (kCommunicates | kStepKeyed))) return false;
  for (const Arg& arg : call->args)
    if ((arg.kind == Arg::Kind::Stream && arg.value != 0) || arg.kind == Arg::Kind::StreamKey ||
        (arg.kind == Arg::Kind::Text && arg.text == "seed_") || readsMicrobatch(arg))
      return false; // the seed changes on load(); streams keyed by step change every step
  return true;
}

bool passedOnly(const KernelFunction& fn, const std::vector<std::vector<size_t>>& readers,
                const std::vector<int>& writers, BufferId id, size_t reader) {
  return readers[size_t(id)] == std::vector<size_t>{reader} && writers[size_t(id)] == 1 &&
         !fn.isResult(id) && fn.buffers[size_t(id)].storage == Storage::Arena;
}

void fuseAdjacent(KernelFunction& fn,
                  const std::function<bool(size_t k, Stmt& first, Stmt& second)>& fuse) {
  std::vector<Stmt> body;
  for (size_t k = 0; k < fn.body.size(); ++k) {
    Stmt& stmt = fn.body[k];
    if (k + 1 < fn.body.size() && samePlace(stmt, fn.body[k + 1]) &&
        fuse(k, stmt, fn.body[k + 1])) {
      llvm::append_range(stmt.sources, fn.body[k + 1].sources);
      body.push_back(std::move(stmt));
      ++k;
      continue;
    }
    body.push_back(std::move(stmt));
  }
  fn.body = std::move(body);
}

bool samePlace(const Stmt& a, const Stmt& b) {
  return a.perMicrobatch == b.perMicrobatch && a.recomputed == b.recomputed && a.stage == b.stage &&
         a.stageMask == b.stageMask && a.microbatchLoop == b.microbatchLoop;
}

bool alongRow(const Access& access) {
  for (size_t d = 0; d + 1 < access.strides.size(); ++d)
    if (access.strides[d] != 0) return false;
  return !access.strides.empty() && access.strides.back() == 1;
}

bool readsMicrobatch(const Arg& arg) {
  if (llvm::is_contained(arg.names, kMicrobatchAxis)) return true;
  return llvm::any_of(arg.starts, [](const auto& start) {
    return llvm::is_contained(start.first, kMicrobatchAxis);
  });
}

LiveRanges liveRanges(const KernelFunction& fn, const std::vector<Stmt>& stmts) {
  constexpr size_t kNever = ~size_t(0);
  LiveRanges ranges{std::vector<size_t>(fn.buffers.size(), kNever),
                    std::vector<size_t>(fn.buffers.size(), 0)};
  std::vector<bool> inLoop(fn.buffers.size(), false), outside(fn.buffers.size(), false);
  size_t loopBegin = kNever, loopEnd = 0;
  auto touch = [&](BufferId id, size_t at, bool looped) {
    ranges.first[size_t(id)] = std::min(ranges.first[size_t(id)], at);
    ranges.last[size_t(id)] = std::max(ranges.last[size_t(id)], at);
    (looped ? inLoop : outside)[size_t(id)] = true;
  };
  for (size_t k = 0; k < stmts.size(); ++k) {
    if (stmts[k].perMicrobatch) {
      loopBegin = std::min(loopBegin, k);
      loopEnd = std::max(loopEnd, k);
    }
    for (BufferId id : readsOf(stmts[k]))
      touch(id, k, stmts[k].perMicrobatch);
    for (BufferId id : writesOf(stmts[k]))
      touch(id, k, stmts[k].perMicrobatch);
  }
  for (BufferId id : fn.outputs)
    touch(id, stmts.size(), false);
  for (const KernelFunction::Update& update : fn.updates)
    touch(update.value, stmts.size(), false);
  if (loopBegin != kNever)
    for (size_t id = 0; id < fn.buffers.size(); ++id)
      if ((inLoop[id] && outside[id]) || fn.buffers[id].copies > 1) {
        // A buffer with a copy per microbatch holds them all over both loops.
        if (ranges.first[id] == kNever) continue;
        ranges.first[id] = std::min(ranges.first[id], loopBegin);
        ranges.last[id] = std::max(ranges.last[id], loopEnd);
      }
  return ranges;
}

std::vector<uint64_t> bufferStages(const KernelFunction& fn, const std::vector<Stmt>& stmts) {
  uint64_t every = fn.stages.count >= 64 ? ~uint64_t(0) : (uint64_t(1) << fn.stages.count) - 1;
  std::vector<uint64_t> stages(fn.buffers.size(), fn.stages.count > 1 ? 0 : every);
  if (fn.stages.count <= 1) return stages;
  for (const Stmt& stmt : stmts) {
    uint64_t mask = stmt.stageMask ? stmt.stageMask : every;
    if (const Call* call = std::get_if<Call>(&stmt.node);
        call &&
        (call->callee == Callee::StageTransfer || call->callee == Callee::StageTransferStarted))
      mask = (uint64_t(1) << int64_t(call->args.at(2).value)) | uint64_t(call->args.at(3).value);
    for (BufferId id : readsOf(stmt))
      stages[size_t(id)] |= mask;
    for (BufferId id : writesOf(stmt))
      stages[size_t(id)] |= mask;
  }
  for (BufferId id : fn.outputs)
    stages[size_t(id)] = every;
  for (const KernelFunction::Update& update : fn.updates)
    stages[size_t(update.value)] |=
        update.param < fn.paramStages.size() && fn.paramStages[update.param]
            ? fn.paramStages[update.param]
            : every;
  return stages;
}

size_t copyStride(const Buffer& buffer) {
  size_t bytes = size_t(buffer.elements) * sizeof(float); // every dtype is held as float
  return (bytes + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment;
}

std::vector<int> KernelFunction::writerCounts() const {
  std::vector<int> counts(buffers.size(), 0);
  for (const std::vector<Stmt>* list : {&init, &body})
    for (const Stmt& stmt : *list)
      for (BufferId id : writesOf(stmt))
        ++counts[size_t(id)];
  return counts;
}

std::vector<Stmt> KernelFunction::inlinedBody() const {
  std::vector<Stmt> out;
  for (const Stmt& stmt : body) {
    const Invoke* invoke = std::get_if<Invoke>(&stmt.node);
    if (!invoke) {
      out.push_back(stmt);
      continue;
    }
    const Subroutine& sub = subroutines.at(size_t(invoke->subroutine));
    for (Stmt inner : sub.body) {
      forEachBuffer(inner, [&](BufferId& id) {
        if (id >= 0 && size_t(id) < buffers.size() &&
            buffers[size_t(id)].storage == Storage::Argument)
          id = invoke->arguments.at(size_t(buffers[size_t(id)].index));
      });
      forEachStream(inner, [&](Arg& arg) {
        if (arg.textParameter < 0) return;
        arg.text = invoke->texts.at(size_t(arg.textParameter));
        arg.textParameter = -1;
      });
      inner.perMicrobatch = stmt.perMicrobatch;
      inner.microbatchLoop = stmt.microbatchLoop;
      out.push_back(std::move(inner));
    }
  }
  return out;
}

bool KernelFunction::isResult(BufferId id) const {
  if (llvm::is_contained(outputs, id)) return true;
  for (const Update& update : updates)
    if (update.value == id) return true;
  return false;
}

namespace {

std::string ints(const Shape& values) {
  return fmt::format("{{{}}}", fmt::join(values, ","));
}

class Printer {
public:
  explicit Printer(const KernelFunction& fn) : fn(fn) {}

  std::string print() {
    size_t arena = 0, persistent = 0;
    for (const Buffer& buffer : fn.buffers) {
      arena += buffer.storage == Storage::Arena;
      persistent += buffer.storage == Storage::Persistent;
    }
    out += fmt::format("kernels {}: {} buffers ({} arena, {} persistent), arena {} bytes for {} "
                       "bytes of temporaries, persistent {} bytes\n",
                       fn.name, fn.buffers.size(), arena, persistent, fn.arenaBytes,
                       fn.temporaryBytes, fn.persistentBytes);
    if (!fn.stageArenaBytes.empty())
      out += fmt::format("  arena per stage: {} bytes\n", fmt::join(fn.stageArenaBytes, ", "));
    for (const Buffer& buffer : fn.buffers) {
      if (buffer.storage == Storage::Arena && buffer.offset < 0 && fn.arenaBytes > 0)
        continue; // fused away: never stored
      out += fmt::format("  {} = {} {}[{}]", buffer.name, storageName(buffer.storage),
                         buffer.keepMask ? "u8" : ir::dtypeName(buffer.dtype),
                         accessibleElements(buffer));
      if (buffer.index >= 0) out += fmt::format(" #{}", buffer.index);
      if (buffer.offset >= 0) out += fmt::format(" @{}", buffer.offset);
      if (buffer.stages != 0) out += fmt::format(" on stages {:#x}", buffer.stages);
      if (!buffer.what.empty()) out += fmt::format(" \"{}\"", buffer.what);
      out += "\n";
    }
    if (!fn.init.empty()) {
      out += "init:\n";
      for (const Stmt& stmt : fn.init)
        statement(stmt);
    }
    for (const Subroutine& sub : fn.subroutines) {
      std::vector<std::string> parameters;
      for (BufferId id : sub.parameters)
        parameters.push_back(name(id));
      for (size_t k = 0; k < sub.textParameters; ++k)
        parameters.push_back(fmt::format("$t{}", k));
      out += fmt::format("subroutine {}({}):\n", sub.name, fmt::join(parameters, ", "));
      for (const Stmt& stmt : sub.body)
        statement(stmt);
    }
    out += "run:\n";
    bool looping = false;
    for (const Stmt& stmt : fn.body) {
      if (stmt.perMicrobatch != looping)
        out += stmt.perMicrobatch ? fmt::format("microbatches {} along {}:\n",
                                                fn.microbatches.count, fn.microbatches.dim)
                                  : "end microbatches\n";
      looping = stmt.perMicrobatch;
      statement(stmt);
    }
    if (looping) out += "end microbatches\n";
    std::vector<std::string> outputs, updates;
    for (BufferId id : fn.outputs)
      outputs.push_back(name(id));
    for (const KernelFunction::Update& update : fn.updates)
      updates.push_back(fmt::format("{} <- {}", name(fn.params[update.param]), name(update.value)));
    out += fmt::format("outputs: {}\n", fmt::join(outputs, ", "));
    if (!updates.empty()) out += fmt::format("updates: {}\n", fmt::join(updates, ", "));
    return out;
  }

private:
  std::string name(BufferId id) const {
    return id >= 0 && size_t(id) < fn.buffers.size() ? fn.buffers[size_t(id)].name
                                                     : fmt::format("<bad {}>", id);
  }

  void statement(const Stmt& stmt) {
    for (const std::string& source : stmt.sources)
      out += fmt::format("  # {}\n", source);
    if (stmt.stageMask != 0) { // pipeline stages (SplitStages.h): which run it
      std::vector<int> stages;
      for (int s = 0; s < 64; ++s)
        if ((stmt.stageMask >> s) & 1) stages.push_back(s);
      out += fmt::format("  on stages {}{}\n", fmt::join(stages, ","),
                         stmt.perMicrobatch && fn.stages.count > 1 && fn.microbatches.count > 1
                             ? (stmt.microbatchLoop ? " (backwards)" : " (forwards)")
                             : "");
    }
    std::visit([&](const auto& node) { print(node, stmt); }, stmt.node);
  }

  void print(const Loop& loop, const Stmt&) {
    std::vector<std::string> dims;
    for (size_t d = 0; d < loop.extents.size(); ++d)
      dims.push_back(
          fmt::format("{}={}", d < loop.dims.size() ? loop.dims[d] : "?", loop.extents[d]));
    out += fmt::format("  loop [{}]\n", fmt::join(dims, ", "));
    for (size_t k = 0; k < loop.body.size(); ++k) {
      const Scalar& s = loop.body[k];
      std::string text;
      switch (s.kind) {
      case Scalar::Kind::Load:
        text = fmt::format("load {}{}", name(loop.reads[size_t(s.read)].buffer),
                           ints(loop.reads[size_t(s.read)].strides));
        break;
      case Scalar::Kind::Const:
        text = fmt::format("const {}", s.value);
        break;
      case Scalar::Kind::Step:
        text = "step";
        break;
      case Scalar::Kind::Dropout:
        if (s.args.size() == 2) // its mask kept by an earlier loop
          text = fmt::format("dropout %{} rate {} kept %{}", s.args[0], s.value, s.args[1]);
        else
          text = fmt::format("dropout %{} rate {} key {} index {} + i.{}",
                             s.args.empty() ? -1 : s.args[0], s.value, argumentAt(loop, s.read),
                             argumentAt(loop, s.read + 1), ints(s.strides));
        break;
      case Scalar::Kind::Compute: {
        std::vector<std::string> args;
        for (int a : s.args)
          args.push_back(fmt::format("%{}", a));
        text = fmt::format("{}{} {}", ir::opSpelling(s.op),
                           s.function.empty() ? "" : " " + s.function, fmt::join(args, " "));
        break;
      }
      }
      out += fmt::format("    %{} = {} : {}\n", k, text, ir::dtypeName(s.dtype));
    }
    for (const Store& store : loop.stores)
      out += fmt::format("    store {}{} = {}%{}\n", name(store.at.buffer), ints(store.at.strides),
                         store.keepBit ? "keep " : "", store.value);
  }

  std::string argumentAt(const Loop& loop, int index) const {
    return index >= 0 && size_t(index) < loop.invariants.size()
               ? argument(loop.invariants[size_t(index)])
               : "<bad invariant>";
  }

  void print(const Gemm& gemm, const Stmt&) {
    auto named = [&](const std::vector<int64_t>& dims) {
      std::vector<std::string> names;
      for (int64_t d : dims)
        names.push_back(gemm.dims[size_t(d)]);
      return fmt::format("[{}]", fmt::join(names, ","));
    };
    std::vector<std::string> operands, sizes;
    for (size_t k = 0; k < gemm.operands.size(); ++k)
      operands.push_back(name(gemm.operands[k]) + named(gemm.operandDims[k]));
    for (size_t d = 0; d < gemm.dims.size(); ++d)
      sizes.push_back(fmt::format("{}={}", gemm.dims[d], gemm.sizes[d]));
    std::string value =
        fmt::format("{} * einsum({}){}{}", gemm.alpha, fmt::join(operands, ", "),
                    gemm.beta != 0 ? fmt::format(" + {} * {}", gemm.beta, name(gemm.out)) : "",
                    gemm.bias != kNoBuffer ? fmt::format(" + {}[{}]", name(gemm.bias),
                                                         gemm.dims[size_t(gemm.outDims.back())])
                                           : "");
    std::string causal;
    auto dim = [&](int64_t d) {
      return d >= 0 && size_t(d) < gemm.dims.size() ? gemm.dims[size_t(d)] : "?";
    };
    const Gemm::Causal& c = gemm.causal;
    if (c.kind == Gemm::Causal::Kind::Scores)
      causal = fmt::format(
          " causal scores (rows {}, cols {}, block {}, {})", dim(c.row), dim(c.col), c.block,
          c.fillAbove ? fmt::format("fill {}", c.fill) : std::string("unwritten above"));
    else if (c.kind != Gemm::Causal::Kind::None)
      causal =
          fmt::format(" causal {} (rows {}, cols {}, block {}, weights operand {}{}{})",
                      c.kind == Gemm::Causal::Kind::Context ? "context" : "key gradient",
                      dim(c.row), dim(c.col), c.block, c.weights,
                      c.uniformTails ? ", uniform tails" : "", c.knownZeros ? ", known zeros" : "");
    out += fmt::format("  gemm {}{} = {} : {} ({}){}\n", name(gemm.out), named(gemm.outDims),
                       gemm.gelu ? "gelu(" + value + ")" : value, ir::dtypeName(gemm.dtype),
                       fmt::join(sizes, " "), causal);
  }

  void print(const Call& call, const Stmt& stmt) {
    std::vector<std::string> args;
    for (const Arg& arg : call.args)
      args.push_back(argument(arg));
    out += fmt::format("  call {}({}){}\n", calleeSpelling(call.callee), fmt::join(args, ", "),
                       stmt.zeroFirst ? " zeroed first" : "");
  }

  std::string argument(const Arg& arg) const {
    switch (arg.kind) {
    case Arg::Kind::Data:
    case Arg::Kind::View:
      return name(arg.buffer);
    case Arg::Kind::Ints:
      return ints(arg.ints);
    case Arg::Kind::Int:
      return fmt::format("{}", int64_t(arg.value));
    case Arg::Kind::Real:
      return fmt::format("{}", arg.value);
    case Arg::Kind::ShardStart:
      return fmt::format("start[{}]/{}", fmt::join(arg.names, ","), int64_t(arg.value));
    case Arg::Kind::GlobalBase:
      return fmt::format("globalBase({}){}{}", arg.value, ints(arg.ints),
                         readsMicrobatch(arg) ? "+microbatch" : "");
    case Arg::Kind::Shard:
      return fmt::format("shard{}{}{}", ints(arg.ints), ints(arg.ints2),
                         readsMicrobatch(arg) ? "+microbatch" : "");
    case Arg::Kind::BlockIndex:
      return fmt::format("block[{}]", fmt::join(arg.names, ","));
    case Arg::Kind::Group:
    case Arg::Kind::GroupPointer:
      return fmt::format("group[{}]", fmt::join(arg.names, ","));
    case Arg::Kind::Stream:
    case Arg::Kind::StreamKey:
      return fmt::format("stream {}{}",
                         arg.textParameter >= 0 ? fmt::format("$t{}", arg.textParameter)
                                                : fmt::format("\"{}\"", arg.text),
                         arg.value != 0 ? "#step" : "");
    case Arg::Kind::Enum:
    case Arg::Kind::Text:
      return arg.text;
    }
    return "?";
  }

  void print(const Collective& c, const Stmt&) {
    const char* phase = c.phase == Collective::Phase::Start  ? ".start"
                        : c.phase == Collective::Phase::Wait ? ".wait"
                                                             : "";
    std::vector<std::string> buffers;
    for (BufferId id : c.buffers)
      buffers.push_back(name(id));
    out += fmt::format("  {}{}{} [{}] {}\n", plan::collectiveName(c.kind), phase,
                       c.request >= 0 ? fmt::format(" #{}", c.request) : "", fmt::join(c.axes, ","),
                       fmt::join(buffers, " "));
  }

  void print(const Copy& copy, const Stmt&) {
    out += fmt::format("  copy {} <- {}\n", name(copy.to), name(copy.from));
  }

  void print(const Invoke& invoke, const Stmt&) {
    std::vector<std::string> arguments;
    for (BufferId id : invoke.arguments)
      arguments.push_back(name(id));
    for (const std::string& text : invoke.texts)
      arguments.push_back(fmt::format("\"{}\"", text));
    out += fmt::format("  call {}({})\n",
                       invoke.subroutine >= 0 && size_t(invoke.subroutine) < fn.subroutines.size()
                           ? fn.subroutines[size_t(invoke.subroutine)].name
                           : "<bad subroutine>",
                       fmt::join(arguments, ", "));
  }

  const KernelFunction& fn;
  std::string out;
};

} // namespace

std::string printKernels(const KernelFunction& function) {
  return Printer(function).print();
}

std::string printKernels(const KernelModule& module) {
  std::string out;
  for (size_t k = 0; k < module.functions.size(); ++k)
    out += (k ? "\n" : "") + printKernels(module.functions[k]);
  return out;
}

} // namespace meshc::kir
