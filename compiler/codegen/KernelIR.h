// The kernel IR: how one rank computes what the SPMD IR says it computes. Between the plan and
// the text: buffers with arena offsets, fused loop nests over compile-time local extents (their
// bodies are scalar SSA), library calls (GEMM with alpha and beta), the runtime's kernels
// (reductions, softmax, data movement, RNG fills) from one table (KernelCalls.def), and
// collectives as start/wait pairs. Produced by lowerToKernels (LowerToKernels.h), rewritten by the
// passes listed in Lower.cpp, checked by verifyKernels after each, printed by --emit=kernels and
// turned into C++ or CUDA by the printers. docs/codegen.md describes it.
#pragma once

#include "ir/IR.h"
#include "planner/SpmdIR.h"

#include <cstdint>
#include <functional>
#include <string>
#include <variant>
#include <vector>

namespace meshc::kir {

using ir::DType;
using Shape = std::vector<int64_t>;
using BufferId = int32_t;
constexpr BufferId kNoBuffer = -1;

/// Where a buffer's bytes live.
enum class Storage {
  Input,      // the caller's input tensor (read only)
  Param,      // a parameter member of the generated object
  Arena,      // a slot of run()'s arena, at `offset`, live over the statements that use it
  Persistent, // a member computed once, in the constructor (hoisted step-invariant values)
  Argument,   // a parameter of a subroutine: the caller's buffer (see Invoke)
};
const char* storageName(Storage storage);

struct Buffer {
  std::string name; // the C++ variable ("v12")
  std::string what; // the value it holds, for comments ("scores", or "" for a temporary)
  int64_t elements = 0;
  DType dtype = DType::F32; // element values are held as float; dtype says how they round
  Storage storage = Storage::Arena;
  int64_t index = -1;  // Input / Param: which input or param of the function; Argument: which
                       // parameter of its subroutine
  int64_t offset = -1; // Arena / Persistent: byte offset, assigned by planBuffers
  /// Pipeline schedules (ScheduleMicrobatches.h): an activation kept from the forwards' loop for
  /// the backwards' has one copy per microbatch, microbatch m's at offset + m * stride (under
  /// 1F1B one per microbatch in flight on its stage, microbatch m's at (m mod copies) * stride).
  int64_t copies = 1;
  /// Pipeline stages: the stages whose ranks touch it (Arena: they alone hold its bytes, the
  /// arena of a stage is sized for its own buffers), one bit each; 0: every rank. planBuffers.
  uint64_t stages = 0;
  /// A dropout's keep mask (keep-dropout-masks): one byte per point, 0 or 1, packed four to a
  /// float slot, so it lives in the arena as any buffer (`elements` counts the slots) while
  /// loop accesses count bytes. Only loops touch it: keep stores write it, loads read 0 or 1.
  bool keepMask = false;
};

/// The elements a loop access may reach: bytes of a keep mask, else floats.
inline int64_t accessibleElements(const Buffer& buffer) {
  return buffer.keepMask ? buffer.elements * int64_t(sizeof(float)) : buffer.elements;
}

/// One argument of a kernel call; the printers spell each kind for their target.
struct Arg {
  enum class Kind {
    Data,         // buffer's element pointer
    View,         // buffer as a span
    Ints,         // {a, b, ...}
    Int,          // an integer
    Real,         // a double literal
    ShardStart,   // this rank's shard start along a dim split over `names` of global size `value`
    GlobalBase,   // `value` + sum over the shard starts of `starts` times the strides `ints`
    Shard,        // meshrt::kernels::Shard{global sizes `ints`, starts, local sizes `ints2`}
    BlockIndex,   // this rank's block index along the axes `names`
    Group,        // the subgroup communicator over `names` (a reference)
    GroupPointer, // the same as a pointer, nullptr when `names` is empty (the lane is whole)
    Stream,       // the RNG stream name `text` (keyed by the train step when `value` != 0)
    StreamKey,    // the same, as the stream key made with the seed (meshrt::streamKey)
    Enum,         // a support enumerator, e.g. "Reduce::Sum" (target namespace prefixed)
    Text,         // a C++ token the same on every target (a ValueType enumerator, a string)
  };
  Kind kind = Kind::Int;
  BufferId buffer = kNoBuffer;
  Shape ints, ints2;
  double value = 0;
  std::string text;
  std::vector<std::string> names;
  /// GlobalBase / Shard: per dim, the axes its shard start comes from and the local size.
  std::vector<std::pair<std::vector<std::string>, int64_t>> starts;
  /// Stream / StreamKey in a subroutine: the stream's name is the subroutine's text parameter of
  /// this index (each repetition of a layer draws from its own stream), not `text`.
  int textParameter = -1;
  bool operator==(const Arg&) const = default;
};

//===------------------------------------------------------------------------------------------===//
// Fused loop nests
//===------------------------------------------------------------------------------------------===//

/// One buffer access of a loop: element offset = sum over loop dims of index * stride (a
/// stride of 0 repeats the element along that dim: a broadcast).
struct Access {
  BufferId buffer = kNoBuffer;
  Shape strides;
  bool operator==(const Access&) const = default;
};

/// One scalar of a loop body (SSA: `args` name earlier scalars of the same body).
struct Scalar {
  enum class Kind {
    Load,    // reads[read] at the current point
    Const,   // `value`
    Compute, // `op` (an elementwise IR op) of `args`
    Step,    // the train step counter (steps taken before this one), as f32
    Dropout, // args[0] kept with probability 1 - `value` (the rate) and scaled by 1 / (1 - rate),
             // by the layout-invariant RNG: key loop.invariants[read] (a stream key), global
             // index loop.invariants[read + 1] (a global base) + sum of index * `strides`; or,
             // with args[1], kept where that scalar (a load of a keep mask) is 1: the mask an
             // earlier loop drew at the same global indices (keep-dropout-masks)
  };
  Kind kind = Kind::Const;
  ir::OpKind op = ir::OpKind::Add;
  std::vector<int> args;
  int read = -1;
  double value = 0;
  DType dtype = DType::F32;
  std::string function; // op == Call: the user's C++ function
  Shape strides;        // Dropout: the global index's strides over the loop dims
  bool operator==(const Scalar&) const = default;
};

/// One result of a loop: the scalar `value` stored at `at` (rounded to the buffer's dtype), or,
/// `keepBit`, the keep bit (1 kept, 0 dropped) of the Dropout scalar `value`, into a keep mask.
struct Store {
  Access at;
  int value = -1;
  bool keepBit = false;
  bool operator==(const Store&) const = default;
};

/// A fused elementwise loop nest: for every point of `extents`, evaluates `body` and stores
/// some of its scalars (fused producers whose values are still needed store theirs too).
struct Loop {
  std::vector<std::string> dims; // the loop dims' names (for reading the IR)
  Shape extents;                 // compile-time local extents
  std::vector<Access> reads;
  std::vector<Store> stores;
  std::vector<Scalar> body;
  /// Values computed once before the loop (RNG stream keys, global bases), printed as kernel
  /// arguments are.
  std::vector<Arg> invariants;
  bool operator==(const Loop&) const = default;
};

//===------------------------------------------------------------------------------------------===//
// Library calls
//===------------------------------------------------------------------------------------------===//

/// out = alpha * einsum(operands) + beta * out, over named dims with local sizes. Operands and
/// result are dense row-major over their dims (`operandDims`, `outDims`: indices into `dims`).
struct Gemm {
  std::vector<std::string> dims;
  Shape sizes;
  std::vector<BufferId> operands;
  std::vector<std::vector<int64_t>> operandDims;
  BufferId out = kNoBuffer;
  std::vector<int64_t> outDims;
  double alpha = 1, beta = 0;
  DType dtype = DType::F32;
  /// An epilogue (fuse-gemm-epilogues; only with alpha 1 and beta 0, f32): out = f(einsum +
  /// bias), `bias` one value per index of the last out dim, f GELU (tanh form) when `gelu`, else
  /// the identity.
  BufferId bias = kNoBuffer;
  bool gelu = false;
  /// Causal attention (causal-attention-blocks): a GEMM one of whose index pairs, the query
  /// positions dims[row] and the key positions dims[col] (equal extents), holds a triangle: in
  /// blocks of `block`, block i of one only meets the other's positions on its side of the
  /// diagonal, the lower triangle of blocks.
  /// `Scores`: row and col are out dims whose entries above the blocks' diagonal only a masked
  /// softmax reads, which replaces them (the mask is zero there), so they are left out of the
  /// GEMM and written as `fill`, or not written at all when `fillAbove` is false (the softmax is a
  /// causalMaskedSoftmax, which never reads them).
  /// `Context`: col is contracted with operand `weights`, zero above the diagonal: a row block
  /// takes only the key positions up to its end. `KeyGradient`: row is contracted with operand
  /// `weights` (probs^T . d_context, d_scores^T . q): a key block takes only the query positions
  /// from its start. Where the zeros are a softmax's (zero unless a whole row fell back), they are
  /// checked at run time and a block (Context) or the whole GEMM (KeyGradient) takes every
  /// position where they are not, so the result is the full einsum's; `knownZeros`: they are a
  /// where(causal mask, x, 0)'s, exact, and nothing is checked. A target may ignore it and
  /// compute the whole einsum.
  struct Causal {
    enum class Kind { None, Scores, Context, KeyGradient };
    Kind kind = Kind::None;
    int64_t row = -1, col = -1; // indices into dims
    int64_t block = 0;
    int64_t weights = -1;  // Context, KeyGradient: the operand zero above the diagonal
    double fill = 0;       // Scores: the value written above the blocks' diagonal
    bool fillAbove = true; // Scores: whether it is written (false: nothing reads it)
    /// Context, KeyGradient: the weights are a causalMaskedSoftmax's, whose entries past each
    /// row's prefix are all equal (zero unless the row fell back), so one entry per row past its
    /// block's diagonal tells whether that row's weights there are all zero.
    bool uniformTails = false;
    /// Context, KeyGradient: the weights are exactly zero above the diagonal (no check).
    bool knownZeros = false;
    bool operator==(const Causal&) const = default;
  };
  Causal causal;
  bool operator==(const Gemm&) const = default;
};

/// The runtime's kernels, from KernelCalls.def.
enum class Callee {
#define KERNEL(Name, Spelling, Traits, Description) Name,
#include "codegen/KernelCalls.def"
#undef KERNEL
};
/// Traits of a kernel (one table that every pass reads).
enum KernelTrait : unsigned {
  kPure = 1u << 0,         // result depends only on its arguments: may be merged (CSE) or hoisted
  kNeedsZero = 1u << 1,    // writes only part of `out`: the rest must be zero beforehand
  kCommunicates = 1u << 2, // calls collectives (every rank runs it, in the same order)
  kStepKeyed = 1u << 3,    // depends on the train step (RNG streams keyed by step)
};
const char* calleeSpelling(Callee callee);
unsigned calleeTraits(Callee callee);
const char* calleeDescription(Callee callee);

struct Call {
  Callee callee = Callee::Reduce;
  std::vector<Arg> args;
  BufferId out = kNoBuffer;    // the buffer it writes (kNoBuffer: in place on `reads`)
  std::vector<BufferId> reads; // the buffers it reads (and, for in-place kernels, writes)
  /// Buffers it writes besides `out`: a fused kernel that also stores the value it computed
  /// on the way (addLayerNormAffine's sum, read again later as the residual).
  std::vector<BufferId> alsoWrites;
  bool operator==(const Call&) const = default;
};

//===------------------------------------------------------------------------------------------===//
// Collectives
//===------------------------------------------------------------------------------------------===//

/// An in-place all-reduce of `buffers` over the ranks along `axes` (several buffers: one
/// packed collective). Blocking, or split into a Start and the Wait with the same `request`.
struct Collective {
  enum class Phase { Blocking, Start, Wait };
  plan::CollectiveKind kind = plan::CollectiveKind::AllReduceSum;
  std::vector<std::string> axes;
  std::vector<BufferId> buffers;
  Phase phase = Phase::Blocking;
  int request = -1;
  bool operator==(const Collective&) const = default;
};

/// to = from, element for element.
struct Copy {
  BufferId to = kNoBuffer, from = kNoBuffer;
  bool operator==(const Copy&) const = default;
};

/// A call of the function's subroutine `subroutine` (outlined repeated code): its k-th
/// parameter is `arguments[k]`, its k-th text parameter (an RNG stream's name) `texts[k]`.
/// `reads` and `writes` are the arguments its body reads and writes.
struct Invoke {
  int subroutine = -1;
  std::vector<BufferId> arguments;
  std::vector<std::string> texts;
  std::vector<BufferId> reads, writes;
  bool operator==(const Invoke&) const = default;
};

//===------------------------------------------------------------------------------------------===//
// Statements and functions
//===------------------------------------------------------------------------------------------===//

struct Stmt {
  std::variant<Loop, Gemm, Call, Collective, Copy, Invoke> node;
  /// The .mesh ops it computes, "file:line:col op -> value" each (comments in the output).
  std::vector<std::string> sources;
  /// Zero the written buffer first (kernels that write part of it).
  bool zeroFirst = false;
  /// The train step's part it belongs to (that of its first source): named in traces.
  plan::Phase phase = plan::Phase::Forward;
  /// Runs once per microbatch, in the microbatch loop (KernelFunction::microbatches): the
  /// statements so marked are one contiguous stretch of run()'s body.
  bool perMicrobatch = false;
  /// It recomputes a forward value for the backward pass (train/Recompute.h): never merged into
  /// the forward statement it repeats, nor hoisted, or the activation would be kept after all.
  bool recomputed = false;
  /// Pipeline stages (SplitStages.h): the stage of the repeat iteration its op comes from (-1:
  /// none; split-stages places it by what it reads and what reads it), and the stages that run
  /// it, one bit each (0: every rank).
  int stage = -1;
  uint64_t stageMask = 0;
  /// Under a pipeline schedule the microbatch loop is two (ScheduleMicrobatches.h): 0 the
  /// forwards' loop, 1 the backwards'.
  int microbatchLoop = 0;
};

/// The buffers a statement reads and the one it writes (kNoBuffer for in-place collectives,
/// which read and write their buffers).
std::vector<BufferId> readsOf(const Stmt& stmt);
std::vector<BufferId> writesOf(const Stmt& stmt);
/// Calls `visit` on every RNG stream argument (Stream, StreamKey) of `stmt`, in order.
void forEachStream(Stmt& stmt, const std::function<void(Arg&)>& visit);
/// Every buffer reference of `stmt` (reads, writes and arguments) that names `from` names `to`.
void replaceBuffer(Stmt& stmt, BufferId from, BufferId to);
/// Per buffer: the indices of the statements of `stmts` that read it (each once, ascending).
std::vector<std::vector<size_t>> readerLists(const std::vector<Stmt>& stmts, size_t buffers);
/// In `stmts` from `first` on, and in the function's outputs and updates: `from` becomes `to`.
struct KernelFunction;
void replaceBufferFrom(KernelFunction& function, size_t first, BufferId from, BufferId to);
/// Whether `stmt` may be merged with an identical one or moved: a loop, a GEMM, or a kernel
/// that is pure (KernelCalls.def) and not keyed by the seed, the train step or the microbatch.
bool isPure(const Stmt& stmt);
/// Whether two statements run in the same place (microbatch loop, stage, recomputation): what
/// the fusions of a kernel with the loop next to it require.
bool samePlace(const Stmt& a, const Stmt& b);
/// Along a row only: stride 1 on the last loop dim, 0 on the others (a gain or a bias).
bool alongRow(const Access& access);

/// A mesh axis name no mesh has, standing in Arg::names and Arg::starts for the microbatch
/// loop's index: a dim split over `{axes..., kMicrobatchAxis}` with local size s starts at
/// blockIndex(axes) * count * s + microbatch * s (the loop is the innermost split of the
/// microbatched dim), so positions and RNG draws are the whole step's (docs/training.md).
inline constexpr const char* kMicrobatchAxis = "@microbatch";
/// Whether `arg` depends on the microbatch loop's index.
bool readsMicrobatch(const Arg& arg);

/// Live ranges over `stmts` (run()'s body, or it with the subroutines inlined): per buffer, the
/// first and last statement touching it (results: to stmts.size(); never touched: first is
/// ~0). A buffer touched both in the microbatch loop and outside it lives over the whole loop
/// (an accumulator, a value the loop reads from before it or leaves for after it).
struct LiveRanges {
  std::vector<size_t> first, last;
};
LiveRanges liveRanges(const KernelFunction& fn, const std::vector<Stmt>& stmts);
/// Pipeline stages (KernelFunction::stages): per buffer, the stages whose ranks touch it in
/// `stmts` (a statement's stageMask; a stage transfer's sender and receivers; a result: every
/// stage, a param's update: its stages), one bit each; every stage's bits when there are none.
std::vector<uint64_t> bufferStages(const KernelFunction& fn, const std::vector<Stmt>& stmts);
/// The bytes between copies of a buffer with several (Buffer::copies): one slot, padded.
size_t copyStride(const Buffer& buffer);

/// Code that repeats in run() (the layers of a `repeat`), outlined into one member function:
/// its parameters are buffers of storage Argument, its body refers to nothing else.
struct Subroutine {
  std::string name;
  std::vector<BufferId> parameters;
  size_t textParameters = 0;
  std::vector<Stmt> body;
};

struct KernelFunction {
  std::string name; // the SPMD function's
  std::vector<Buffer> buffers;
  /// Run once, in the constructor, after the params are initialized (hoisted statements).
  std::vector<Stmt> init;
  /// run()'s body, in order.
  std::vector<Stmt> body;
  /// Per output (in the SPMD function's order) and per param update: the buffer holding it.
  std::vector<BufferId> outputs;
  /// Per param update: the buffer of the new value; `sameLayout` when the value's local dims
  /// are the param's in the same order (so it may be computed into the param's storage).
  struct Update {
    size_t param = 0;
    BufferId value = kNoBuffer;
    bool sameLayout = false;
  };
  std::vector<Update> updates;
  std::vector<BufferId> params; // per param: its buffer
  /// Pipeline stages (SplitStages.h): per param, the stages that hold it (allocate, update and
  /// checkpoint it), one bit each; 0 (or no entry): every rank.
  std::vector<uint64_t> paramStages;
  std::vector<Subroutine> subroutines;
  size_t arenaBytes = 0, persistentBytes = 0, temporaryBytes = 0;
  /// Pipeline stages: the arena bytes of each stage's ranks (arenaBytes is their largest).
  std::vector<size_t> stageArenaBytes;
  /// The microbatch loop (FormMicrobatchLoop.h): the statements marked perMicrobatch run `count`
  /// times, microbatch m over the m-th of `count` slices of the inputs along `dim`.
  struct Microbatches {
    int64_t count = 1;
    std::string dim;
  };
  Microbatches microbatches;
  /// Pipeline stages (SplitStages.h): `count` stages along the mesh axis `axis`.
  struct Stages {
    std::string axis;
    int64_t count = 1;
    bool oneFOneB = false;
  };
  Stages stages;

