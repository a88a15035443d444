// The layout-invariant RNG: Philox4x32-10 known answers, the stream definition (element i takes
// word i mod 4 of the call with counter i / 4), the run helpers against the per-element
// functions, distribution statistics, stream keys.
#include "meshrt/Random.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <set>
#include <vector>

using namespace meshrt;

namespace {

void checkPhilox(Philox4x32 counter, uint32_t key0, uint32_t key1, Philox4x32 expected) {
  Philox4x32 got = philox4x32(counter, key0, key1);
  for (int i = 0; i < 4; ++i) {
    INFO("word " << i);
    CHECK(got.v[i] == expected.v[i]);
  }
}

struct Moments {
  double mean = 0, variance = 0;
};

template <typename Sample> Moments moments(int count, Sample sample) {
  double sum = 0, sumSquares = 0;
  for (int i = 0; i < count; ++i) {
    double x = sample(uint64_t(i));
    sum += x;
    sumSquares += x * x;
  }
  Moments result;
  result.mean = sum / count;
  result.variance = sumSquares / count - result.mean * result.mean;
  return result;
}

} // namespace

TEST_CASE("philox4x32-10 matches the Random123 known answers", "[random]") {
  checkPhilox({{0, 0, 0, 0}}, 0, 0, {{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}});
  checkPhilox({{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}}, 0xffffffff, 0xffffffff,
              {{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}});
  checkPhilox({{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}}, 0xa4093822, 0x299f31d0,
              {{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}});
}

TEST_CASE("randomBlock lays the block number and draw into the counter", "[random]") {
  uint64_t key = 0x0123456789abcdefull;
  uint64_t block = 0x0000000500000007ull;
  Philox4x32 direct = philox4x32({{7, 5, 3, 0}}, 0x89abcdef, 0x01234567);
  Philox4x32 viaBlock = randomBlock(key, block, 3);
  for (int i = 0; i < 4; ++i)
    CHECK(direct.v[i] == viaBlock.v[i]);
}

TEST_CASE("element i takes word i mod 4 of the call with counter i / 4", "[random]") {
  uint64_t key = streamKey(5, "input/x");
  for (uint64_t index : {0ull, 1ull, 2ull, 3ull, 4ull, 7ull, 1001ull, 0x0000000500000007ull,
                         0xfffffffffffffffeull}) {
    for (uint32_t draw : {0u, 2u}) {
      INFO("index " << index << " draw " << draw);
      Philox4x32 call = philox4x32({{uint32_t(index / 4), uint32_t((index / 4) >> 32), draw, 0}},
                                   uint32_t(key), uint32_t(key >> 32));
      uint32_t word = call.v[index % 4];
      CHECK(randomWord(key, index, draw) == word);
      CHECK(uniform01(key, index, draw) == bitsToUnit(word));
      CHECK(uniformIndex(key, index, 1000, draw) == uint32_t((uint64_t(word) * 1000) >> 32));
      // Box-Muller on the word pair of the element's half of the call: cos for even, sin for odd.
      uint32_t pair = uint32_t(index % 4) & 2u;
      double radius = std::sqrt(-2.0 * std::log(bitsToUnit(call.v[pair])));
      double angle = 6.283185307179586476925 * bitsToUnit(call.v[pair + 1]);
      CHECK(normal(key, index, draw) == radius * (index % 2 ? std::sin(angle) : std::cos(angle)));
    }
  }
  // The four elements of one call see four different words.
  std::set<uint32_t> words;
  for (uint64_t i = 8; i < 12; ++i)
    words.insert(randomWord(key, i));
  CHECK(words.size() == 4);
}

TEST_CASE("truncated normal redraws an element alone until |z| <= 2", "[random]") {
  uint64_t key = streamKey(9, "param/w");
  int redrawn = 0;
  for (uint64_t i = 0; i < 20000; ++i) {
    double first = normal(key, i);
    double z = truncatedNormal(key, i);
    REQUIRE(std::fabs(z) <= 2.0);
    if (std::fabs(first) <= 2.0) {
      REQUIRE(z == first);
    } else {
      ++redrawn;
      // The first redraw that lands inside, by draw number.
      double expected = 0;
      for (uint32_t draw = 1; draw < 1000; ++draw)
        if (std::fabs(expected = normal(key, i, draw)) <= 2.0) break;
      REQUIRE(z == expected);
    }
  }
  CHECK(redrawn == Approx(910).margin(150)); // P(|z| > 2) = 4.55%
  Moments m = moments(100000, [&](uint64_t i) { return truncatedNormal(key, i); });
  CHECK(m.mean == Approx(0.0).margin(0.01));
  CHECK(m.variance == Approx(0.7737).margin(0.015)); // 1 - 4 phi(2) / (Phi(2) - Phi(-2))
}

