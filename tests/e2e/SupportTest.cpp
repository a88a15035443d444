// The generated code's support header (compiler/codegen/support/meshc/GeneratedSupport.h):
// einsum through BLAS against the reference loop on transposed and batched layouts, and every
// sharded helper (collectives over a dim, ops along a split dim, shift with halos) against the
// same op on the whole tensor, on the threads backend. The examples' end-to-end runs do not
// reach every path (e.g. no example plan uses all-to-all), so they are checked here.
#include <catch2/catch.hpp>

#include "meshc/GeneratedSupport.h"
#include "meshrt/Threads.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <random>

#include <unistd.h>

using meshc::gen::Buffer;
using meshc::gen::Shape;

namespace {

Buffer randomBuffer(size_t count, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  Buffer data(count);
  for (float& x : data)
    x = normal(rng);
  return data;
}

/// Block `block` of `blocks` along dim `dim` of a row-major tensor of `sizes`.
Buffer blockOf(const Buffer& global, const Shape& sizes, size_t dim, int64_t block,
               int64_t blocks) {
  Shape local = sizes;
  local[dim] /= blocks;
  Shape starts(sizes.size(), 0);
  starts[dim] = block * local[dim];
  return meshc::gen::sliceShard(global, local, meshc::gen::rowMajorStrides(sizes), starts);
}

void requireClose(const Buffer& actual, const Buffer& expected, float tolerance = 1e-5f) {
  REQUIRE(actual.size() == expected.size());
  for (size_t i = 0; i < actual.size(); ++i) {
    INFO("element " << i);
    REQUIRE(actual[i] == Approx(expected[i]).margin(tolerance).epsilon(tolerance));
  }
}

/// Runs `body(comm)` on a 1-D mesh of `ranks` ranks; failures are rethrown by runThreads.
template <typename Body> void onRanks(int ranks, Body&& body) {
  meshrt::runThreads(meshrt::Mesh({{"x", ranks}}),
                     [&](meshrt::Communicator& world) { body(world); });
}

} // namespace

TEST_CASE("einsum2 matches the reference loop for every operand layout", "[codegen][support]") {
  // out[b, m, n] = sum_k a * b with a and b stored in each of their dim orders.
  const int64_t B = 3, M = 5, N = 4, K = 6;
  Buffer aBMK = randomBuffer(size_t(B * M * K), 1), bBKN = randomBuffer(size_t(B * K * N), 2);
  // Reference through einsumGeneric over the canonical layouts.
  Buffer expected(size_t(B * M * N));
  meshc::gen::einsumGeneric(expected.data(), {B, M, N}, {K}, {aBMK.data(), bBKN.data()},
                            {{M * K, K, 0}, {K * N, 0, 1}}, {{1}, {N}});
  // a as [m, b, k] or [k, b, m] (transposed), b as [n, k, b] (transposed, batch innermost).
  Buffer aMBK(aBMK.size()), aKBM(aBMK.size()), bNKB(bBKN.size());
  meshc::gen::copyStrided(aMBK.data(), {B, M, K}, {K, B * K, 1}, aBMK.data(), {M * K, K, 1});
  meshc::gen::copyStrided(aKBM.data(), {B, M, K}, {M, 1, B * M}, aBMK.data(), {M * K, K, 1});
  meshc::gen::copyStrided(bNKB.data(), {B, K, N}, {1, B, K * B}, bBKN.data(), {K * N, N, 1});
  SECTION("row-major operands") {
    Buffer out(expected.size());
    meshc::gen::einsum2(
        out.data(), aBMK.data(), bBKN.data(),
        {{B}, {M}, {N}, {K}, {M * K}, {K}, {1}, {K * N}, {N}, {1}, {M * N}, {N}, {1}});
    requireClose(out, expected);
  }
  SECTION("strided batch, transposed a, packed b, transposed out") {
    Buffer out(expected.size()), outT(expected.size());
    meshc::gen::einsum2(
        outT.data(), aKBM.data(), bNKB.data(),
        {{B}, {M}, {N}, {K}, {M}, {1}, {B * M}, {1}, {B}, {K * B}, {1}, {B}, {B * M}});
    // outT is [n, m, b]: bring it back to [b, m, n].
    meshc::gen::copyStrided(out.data(), {B, M, N}, {M * N, N, 1}, outT.data(), {1, B, B * M});
    requireClose(out, expected);
  }
  SECTION("a with the batch dim in the middle") {
    Buffer out(expected.size());
    meshc::gen::einsum2(
        out.data(), aMBK.data(), bBKN.data(),
        {{B}, {M}, {N}, {K}, {K}, {B * K}, {1}, {K * N}, {N}, {1}, {M * N}, {N}, {1}});
    requireClose(out, expected);
  }
  SECTION("double accumulation for narrow dtypes") {
    Buffer out(expected.size());
    meshc::gen::einsum2Double(
        out.data(), aKBM.data(), bBKN.data(),
        {{B}, {M}, {N}, {K}, {M}, {1}, {B * M}, {K * N}, {N}, {1}, {M * N}, {N}, {1}});
    requireClose(out, expected);
  }
}

TEST_CASE("collectives over a dim reproduce the whole tensor's blocks", "[codegen][support]") {
  const int ranks = 4;
  const Shape sizes = {3, 8, 4}; // dims 1 and 2 divide by 4
  Buffer global = randomBuffer(size_t(meshc::gen::product(sizes)), 3);
  // Per rank: gathered, scattered, moved, sliced, whole (checked on the main thread: Catch's
  // assertions are not thread-safe).
  std::vector<std::vector<Buffer>> results(ranks);
  onRanks(ranks, [&](meshrt::Communicator& world) {
    int64_t r = world.rank();
    std::vector<Buffer>& mine = results[size_t(r)];
    // all-gather dim 1: block r -> whole.
    Buffer local = blockOf(global, sizes, 1, r, ranks);
    Buffer gathered(global.size());
    meshc::gen::allGatherDim(gathered, local, {3, 2, 4}, 1, world);
    mine.push_back(gathered);
    // reduce-scatter into dim 2: every rank holds (r + 1) * global; keeps block r of the sum.
    Buffer scaled = global;
    for (float& x : scaled)
      x *= float(r + 1);
    Buffer scattered(global.size() / ranks);
    meshc::gen::reduceScatterDim(scattered, scaled, sizes, 2, world);
    mine.push_back(scattered);
    // all-to-all: split dim 1 -> split dim 2.
    Buffer moved(global.size() / ranks);
    meshc::gen::allToAllDims(moved, local, {3, 2, 4}, 1, 2, world);
    mine.push_back(moved);
    // local slice of dim 2.
    Buffer sliced(global.size() / ranks);
    meshc::gen::sliceDim(sliced, global, sizes, 2, r, ranks);
    mine.push_back(sliced);
    // gatherShards: the whole tensor from shards split along dim 1.
    mine.push_back(meshc::gen::gatherShards(world, local, {3, 2, 4}, sizes, [&](int rank) {
      return Shape{0, meshc::gen::shardStartOf(world.mesh(), rank, {"x"}, 2), 0};
    }));
  });
  for (int64_t r = 0; r < ranks; ++r) {
    INFO("rank " << r);
    const std::vector<Buffer>& mine = results[size_t(r)];
    requireClose(mine[0], global);
    Buffer expected = blockOf(global, sizes, 2, r, ranks);
    for (float& x : expected)
      x *= 10.0f; // 1 + 2 + 3 + 4
    requireClose(mine[1], expected);
    requireClose(mine[2], blockOf(global, sizes, 2, r, ranks));
    requireClose(mine[3], blockOf(global, sizes, 2, r, ranks));
    requireClose(mine[4], global);
  }
}

