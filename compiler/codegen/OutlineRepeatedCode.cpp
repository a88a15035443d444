// Pass outline-repeated-code (OutlineRepeatedCode.h). Greedy, as code outliners are: statements
// fall into classes (equal up to renaming their buffers); the longest common extension of two
// positions gives candidate windows; the best (weight times repetitions) is checked buffer by
// buffer across the whole window (one renaming for all its statements), outlined at every place
// it occurs, and the search repeats on the shorter body.
#include "codegen/OutlineRepeatedCode.h"

#include <fmt/format.h>
#include <llvm/ADT/STLExtras.h>

#include <map>
#include <set>
#include <tuple>
#include <unordered_map>

namespace meshc::kir {
namespace {

/// Below this a window saves too little source to be worth a call (a loop nest of ~20 scalars).
constexpr int64_t kMinimumWeight = 24;
/// The search stops after this many subroutines, or this many candidates in a row that fail the
/// full check (each round is quadratic in the body's length).
constexpr size_t kMaxSubroutines = 64;
constexpr size_t kMaxRejected = 32;

/// Roughly how much source a statement prints to.
int64_t weightOf(const Stmt& stmt) {
  if (const Loop* loop = std::get_if<Loop>(&stmt.node)) return 4 + int64_t(loop->body.size());
  if (std::holds_alternative<Gemm>(stmt.node)) return 8;
  if (std::holds_alternative<Call>(stmt.node)) return 4;
  return 2;
}

/// The buffers `stmt` refers to, each once, in order of first reference.
std::vector<BufferId> buffersOf(Stmt stmt) {
  std::vector<BufferId> order;
  forEachBuffer(stmt, [&](BufferId& id) {
    if (!llvm::is_contained(order, id)) order.push_back(id);
  });
  return order;
}

class Outliner {
public:
  explicit Outliner(KernelFunction& fn) : fn(fn) {}

  void run() {
    std::set<std::pair<size_t, size_t>> rejected; // pairs whose window failed the full check
    classify();
    while (fn.subroutines.size() < kMaxSubroutines && rejected.size() < kMaxRejected) {
      Candidate best = bestCandidate(rejected);
      if (best.estimate < kMinimumWeight) return;
      size_t length =
          balancedPrefix(best.first, matchingPrefix(best.first, best.second, best.length));
      std::vector<size_t> places = length ? occurrences(best.first, length) : std::vector<size_t>{};
      if (places.size() < 2 || weight(best.first, length) < kMinimumWeight) {
        rejected.insert({best.first, best.second});
        continue;
      }
      outline(places, length);
      rejected.clear(); // positions moved
      classify();
    }
  }

private:
  struct Candidate {
    size_t first = 0, second = 0, length = 0;
    int64_t estimate = 0;
  };

  /// classes[k]: equal for statements that are the same code up to renaming their buffers (of
  /// the same sizes and dtypes, keep masks for keep masks), their collective requests and their RNG
  /// streams. Calls of subroutines are never repeated.
  void classify() {
    classes.assign(fn.body.size(), 0);
    struct Skeleton {
      Stmt stmt;
      std::vector<std::tuple<int64_t, DType, bool>> buffers;
    };
    std::vector<Skeleton> representatives;
    std::unordered_multimap<size_t, int> byHash;
    int unique = 0;
    for (size_t k = 0; k < fn.body.size(); ++k) {
      const Stmt& stmt = fn.body[k];
      if (std::holds_alternative<Invoke>(stmt.node)) {
        classes[k] = -1 - unique++;
        continue;
      }
      Skeleton skeleton{stmt, {}};
      skeleton.stmt.sources.clear();
      if (Collective* c = std::get_if<Collective>(&skeleton.stmt.node)) c->request = -1;
      forEachStream(skeleton.stmt, [](Arg& arg) { arg.text.clear(); });
      std::vector<BufferId> order = buffersOf(stmt);
      forEachBuffer(skeleton.stmt, [&](BufferId& id) {
        id = -2 - BufferId(llvm::find(order, id) - order.begin());
      });
      size_t hash = stmt.node.index() * 1000003u + order.size();
      for (BufferId id : order) {
        const Buffer& buffer = fn.buffers[size_t(id)];
        skeleton.buffers.push_back({buffer.elements, buffer.dtype, buffer.keepMask});
        hash = hash * 31 + size_t(buffer.elements);
      }
      int found = -1;
      auto [begin, end] = byHash.equal_range(hash);
      for (auto it = begin; it != end && found < 0; ++it) {
        const Skeleton& other = representatives[size_t(it->second)];
        if (other.buffers == skeleton.buffers && other.stmt.node == skeleton.stmt.node &&
            other.stmt.zeroFirst == skeleton.stmt.zeroFirst &&
            other.stmt.perMicrobatch == skeleton.stmt.perMicrobatch &&
            other.stmt.stageMask == skeleton.stmt.stageMask &&
            other.stmt.microbatchLoop == skeleton.stmt.microbatchLoop)
          found = it->second;
      }
      if (found < 0) {
        found = int(representatives.size());
        byHash.insert({hash, found});
        representatives.push_back(std::move(skeleton));
      }
      classes[k] = found;
    }
    prefixWeights.assign(fn.body.size() + 1, 0);
    for (size_t k = 0; k < fn.body.size(); ++k)
      prefixWeights[k + 1] = prefixWeights[k] + weightOf(fn.body[k]);
  }

