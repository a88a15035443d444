// Support for generated code, part 2 of 5 (meshc/GeneratedSupport.h includes them in order):
// shards and the layout-invariant RNG fills; params with their layouts (getParam/setParam,
// checkpoints) and the bucketed gradient reductions.
#pragma once

#include "meshc/SupportCore.h"

namespace meshc::gen {

//===------------------------------------------------------------------------------------------===//
// Shards and the layout-invariant RNG
//===------------------------------------------------------------------------------------------===//

/// This rank's block index along a dim split over `axes` (row-major over the axes, in order).
inline int64_t blockIndex(meshrt::Communicator& world, const std::vector<std::string>& axes) {
  int64_t index = 0;
  for (const std::string& axis : axes)
    index = index * world.mesh().axisSize(axis) + world.coord(axis);
  return index;
}

/// The global start of this rank's shard of a dim split over `axes`, `localSize` per shard.
inline int64_t shardStart(meshrt::Communicator& world, const std::vector<std::string>& axes,
                          int64_t localSize) {
  return blockIndex(world, axes) * localSize;
}

/// The same for any world rank of `mesh`.
inline int64_t shardStartOf(const meshrt::Mesh& mesh, int rank,
                            const std::vector<std::string>& axes, int64_t localSize) {
  std::vector<int> coords = mesh.coords(rank);
  int64_t index = 0;
  for (const std::string& axis : axes)
    index = index * mesh.axisSize(axis) + coords[size_t(mesh.axisIndex(axis))];
  return index * localSize;
}

/// Returns `world` after checking that its mesh is the plan's (else std::invalid_argument);
/// generated constructors call it first, before creating subgroups of the planned axes.
inline meshrt::Communicator& checkedWorld(meshrt::Communicator& world, const meshrt::Mesh& planned,
                                          const char* program) {
  if (!(world.mesh() == planned))
    throw std::invalid_argument(std::string(program) + ": compiled for mesh " + planned.str() +
                                " but the communicator's mesh is " + world.mesh().str());
  return world;
}

enum class DType { F32, BF16, F16, I32 };

/// Rounds a value computed in double to its dtype once, as the interpreter does.
MESHRT_HD inline float roundValue(DType dtype, double x) {
  switch (dtype) {
  case DType::F32:
    return float(x);
  case DType::BF16:
    return float(roundToFormat(x, 7, -126, 0x1.FEp127));
  case DType::F16:
    return float(roundToFormat(x, 10, -14, 65504.0));
  case DType::I32:
    return wrapI32(x);
  }
  return float(x);
}

/// The global row-major index of the local shard's first element, given each dim's shard
/// start and the global strides.
inline int64_t globalBase(const Shape& starts, const Shape& globalStrides) {
  int64_t base = 0;
  for (size_t i = 0; i < starts.size(); ++i)
    base += starts[i] * globalStrides[i];
  return base;
}

/// The local shard of a global row-major tensor: starts[d] + local index along every dim.
inline Buffer sliceShard(const Buffer& global, const Shape& localSizes, const Shape& globalStrides,
                         const Shape& starts) {
  Buffer out(size_t(product(localSizes)));
  copyStrided(out.data(), localSizes, rowMajorStrides(localSizes), global.data(), globalStrides,
              globalBase(starts, globalStrides));
  return out;
}

/// Gathers every rank's shard into the global tensor on every rank (one all-gather over the
/// world). `startsOf(rank)` gives a world rank's shard starts; only the ranks for which
/// `holds(rank)` is true have one (the others pass zeros of the shard's size).
template <typename StartsOf, typename Holds = bool (*)(int)>
inline Buffer gatherShards(
    meshrt::Communicator& world, const Buffer& local, const Shape& localSizes,
    const Shape& globalSizes, StartsOf&& startsOf, Holds&& holds = [](int) { return true; }) {
  size_t count = local.size();
  Buffer all(count * size_t(world.size()));
  world.allGather(local.data(), all.data(), count);
  Buffer global(size_t(product(globalSizes)), 0.0f);
  Shape globalStrides = rowMajorStrides(globalSizes), localStrides = rowMajorStrides(localSizes);
  for (int rank = 0; rank < world.size(); ++rank) {
    if (!holds(rank)) continue;
    Shape starts = startsOf(rank);
    copyStrided(global.data() + globalBase(starts, globalStrides), localSizes, globalStrides,
                all.data() + size_t(rank) * count, localStrides);
  }
  return global;
}

//===------------------------------------------------------------------------------------------===//
// Params: shards with their layouts (getParam/setParam, checkpoints) and bucketed reductions
//===------------------------------------------------------------------------------------------===//

/// One param's shard on this rank, as the generated paramShards() lists them: enough to gather
/// the global value, scatter one in, or write and reshard a checkpoint.
struct ParamShard {
  std::string path;            // `ffn/w_in`, or `ffn/w_in@m` for optimizer state
  bool optimizerState = false; // a slot of optimizer state (ParamRole::OptimizerState)
  std::string dtype;           // "f32", "bf16", ... (values are held in float buffers)
  Shape globalShape, localShape;
  std::vector<std::string> dims;              // the dim names, in storage order
  std::vector<std::vector<std::string>> axes; // per dim: the mesh axes splitting it, major first
  Buffer* data = nullptr;                     // this rank's shard, row-major over localShape
  /// Pipeline stages: held only by the ranks of the stages in `stages` (one bit per coordinate
  /// along `stageAxis`; 0: every rank). Elsewhere `data` is empty.
  std::string stageAxis;
  uint64_t stages = 0;