namespace {

/// along() over the 3 lanes of 8 of `global` on one rank.
Buffer alongWhole(const Buffer& global, meshc::gen::Along kind) {
  Buffer expected(global.size());
  meshc::gen::along(expected.data(), global.data(), {3}, {8}, {8}, {8}, {1}, {1}, kind, 1e-5, 8,
                    nullptr);
  return expected;
}

/// The same lanes split over `ranks` thread ranks: each rank's block.
std::vector<Buffer> alongSplit(const Buffer& global, meshc::gen::Along kind, int ranks) {
  std::vector<Buffer> outs(static_cast<size_t>(ranks));
  onRanks(ranks, [&](meshrt::Communicator& world) {
    Buffer local = blockOf(global, {3, 8}, 1, world.rank(), ranks);
    Buffer& out = outs[size_t(world.rank())];
    out.resize(local.size());
    meshc::gen::along(out.data(), local.data(), {3}, {2}, {2}, {2}, {1}, {1}, kind, 1e-5, 8,
                      &world);
  });
  return outs;
}

} // namespace

TEST_CASE("ops along a split dim match the whole lane", "[codegen][support]") {
  const int ranks = 4;
  const Shape sizes = {3, 8}; // lanes along dim 1, split over 4 ranks
  Buffer global = randomBuffer(24, 4);
  using meshc::gen::Along;
  for (Along kind : {Along::Softmax, Along::LogSoftmax, Along::LayerNorm, Along::Cumsum,
                     Along::CumsumExclusive}) {
    Buffer expected = alongWhole(global, kind);
    std::vector<Buffer> outs = alongSplit(global, kind, ranks);
    INFO("along kind " << int(kind));
    for (int r = 0; r < ranks; ++r)
      requireClose(outs[size_t(r)], blockOf(expected, sizes, 1, r, ranks), 1e-5f);
  }
  SECTION("a group of one rank is the whole lane, the same path") {
    // On [1] (the lane's axes of size 1) the generated code still passes the group: it must
    // take the whole lane's contiguous rows, not the strided walk with an all-gather.
    for (Along kind : {Along::Softmax, Along::LogSoftmax, Along::LayerNorm, Along::Cumsum,
                       Along::CumsumExclusive}) {
      INFO("along kind " << int(kind));
      Buffer out(global.size());
      onRanks(1, [&](meshrt::Communicator& world) {
        meshc::gen::along(out.data(), global.data(), {3}, {8}, {8}, {8}, {1}, {1}, kind, 1e-5, 8,
                          &world);
      });
      requireClose(out, alongWhole(global, kind), 0);
    }
  }
  SECTION("logsumexp over a split dim") {
    Buffer expected(3);
    meshc::gen::reduce(expected.data(), {3}, global.data(), {8}, {8}, {1},
                       meshc::gen::Reduce::LogSumExp, 1);
    std::vector<Buffer> outs(ranks, Buffer(3));
    onRanks(ranks, [&](meshrt::Communicator& world) {
      Buffer local = blockOf(global, sizes, 1, world.rank(), ranks);
      Buffer& out = outs[size_t(world.rank())];
      meshc::gen::reduce(out.data(), {3}, local.data(), {2}, {2}, {1},
                         meshc::gen::Reduce::LogSumExp, 1);
      meshc::gen::combineLogSumExp(out, world);
    });
    for (const Buffer& out : outs)
      requireClose(out, expected);
  }
}