TEST_CASE("runs reproduce the per-element values bit for bit from any start", "[random]") {
  uint64_t key = streamKey(1, "param/block[0]/w");
  // Starts and lengths that cut calls anywhere (a shard's rows start at any global index).
  for (uint64_t first : {0ull, 1ull, 2ull, 3ull, 6ull, 0xfffffffdull}) {
    for (uint64_t count : {0ull, 1ull, 2ull, 3ull, 5ull, 9ull, 64ull}) {
      INFO("first " << first << " count " << count);
      std::vector<uint64_t> seen;
      forEachRandomWord(key, first, count, [&](uint64_t k, uint32_t word) {
        seen.push_back(k);
        CHECK(word == randomWord(key, first + k));
      });
      std::vector<uint64_t> inOrder(count);
      for (uint64_t k = 0; k < count; ++k)
        inOrder[k] = k;
      CHECK(seen == inOrder);
      forEachRandomWord(
          key, first, count,
          [&](uint64_t k, uint32_t word) { CHECK(word == randomWord(key, first + k, 4)); }, 4);
      forEachUniform01(key, first, count,
                       [&](uint64_t k, double u) { CHECK(u == uniform01(key, first + k)); });
      forEachUniformIndex(key, first, count, 7, [&](uint64_t k, uint32_t value) {
        CHECK(value == uniformIndex(key, first + k, 7));
      });
      forEachNormal(key, first, count,
                    [&](uint64_t k, double z) { CHECK(z == normal(key, first + k)); });
      forEachNormal(
          key, first, count, [&](uint64_t k, double z) { CHECK(z == normal(key, first + k, 1)); },
          1);
      forEachTruncatedNormal(key, first, count, [&](uint64_t k, double z) {
        CHECK(z == truncatedNormal(key, first + k));
      });
      forEachDropoutKeep(key, first, count, 0.3, [&](uint64_t k, bool keep) {
        CHECK(keep == dropoutKeep(key, first + k, 0.3));
        CHECK(keep == (uniform01(key, first + k) >= 0.3));
      });
    }
  }
}

TEST_CASE("stream keys are deterministic and distinct", "[random]") {
  static_assert(fnv1a64("") == 0xCBF29CE484222325ull);
  static_assert(fnv1a64("a") == 0xAF63DC4C8601EC8Cull); // FNV-1a reference value
  static_assert(streamKey(1, "input/x") == streamKey(1, "input/x"));
  // A train step's dropout stream, hashed without building "<name>#<step>".
  for (uint64_t step : {0ull, 7ull, 10ull, 99ull, 1234567ull, ~0ull})
    CHECK(stepStreamKey(3, "decoder/ffn/dropout#0", step) ==
          streamKey(3, "decoder/ffn/dropout#0#" + std::to_string(step)));
  CHECK(streamKey(0, "input/x") != streamKey(1, "input/x"));
  CHECK(streamKey(0, "input/x") != streamKey(0, "input/y"));
  CHECK(streamKey(0, "param/w") != streamKey(0, "input/w"));
  std::set<uint64_t> keys;
  for (uint64_t seed = 0; seed < 100; ++seed)
    keys.insert(streamKey(seed, "dropout#0"));
  CHECK(keys.size() == 100);
}

TEST_CASE("uniform01 lies strictly inside (0, 1) and is exact in float", "[random]") {
  CHECK(bitsToUnit(0) > 0.0);
  CHECK(bitsToUnit(0xffffffffu) < 1.0);
  CHECK(bitsToUnit(0) == std::ldexp(1.0, -24));
  CHECK(bitsToUnit(0xffffffffu) == 1.0 - std::ldexp(1.0, -24));
  uint64_t key = streamKey(7, "u");
  for (uint64_t i = 0; i < 1000; ++i) {
    double u = uniform01(key, i);
    REQUIRE(u > 0.0);
    REQUIRE(u < 1.0);
    REQUIRE(double(float(u)) == u);
  }
  Moments m = moments(100000, [&](uint64_t i) { return uniform01(key, i); });
  CHECK(m.mean == Approx(0.5).margin(0.005));
  CHECK(m.variance == Approx(1.0 / 12).margin(0.002));
}

TEST_CASE("normal samples have mean 0 and variance 1", "[random]") {
  uint64_t key = streamKey(42, "input/x");
  Moments m = moments(100000, [&](uint64_t i) { return normal(key, i); });
  CHECK(m.mean == Approx(0.0).margin(0.01));
  CHECK(m.variance == Approx(1.0).margin(0.02));
  // The tails are present but not absurd.
  int beyondTwo = 0;
  for (uint64_t i = 0; i < 100000; ++i)
    beyondTwo += std::fabs(normal(key, i)) > 2.0;
  CHECK(beyondTwo == Approx(4550).margin(400)); // P(|z| > 2) = 4.55%
}

