// Pass keep-dropout-masks (KeepDropoutMasks.h). Measured (docs/codegen.md): drawing 1M masks
// costs 1.54 ms on an AVX2 core (a Philox call per four points), and the one-rank train step of
// bench/train_step.py ran 83.0-85.0 ms drawing them again in backward against 81.3-81.8 keeping
// them as bytes. The price is a byte per point alive from the forward to the backward.
#include "codegen/KeepDropoutMasks.h"

#include <fmt/format.h>
#include <llvm/ADT/STLExtras.h>

#include <optional>

namespace meshc::kir {
namespace {

/// What fixes a dropout's mask: its stream key and global indices (the base, and the strides
/// over loop extents, which give each point's index) and its rate.
struct MaskKey {
  Arg key, base;
  Shape extents, strides;
  double rate = 0;
  bool perMicrobatch = false;
  bool operator==(const MaskKey&) const = default;
};

MaskKey maskKeyOf(const Stmt& stmt, const Loop& loop, const Scalar& dropout) {
  return MaskKey{loop.invariants[size_t(dropout.read)],
                 loop.invariants[size_t(dropout.read) + 1],
                 loop.extents,
                 dropout.strides,
                 dropout.value,
                 stmt.perMicrobatch};
}

/// Inserts `scalar` at `at` of the loop's body; later scalars and the stores follow.
void insertScalar(Loop& loop, size_t at, Scalar scalar) {
  for (Scalar& s : loop.body)
    for (int& arg : s.args)
      if (size_t(arg) >= at) ++arg;
  for (Store& store : loop.stores)
    if (size_t(store.value) >= at) ++store.value;
  loop.body.insert(loop.body.begin() + std::ptrdiff_t(at), std::move(scalar));
}

/// Drops the invariants no dropout draws from any more (a key and its base, a pair each).
void dropUnusedInvariants(Loop& loop) {
  std::vector<Arg> kept;
  std::vector<int> pairAt(loop.invariants.size(), -1); // per old key index: its new one
  for (Scalar& s : loop.body) {
    if (s.kind != Scalar::Kind::Dropout || s.read < 0) continue;
    int& at = pairAt[size_t(s.read)];
    if (at < 0) {
      at = int(kept.size());
      kept.push_back(loop.invariants[size_t(s.read)]);
      kept.push_back(loop.invariants[size_t(s.read) + 1]);
    }
    s.read = at;
  }
  loop.invariants = std::move(kept);
}

class MaskKeeper {
public:
  explicit MaskKeeper(KernelFunction& fn) : fn(fn) {}

  void run() {
    for (size_t k = 0; k < fn.body.size(); ++k) {
      Loop* loop = std::get_if<Loop>(&fn.body[k].node);
      if (!loop) continue;
      bool changed = false;
      for (size_t j = 0; j < loop->body.size(); ++j) {
        const Scalar& s = loop->body[j];
        if (s.kind != Scalar::Kind::Dropout || s.args.size() != 1) continue;
        MaskKey key = maskKeyOf(fn.body[k], *loop, s);
        std::optional<size_t> earlier;
        for (size_t d = drawn.size(); d-- > 0 && !earlier;)
          if (drawn[d].key == key && drawn[d].stmt != k) earlier = d; // stored after it loads
        // A recomputed forward draws again: it exists to keep nothing alive from the forward.
        if (!earlier || fn.body[k].recomputed) {
          drawn.push_back(Drawn{std::move(key), k, j, kNoBuffer});
          continue;
        }
        BufferId mask = maskOf(*earlier);
        loop->reads.push_back(Access{mask, rowMajorStrides(loop->extents)});
        insertScalar(*loop, j,
                     Scalar{.kind = Scalar::Kind::Load,
                            .read = int(loop->reads.size() - 1),
                            .dtype = DType::F32});
        Scalar& dropout = loop->body[j + 1];
        dropout.args.push_back(int(j));
        dropout.read = -1;
        dropout.strides.clear();
        drawn.push_back(Drawn{std::move(key), k, j + 1, mask});
        changed = true;
        ++j;
      }
      if (changed) dropUnusedInvariants(*loop);
    }
  }

private:
  /// A dropout of run()'s body that draws its mask, or reads it from `mask`.
  struct Drawn {
    MaskKey key;
    size_t stmt = 0;
    size_t scalar = 0;
    BufferId mask = kNoBuffer;
  };

  /// The keep mask of drawn[d]: made on first use, stored by the loop that draws it.
  BufferId maskOf(size_t d) {
    Drawn& earlier = drawn[d];
    if (earlier.mask != kNoBuffer) return earlier.mask;
    earlier.mask = fn.addBuffer(Buffer{.name = fmt::format("keep_v{}", fn.buffers.size()),
                                       .what = "dropout keep mask",
                                       .elements = (pointCount(earlier.key.extents) + 3) / 4,
                                       .keepMask = true});
    Loop& loop = std::get<Loop>(fn.body[earlier.stmt].node);
    loop.stores.push_back(Store{Access{earlier.mask, rowMajorStrides(loop.extents)},
                                int(earlier.scalar), /*keepBit=*/true});
    return earlier.mask;
  }

  KernelFunction& fn;
  std::vector<Drawn> drawn;
};

} // namespace

void keepDropoutMasks(KernelFunction& fn) {
  MaskKeeper(fn).run();
}

} // namespace meshc::kir