TEST_CASE("fused row kernels compute what the row kernel and the loop next to it compute",
          "[codegen][support]") {
  using meshc::gen::Along;
  SECTION("layerNormAffine: layer_norm, then times the gain plus the bias along the row") {
    // 5 rows of 37 (not a multiple of the kernels' 16 lanes), one row far from zero.
    const int64_t rows = 5, size = 37;
    Buffer x = randomBuffer(size_t(rows * size), 11), gain = randomBuffer(size, 12),
           bias = randomBuffer(size, 13);
    for (int64_t i = 0; i < size; ++i)
      x[size_t(size + i)] += 3000.0f;
    Buffer expected(x.size()), fused(x.size());
    meshc::gen::along(expected.data(), x.data(), {rows}, {size}, {size}, {size}, {1}, {1},
                      Along::LayerNorm, 1e-5, size, nullptr);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < size; ++i) {
        float& y = expected[size_t(r * size + i)];
        float scaled = y * gain[size_t(i)];
        y = scaled + bias[size_t(i)];
      }
    meshc::gen::layerNormAffine(fused.data(), x.data(), rows, size, gain.data(), bias.data(), 1e-5,
                                size);
    requireClose(fused, expected, 1e-6f);
  }
  SECTION("addLayerNormAffine: a sum of rows stored, then layerNormAffine of it") {
    // [a=2, b=3, lane=37]: prev dense, partial dense, a bias along the row (three terms); then
    // an embedding plus a position row broadcast over a (two terms).
    const Shape outer = {2, 3};
    const int64_t rows = 6, size = 37;
    Buffer prev = randomBuffer(size_t(rows * size), 31), partial = randomBuffer(prev.size(), 32),
           rowBias = randomBuffer(size, 33), position = randomBuffer(size_t(3 * size), 34),
           gain = randomBuffer(size, 35), bias = randomBuffer(size, 36);
    for (int64_t i = 0; i < size; ++i)
      prev[size_t(size + i)] += 3000.0f; // a row far from zero
    Buffer expectedSum(prev.size()), expected(prev.size()), sum(prev.size()), fused(prev.size());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < size; ++i) {
        size_t at = size_t(r * size + i);
        expectedSum[at] = prev[at] + (partial[at] + rowBias[size_t(i)]);
      }
    meshc::gen::layerNormAffine(expected.data(), expectedSum.data(), rows, size, gain.data(),
                                bias.data(), 1e-5, size);
    meshc::gen::addLayerNormAffine(fused.data(), sum.data(), outer, size, gain.data(), bias.data(),
                                   1e-5, size, prev.data(), {3 * size, size}, partial.data(),
                                   {3 * size, size}, rowBias.data(), {0, 0});
    CHECK(sum == expectedSum); // the loop's own additions, in its order
    CHECK(fused == expected);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < size; ++i) {
        size_t at = size_t(r * size + i);
        expectedSum[at] = partial[at] + position[size_t((r % 3) * size + i)];
      }
    meshc::gen::layerNormAffine(expected.data(), expectedSum.data(), rows, size, gain.data(),
                                bias.data(), 1e-5, size);
    meshc::gen::addLayerNormAffine(fused.data(), sum.data(), outer, size, gain.data(), bias.data(),
                                   1e-5, size, partial.data(), {3 * size, size}, position.data(),
                                   {0, size}, nullptr, {});
    CHECK(sum == expectedSum);
    CHECK(fused == expected);
  }
  SECTION("reduceProduct: the products stored by a loop, then reduce's sum along the row") {
    // [a=2, b=3, lane=37] (not a multiple of the sums' 8 accumulators), y broadcast over b, one
    // row far from zero; the values must be the two statements' to the bit.
    const Shape outer = {2, 3};
    const int64_t rows = 6, size = 37;
    Buffer x = randomBuffer(size_t(rows * size), 51), y = randomBuffer(size_t(2 * size), 52);
    for (int64_t i = 0; i < size; ++i)
      x[size_t(size + i)] += 3000.0f;
    Buffer products(x.size()), expected(static_cast<size_t>(rows)),
        fused(static_cast<size_t>(rows), 7.0f);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < size; ++i)
        products[size_t(r * size + i)] = x[size_t(r * size + i)] * y[size_t((r / 3) * size + i)];
    meshc::gen::reduce(expected.data(), outer, products.data(), {3 * size, size}, {size}, {1},
                       meshc::gen::Reduce::Sum, 0.25);
    meshc::gen::reduceProduct(fused.data(), outer, size, x.data(), {3 * size, size}, y.data(),
                              {size, 0}, 0.25);
    CHECK(fused == expected);
  }
  SECTION("maskedSoftmax: where(mask, x, fill), then softmax along the row") {
    // [a=2, b=3, lane=8]; the mask [a, lane] is broadcast over b (stride 0); row 4 entirely
    // masked (every element the fill: uniform weights), and a fill of -inf in a second pass.
    const Shape outer = {2, 3};
    const int64_t size = 8;
    Buffer x = randomBuffer(48, 21), mask(16);
    for (size_t i = 0; i < mask.size(); ++i)
      mask[i] = (i * 7) % 3 == 0 ? 0.0f : 1.0f;
    for (int64_t i = 0; i < size; ++i)
      mask[size_t(size + i)] = 0; // a = 1: rows 3, 4, 5 wholly masked
    mask[size_t(size + 2)] = 1;   // except element 2
    for (float fill : {-1e9f, -INFINITY}) {
      INFO("fill " << fill);
      Buffer masked(x.size()), expected(x.size()), fused(x.size());
      for (int64_t a = 0; a < 2; ++a)
        for (int64_t b = 0; b < 3; ++b)
          for (int64_t i = 0; i < size; ++i) {
            size_t at = size_t((a * 3 + b) * size + i);
            masked[at] = mask[size_t(a * size + i)] != 0 ? x[at] : fill;
          }
      meshc::gen::along(expected.data(), masked.data(), outer, {24, 8}, {24, 8}, {size}, {1}, {1},
                        Along::Softmax, 1e-5, size, nullptr);
      meshc::gen::maskedSoftmax(fused.data(), x.data(), mask.data(), outer, {size, 0}, size, 1,
                                fill);
      requireClose(fused, expected, 1e-6f);
      CHECK(fused[size_t(3 * size + 2)] == 1.0f); // the one unmasked element of a masked row
    }
  }
  SECTION("causalMaskedSoftmax: maskedSoftmax's values to the bit, its scores read only up to "
          "each row's query position") {
    // [batch 2, heads 2, seq = mem = 40] (a prefix of 16 or 32 keys, or the whole row, which
    // 40 is no multiple of 16), the mask [batch, seq, mem] causal and broadcast over the heads:
    // scores above the diagonal are NaN (causalMaskedSoftmax must not read them, maskedSoftmax
    // replaces them by the fill). Batch 1's query 5 wholly masked (uniform weights over every
    // key: the fallback to the whole row), query 9 of batch 0 with one more key masked, a NaN
    // score in one row and an inf in another (NaN rows, as the whole row's); then a fill close to
    // the scores (e^(fill - max) not 0: every row falls back) and a fill of -inf.
    const int64_t batch = 2, heads = 2, size = 40;
    const Shape outer = {batch, heads, size}, maskOuter = {size * size, 0, size};
    Buffer x = randomBuffer(size_t(batch * heads * size * size), 22);
    Buffer mask(size_t(batch * size * size));
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t s = 0; s < size; ++s)
        for (int64_t m = 0; m < size; ++m)
          mask[size_t((b * size + s) * size + m)] = m <= s ? 1.0f : 0.0f;
    std::fill_n(mask.begin() + (size + 5) * size, size, 0.0f); // batch 1, query 5
    mask[size_t(9 * size + 3)] = 0;                            // batch 0, query 9, key 3
    for (size_t i = 0; i < x.size(); ++i)
      if (int64_t(i) % size > int64_t(i) / size % size) x[i] = NAN;
    x[size_t((1 * size + 20) * size + 7)] = NAN;      // batch 0, head 1, query 20
    x[size_t((2 * size + 30) * size + 2)] = INFINITY; // batch 1, head 0, query 30
    for (float fill : {-1e9f, -3.0f, -INFINITY}) {
      INFO("fill " << fill);
      Buffer expected(x.size()), causal(x.size(), 7.0f);
      meshc::gen::maskedSoftmax(expected.data(), x.data(), mask.data(), outer, maskOuter, size, 1,
                                fill);
      meshc::gen::causalMaskedSoftmax(causal.data(), x.data(), mask.data(), outer, maskOuter, size,
                                      1, fill, 2);
      CHECK(std::memcmp(causal.data(), expected.data(), x.size() * sizeof(float)) == 0);
      CHECK(std::isnan(causal[size_t((1 * size + 20) * size + 7)]));
      if (fill == -1e9f) {
        CHECK(std::isnan(causal[size_t((1 * size + 20) * size + 30)]));   // past the query too
        CHECK(causal[size_t((0 * size + 10) * size + 39)] == 0.0f);       // past the query: 0
        CHECK(causal[size_t((2 * size + 5) * size + 39)] == 1.0f / size); // wholly masked
      }
    }
  }
}

