// RNG fills of local shards, keyed by the GLOBAL row-major element index (meshrt/Random.h), so
// every shard of every layout holds exactly the values of the unsharded tensor. They reproduce
// interp::synthesizeInput ("input/<name>"), interp::initializeParam ("param/<path>"), the
// random_normal/random_uniform ops (stream attribute) and dropout ("<stream>#<step>") bit for
// bit: values are computed in double and rounded once to the dtype, as the interpreter does.
#pragma once

#include "meshrt/kernels/Index.h"
#include "meshrt/kernels/Scalar.h"

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string_view>
#include <utility>

namespace meshrt::kernels {

/// A local shard of a global row-major tensor: the global shape, the global index of the
/// shard's first element along each dim, and the shard's (local) shape.
struct Shard {
  Dims globalShape;
  Dims offset;
  Dims localShape;
};

/// The whole tensor as one shard.
inline Shard wholeTensor(const Dims& shape) {
  return Shard{shape, Dims::filled(shape.rank, 0), shape};
}

/// Global row-major index of every local element, in local row-major order: fn(local, global).
template <typename Fn> void forEachGlobalIndex(const Shard& shard, Fn&& fn) {
  Dims global = rowMajorStrides(shard.globalShape);
  int64_t base = 0;
  for (int d = 0; d < shard.globalShape.rank; ++d)
    base += shard.offset[d] * global[d];
  forEachIndex<2>(shard.localShape, {rowMajorStrides(shard.localShape), global},
                  [&](int64_t local, int64_t index) { fn(local, base + index); });
}

/// A program input: float dtypes normal(0, 1) rounded to `type`.
void fillInput(float* out, const Shard& shard, uint64_t seed, std::string_view name,
               ValueType type = ValueType::F32);
/// An i32 input: uniform in [0, indexBound) (indexBound <= 0: {0, 1}; capped at 2^31).
void fillInput(int32_t* out, const Shard& shard, uint64_t seed, std::string_view name,
               int64_t indexBound);

enum class InitKind { Zeros, Ones, Constant, Normal, TruncatedNormal, Uniform, Orthogonal };
/// "zeros", "ones", ... (ir::Initializer::kind); nullopt when unknown.
std::optional<InitKind> parseInitKind(std::string_view kind);

/// An initializer with the interpreter's defaults for absent arguments.
struct Init {
  InitKind kind = InitKind::Zeros;
  double mean = 0, stddev = 1; // normal, truncated_normal
  double min = 0, max = 1;     // uniform
  double value = 0;            // constant
  double scale = 1;            // orthogonal
};

/// The Init of an IR initializer by name and keyword arguments, e.g.
/// makeInit("normal", {{"stddev", 0.02}}); throws std::invalid_argument on an unknown kind or
/// argument name.
Init makeInit(std::string_view kind,
              std::initializer_list<std::pair<std::string_view, double>> args = {});

/// A parameter's shard. Orthogonal: rows = the first global dim, columns = the rest
/// flattened; only the row blocks the shard touches are computed (each block is a
/// Gram-Schmidt over `columns` rows, so a row shard costs its blocks, not the whole matrix).
void fillParam(float* out, const Shard& shard, uint64_t seed, std::string_view path,
               const Init& init, ValueType type = ValueType::F32);

/// The random_normal / random_uniform ops (stream: the op's `stream` attribute).
void fillRandomNormal(float* out, const Shard& shard, uint64_t seed, std::string_view stream,
                      double mean, double stddev, ValueType type = ValueType::F32);
void fillRandomUniform(float* out, const Shard& shard, uint64_t seed, std::string_view stream,
                       double min, double max, ValueType type = ValueType::F32);
/// The random_int op: i32 values uniform in [0, max) (max <= 2^24, exact in f32 storage).
void fillRandomInt(float* out, const Shard& shard, uint64_t seed, std::string_view stream,
                   double max);

/// The key of a dropout op's mask at `step`: streamKey(seed, "<stream>#<step>").
uint64_t dropoutKey(uint64_t seed, std::string_view stream, uint64_t step);
/// The `dropout` op when training: in and out dense over shard.localShape (out is the op's
/// result shard; may alias in). Not training: the op is the identity.
void dropout(const float* in, float* out, const Shard& shard, uint64_t key, double rate,
             ValueType type = ValueType::F32);

} // namespace meshrt::kernels