  /// Whether world rank `rank` of `mesh` holds its shard.
  bool heldBy(const meshrt::Mesh& mesh, int rank) const {
    return stages == 0 || ((stages >> mesh.coords(rank)[size_t(mesh.axisIndex(stageAxis))]) & 1);
  }
};

/// One param as the generated paramShards() lists it: a table of constants, which compilers
/// build in no time (the same list as ParamShard initializers took seconds per hundred params).
struct ParamSpec {
  const char* path;
  bool optimizerState;
  const char* dtype;
  /// Per dim, `name:global:local:axis+axis` (no axes: nothing after the last colon), dims
  /// separated by spaces: "vocab:96:48:model d_model:64:64:".
  const char* dims;
  /// Pipeline stages: the stages holding it along `stageAxis` (ParamShard::stages; 0: every).
  uint64_t stages = 0;
  const char* stageAxis = "";
};

/// The pieces of `text` between `separator`s (none for an empty text).
inline std::vector<std::string> splitText(std::string_view text, char separator) {
  std::vector<std::string> parts;
  while (!text.empty()) {
    size_t end = std::min(text.find(separator), text.size());
    parts.emplace_back(text.substr(0, end));
    text.remove_prefix(std::min(end + 1, text.size()));
  }
  return parts;
}

/// One dim of a ParamSpec's `dims`.
struct ParamDim {
  std::string name;
  int64_t global = 0, local = 0;
  std::vector<std::string> axes;
};
inline std::vector<ParamDim> paramDims(const ParamSpec& spec) {
  std::vector<ParamDim> dims;
  for (const std::string& dim : splitText(spec.dims, ' ')) {
    size_t a = dim.find(':'), b = dim.find(':', a + 1), c = dim.find(':', b + 1);
    dims.push_back({dim.substr(0, a), std::stoll(dim.substr(a + 1, b - a - 1)),
                    std::stoll(dim.substr(b + 1, c - b - 1)),
                    splitText(std::string_view(dim).substr(c + 1), '+')});
  }
  return dims;
}

/// The shards `specs` describe over the buffers `data` (one per spec), as ParamShard or the
/// CUDA support's device ParamShard.
template <class Shard, class Storage, size_t N>
std::vector<Shard> paramShardsOf(const ParamSpec (&specs)[N], Storage* const (&data)[N]) {
  std::vector<Shard> shards(N);
  for (size_t k = 0; k < N; ++k) {
    Shard& shard = shards[k];
    shard.path = specs[k].path;
    shard.optimizerState = specs[k].optimizerState;
    shard.dtype = specs[k].dtype;
    shard.data = data[k];
    shard.stages = specs[k].stages;
    shard.stageAxis = specs[k].stageAxis;
    for (ParamDim& dim : paramDims(specs[k])) {
      shard.dims.push_back(std::move(dim.name));
      shard.globalShape.push_back(dim.global);
      shard.localShape.push_back(dim.local);
      shard.axes.push_back(std::move(dim.axes));
    }
  }
  return shards;
}

/// A param's initializer, as the generated constructor's table lists it (one row per row of the
/// class's ParamSpec table): the IR initializer's kind, the param's dtype and the initializer's
/// keyword arguments (sema gives every kind at most two; an unused slot has a null name).
struct ParamInit {
  const char* kind;
  DType dtype;
  std::pair<const char*, double> args[2];
};

/// How a generated constructor initializes one param on this rank (paramFill).
struct ParamFill {
  size_t count = 0;             // local elements
  bool constant = false;        // zeros, ones, constant: `value` everywhere
  double value = 0;             // rounded to the dtype as the interpreter does
  meshrt::kernels::Shard shard; // else: the RNG fill of this rank's shard
  meshrt::kernels::Init init;
  meshrt::kernels::ValueType type = meshrt::kernels::ValueType::F32;
};

/// The fill of param `spec` on this rank, or nullopt when this rank's pipeline stage (`stage`;
/// -1: no stages) does not hold it. Random initializers are keyed like the interpreter's, by the
/// global index at this rank's shard, so every mesh holds the same global values.
inline std::optional<ParamFill> paramFill(meshrt::Communicator& world, int stage,
                                          const ParamSpec& spec, const ParamInit& init) {
  if (stage >= 0 && spec.stages != 0 && !((spec.stages >> stage) & 1)) return std::nullopt;
  ParamFill fill;
  std::pair<std::string_view, double> a0{init.args[0].first ? init.args[0].first : "",
                                         init.args[0].second},
      a1{init.args[1].first ? init.args[1].first : "", init.args[1].second};
  fill.init = !init.args[0].first   ? meshrt::kernels::makeInit(init.kind)
              : !init.args[1].first ? meshrt::kernels::makeInit(init.kind, {a0})
                                    : meshrt::kernels::makeInit(init.kind, {a0, a1});
  fill.count = 1;
  for (const ParamDim& dim : paramDims(spec)) {
    fill.count *= size_t(dim.local);
    fill.shard.globalShape.push_back(dim.global);
    fill.shard.offset.push_back(dim.axes.empty() ? 0 : shardStart(world, dim.axes, dim.local));
    fill.shard.localShape.push_back(dim.local);
  }
  using meshrt::kernels::InitKind;
  fill.constant = fill.init.kind == InitKind::Zeros || fill.init.kind == InitKind::Ones ||
                  fill.init.kind == InitKind::Constant;
  fill.value = fill.init.kind == InitKind::Ones ? 1.0 : fill.init.value; // zeros: value 0
  fill.type = init.dtype == DType::BF16  ? meshrt::kernels::ValueType::BF16
              : init.dtype == DType::F16 ? meshrt::kernels::ValueType::F16
              : init.dtype == DType::I32 ? meshrt::kernels::ValueType::I32
                                         : meshrt::kernels::ValueType::F32;
  return fill;
}

/// The generated constructor's param initialization: every param of the class's table this
/// rank holds sized to its local shard and filled by its initializer (one loop over constant
/// tables, which compilers build in no time, instead of a block of code per param), random ones
/// through `fill` (meshrt::kernels::fillParam's signature; the CUDA support's uploads).
template <class Storage, size_t N, class Fill>
void initParamsWith(const Fill& fill, meshrt::Communicator& world, uint64_t seed, int stage,
                    const ParamSpec (&specs)[N], const ParamInit (&inits)[N],
                    Storage* const (&data)[N]) {
  for (size_t k = 0; k < N; ++k) {
    std::optional<ParamFill> param = paramFill(world, stage, specs[k], inits[k]);
    if (!param) continue;
    if (param->constant) {
      data[k]->assign(param->count, roundValue(inits[k].dtype, param->value));
    } else {
      data[k]->resize(param->count);
      fill(data[k]->data(), param->shard, seed, specs[k].path, param->init, param->type);
    }
  }
}

template <size_t N>
void initParams(meshrt::Communicator& world, uint64_t seed, int stage, const ParamSpec (&specs)[N],
                const ParamInit (&inits)[N], Buffer* const (&data)[N]) {
  initParamsWith([](auto&&... args) { meshrt::kernels::fillParam(args...); }, world, seed, stage,
                 specs, inits, data);
}

/// The global starts of `rank`'s shard of `shard`.
inline Shape shardStartsOf(const meshrt::Mesh& mesh, int rank, const ParamShard& shard) {
  Shape starts;
  for (size_t d = 0; d < shard.localShape.size(); ++d)
    starts.push_back(
        shard.axes[d].empty() ? 0 : shardStartOf(mesh, rank, shard.axes[d], shard.localShape[d]));
  return starts;
}

/// The params as meshrt checkpoint tensors (generated save() and load()), pointing into the
/// shards' buffers.
inline std::vector<meshrt::CheckpointTensor> checkpointTensors(std::vector<ParamShard>& shards) {
  std::vector<meshrt::CheckpointTensor> tensors;
  for (ParamShard& shard : shards) {
    meshrt::CheckpointTensor tensor;
    tensor.name = shard.path;
    tensor.dtype = shard.dtype;
    tensor.storage = meshrt::DType::F32;
    tensor.data = shard.data->data();
    tensor.count = shard.data->size();
    for (size_t d = 0; d < shard.dims.size(); ++d)
      tensor.dims.push_back({shard.dims[d], shard.globalShape[d], shard.axes[d]});
    tensor.heldAxis = shard.stageAxis;
    tensor.heldMask = shard.stages;
    tensors.push_back(std::move(tensor));
  }
  return tensors;
}

/// The generated save(): every param shard as a new checkpoint under `dir` (collective).
inline void saveParams(meshrt::Communicator& world, const std::string& dir,
                       std::vector<ParamShard>& shards, const meshrt::CheckpointInfo& info) {
  meshrt::saveCheckpoint(world, dir, checkpointTensors(shards), info);
}

/// The generated load(): the latest checkpoint under `dir` into the param shards (collective).
inline meshrt::CheckpointInfo loadParams(meshrt::Communicator& world, const std::string& dir,
                                         std::vector<ParamShard>& shards) {
  return meshrt::loadCheckpoint(world, dir, checkpointTensors(shards));
}

inline ParamShard& findParamShard(std::vector<ParamShard>& shards, const std::string& path,
                                  const char* program) {
  for (ParamShard& shard : shards)
    if (shard.path == path) return shard;
  throw std::invalid_argument(std::string(program) + ": no param named '" + path + "'");
}

/// The global value of a param from every rank's shard (collective over `world`). A param of
/// some stages only: the other ranks contribute zeros, which no holder's shard overlaps.
inline Tensor gatherParam(meshrt::Communicator& world, const ParamShard& shard) {
  const meshrt::Mesh& mesh = world.mesh();
  bool held = shard.heldBy(mesh, world.rank());
  Buffer zeros = held ? Buffer() : Buffer(size_t(product(shard.localShape)), 0.0f);
  return Tensor{shard.globalShape,
                gatherShards(
                    world, held ? *shard.data : zeros, shard.localShape, shard.globalShape,
                    [&](int rank) { return shardStartsOf(mesh, rank, shard); },
                    [&](int rank) { return shard.heldBy(mesh, rank); })};
}

/// Sets this rank's shard of a param from its global value (no communication; nothing on a rank
/// of a stage that does not hold it).
inline void scatterParam(meshrt::Communicator& world, ParamShard& shard, const Tensor& global) {
  checkShape("global param", shard.path, global, shard.globalShape);
  if (!shard.heldBy(world.mesh(), world.rank())) return;
  *shard.data = sliceShard(global.data, shard.localShape, rowMajorStrides(shard.globalShape),
                           shardStartsOf(world.mesh(), world.rank(), shard));
}

/// A train step's update: the param's storage takes the step's new value.
inline void copyValues(View to, ConstView from) {
  std::copy(from.begin(), from.end(), to.begin());
}

/// Zeroes a subroutine's argument before a kernel that writes only part of it.
inline void zero(View to) {
  std::fill(to.begin(), to.end(), 0.0f);
}

/// Resolves the partial sums of several values over one group with one all-reduce: packed into
/// one buffer, reduced, unpacked (the planner's bucketed_all_reduce_sum).
inline void allReduceBucket(meshrt::Communicator& group, std::span<const View> values) {
  size_t total = 0;
  for (View value : values)
    total += value.size();
  Buffer packed(total);
  size_t at = 0;
  for (View value : values) {
    std::copy(value.begin(), value.end(), packed.begin() + std::ptrdiff_t(at));
    at += value.size();
  }
  group.allReduce(packed.data(), packed.size(), meshrt::ReduceOp::Sum);
  at = 0;
  for (View value : values) {
    std::copy(packed.begin() + std::ptrdiff_t(at),
              packed.begin() + std::ptrdiff_t(at + value.size()), value.begin());
    at += value.size();
  }
}
inline void allReduceBucket(meshrt::Communicator& group, std::initializer_list<View> values) {
  allReduceBucket(group, std::span<const View>(values.begin(), values.size()));
}

/// An all-reduce that schedule-collectives split into this start and a wait placed just before
/// the first statement that touches its values: meshrt's non-blocking collective (a bucket is
/// one collective), which progresses while the statements between run. `ViewT`: the target's
/// span (host here, device in meshc/CudaSupport.h).
template <typename ViewT>
inline meshrt::Request startAllReduceOf(meshrt::Communicator& group,
                                        std::initializer_list<ViewT> values, meshrt::ReduceOp op) {
  std::array<meshrt::Segment<float>, 16> small;
  std::vector<meshrt::Segment<float>> large;
  meshrt::Segment<float>* segments = small.data();
  if (values.size() > small.size()) {
    large.resize(values.size());
    segments = large.data();
  }
  size_t k = 0;
  for (ViewT value : values)
    segments[k++] = meshrt::Segment<float>{value.data(), value.size()};
  return group.startAllReduce<float>(segments, values.size(), op);
}

inline meshrt::Request startAllReduce(meshrt::Communicator& group,
                                      std::initializer_list<View> values, meshrt::ReduceOp op) {
  return startAllReduceOf<View>(group, values, op);
}

} // namespace meshc::gen