TEST_CASE("softmax along a split dim: one all-gather of the blocks' statistics, any maxima",
          "[codegen][support]") {
  // Lanes of 8 over 4 ranks: row 0's blocks have maxima 80 apart (a block's exponentials are
  // rescaled by exp(block max - lane max), which underflows for the low ones, as their terms do
  // in the whole lane); row 1 has a block of -inf (a masked block adds nothing); row 2 is all
  // -inf (no finite max: nan, as the whole lane gives).
  const int ranks = 4;
  const Shape sizes = {3, 8};
  const float inf = INFINITY;
  // clang-format off
  Buffer global = {-80,  -79.5f, 0,    0.25f, 80,   79,    -1,   1,
                   -inf, -inf,   2,    3,     0.5f, -0.5f, 1,    0,
                   -inf, -inf,   -inf, -inf,  -inf, -inf,  -inf, -inf};
  // clang-format on
  using meshc::gen::Along;
  for (Along kind : {Along::Softmax, Along::LogSoftmax}) {
    INFO("along kind " << int(kind));
    Buffer expected = alongWhole(global, kind);
    std::vector<Buffer> outs = alongSplit(global, kind, ranks);
    for (int r = 0; r < ranks; ++r) {
      INFO("rank " << r);
      Buffer want = blockOf(expected, sizes, 1, r, ranks);
      for (size_t i = 0; i < want.size(); ++i) {
        INFO("element " << i);
        if (std::isnan(want[i])) {
          REQUIRE(std::isnan(outs[size_t(r)][i]));
        } else if (std::isinf(want[i])) {
          REQUIRE(outs[size_t(r)][i] == want[i]);
        } else {
          REQUIRE(outs[size_t(r)][i] == Approx(want[i]).margin(1e-6).epsilon(1e-6));
        }
      }
    }
  }
}

TEST_CASE("reduce sums any lane: dense runs, bias-gradient rows and strided lanes alike",
          "[codegen][support]") {
  // [4, 6, 5] row-major; each case sums one or two dims. The expected values are plain double
  // sums over the points; every path must agree with them to f32 rounding.
  const Shape sizes = {4, 6, 5};
  Buffer x = randomBuffer(120, 11);
  auto at = [&](int64_t i, int64_t j, int64_t k) { return double(x[size_t((i * 6 + j) * 5 + k)]); };
  struct Case {
    const char* what;
    Shape outSizes, inOuter, lane, laneStrides;
    std::function<double(int64_t)> expected; // per output, in row-major order
  };
  std::vector<Case> cases = {
      {"last dim (a dense run per output)",
       {4, 6},
       {30, 5},
       {5},
       {1},
       [&](int64_t o) {
         double sum = 0;
         for (int64_t k = 0; k < 5; ++k)
           sum += at(o / 6, o % 6, k);
         return sum;
       }},
      {"two outer dims (bias gradient rows)",
       {5},
       {1},
       {4, 6},
       {30, 5},
       [&](int64_t o) {
         double sum = 0;
         for (int64_t i = 0; i < 4; ++i)
           for (int64_t j = 0; j < 6; ++j)
             sum += at(i, j, o);
         return sum;
       }},
      {"the middle dim (strided)",
       {4, 5},
       {30, 1},
       {6},
       {5},
       [&](int64_t o) {
         double sum = 0;
         for (int64_t j = 0; j < 6; ++j)
           sum += at(o / 5, j, o % 5);
         return sum;
       }},
      {"everything",
       {},
       {},
       {4, 6, 5},
       {30, 5, 1},
       [&](int64_t) {
         double sum = 0;
         for (float v : x)
           sum += v;
         return sum;
       }},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    int64_t outputs = meshc::gen::product(c.outSizes);
    Buffer out(size_t(outputs), NAN);
    Buffer want(size_t(outputs), 0.0f);
    meshc::gen::reduce(out.data(), c.outSizes, x.data(), c.inOuter, c.lane, c.laneStrides,
                       meshc::gen::Reduce::Sum, 0.5);
    for (int64_t o = 0; o < outputs; ++o)
      want[size_t(o)] = float(c.expected(o) * 0.5);
    requireClose(out, want, 1e-6f);
  }
}

TEST_CASE("reduce max over contiguous runs: the largest element, NaN propagated",
          "[codegen][support]") {
  // [3, 5, 40] row-major (40: two 16-lane vectors and a tail). Max over the last dim (one run
  // per output) and over dims 0 and 2 (three runs per output, dim 1 kept between them).
  Buffer x = randomBuffer(600, 12);
  auto at = [&](int64_t i, int64_t j, int64_t k) { return x[size_t((i * 5 + j) * 40 + k)]; };
  auto check = [&](bool withNan) {
    INFO((withNan ? "a NaN at [1, 2, 37]" : "no NaN"));
    if (withNan) x[size_t((1 * 5 + 2) * 40 + 37)] = NAN;
    Buffer last(15, 0.0f), outer(5, 0.0f);
    meshc::gen::reduce(last.data(), {3, 5}, x.data(), {200, 40}, {40}, {1}, meshc::gen::Reduce::Max,
                       1.0);
    meshc::gen::reduce(outer.data(), {5}, x.data(), {40}, {3, 40}, {200, 1},
                       meshc::gen::Reduce::Max, 1.0);
    for (int64_t i = 0; i < 3; ++i)
      for (int64_t j = 0; j < 5; ++j) {
        float want = -INFINITY;
        for (int64_t k = 0; k < 40; ++k)
          want = std::isnan(at(i, j, k)) || std::isnan(want) ? NAN : std::max(want, at(i, j, k));
        float got = last[size_t(i * 5 + j)];
        CHECK((std::isnan(want) ? std::isnan(got) : got == want));
      }
    for (int64_t j = 0; j < 5; ++j) {
      float want = -INFINITY;
      for (int64_t i = 0; i < 3; ++i)
        for (int64_t k = 0; k < 40; ++k)
          want = std::isnan(at(i, j, k)) || std::isnan(want) ? NAN : std::max(want, at(i, j, k));
      CHECK((std::isnan(want) ? std::isnan(outer[size_t(j)]) : outer[size_t(j)] == want));
    }
  };
  check(false);
  check(true);
}

TEST_CASE("shift along a split dim exchanges halos and whole shards", "[codegen][support]") {
  const int ranks = 4;
  const Shape sizes = {2, 12, 3}; // shift dim 1: 3 rows per rank
  Buffer global = randomBuffer(72, 5);
  for (int64_t offset : {1, -1, 2, -3, 4, -5, 7, 12, -12, 0}) {
    INFO("offset " << offset);
    Buffer expected(global.size());
    meshc::gen::shift(expected, global, sizes, 1, offset, nullptr);
    std::vector<Buffer> outs(ranks);
    onRanks(ranks, [&](meshrt::Communicator& world) {
      Buffer local = blockOf(global, sizes, 1, world.rank(), ranks);
      Buffer& out = outs[size_t(world.rank())];
      out.resize(local.size());
      meshc::gen::shift(out, local, {2, 3, 3}, 1, offset, &world);
    });
    for (int r = 0; r < ranks; ++r)
      requireClose(outs[size_t(r)], blockOf(expected, sizes, 1, r, ranks));
  }
}

TEST_CASE("API checks name the tensor and both shapes", "[codegen][support]") {
  meshc::gen::Tensor tensor{{2, 3}, Buffer(6)};
  CHECK_NOTHROW(meshc::gen::checkShape("input", "x", tensor, {2, 3}));
  CHECK_THROWS_WITH(meshc::gen::checkShape("input", "x", tensor, {3, 2}),
                    "input 'x': expected shape [3, 2] (6 elements) but got shape [2, 3] with 6 "
                    "elements");
  tensor.data.resize(5);
  CHECK_THROWS_AS(meshc::gen::checkShape("input", "x", tensor, {2, 3}), std::invalid_argument);
}

