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

/// Fills out[local] = roundTo(type, value(global)).
template <typename Fn> void fillWith(float* out, const Shard& shard, ValueType type, Fn&& value) {
  forEachGlobalIndex(shard, [&](int64_t local, int64_t global) {
    out[local] = roundTo(type, double(value(uint64_t(global))));
  });
}

/// Standard normal conditioned on |z| <= 2 (redraws with draw numbers 1, 2, ...).
double truncatedNormal(uint64_t key, uint64_t index) {
  for (uint32_t draw = 0; draw < 1000; ++draw) {
    double z = normal(key, index, draw);
    if (std::fabs(z) <= 2.0) return z;
  }
  return 0;
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
    for (int64_t c = 0; c < cols; ++c)
      row[size_t(c)] = normal(key, uint64_t(base + c));
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
    for (int64_t c = 0; c < cols; ++c) {
      double z = normal(key, uint64_t(base + c), 1);
      chi += z * z;
    }
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
  fillWith(out, shard, type, [&](uint64_t index) { return normal(key, index); });
}

void fillInput(int32_t* out, const Shard& shard, uint64_t seed, std::string_view name,
               int64_t indexBound) {
  uint64_t key = keyOf(seed, "input/", name);
  uint64_t bound = indexBound > 0 ? uint64_t(indexBound) : 2;
  bound = std::min<uint64_t>(bound, uint64_t(1) << 31);
  forEachGlobalIndex(shard, [&](int64_t local, int64_t global) {
    out[local] = int32_t(uniformIndex(key, uint64_t(global), bound));
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
    fillWith(out, shard, type, [](uint64_t) { return 0.0; });
    return;
  case InitKind::Ones:
    fillWith(out, shard, type, [](uint64_t) { return 1.0; });
    return;
  case InitKind::Constant:
    fillWith(out, shard, type, [&](uint64_t) { return init.value; });
    return;
  case InitKind::Normal:
    fillWith(out, shard, type,
             [&](uint64_t index) { return init.mean + init.stddev * normal(key, index); });
    return;
  case InitKind::TruncatedNormal:
    fillWith(out, shard, type,
             [&](uint64_t index) { return init.mean + init.stddev * truncatedNormal(key, index); });
    return;
  case InitKind::Uniform:
    fillWith(out, shard, type, [&](uint64_t index) {
      return init.min + (init.max - init.min) * uniform01(key, index);
    });
    return;
  case InitKind::Orthogonal:
    fillWith(out, shard, type, [](uint64_t) { return 0.0; });
    fillOrthogonal(out, shard, key, init.scale, type);
    return;
  }
}

void fillRandomNormal(float* out, const Shard& shard, uint64_t seed, std::string_view stream,
                      double mean, double stddev, ValueType type) {
  uint64_t key = streamKey(seed, stream);
  fillWith(out, shard, type, [&](uint64_t index) { return mean + stddev * normal(key, index); });
}

void fillRandomUniform(float* out, const Shard& shard, uint64_t seed, std::string_view stream,
                       double min, double max, ValueType type) {
  uint64_t key = streamKey(seed, stream);
  fillWith(out, shard, type,
           [&](uint64_t index) { return min + (max - min) * uniform01(key, index); });
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
  forEachGlobalIndex(shard, [&](int64_t local, int64_t global) {
    bool keep = dropoutKeep(key, uint64_t(global), rate);
    out[local] = keep ? roundTo(type, double(in[local]) * scale) : 0.0f;
  });
}

} // namespace meshrt::kernels
