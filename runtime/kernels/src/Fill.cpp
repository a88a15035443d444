// RNG fills of local shards: the interpreter's synthesizeInput, initializeParam, random ops and
// dropout, evaluated only at the shard's global indices.
#include "meshrt/kernels/Fill.h"

#include "meshrt/Random.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

namespace meshrt::kernels {
namespace {

uint64_t keyOf(uint64_t seed, std::string_view prefix, std::string_view name) {
  std::string stream(prefix);
  stream += name;
  return streamKey(seed, stream);
}

/// fn(local, global, count) for each run of `count` elements that are consecutive in both the
/// local and the global row-major order: the innermost dim, widened over the dims that the shard
/// holds whole (so that the RNG's runs, one Philox call per 4 elements, are as long as possible).
template <typename Fn> void forEachGlobalRun(const Shard& shard, Fn&& fn) {
  int rank = shard.globalShape.rank;
  if (rank == 0) {
    fn(int64_t(0), int64_t(0), int64_t(1));
    return;
  }
  int inner = rank - 1;
  int64_t run = shard.localShape[inner];
  while (inner > 0 && shard.localShape[inner] == shard.globalShape[inner]) {
    --inner;
    run *= shard.localShape[inner];
  }
  if (run == 0) return;
  Shard rows = shard;
  for (int d = inner; d < rank; ++d)
    rows.localShape[d] = 1;
  forEachGlobalIndex(rows, [&](int64_t row, int64_t global) { fn(row * run, global, run); });
}

/// Fills out[local] = roundTo(type, value) run by run: draw(first, count, write) calls
/// write(k, value) for the global indices first + k, k < count.
template <typename Draw>
void fillRuns(float* out, const Shard& shard, ValueType type, Draw&& draw) {
  forEachGlobalRun(shard, [&](int64_t local, int64_t global, int64_t count) {
    float* run = out + local;
    draw(uint64_t(global), uint64_t(count),
         [&](uint64_t k, double value) { run[k] = roundTo(type, value); });
  });
}

void fillConstant(float* out, const Shard& shard, ValueType type, double value) {
  std::fill_n(out, shard.localShape.product(), roundTo(type, value));
}

void fillNormal(float* out, const Shard& shard, ValueType type, uint64_t key, double mean,
                double stddev) {
  fillRuns(out, shard, type, [&](uint64_t first, uint64_t count, auto write) {
    forEachNormal(key, first, count, [&](uint64_t k, double z) { write(k, mean + stddev * z); });
  });
}

void fillUniform(float* out, const Shard& shard, ValueType type, uint64_t key, double min,
                 double max) {
  fillRuns(out, shard, type, [&](uint64_t first, uint64_t count, auto write) {
    forEachUniform01(key, first, count,
                     [&](uint64_t k, double u) { write(k, min + (max - min) * u); });
  });
}

/// Rows [blockStart, blockStart + blockRows) of the interpreter's orthogonal init, written to
/// rowsOut (row-major, `cols` wide): Gaussian rows orthonormalized by two passes of modified
/// Gram-Schmidt within the block, each scaled to the norm of an independent Gaussian (draw 1).
void orthogonalBlock(int64_t blockStart, int64_t blockRows, int64_t cols, uint64_t key,
                     double scale, double* rowsOut) {
  std::vector<std::vector<double>> block(static_cast<size_t>(blockRows),
                                         std::vector<double>(static_cast<size_t>(cols)));
  for (int64_t r = 0; r < blockRows; ++r) {
    std::vector<double>& row = block[size_t(r)];
    int64_t base = (blockStart + r) * cols;
    forEachNormal(key, uint64_t(base), uint64_t(cols), [&](uint64_t c, double z) { row[c] = z; });
    for (int pass = 0; pass < 2; ++pass) {
      for (int64_t prev = 0; prev < r; ++prev) {
        const std::vector<double>& other = block[size_t(prev)];
        double dot = 0;
        for (int64_t c = 0; c < cols; ++c)
          dot += row[size_t(c)] * other[size_t(c)];
        for (int64_t c = 0; c < cols; ++c)
          row[size_t(c)] -= dot * other[size_t(c)];
      }
    }
    double norm = 0;
    for (double x : row)
      norm += x * x;
    norm = std::sqrt(norm);
    if (norm > 0)
      for (double& x : row)
        x /= norm;
    double chi = 0;
    forEachNormal(
        key, uint64_t(base), uint64_t(cols), [&](uint64_t, double z) { chi += z * z; }, 1);
    chi = std::sqrt(chi);
    for (int64_t c = 0; c < cols; ++c)
      rowsOut[r * cols + c] = row[size_t(c)] * chi * scale;
  }
}

void fillOrthogonal(float* out, const Shard& shard, uint64_t key, double scale, ValueType type) {
  int64_t count = shard.globalShape.product();
  int64_t rows = shard.globalShape.rank == 0 ? 1 : shard.globalShape[0];
  int64_t cols = rows > 0 ? count / rows : 0;
  if (rows <= 0 || cols <= 0 || shard.localShape.product() == 0) return;
  // The row range the shard touches, widened to whole blocks of `cols` rows.
  int64_t firstRow = shard.globalShape.rank == 0 ? 0 : shard.offset[0];
  int64_t lastRow = shard.globalShape.rank == 0 ? 0 : firstRow + shard.localShape[0] - 1;
  int64_t begin = firstRow / cols * cols;
  int64_t end = std::min(rows, (lastRow / cols + 1) * cols);
  std::vector<double> values(size_t((end - begin) * cols));
  for (int64_t blockStart = begin; blockStart < end; blockStart += cols)
    orthogonalBlock(blockStart, std::min(cols, rows - blockStart), cols, key, scale,
                    values.data() + (blockStart - begin) * cols);
  forEachGlobalIndex(shard, [&](int64_t local, int64_t global) {
    out[local] = roundTo(type, values[size_t(global - begin * cols)]);
  });
}

} // namespace

void fillInput(float* out, const Shard& shard, uint64_t seed, std::string_view name,
               ValueType type) {
  uint64_t key = keyOf(seed, "input/", name);
  fillNormal(out, shard, type, key, 0.0, 1.0);
}

void fillInput(int32_t* out, const Shard& shard, uint64_t seed, std::string_view name,
               int64_t indexBound) {
  uint64_t key = keyOf(seed, "input/", name);
  uint64_t bound = indexBound > 0 ? uint64_t(indexBound) : 2;
  bound = std::min<uint64_t>(bound, uint64_t(1) << 31);
  forEachGlobalRun(shard, [&](int64_t local, int64_t global, int64_t count) {
    int32_t* run = out + local;
    forEachUniformIndex(key, uint64_t(global), uint64_t(count), bound,
                        [&](uint64_t k, uint32_t value) { run[k] = int32_t(value); });
  });
}

std::optional<InitKind> parseInitKind(std::string_view kind) {
  static constexpr std::pair<std::string_view, InitKind> kKinds[] = {
      {"zeros", InitKind::Zeros},
      {"ones", InitKind::Ones},
      {"constant", InitKind::Constant},
      {"normal", InitKind::Normal},
      {"truncated_normal", InitKind::TruncatedNormal},
      {"uniform", InitKind::Uniform},
      {"orthogonal", InitKind::Orthogonal}};
  for (const auto& [name, value] : kKinds)
    if (name == kind) return value;
  return std::nullopt;
}

Init makeInit(std::string_view kind,
              std::initializer_list<std::pair<std::string_view, double>> args) {
  std::optional<InitKind> parsed = parseInitKind(kind);
  if (!parsed) throw std::invalid_argument("unknown initializer '" + std::string(kind) + "'");
  Init init;
  init.kind = *parsed;
  for (const auto& [name, value] : args) {
    if (name == "mean")
      init.mean = value;
    else if (name == "stddev")
      init.stddev = value;
    else if (name == "min")
      init.min = value;
    else if (name == "max")
      init.max = value;
    else if (name == "value")
      init.value = value;
    else if (name == "scale")
      init.scale = value;
    else
      throw std::invalid_argument("unknown initializer argument '" + std::string(name) + "'");
  }
  return init;
}

void fillParam(float* out, const Shard& shard, uint64_t seed, std::string_view path,
               const Init& init, ValueType type) {
  uint64_t key = keyOf(seed, "param/", path);
  switch (init.kind) {
  case InitKind::Zeros:
    fillConstant(out, shard, type, 0.0);
    return;
  case InitKind::Ones:
    fillConstant(out, shard, type, 1.0);
    return;
  case InitKind::Constant:
    fillConstant(out, shard, type, init.value);
    return;
  case InitKind::Normal:
    fillNormal(out, shard, type, key, init.mean, init.stddev);
    return;
  case InitKind::TruncatedNormal:
    fillRuns(out, shard, type, [&](uint64_t first, uint64_t count, auto write) {
      forEachTruncatedNormal(key, first, count,
                             [&](uint64_t k, double z) { write(k, init.mean + init.stddev * z); });
    });
    return;
  case InitKind::Uniform:
    fillUniform(out, shard, type, key, init.min, init.max);
    return;
  case InitKind::Orthogonal:
    fillConstant(out, shard, type, 0.0);
    fillOrthogonal(out, shard, key, init.scale, type);
    return;
  }
}

void fillRandomNormal(float* out, const Shard& shard, uint64_t seed, std::string_view stream,
                      double mean, double stddev, ValueType type) {
  fillNormal(out, shard, type, streamKey(seed, stream), mean, stddev);
}

void fillRandomUniform(float* out, const Shard& shard, uint64_t seed, std::string_view stream,
                       double min, double max, ValueType type) {
  fillUniform(out, shard, type, streamKey(seed, stream), min, max);
}

void fillRandomInt(float* out, const Shard& shard, uint64_t seed, std::string_view stream,
                   double max) {
  uint64_t key = streamKey(seed, stream), bound = uint64_t(max);
  forEachGlobalRun(shard, [&](int64_t local, int64_t global, int64_t count) {
    float* run = out + local;
    forEachUniformIndex(key, uint64_t(global), uint64_t(count), bound,
                        [&](uint64_t k, uint32_t value) { run[k] = float(value); });
  });
}

uint64_t dropoutKey(uint64_t seed, std::string_view stream, uint64_t step) {
  std::string name(stream);
  name.push_back('#');
  name.append(std::to_string(step));
  return streamKey(seed, name);
}

void dropout(const float* in, float* out, const Shard& shard, uint64_t key, double rate,
             ValueType type) {
  double scale = rate < 1 ? 1 / (1 - rate) : 0.0;
  forEachGlobalRun(shard, [&](int64_t local, int64_t global, int64_t count) {
    const float* inRun = in + local;
    float* outRun = out + local;
    forEachDropoutKeep(key, uint64_t(global), uint64_t(count), rate, [&](uint64_t k, bool keep) {
      outRun[k] = keep ? roundTo(type, double(inRun[k]) * scale) : 0.0f;
    });
  });
}

} // namespace meshrt::kernels