namespace {

/// Writes `text` (a header line) followed by `values` doubles to a fresh file; returns its path.
std::string tensorFile(const std::string& name, const std::string& header,
                       const std::vector<double>& values) {
  std::string path = (std::filesystem::temp_directory_path() /
                      ("meshc-support-" + std::to_string(::getpid()) + "-" + name))
                         .string();
  std::FILE* file = std::fopen(path.c_str(), "wb");
  std::fwrite(header.data(), 1, header.size(), file);
  std::fwrite(values.data(), sizeof(double), values.size(), file);
  std::fclose(file);
  return path;
}

} // namespace

TEST_CASE("the inputs file is checked against the program's shape by dims", "[codegen][support]") {
  // A transposed [64, 32] tensor has the right count for a [32, 64] input: still an error naming
  // the file, the tensor and both shapes.
  std::string path =
      tensorFile("transposed", "tensor mlp.x f32 2 64 32\n", std::vector<double>(64 * 32, 1.0));
  auto tensors = meshc::gen::readTensors(path);
  CHECK_THROWS_WITH(meshc::gen::batchOfStep("mlp.x", tensors.at("mlp.x"), {32, 64}, 0),
                    "inputs file '" + path +
                        "': tensor 'mlp.x' has shape [64, 32], but the "
                        "program's input is [32, 64] (or k of it stacked along the first dim)");
  CHECK_THROWS_AS(meshc::gen::batchOfStep("mlp.x", tensors.at("mlp.x"), {64}, 0),
                  std::invalid_argument);
  // Two batches stacked along the first dim are fine; step 1 reads the second.
  std::vector<double> two(2 * 32 * 64);
  for (size_t i = 0; i < two.size(); ++i)
    two[i] = double(i);
  path = tensorFile("stacked", "tensor mlp.x f32 2 64 64\n", two);
  tensors = meshc::gen::readTensors(path);
  meshc::gen::Tensor second = meshc::gen::batchOfStep("mlp.x", tensors.at("mlp.x"), {32, 64}, 1);
  CHECK(second.shape == meshc::gen::Shape{32, 64});
  CHECK(second.data.front() == 32 * 64);
  std::filesystem::remove(path);
}

TEST_CASE("a tensor header declaring more values than the file holds is an error, not bad_alloc",
          "[codegen][support]") {
  // 10^11 values: caught before any allocation, naming the file and the tensor.
  std::string path = tensorFile("huge", "tensor mlp.x f32 2 100000 1000000\n", {1, 2, 3});
  CHECK_THROWS_WITH(meshc::gen::readTensors(path),
                    "inputs file '" + path +
                        "': tensor 'mlp.x' declares shape [100000, "
                        "1000000] but only 3 values follow in the file");
  // Sizes whose product overflows 64 bits, and negative sizes.
  path = tensorFile("overflow", "tensor t f32 3 4294967296 4294967296 16\n", {1});
  CHECK_THROWS_WITH(meshc::gen::readTensors(path), Catch::Contains("tensor 't' declares shape"));
  path = tensorFile("negative", "tensor t f32 1 -1\n", {1});
  CHECK_THROWS_WITH(meshc::gen::readTensors(path), Catch::Contains("is not a tensor file"));
  std::filesystem::remove(path);
}

TEST_CASE("cumsum and sum over a middle dim of a dense box: the same values as the lane walk",
          "[codegen][support]") {
  // [a=3, j=5, i=4] along j: the box path; the same lanes through a permuted view
  // ([i, a, j] strides), which is no box, take the table walk. Both sum in double in j order.
  const Shape outer = {3, 4}, boxStrides = {20, 1}, lane = {5}, boxLane = {4};
  Buffer in = randomBuffer(60, 31);
  for (auto kind : {meshc::gen::Along::Cumsum, meshc::gen::Along::CumsumExclusive}) {
    Buffer box(60), walked(60, 0.0f);
    meshc::gen::along(box.data(), in.data(), outer, boxStrides, boxStrides, lane, boxLane, boxLane,
                      kind, 0, 5, nullptr);
    for (int64_t a = 0; a < 3; ++a)
      for (int64_t i = 0; i < 4; ++i) {
        double sum = 0;
        for (int64_t j = 0; j < 5; ++j) {
          int64_t at = a * 20 + j * 4 + i;
          if (kind == meshc::gen::Along::CumsumExclusive) {
            walked[size_t(at)] = float(sum);
            sum += in[size_t(at)];
          } else {
            sum += in[size_t(at)];
            walked[size_t(at)] = float(sum);
          }
        }
      }
    CHECK(box == walked);
  }
  Buffer sums(12), expected(12);
  meshc::gen::reduce(sums.data(), outer, in.data(), boxStrides, lane, boxLane,
                     meshc::gen::Reduce::Sum, 0.5);
  for (int64_t a = 0; a < 3; ++a)
    for (int64_t i = 0; i < 4; ++i) {
      double sum = 0;
      for (int64_t j = 0; j < 5; ++j)
        sum += in[size_t(a * 20 + j * 4 + i)];
      expected[size_t(a * 4 + i)] = float(sum * 0.5);
    }
  CHECK(sums == expected);
}

TEST_CASE("bf16 and f16 rounding on the bits agrees with ilogb, ldexp and nearbyint",
          "[codegen][support]") {
  // The interpreter's definition (compiler/interp/Interpreter.cpp), which roundToFormat
  // computed until it was rewritten branch-free for the vectorized loops.
  auto reference = [](double x, int mantissaBits, int minExponent, double maxFinite) {
    if (x == 0 || !std::isfinite(x)) return x;
    int exponent = std::max(std::ilogb(x), minExponent);
    double quantum = std::ldexp(1.0, exponent - mantissaBits);
    double rounded = std::nearbyint(x / quantum) * quantum;
    if (std::fabs(rounded) > maxFinite) return std::copysign(double(INFINITY), x);
    return rounded;
  };
  struct Format {
    int mantissaBits, minExponent;
    double maxFinite;
  };
  std::mt19937_64 rng(7);
  for (Format f : {Format{7, -126, 0x1.FEp127}, Format{10, -14, 65504.0}}) {
    std::vector<double> values = {0.0,         -0.0,         INFINITY,        -INFINITY, NAN,
                                  f.maxFinite, -f.maxFinite, 2 * f.maxFinite, 1e300,     5e-324};
    std::uniform_int_distribution<int> exponent(f.minExponent - f.mantissaBits - 3,
                                                int(std::ilogb(f.maxFinite)) + 2);
    for (int i = 0; i < 200000; ++i) {
      // A random mantissa at a random exponent of the format's range and past its ends; every
      // fourth one an exact tie (the bit below the kept ones set, nothing after it).
      uint64_t bits = rng() & 0x000FFFFFFFFFFFFFull;
      if (i % 4 == 0) {
        int shift = 52 - f.mantissaBits;
        bits = (bits & ~((uint64_t(1) << shift) - 1)) | (uint64_t(1) << (shift - 1));
      }
      double mantissa;
      bits |= 0x3FF0000000000000ull;
      std::memcpy(&mantissa, &bits, 8);
      double x = std::ldexp(mantissa, exponent(rng));
      values.push_back(i % 2 ? x : -x);
    }
    for (double x : values) {
      double expected = reference(x, f.mantissaBits, f.minExponent, f.maxFinite);
      double actual = meshc::gen::roundToFormat(x, f.mantissaBits, f.minExponent, f.maxFinite);
      INFO("x = " << x << " (" << f.mantissaBits << " bits)");
      if (std::isnan(expected)) {
        CHECK(std::isnan(actual));
        continue;
      }
      CHECK(actual == expected);
      CHECK(std::signbit(actual) == std::signbit(expected));
    }
  }
}