  int64_t weight(size_t first, size_t length) const {
    return prefixWeights[first + length] - prefixWeights[first];
  }

  /// Over every pair of positions i < j: the window at i as long as the classes at i and j
  /// agree (and not past j), estimated to save its weight once per back-to-back repetition.
  Candidate bestCandidate(const std::set<std::pair<size_t, size_t>>& rejected) const {
    size_t n = classes.size();
    std::vector<size_t> next(n + 1, 0), current(n + 1, 0); // common extension of (i+1, j+1)
    Candidate best;
    for (size_t i = n; i-- > 0;) {
      current[n] = 0;
      for (size_t j = n; j-- > i + 1;) {
        current[j] = classes[i] == classes[j] ? next[j + 1] + 1 : 0;
        if (current[j] == 0) continue;
        size_t period = j - i, length = std::min(current[j], period);
        int64_t estimate = weight(i, length) * int64_t(std::max<size_t>(1, current[j] / period));
        if (estimate > best.estimate && !rejected.count({i, j}))
          best = Candidate{i, j, length, estimate};
      }
      std::swap(current, next);
    }
    return best;
  }

  /// How many statements from `a` and from `b` (at most `length`) are the same code under one
  /// renaming of buffers that is one-to-one over the whole stretch.
  size_t matchingPrefix(size_t a, size_t b, size_t length) const {
    std::map<BufferId, BufferId> aToB, bToA;
    std::map<int, int> requests; // a's request -> b's
    for (size_t t = 0; t < length; ++t) {
      Stmt x = fn.body[a + t];
      const Stmt& y = fn.body[b + t];
      const Collective* cx = std::get_if<Collective>(&x.node);
      const Collective* cy = std::get_if<Collective>(&y.node);
      if (cx && cy && cx->request >= 0) {
        auto [it, added] = requests.insert({cx->request, cy->request});
        if (it->second != cy->request) return t;
        std::get<Collective>(x.node).request = cy->request;
      }
      std::vector<std::string> yStreams;
      forEachStream(const_cast<Stmt&>(y), [&](Arg& arg) { yStreams.push_back(arg.text); });
      size_t stream = 0;
      forEachStream(x, [&](Arg& arg) {
        if (stream < yStreams.size()) arg.text = yStreams[stream++];
      });
      std::vector<BufferId> xs = buffersOf(x), ys = buffersOf(y);
      if (xs.size() != ys.size()) return t;
      for (size_t k = 0; k < xs.size(); ++k) {
        auto [forward, newForward] = aToB.insert({xs[k], ys[k]});
        auto [backward, newBackward] = bToA.insert({ys[k], xs[k]});
        if (forward->second != ys[k] || backward->second != xs[k]) return t;
      }
      forEachBuffer(x, [&](BufferId& id) { id = aToB.at(id); });
      if (!(x.node == y.node) || x.zeroFirst != y.zeroFirst) return t;
    }
    return length;
  }

  /// The longest prefix of the `length` statements at `first` that holds whole collectives:
  /// every request it starts is waited for in it, and it waits for none started before it (a
  /// request is a local of the function that starts it).
  size_t balancedPrefix(size_t first, size_t length) const {
    std::set<int> open;
    size_t balanced = 0;
    for (size_t t = 0; t < length; ++t) {
      if (const Collective* c = std::get_if<Collective>(&fn.body[first + t].node)) {
        if (c->phase == Collective::Phase::Start) open.insert(c->request);
        if (c->phase == Collective::Phase::Wait && !open.erase(c->request)) break;
      }
      if (open.empty()) balanced = t + 1;
    }
    return balanced;
  }

