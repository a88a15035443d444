// Pass fuse-loops (FuseLoops.h).
#include "codegen/FuseLoops.h"

#include <llvm/ADT/STLExtras.h>

#include <algorithm>
#include <optional>

namespace meshc::kir {
namespace {

/// Ops worth recomputing at every point of a broadcast rather than storing once.
bool isCheap(const Scalar& scalar) {
  if (scalar.kind == Scalar::Kind::Dropout) return false; // a Philox call
  if (scalar.kind != Scalar::Kind::Compute) return true;
  switch (scalar.op) {
  case ir::OpKind::Exp:
  case ir::OpKind::Log:
  case ir::OpKind::Sqrt:
  case ir::OpKind::Rsqrt:
  case ir::OpKind::Tanh:
  case ir::OpKind::Sigmoid:
  case ir::OpKind::Gelu:
  case ir::OpKind::Sin:
  case ir::OpKind::Cos:
  case ir::OpKind::Pow:
  case ir::OpKind::Call:
    return false;
  default:
    return true;
  }
}

/// The producer's strides mapped into the consumer's loop space, when every producer point is
/// the consumer point whose load of `stored` reads it: the same space (the consumer reads the
/// store's strides) or, by dim name, a subspace the consumer broadcasts along.
std::optional<std::vector<Shape>> mapInto(const Loop& producer, const Shape& storeStrides,
                                          const Loop& consumer, const Shape& loadStrides) {
  std::vector<Shape> mapped;
  if (producer.extents == consumer.extents && loadStrides == storeStrides) {
    for (const Access& read : producer.reads)
      mapped.push_back(read.strides);
    return mapped;
  }
  // Broadcast: each producer dim is a consumer dim of the same name and extent, read with the
  // store's stride; the consumer's other dims are read with stride 0.
  std::vector<int> position(producer.dims.size(), -1);
  for (size_t d = 0; d < producer.dims.size(); ++d) {
    auto it = llvm::find(consumer.dims, producer.dims[d]);
    if (it == consumer.dims.end()) return std::nullopt;
    position[d] = int(it - consumer.dims.begin());
    if (consumer.extents[size_t(position[d])] != producer.extents[d] ||
        loadStrides[size_t(position[d])] != storeStrides[d])
      return std::nullopt;
  }
  for (size_t c = 0; c < consumer.dims.size(); ++c)
    if (!llvm::is_contained(position, int(c)) && loadStrides[c] != 0) return std::nullopt;
  for (const Access& read : producer.reads) {
    Shape strides(consumer.dims.size(), 0);
    for (size_t d = 0; d < producer.dims.size(); ++d)
      strides[size_t(position[d])] = read.strides[d];
    mapped.push_back(strides);
  }
  return mapped;
}

class Fuser {
public:
  explicit Fuser(KernelFunction& fn) : fn(fn) {}

  /// One pass over the consumers in order, each fused with its producers until none is left.
  /// (No earlier consumer can gain a producer from a later fusion: a fused producer leaves the
  /// readers of its inputs where they were, now at the consumer.) Statement positions stay put
  /// during the pass, a fused producer only marked dead, so the def-use tables are updated in
  /// place instead of rebuilt after every fusion.
  void run() {
    readers = readerLists(fn.body, fn.buffers.size());
    writers = fn.writerCounts();
    writerOf.assign(fn.buffers.size(), -1);
    for (size_t k = 0; k < fn.body.size(); ++k)
      for (BufferId id : writesOf(fn.body[k]))
        writerOf[size_t(id)] = int(k);
    dead.assign(fn.body.size(), false);
    for (size_t c = 0; c < fn.body.size(); ++c)
      while (fuseIntoConsumer(c)) {
      }
    size_t kept = 0;
    for (size_t k = 0; k < fn.body.size(); ++k) {
      if (dead[k]) continue;
      if (kept != k) fn.body[kept] = std::move(fn.body[k]);
      ++kept;
    }
    fn.body.resize(kept);
  }

private:
  /// Fuses one producer into the loop at `c`, if one may be.
  bool fuseIntoConsumer(size_t c) {
    if (!std::holds_alternative<Loop>(fn.body[c].node)) return false;
    const Loop& consumer = std::get<Loop>(fn.body[c].node);
    for (const Access& read : consumer.reads) {
      BufferId x = read.buffer;
      if (fn.buffers[size_t(x)].storage != Storage::Arena || writers[size_t(x)] != 1) continue;
      int p = writerOf[size_t(x)];
      if (p < 0 || size_t(p) >= c || dead[size_t(p)] ||
          !std::holds_alternative<Loop>(fn.body[size_t(p)].node))
        continue;
      if (tryFuse(size_t(p), c, x)) return true;
    }
    return false;
  }