TEST_CASE("the i32 cast holds the interpreter's value in both targets' support function",
          "[codegen][support]") {
  // The support function both targets call, against the interpreter's rule (docs/language.md):
  // truncation toward zero, saturating to [-2^31, 2^31 - 128], nan to 0; the values held as
  // floats are exact.
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::pair<double, double>> cases = {{3e9, 2147483520.0},
                                                  {-3e9, -2147483648.0},
                                                  {inf, 2147483520.0},
                                                  {-inf, -2147483648.0},
                                                  {std::nan(""), 0.0},
                                                  {2147483647.0, 2147483520.0},
                                                  {2147483520.0, 2147483520.0},
                                                  {-2147483648.0, -2147483648.0},
                                                  {-2.7, -2.0},
                                                  {2.7, 2.0}};
  for (auto [x, expected] : cases) {
    INFO(x);
    CHECK(double(meshc::gen::castToI32(x)) == expected);
    CHECK(double(meshc::gen::castToI32(double(float(x)))) == expected);
  }
}

TEST_CASE("arena slots are aligned, zeroed, filled or copied, and bounds-checked",
          "[codegen][support]") {
  meshc::gen::Arena arena(256);
  CHECK(arena.bytes() == 256);
  meshc::gen::View first = arena.fill(0, 16, 2.5f);
  CHECK(reinterpret_cast<uintptr_t>(first.data()) % meshc::gen::Arena::kAlignment == 0);
  CHECK(std::all_of(first.begin(), first.end(), [](float x) { return x == 2.5f; }));
  // A later value placed over dead bytes starts from zeros, not the stale 2.5s.
  meshc::gen::View reused = arena.slot(0, 8);
  CHECK(reused.data() == first.data());
  CHECK(std::all_of(reused.begin(), reused.end(), [](float x) { return x == 0.0f; }));
  Buffer source = randomBuffer(32, 9);
  meshc::gen::View copied = arena.copy(128, source);
  CHECK(copied.data() == first.data() + 32);
  CHECK(Buffer(copied.begin(), copied.end()) == source);
  CHECK_THROWS_AS(arena.slot(192, 17), std::logic_error); // past the end
  CHECK_THROWS_AS(arena.slot(4, 1), std::logic_error);    // misaligned
  CHECK_NOTHROW(arena.slot(192, 16));
}

TEST_CASE("dropout keeps exactly meshrt::dropoutKeep's elements on any shard",
          "[codegen][support]") {
  // A [4, 6] shard of a global [8, 10] tensor at offset (2, 3): its rows are runs of global
  // indices that start and end inside Philox calls. The input is read transposed (strides
  // {1, 4}), and a permuted output (global strides {1, 8}: no unit stride innermost) takes the
  // per-element path. Both must keep element i iff meshrt::dropoutKeep(key, i, rate).
  const int64_t rows = 4, cols = 6, globalCols = 10;
  const double rate = 0.4, scale = 1 / (1 - rate);
  uint64_t key = meshrt::streamKey(3, "ffn/dropout#0#5");
  Buffer in = randomBuffer(size_t(rows * cols), 9);
  int64_t base = 2 * globalCols + 3;
  Buffer out(size_t(rows * cols));
  meshc::gen::dropout(out.data(), {rows, cols}, in.data(), {1, rows}, {globalCols, 1}, base, key,
                      rate);
  int kept = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      INFO("row " << r << " col " << c);
      float x = in[size_t(c * rows + r)];
      bool keep = meshrt::dropoutKeep(key, uint64_t(base + r * globalCols + c), rate);
      kept += keep;
      CHECK(out[size_t(r * cols + c)] == (keep ? float(double(x) * scale) : 0.0f));
    }
  CHECK(kept > 0);
  CHECK(kept < rows * cols);
  Buffer permuted(size_t(rows * cols));
  meshc::gen::dropout(permuted.data(), {cols, rows}, in.data(), {rows, 1}, {1, 8}, 5, key, rate);
  for (int64_t c = 0; c < cols; ++c)
    for (int64_t r = 0; r < rows; ++r) {
      bool keep = meshrt::dropoutKeep(key, uint64_t(5 + c + r * 8), rate);
      CHECK(permuted[size_t(c * rows + r)] ==
            (keep ? float(double(in[size_t(c * rows + r)]) * scale) : 0.0f));
    }
}

TEST_CASE("oneHot sets each id's position, on any shard and with the one-hot dim anywhere",
          "[codegen][support]") {
  // ids [2, 3, 4] (whole numbers in and out of range, a fraction, NaN, infinities) one-hot over
  // a dim of 6 in every position of the output, for the shards starting at 0 and 3 of a dim of
  // 9, and a position stride of 2; each against the definition, element by element.
  Buffer ids = {0,   1,        2,         3, 4, 5, 6, 7, 8, 9, -1, 2.5f,
                NAN, INFINITY, -INFINITY, 3, 3, 3, 0, 5, 8, 1, 4,  2};
  const Shape idSizes = {2, 3, 4};
  for (size_t dim = 0; dim <= 3; ++dim)
    for (int64_t start : {0, 3})
      for (int64_t stride : {1, 2}) {
        Shape outSizes = idSizes, idStrides = {12, 4, 1}, positions(4, 0);
        outSizes.insert(outSizes.begin() + long(dim), 6);
        idStrides.insert(idStrides.begin() + long(dim), 0);
        positions[dim] = stride;
        Buffer out(size_t(meshc::gen::product(outSizes)), NAN), want(out.size());
        meshc::gen::oneHot(out.data(), outSizes, ids.data(), idStrides, positions, start);
        Shape outStrides = meshc::gen::rowMajorStrides(outSizes);
        for (int64_t flat = 0; flat < int64_t(want.size()); ++flat) {
          int64_t idOffset = 0, position = start;
          for (size_t d = 0; d < 4; ++d) {
            int64_t index = flat / outStrides[d] % outSizes[d];
            idOffset += index * idStrides[d];
            position += index * positions[d];
          }
          want[size_t(flat)] = ids[size_t(idOffset)] == float(position) ? 1.0f : 0.0f;
        }
        INFO("one-hot dim " << dim << ", start " << start << ", stride " << stride);
        requireClose(out, want, 0);
      }
}