  /// Where the window at `first` of `length` statements occurs, left to right, not overlapping.
  std::vector<size_t> occurrences(size_t first, size_t length) const {
    std::vector<size_t> places;
    for (size_t k = 0; k + length <= classes.size();) {
      bool same =
          k == first || (std::equal(classes.begin() + long(k), classes.begin() + long(k + length),
                                    classes.begin() + long(first)) &&
                         matchingPrefix(first, k, length) == length);
      if (same) {
        places.push_back(k);
        k += length;
      } else {
        ++k;
      }
    }
    return places;
  }

  /// The buffers of the window at `first`, each once, in order of first reference.
  std::vector<BufferId> windowBuffers(size_t first, size_t length) const {
    std::vector<BufferId> order;
    for (size_t t = 0; t < length; ++t)
      for (BufferId id : buffersOf(fn.body[first + t]))
        if (!llvm::is_contained(order, id)) order.push_back(id);
    return order;
  }

  void outline(const std::vector<size_t>& places, size_t length) {
    Subroutine sub;
    sub.name = fmt::format("repeated{}", fn.subroutines.size());
    std::vector<BufferId> order = windowBuffers(places[0], length);
    std::map<BufferId, size_t> position;
    for (size_t k = 0; k < order.size(); ++k) {
      const Buffer& buffer = fn.buffers[size_t(order[k])];
      position[order[k]] = k;
      sub.parameters.push_back(fn.addBuffer(Buffer{.name = fmt::format("a{}", k),
                                                   .what = "",
                                                   .elements = buffer.elements,
                                                   .dtype = buffer.dtype,
                                                   .storage = Storage::Argument,
                                                   .index = int64_t(k),
                                                   .keepMask = buffer.keepMask}));
    }
    std::vector<bool> read(order.size(), false), written(order.size(), false);
    for (size_t t = 0; t < length; ++t) {
      Stmt stmt = fn.body[places[0] + t];
      forEachStream(stmt, [&](Arg& arg) {
        arg.textParameter = int(sub.textParameters++);
        arg.text.clear();
      });
      for (BufferId id : readsOf(stmt))
        read[position.at(id)] = true;
      for (BufferId id : writesOf(stmt))
        written[position.at(id)] = true;
      forEachBuffer(stmt, [&](BufferId& id) { id = sub.parameters[position.at(id)]; });
      stmt.perMicrobatch = false; // the call says where it runs (each statement, on which stages)
      sub.body.push_back(std::move(stmt));
    }
    int index = int(fn.subroutines.size());
    std::string firstSource = sub.body.front().sources.empty() ? "" : sub.body.front().sources[0];
    fn.subroutines.push_back(std::move(sub));
    // Back to front, so that earlier places keep their positions.
    for (size_t p = places.size(); p-- > 0;) {
      Invoke invoke{.subroutine = index, .arguments = windowBuffers(places[p], length)};
      for (size_t t = 0; t < length; ++t)
        forEachStream(fn.body[places[p] + t], [&](Arg& arg) { invoke.texts.push_back(arg.text); });
      for (size_t k = 0; k < invoke.arguments.size(); ++k) {
        if (read[k]) invoke.reads.push_back(invoke.arguments[k]);
        if (written[k]) invoke.writes.push_back(invoke.arguments[k]);
      }
      // A window lies on one side of the microbatch loop's bounds (its class says which).
      Stmt call{.node = std::move(invoke),
                .sources = {fmt::format("{} statements from {} ({} of {})", length, firstSource,
                                        p + 1, places.size())},
                .perMicrobatch = fn.body[places[p]].perMicrobatch};
      call.microbatchLoop = fn.body[places[p]].microbatchLoop;
      auto begin = fn.body.begin() + long(places[p]);
      fn.body.erase(begin, begin + long(length));
      fn.body.insert(fn.body.begin() + long(places[p]), std::move(call));
    }
  }

  KernelFunction& fn;
  std::vector<int> classes;
  std::vector<int64_t> prefixWeights;
};

} // namespace

void outlineRepeatedCode(KernelFunction& function) {
  Outliner(function).run();
}

} // namespace meshc::kir