TEST_CASE("different streams, draws and indices are uncorrelated", "[random]") {
  uint64_t keyA = streamKey(0, "a"), keyB = streamKey(0, "b"), keyA1 = streamKey(1, "a");
  auto correlation = [](auto first, auto second) {
    double sum = 0;
    const int count = 100000;
    for (int i = 0; i < count; ++i)
      sum += first(uint64_t(i)) * second(uint64_t(i));
    return sum / count;
  };
  CHECK(correlation([&](uint64_t i) { return normal(keyA, i); },
                    [&](uint64_t i) { return normal(keyB, i); }) == Approx(0).margin(0.015));
  CHECK(correlation([&](uint64_t i) { return normal(keyA, i); },
                    [&](uint64_t i) { return normal(keyA1, i); }) == Approx(0).margin(0.015));
  CHECK(correlation([&](uint64_t i) { return normal(keyA, i); },
                    [&](uint64_t i) { return normal(keyA, i, 1); }) == Approx(0).margin(0.015));
  CHECK(correlation([&](uint64_t i) { return normal(keyA, i); },
                    [&](uint64_t i) { return normal(keyA, i + 1); }) == Approx(0).margin(0.015));
  // The two branches of one Box-Muller pair (elements 2j and 2j + 1) are independent: their
  // squares are uncorrelated too (E[z0^2 z1^2] = 1 for independent standard normals).
  CHECK(correlation([&](uint64_t i) { return normal(keyA, 2 * i); },
                    [&](uint64_t i) { return normal(keyA, 2 * i + 1); }) ==
        Approx(0).margin(0.015));
  CHECK(correlation([&](uint64_t i) { return std::pow(normal(keyA, 2 * i), 2); },
                    [&](uint64_t i) { return std::pow(normal(keyA, 2 * i + 1), 2); }) ==
        Approx(1).margin(0.05));
  CHECK(normal(keyA, 5) == normal(keyA, 5));
}

TEST_CASE("uniformIndex covers [0, bound) evenly", "[random]") {
  uint64_t key = streamKey(3, "input/ids");
  std::vector<int> counts(10, 0);
  for (uint64_t i = 0; i < 100000; ++i) {
    uint32_t value = uniformIndex(key, i, 10);
    REQUIRE(value < 10);
    ++counts[value];
  }
  for (int count : counts)
    CHECK(count == Approx(10000).margin(500));
  for (uint64_t i = 0; i < 100; ++i)
    CHECK(uniformIndex(key, i, 1) == 0);
}

TEST_CASE("the vectorizable dropout test keeps exactly the elements dropoutKeep keeps",
          "[random]") {
  uint64_t key = streamKey(7, "ffn/dropout#3");
  // Rates at and around the 2^-23 grid of uniform01, and the ends.
  for (double rate : {0.0, 0.1, 0.25, 0.5, 0.9, 1.0, 1.5, -0.5, 0.5 / 8388608.0, 1.5 / 8388608.0,
                      1.0 - 0.5 / 8388608.0, 3.0 / 8388608.0}) {
    uint32_t threshold = dropoutThreshold(rate);
    for (uint64_t index = 0; index < 20000; ++index) {
      REQUIRE(randomWordSelected(key, index) == randomWord(key, index));
      REQUIRE(dropoutKeepBelow(key, index, threshold) == dropoutKeep(key, index, rate));
      REQUIRE(dropoutKeepMask(key, index, threshold) == (dropoutKeep(key, index, rate) ? ~0u : 0u));
    }
  }
  // Masks drawn a run at a time (one call per four elements, eight calls at once) from starts and
  // lengths that cut calls and groups anywhere, one across the carry into the block counter's
  // high word (block 2^32 - 3 on): the same bits as the per-element test.
  uint32_t threshold = dropoutThreshold(0.3);
  for (uint64_t first : {0ull, 1ull, 2ull, 3ull, 6ull, 0xfffffffdull, 0x3fffffff4ull})
    for (int64_t count : {0, 1, 2, 3, 5, 9, 64, 1027}) {
      INFO("first " << first << " count " << count);
      std::vector<uint32_t> masks(size_t(count) + 1, 12345u);
      dropoutKeepMasks(key, first, count, threshold, masks.data());
      for (int64_t k = 0; k < count; ++k)
        REQUIRE(masks[size_t(k)] == dropoutKeepMask(key, first + uint64_t(k), threshold));
      CHECK(masks[size_t(count)] == 12345u); // nothing written past the run
    }
  // Every word at the threshold's edge: keep iff uniform01(word) >= rate.
  for (double rate : {0.1, 0.3, 0.7})
    for (uint32_t high = dropoutThreshold(rate) - 2; high < dropoutThreshold(rate) + 2; ++high) {
      uint32_t word = high << 9;
      CHECK((bitsToUnit(word) >= rate) == ((word >> 9) >= dropoutThreshold(rate)));
    }
}