TEST_CASE("gather and scatterAdd compute the einsums of a one-hot tensor", "[codegen][support]") {
  // ids [2, 3] over a vocab block [1, 5) of a global vocab of 8 (ids outside it select nothing);
  // the one-hot tensor [2, 3, v=4] times a table [v, d=5] (gather), and a gradient [2, 3, d]
  // times the one-hot tensor into [v, d] and, transposed, [d, v] (scatterAdd).
  const int64_t points = 6, vocab = 4, width = 5, start = 1;
  Buffer ids = {2, 0, 4, 7, 1, 2};
  Buffer table = randomBuffer(size_t(vocab * width), 3),
         grad = randomBuffer(size_t(points * width), 4);
  auto oneHot = [&](int64_t p, int64_t v) {
    return ids[size_t(p)] == float(v + start) ? 1.0 : 0.0;
  };
  Buffer gathered(size_t(points * width), NAN);
  meshc::gen::gather(gathered.data(), {2, 3, width}, table.data(), {0, 0, 1}, ids.data(), {3, 1, 0},
                     vocab, width, start);
  Buffer wantGathered(gathered.size());
  for (int64_t p = 0; p < points; ++p)
    for (int64_t d = 0; d < width; ++d) {
      double sum = 0;
      for (int64_t v = 0; v < vocab; ++v)
        sum += oneHot(p, v) * table[size_t(v * width + d)];
      wantGathered[size_t(p * width + d)] = float(sum);
    }
  requireClose(gathered, wantGathered, 0);
  Buffer rows(size_t(vocab * width), NAN), columns(size_t(width * vocab), NAN);
  // [v, d]: each point's gradient row added to the id's row (the dense path) ...
  meshc::gen::scatterAdd(rows.data(), {vocab, width}, grad.data(), {0, 1}, ids.data(), {0, 0},
                         {2, 3}, {3 * width, width}, {3, 1}, 0, start);
  // ... and [d, v]: the transposed output walks the general path.
  meshc::gen::scatterAdd(columns.data(), {width, vocab}, grad.data(), {1, 0}, ids.data(), {0, 0},
                         {2, 3}, {3 * width, width}, {3, 1}, 1, start);
  Buffer wantRows(rows.size()), wantColumns(columns.size());
  for (int64_t v = 0; v < vocab; ++v)
    for (int64_t d = 0; d < width; ++d) {
      double sum = 0;
      for (int64_t p = 0; p < points; ++p)
        sum += oneHot(p, v) * grad[size_t(p * width + d)];
      wantRows[size_t(v * width + d)] = wantColumns[size_t(d * vocab + v)] = float(sum);
    }
  requireClose(rows, wantRows, 1e-6f);
  requireClose(columns, wantColumns, 1e-6f);
  CHECK(wantRows[size_t(0 * width)] != 0); // id 1 is in the block: row 0 has a point
}

TEST_CASE("a bias-gradient sum wider than one block of columns sums every column",
          "[codegen][support]") {
  // [3, 5000]: the sum over the 3 rows walks the columns in blocks (at most 2048 a block).
  const int64_t rows = 3, columns = 5000;
  Buffer x = randomBuffer(size_t(rows * columns), 21);
  Buffer out(size_t(columns), NAN);
  Buffer want(out.size());
  meshc::gen::reduce(out.data(), {columns}, x.data(), {1}, {rows}, {columns},
                     meshc::gen::Reduce::Sum, 1.0);
  for (int64_t c = 0; c < columns; ++c)
    want[size_t(c)] = float(double(x[size_t(c)]) + double(x[size_t(columns + c)]) +
                            double(x[size_t(2 * columns + c)]));
  requireClose(out, want, 0);
}

TEST_CASE("initParams fills each rank's block of the whole tensor, only on its stages",
          "[codegen][support]") {
  // The generated constructor's tables: a normal param split over x, a bf16 constant, and a
  // param held by pipeline stage 1 only (here: stage = this rank's x coordinate).
  static constexpr meshc::gen::ParamSpec specs[] = {{"w", false, "f32", "rows:4:2:x cols:3:3:"},
                                                    {"b", false, "bf16", "d:5:5:"},
                                                    {"late", false, "f32", "d:2:2:", 0x2, "x"}};
  static constexpr meshc::gen::ParamInit inits[] = {
      {"normal", meshc::gen::DType::F32, {{"mean", 0.5}, {"stddev", 2.0}}},
      {"constant", meshc::gen::DType::BF16, {{"value", 1.3}}},
      {"ones", meshc::gen::DType::F32, {}}};
  Buffer whole(12);
  meshrt::kernels::fillParam(whole.data(), meshrt::kernels::wholeTensor({4, 3}), 7, "w",
                             meshrt::kernels::makeInit("normal", {{"mean", 0.5}, {"stddev", 2.0}}));
  // Per rank: w, b, late, then late again without stages (checked on the main thread:
  // Catch's assertions are not thread-safe).
  std::vector<std::array<Buffer, 4>> held(2);
  onRanks(2, [&](meshrt::Communicator& world) {
    std::array<Buffer, 4>& mine = held[size_t(world.rank())];
    Buffer* const data[] = {&mine[0], &mine[1], &mine[2]};
    meshc::gen::initParams(world, 7, world.rank(), specs, inits, data);
    // Without stages (-1) every rank holds every param.
    Buffer w2, b2;
    Buffer* const data2[] = {&w2, &b2, &mine[3]};
    meshc::gen::initParams(world, 7, -1, specs, inits, data2);
  });
  for (int rank = 0; rank < 2; ++rank) {
    INFO("rank " << rank);
    const auto& [w, b, late, late2] = held[size_t(rank)];
    CHECK(w == blockOf(whole, {4, 3}, 0, rank, 2));
    CHECK(b == Buffer(5, meshc::gen::roundValue(meshc::gen::DType::BF16, 1.3)));
    CHECK(b[0] != 1.3f); // rounded to bf16
    CHECK(late == (rank == 1 ? Buffer{1.0f, 1.0f} : Buffer{}));
    CHECK(late2 == Buffer{1.0f, 1.0f});
  }
}