  bool tryFuse(size_t p, size_t c, BufferId x) {
    if (fn.body[p].perMicrobatch != fn.body[c].perMicrobatch) return false; // the loop's bounds
    const Loop& producer = std::get<Loop>(fn.body[p].node);
    const Loop& consumer = std::get<Loop>(fn.body[c].node);
    const Store* store = nullptr;
    for (const Store& s : producer.stores)
      if (s.at.buffer == x) store = &s;
    const Shape* load = nullptr;
    for (const Access& read : consumer.reads)
      if (read.buffer == x) {
        if (load && *load != read.strides) return false; // two different reads of x
        load = &read.strides;
      }
    std::optional<std::vector<Shape>> mapped =
        mapInto(producer, store->at.strides, consumer, *load);
    if (!mapped) return false;
    bool sameSpace = producer.extents == consumer.extents;
    // Every buffer the producer stores is either read by the consumer exactly at the stored
    // point (replaced by the producer's scalar), or not at all; later readers keep the store.
    std::vector<bool> keepStore(producer.stores.size(), false);
    for (size_t s = 0; s < producer.stores.size(); ++s) {
      BufferId id = producer.stores[s].at.buffer;
      for (const Access& read : consumer.reads)
        if (read.buffer == id &&
            (sameSpace ? read.strides != producer.stores[s].at.strides : id != x))
          return false;
      bool otherReaders = llvm::any_of(readers[size_t(id)], [&](size_t k) { return k != c; });
      keepStore[s] =
          otherReaders || fn.isResult(id) || fn.buffers[size_t(id)].storage != Storage::Arena;
      if (keepStore[s] && !sameSpace)
        return false; // a broadcast producer is recomputed, not stored
    }
    if (!sameSpace && !llvm::all_of(producer.body, isCheap)) return false;
    // Moving the producer down to the consumer: nothing in between may read what it stores or
    // write what it reads.
    for (size_t k = p + 1; k < c; ++k) {
      if (dead[k]) continue;
      for (BufferId id : readsOf(fn.body[k]))
        for (const Store& s : producer.stores)
          if (s.at.buffer == id) return false;
      for (BufferId id : writesOf(fn.body[k]))
        for (const Access& read : producer.reads)
          if (read.buffer == id) return false;
      // Stores the producer keeps must also not be overwritten in between.
      for (BufferId id : writesOf(fn.body[k]))
        for (const Store& s : producer.stores)
          if (s.at.buffer == id) return false;
    }

    Loop merged;
    merged.dims = consumer.dims;
    merged.extents = consumer.extents;
    merged.invariants = producer.invariants;
    merged.invariants.insert(merged.invariants.end(), consumer.invariants.begin(),
                             consumer.invariants.end());
    auto readIndex = [&](BufferId id, const Shape& strides) {
      for (size_t r = 0; r < merged.reads.size(); ++r)
        if (merged.reads[r].buffer == id && merged.reads[r].strides == strides) return int(r);
      merged.reads.push_back(Access{id, strides});
      return int(merged.reads.size() - 1);
    };
    for (const Scalar& scalar : producer.body) {
      Scalar copy = scalar;
      if (copy.kind == Scalar::Kind::Load)
        copy.read =
            readIndex(producer.reads[size_t(scalar.read)].buffer, (*mapped)[size_t(scalar.read)]);
      merged.body.push_back(copy);
    }
    std::vector<int> consumerIndex(consumer.body.size(), -1);
    for (size_t k = 0; k < consumer.body.size(); ++k) {
      const Scalar& scalar = consumer.body[k];
      if (scalar.kind == Scalar::Kind::Load) {
        BufferId id = consumer.reads[size_t(scalar.read)].buffer;
        auto stored =
            llvm::find_if(producer.stores, [&](const Store& s) { return s.at.buffer == id; });
        if (stored != producer.stores.end()) {
          consumerIndex[k] = stored->value; // the producer's scalar itself
          continue;
        }
      }
      Scalar copy = scalar;
      if (copy.kind == Scalar::Kind::Load)
        copy.read = readIndex(consumer.reads[size_t(scalar.read)].buffer,
                              consumer.reads[size_t(scalar.read)].strides);
      if (copy.kind == Scalar::Kind::Dropout && copy.read >= 0)
        copy.read += int(producer.invariants.size());
      for (int& arg : copy.args)
        arg = consumerIndex[size_t(arg)];
      consumerIndex[k] = int(merged.body.size());
      merged.body.push_back(copy);
    }
    for (size_t s = 0; s < producer.stores.size(); ++s)
      if (keepStore[s]) merged.stores.push_back(producer.stores[s]);
    for (const Store& s : consumer.stores)
      merged.stores.push_back(Store{s.at, consumerIndex[size_t(s.value)]});
    // In place: a buffer both read and stored must be read exactly at the stored point.
    for (const Store& s : merged.stores)
      for (const Access& read : merged.reads)
        if (read.buffer == s.at.buffer && read.strides != s.at.strides) return false;

    Stmt fused{.node = std::move(merged)};
    fused.sources = fn.body[p].sources;
    // The later phase (an update fused with the gradient it reads is the update's work).
    fused.phase = std::max(fn.body[p].phase, fn.body[c].phase);
    fused.perMicrobatch = fn.body[c].perMicrobatch; // and p's: fusion keeps to the loop's bounds
    fused.sources.insert(fused.sources.end(), fn.body[c].sources.begin(), fn.body[c].sources.end());
    // The def-use tables: what p and c read is now read at c; p's dropped stores are gone.
    std::vector<BufferId> touched = readsOf(fn.body[p]);
    for (BufferId id : readsOf(fn.body[c]))
      touched.push_back(id);
    for (BufferId id : touched)
      llvm::erase_if(readers[size_t(id)], [&](size_t k) { return k == p || k == c; });
    for (size_t s = 0; s < producer.stores.size(); ++s) {
      BufferId id = producer.stores[s].at.buffer;
      if (keepStore[s])
        writerOf[size_t(id)] = int(c);
      else
        --writers[size_t(id)];
    }
    fn.body[c] = std::move(fused);
    dead[p] = true;
    for (BufferId id : readsOf(fn.body[c])) {
      std::vector<size_t>& list = readers[size_t(id)];
      if (!llvm::is_contained(list, c)) list.insert(llvm::upper_bound(list, c), c);
    }
    return true;
  }

  KernelFunction& fn;
  std::vector<std::vector<size_t>> readers;
  std::vector<int> writers, writerOf;
  std::vector<bool> dead; // fused into a later statement (removed when the pass ends)
};

} // namespace

void fuseLoops(KernelFunction& fn) {
  Fuser(fn).run();
}

} // namespace meshc::kir