  /// Per buffer: how many statements of init and body write it.
  std::vector<int> writerCounts() const;
  /// run()'s body with every Invoke replaced by its subroutine's body over the arguments (what
  /// run() does, statement by statement, for liveness and verification).
  std::vector<Stmt> inlinedBody() const;
  /// Whether `id` is a result the caller sees after run() (an output or an update).
  bool isResult(BufferId id) const;

  BufferId addBuffer(Buffer buffer) {
    buffers.push_back(std::move(buffer));
    return BufferId(buffers.size() - 1);
  }
};

/// Whether arena buffer `id` only passes a value from its one writer to statement `reader` of
/// run()'s body (`readers`: readerLists of the body; `writers`: writerCounts): it dies there, so
/// the two statements may become one.
bool passedOnly(const KernelFunction& function, const std::vector<std::vector<size_t>>& readers,
                const std::vector<int>& writers, BufferId id, size_t reader);

/// Joins adjacent statements of run()'s body: for each two in the same place (samePlace),
/// `fuse(k, first, second)` (k: the first's index) may rewrite `first` to do both and return
/// true; `second` is then dropped, its sources appended to the first's, and the statement after
/// it is tried with the joined one's successor.
void fuseAdjacent(KernelFunction& function,
                  const std::function<bool(size_t k, Stmt& first, Stmt& second)>& fuse);

/// Calls `visit(BufferId&)` on every buffer reference of `stmt` (reads, writes and arguments), in
/// order. A template: renaming buffers (replaceBuffer) runs it over whole bodies.
template <class Visit> void forEachBuffer(Stmt& stmt, Visit&& visit) {
  struct Visitor {
    Visit& apply;
    void operator()(Loop& loop) const {
      for (Access& access : loop.reads)
        apply(access.buffer);
      for (Store& store : loop.stores)
        apply(store.at.buffer);
    }
    void operator()(Gemm& gemm) const {
      for (BufferId& id : gemm.operands)
        apply(id);
      apply(gemm.out);
      if (gemm.bias != kNoBuffer) apply(gemm.bias);
    }
    void operator()(Call& call) const {
      if (call.out != kNoBuffer) apply(call.out);
      for (BufferId& id : call.alsoWrites)
        apply(id);
      for (BufferId& id : call.reads)
        apply(id);
      for (Arg& arg : call.args)
        if (arg.buffer != kNoBuffer) apply(arg.buffer);
    }
    void operator()(Collective& c) const {
      for (BufferId& id : c.buffers)
        apply(id);
    }
    void operator()(Copy& copy) const {
      apply(copy.to);
      apply(copy.from);
    }
    void operator()(Invoke& invoke) const {
      for (std::vector<BufferId>* list : {&invoke.arguments, &invoke.reads, &invoke.writes})
        for (BufferId& id : *list)
          apply(id);
    }
  };
  std::visit(Visitor{visit}, stmt.node);
}

struct KernelModule {
  std::vector<KernelFunction> functions;
};

/// The sizes of `dims` / of a type's dims, and a type's row-major strides (its elements'
/// layout in a buffer).
Shape sizesOf(const std::vector<ir::Dim>& dims);
Shape sizesOf(const ir::TensorType& type);
Shape rowMajorStrides(const ir::TensorType& type);
/// The row-major strides of dense elements over `sizes`.
Shape rowMajorStrides(const Shape& sizes);
/// The number of points of `extents` (their product; 1 for none).
int64_t pointCount(const Shape& extents);

/// meshrt::kernels' name of a dtype ("meshrt::kernels::ValueType::F32"), for the RNG fills.
const char* valueTypeEnum(DType dtype);

/// `--emit=kernels`: the readable form of every function.
std::string printKernels(const KernelModule& module);
std::string printKernels(const KernelFunction& function);

/// Arena slots are aligned to this many bytes (meshc::gen::Arena::kAlignment).
constexpr size_t kArenaAlignment = 64;

} // namespace meshc::kir