TEST_CASE("CausalEinsum: the attention GEMMs over the lower triangle of blocks, as the whole "
          "einsum where it is read",
          "[codegen][support]") {
  // [batch 2, heads 2, seq = mem = 96 (3 blocks of 32), d_head 8]; the layouts of
  // causal-attention-blocks' GEMMs in lm: q[b,s,h,e] . k[b,m,h,e] -> scores[b,h,s,m], then
  // weights[b,h,s,m] . v[b,m,h,e] -> context[b,s,h,e].
  using Blocks = meshc::gen::CausalEinsum::Blocks;
  using Check = meshc::gen::CausalEinsum::Check;
  const int64_t batch = 2, heads = 2, size = 96, dHead = 8, block = 32;
  Buffer q = randomBuffer(size_t(batch * size * heads * dHead), 41), k = randomBuffer(q.size(), 42),
         v = randomBuffer(q.size(), 43),
         weights = randomBuffer(size_t(batch * heads * size * size), 44);
  auto keyOf = [&](size_t i) { return int64_t(i) % size; };
  auto queryOf = [&](size_t i) { return int64_t(i) / size % size; };
  for (size_t i = 0; i < weights.size(); ++i)
    if (keyOf(i) > queryOf(i)) weights[i] = 0; // a causal softmax's zeros
  meshrt::kernels::EinsumSpec scores{{batch, heads, size, dHead, size},
                                     {{{0, 2, 1, 3}, {}}, {{0, 4, 1, 3}, {}}},
                                     {{0, 1, 2, 4}, {}}};
  meshrt::kernels::EinsumSpec context{{batch, heads, size, size, dHead},
                                      {{{0, 1, 2, 3}, {}}, {{0, 3, 1, 4}, {}}},
                                      {{0, 2, 1, 4}, {}}};
  SECTION("scores: the einsum's values in the blocks on and below the diagonal, the fill above") {
    Buffer expected(weights.size()), blocked(weights.size(), 7.0f);
    meshrt::kernels::EinsumPlan(scores).run(q.data(), k.data(), expected.data(), 0.125f);
    meshc::gen::CausalEinsum(scores, 2, 4, block, Blocks::Keys, -1, Check::None, -1e9f)
        .run(q.data(), k.data(), blocked.data(), 0.125f);
    for (size_t i = 0; i < blocked.size(); ++i) {
      INFO("element " << i << ": query " << queryOf(i) << ", key " << keyOf(i));
      if (keyOf(i) / block > queryOf(i) / block)
        REQUIRE(blocked[i] == -1e9f);
      else
        REQUIRE(blocked[i] == Approx(expected[i]).margin(1e-5).epsilon(1e-5));
    }
  }
  SECTION("scores for a causalMaskedSoftmax: the entries above the blocks' diagonal unwritten") {
    Buffer expected(weights.size()), blocked(weights.size(), 7.0f);
    meshrt::kernels::EinsumPlan(scores).run(q.data(), k.data(), expected.data(), 0.125f);
    meshc::gen::CausalEinsum(scores, 2, 4, block, Blocks::Keys, -1, Check::None, -1e9f,
                             /*fillAbove=*/false)
        .run(q.data(), k.data(), blocked.data(), 0.125f);
    for (size_t i = 0; i < blocked.size(); ++i) {
      INFO("element " << i << ": query " << queryOf(i) << ", key " << keyOf(i));
      if (keyOf(i) / block > queryOf(i) / block)
        REQUIRE(blocked[i] == 7.0f);
      else
        REQUIRE(blocked[i] == Approx(expected[i]).margin(1e-5).epsilon(1e-5));
    }
  }
  SECTION("context: the whole einsum, also where a row's weights above the diagonal are not "
          "zero (a wholly masked row's are uniform)") {
    // uniformTails: the weights' entries past each row's diagonal block all equal (a
    // causalMaskedSoftmax's, as these are), so one per row is checked.
    meshc::gen::CausalEinsum causal(context, 2, 3, block, Blocks::Queries, 0, Check::Every),
        uniform(context, 2, 3, block, Blocks::Queries, 0, Check::Tails);
    for (bool masked : {false, true}) {
      INFO("a wholly masked row: " << masked);
      if (masked) // query 40 of batch 1, head 0 (block 1): uniform weights
        std::fill_n(weights.begin() + ((1 * heads + 0) * size + 40) * size, size, 1.0f / size);
      Buffer expected(q.size()), blocked(q.size(), 7.0f), checkedOnce(q.size(), 7.0f);
      meshrt::kernels::EinsumPlan(context).run(weights.data(), v.data(), expected.data());
      causal.run(weights.data(), v.data(), blocked.data(), 1.0f);
      uniform.run(weights.data(), v.data(), checkedOnce.data(), 1.0f);
      requireClose(blocked, expected);
      requireClose(checkedOnce, expected);
    }
  }
  SECTION("context of weights known zero above the diagonal: nothing checked") {
    // d_scores . k: the weights a where(causal mask, x, 0), exactly zero above the diagonal.
    Buffer expected(q.size()), blocked(q.size(), 7.0f);
    meshrt::kernels::EinsumPlan(context).run(weights.data(), v.data(), expected.data());
    meshc::gen::CausalEinsum(context, 2, 3, block, Blocks::Queries, 0, Check::None)
        .run(weights.data(), v.data(), blocked.data(), 1.0f);
    requireClose(blocked, expected);
  }
  SECTION("key gradient: the query positions contracted, each key block from its own start") {
    // probs^T . d_context -> d_v[b,m,h,e] (probs operand 0) and d_scores^T . q -> d_k (known
    // zeros, operand 1 here: q first); dims batch 0, heads 1, seq 2, mem 3, d_head 4.
    meshrt::kernels::EinsumSpec probsFirst{{batch, heads, size, size, dHead},
                                           {{{0, 1, 2, 3}, {}}, {{0, 2, 1, 4}, {}}},
                                           {{0, 3, 1, 4}, {}}};
    meshrt::kernels::EinsumSpec probsSecond{{batch, heads, size, size, dHead},
                                            {{{0, 2, 1, 4}, {}}, {{0, 1, 2, 3}, {}}},
                                            {{0, 3, 1, 4}, {}}};
    meshc::gen::CausalEinsum tails(probsFirst, 2, 3, block, Blocks::Keys, 0, Check::Tails),
        every(probsFirst, 2, 3, block, Blocks::Keys, 0, Check::Every),
        known(probsSecond, 2, 3, block, Blocks::Keys, 1, Check::None);
    for (bool masked : {false, true}) {
      INFO("a wholly masked row: " << masked);
      if (masked) // query 40 of batch 1, head 0 (block 1): uniform weights, so every key block
        std::fill_n(weights.begin() + ((1 * heads + 0) * size + 40) * size, size, 1.0f / size);
      Buffer expected(q.size()), checkedOnce(q.size(), 7.0f), checkedAll(q.size(), 7.0f);
      meshrt::kernels::EinsumPlan(probsFirst).run(weights.data(), v.data(), expected.data());
      tails.run(weights.data(), v.data(), checkedOnce.data(), 1.0f);
      every.run(weights.data(), v.data(), checkedAll.data(), 1.0f);
      requireClose(checkedOnce, expected);
      requireClose(checkedAll, expected);
      if (masked) continue;
      Buffer unchecked(q.size(), 7.0f);
      known.run(v.data(), weights.data(), unchecked.data(), 1.0f);
      requireClose(unchecked, expected);
    }
    // Known zeros are taken at their word: a nonzero weight above the blocks' diagonal (query 0,
    // key 95) is left out, which is how the test knows the blocks were skipped: d_v[0, 95, 0, 0]
    // lacks its term weights[0, 0, 0, 95] * d_context[0, 0, 0, 0].
    weights[95] = 1.0f;
    Buffer expected(q.size()), unchecked(q.size(), 7.0f);
    meshrt::kernels::EinsumPlan(probsFirst).run(weights.data(), v.data(), expected.data());
    known.run(v.data(), weights.data(), unchecked.data(), 1.0f);
    size_t key95 = size_t(95 * heads * dHead);
    CHECK(unchecked[key95] == Approx(expected[key95] - v[0]).margin(1e-5));
  }
}
