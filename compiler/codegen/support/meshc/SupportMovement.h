// Support for generated code, part 5 of 5 (meshc/GeneratedSupport.h includes them in order):
// data movement (reshape, windows, one_hot, gather and scatter-add, top_k, iota, dropout),
// collectives over a dim (the packing around meshrt's chunked collectives), the OpenMP and BLAS
// thread settings, the output files, and pipeline stages' sends.
#pragma once

#include "meshc/SupportRows.h"

#include <chrono>

namespace meshc::gen {

//===------------------------------------------------------------------------------------------===//
// Data movement
//===------------------------------------------------------------------------------------------===//

/// Regroups `from` dims (sizes `fromSizes`, strides `fromStrides` in `in`) into the result's
/// dims: out point -> in[other + fromOffsets[linear]], where linear (from `linearBase`) is the
/// position in the regrouped block.
inline void reshape(float* out, const Shape& outSizes, const float* in, const Shape& otherStrides,
                    const Shape& linearStrides, const Shape& fromSizes, const Shape& fromStrides,
                    int64_t linearBase = 0) {
  std::vector<int64_t> fromOffsets = offsetsOf(fromSizes, fromStrides);
  forEach<3>(outSizes, {rowMajorStrides(outSizes), otherStrides, linearStrides}, {0, 0, linearBase},
             [&](const std::array<int64_t, 3>& at) {
               out[at[0]] = in[at[1] + fromOffsets[size_t(at[2])]];
             });
}

/// out[.., j, ..] = in[.., j - offset, ..] along the window dim (out dim `outDim` / in stride
/// `inStride`, sizes inSize / outSize), other dims through `outer` strides. Positions outside
/// `in` are left as they are (zero-initialized by the caller).
inline void copyWindow(float* out, const float* in, const Shape& outer, const Shape& outOuter,
                       const Shape& inOuter, int64_t outStride, int64_t inStride, int64_t outSize,
                       int64_t inSize, int64_t offset) {
  int64_t begin = std::max<int64_t>(0, offset), end = std::min(outSize, inSize + offset);
  forEach<2>(outer, {outOuter, inOuter}, {0, 0}, [&](const std::array<int64_t, 2>& at) {
    for (int64_t j = begin; j < end; ++j)
      out[at[0] + j * outStride] = in[at[1] + (j - offset) * inStride];
  });
}

/// one_hot: out = (ids == global position along the dim), position = start + local index.
inline void oneHot(float* out, const Shape& outSizes, const float* ids, const Shape& idStrides,
                   const Shape& positionStrides, int64_t start) {
  // The usual call: one dim (the one-hot dim) walks the positions, the ids do not move along
  // it, and every position is a float exactly. Then the output is zeros but for at most one
  // element per id: filled, then each id's element set (a compare per element cost 2 ns here,
  // moe's dispatch masks 40 us a call).
  size_t rank = outSizes.size(), dim = rank;
  for (size_t d = 0; d < rank; ++d)
    if (positionStrides[d] != 0) dim = dim == rank ? d : rank + 1;
  int64_t total = product(outSizes);
  if (dim < rank && idStrides[dim] == 0 && total > 0) {
    int64_t stride = positionStrides[dim], size = outSizes[dim];
    int64_t first = start, last = start + stride * (size - 1);
    if (std::max(std::abs(first), std::abs(last)) <= (int64_t(1) << 24)) {
      std::fill_n(out, total, 0.0f);
      Shape outStrides = rowMajorStrides(outSizes), points = outSizes;
      points[dim] = 1;
      int64_t outStride = outStrides[dim];
      forEach<2>(points, {outStrides, idStrides}, {0, 0}, [&](const std::array<int64_t, 2>& at) {
        double offset = (double(ids[at[1]]) - double(start)) / double(stride);
        if (offset >= 0 && offset < double(size) && offset == std::floor(offset))
          out[at[0] + int64_t(offset) * outStride] = 1.0f;
      });
      return;
    }
  }
  forEach<3>(outSizes, {rowMajorStrides(outSizes), idStrides, positionStrides}, {0, 0, start},
             [&](const std::array<int64_t, 3>& at) {
               out[at[0]] = ids[at[1]] == float(at[2]) ? 1.0f : 0.0f;
             });
}

/// gather: rows of the table's local block [start, start + rows) selected by ids; 0 elsewhere
/// (a partial sum over the table dim's axes when that dim is split).
inline void gather(float* out, const Shape& outSizes, const float* table, const Shape& tableStrides,
                   const float* ids, const Shape& idStrides, int64_t rows, int64_t rowStride,
                   int64_t start) {
  // The usual layout (an embedding lookup): the last dim walks one table row (stride 1, one id),
  // the others only the ids. One id per row, then a row copy (or zeros outside the block).
  size_t last = outSizes.size() - 1;
  if (!outSizes.empty() && tableStrides[last] == 1 && idStrides[last] == 0 &&
      std::all_of(tableStrides.begin(), tableStrides.end() - 1,
                  [](int64_t stride) { return stride == 0; })) {
    int64_t run = outSizes[last];
    Shape points(outSizes.begin(), outSizes.end() - 1),
        idPoint(idStrides.begin(), idStrides.end() - 1);
    Shape outPoint = rowMajorStrides(points);
    for (int64_t& stride : outPoint)
      stride *= run;
    forEach<2>(points, {outPoint, idPoint}, {0, 0}, [&](const std::array<int64_t, 2>& at) {
      double id = double(ids[at[1]]) - double(start);
      float* row = out + at[0];
      if (id >= 0 && id < double(rows))
        std::copy_n(table + int64_t(id) * rowStride, run, row);
      else
        std::fill_n(row, run, 0.0f);
    });
    return;
  }
  forEach<3>(outSizes, {rowMajorStrides(outSizes), tableStrides, idStrides}, {0, 0, 0},
             [&](const std::array<int64_t, 3>& at) {
               double id = double(ids[at[2]]) - double(start);
               out[at[0]] =
                   id >= 0 && id < double(rows) ? table[at[1] + int64_t(id) * rowStride] : 0.0f;
             });
}

/// scatterAdd: out (row-major over outSizes, written whole) = for every point p of `points`, in
/// order, the operand at p (`inStrides` over out's dims, `inPointStrides` over the points) added
/// into out's row along dim `at` that the id selects (id - start; ids outside the local block
/// add nothing): the einsum of a one-hot tensor that keeps its one-hot dim (an embedding's
/// gradient).
inline void scatterAdd(float* out, const Shape& outSizes, const float* in, const Shape& inStrides,
                       const float* ids, const Shape& idStrides, const Shape& points,
                       const Shape& inPointStrides, const Shape& idPointStrides, int64_t at,
                       int64_t start) {
  std::fill(out, out + product(outSizes), 0.0f);
  Shape outStrides = rowMajorStrides(outSizes), rowSizes = outSizes, rowStrides = outStrides;
  int64_t rows = outSizes[size_t(at)], rowStride = outStrides[size_t(at)];
  rowSizes[size_t(at)] = 1;
  rowStrides[size_t(at)] = 0;
  auto select = [&](int64_t idOffset) {
    double id = double(ids[idOffset]) - double(start);
    return id >= 0 && id < double(rows) ? int64_t(id) : int64_t(-1);
  };
  // The usual layout (ids per point, rows dense in both): one id and one vector add per point.
  bool dense = std::all_of(idStrides.begin(), idStrides.end(), [](int64_t v) { return v == 0; }) &&
               detail::denseRun(rowSizes, rowStrides, 1) &&
               detail::denseRun(rowSizes, inStrides, 1);
  int64_t run = product(rowSizes);
  forEach<2>(points, {inPointStrides, idPointStrides}, {0, 0},
             [&](const std::array<int64_t, 2>& point) {
               if (dense) {
                 int64_t id = select(point[1]);
                 if (id < 0) return;
                 float* __restrict row = out + id * rowStride;
                 const float* __restrict x = in + point[0];
                 for (int64_t i = 0; i < run; ++i)
                   row[i] += x[i];
                 return;
               }
               forEach<3>(rowSizes, {rowStrides, inStrides, idStrides}, {0, point[0], point[1]},
                          [&](const std::array<int64_t, 3>& o) {
                            int64_t id = select(o[2]);
                            if (id >= 0) out[o[0] + id * rowStride] += in[o[1]];
                          });
             });
}

/// top_k: along out's dim kAt, the positions of each row's first size(kAt) elements in
/// topKBefore's order (the row of n elements whole on this rank; inStrides 0 along kAt). A
/// partial sort per row.
inline void topK(float* out, const Shape& outSizes, const float* in, const Shape& inStrides,
                 int64_t kAt, int64_t n, int64_t stride) {
  Shape rows = outSizes;
  int64_t k = rows[size_t(kAt)];
  rows[size_t(kAt)] = 1;
  Shape outStrides = rowMajorStrides(outSizes);
  int64_t outStride = outStrides[size_t(kAt)];
  std::vector<int64_t> order(size_t(n), 0);
  forEach<2>(rows, {outStrides, inStrides}, {0, 0}, [&](const std::array<int64_t, 2>& at) {
    const float* row = in + at[1];
    for (int64_t i = 0; i < n; ++i)
      order[size_t(i)] = i;
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](int64_t a, int64_t b) { return topKBefore(row, stride, a, b); });
    for (int64_t j = 0; j < k; ++j)
      out[at[0] + j * outStride] = float(order[size_t(j)]);
  });
}

/// iota: the global position along the dim (position strides: 1 at the dim, else 0).
inline void iota(float* out, const Shape& outSizes, const Shape& positionStrides, int64_t start) {
  forEach<2>(outSizes, {rowMajorStrides(outSizes), positionStrides}, {0, start},
             [&](const std::array<int64_t, 2>& at) { out[at[0]] = float(at[1]); });
}

/// dropout when training: keep iff meshrt::dropoutKeep(key, global index, rate), scaled by
/// 1/(1-rate).
inline void dropout(float* out, const Shape& outSizes, const float* in, const Shape& inStrides,
                    const Shape& globalStrides, int64_t base, uint64_t key, double rate) {
  double scale = rate < 1 ? 1 / (1 - rate) : 0.0;
  size_t rank = outSizes.size();
  if (rank == 0 || globalStrides[rank - 1] != 1) {
    forEach<3>(outSizes, {rowMajorStrides(outSizes), inStrides, globalStrides}, {0, 0, base},
               [&](const std::array<int64_t, 3>& at) {
                 bool keep = meshrt::dropoutKeep(key, uint64_t(at[2]), rate);
                 out[at[0]] = keep ? float(double(in[at[1]]) * scale) : 0.0f;
               });
    return;
  }
  // The innermost dim is a run of consecutive global indices: one Philox call per 4 elements.
  Shape rows = outSizes;
  int64_t run = rows[rank - 1], inStep = inStrides[rank - 1];
  rows[rank - 1] = 1;
  forEach<3>(rows, {rowMajorStrides(outSizes), inStrides, globalStrides}, {0, 0, base},
             [&](const std::array<int64_t, 3>& at) {
               meshrt::forEachDropoutKeep(
                   key, uint64_t(at[2]), uint64_t(run), rate, [&](uint64_t k, bool keep) {
                     float x = in[at[1] + int64_t(k) * inStep];
                     out[at[0] + int64_t(k)] = keep ? float(double(x) * scale) : 0.0f;
                   });
             });
}

//===------------------------------------------------------------------------------------------===//
// Collectives over a dim: chunk packing around meshrt's chunked collectives. A local shape is
// seen as [outer, dim, inner] (row-major).
//===------------------------------------------------------------------------------------------===//

struct DimView {
  int64_t outer, size, inner;
};

inline DimView dimView(const Shape& sizes, size_t dimIndex) {
  DimView view{1, sizes[dimIndex], 1};
  for (size_t i = 0; i < dimIndex; ++i)
    view.outer *= sizes[i];
  for (size_t i = dimIndex + 1; i < sizes.size(); ++i)
    view.inner *= sizes[i];
  return view;
}

/// Copies block `block` (of `blockSize` rows) along the dim of `from` (rows `fromSize`) into
/// `to` (rows `toSize`) at row `toRow`... the two directions of packing.
inline void copyRowsBlock(float* to, int64_t toSize, int64_t toRow, const float* from,
                          int64_t fromSize, int64_t fromRow, int64_t rows, int64_t outer,
                          int64_t inner) {
  for (int64_t o = 0; o < outer; ++o)
    std::copy_n(from + (o * fromSize + fromRow) * inner, rows * inner,
                to + (o * toSize + toRow) * inner);
}

/// all-gather of a dim over `group`: out's dim = group size x in's dim, block i from rank i.
inline void allGatherDim(View out, ConstView in, const Shape& inSizes, size_t dimIndex,
                         meshrt::Communicator& group) {
  DimView view = dimView(inSizes, dimIndex);
  int64_t ranks = group.size();
  // A major-most dim (sequence parallelism's rows): the blocks are already in rank order.
  if (view.outer == 1) {
    group.allGather(in.data(), out.data(), in.size());
    return;
  }
  Buffer chunks(in.size() * size_t(ranks));
  group.allGather(in.data(), chunks.data(), in.size());
  for (int64_t i = 0; i < ranks; ++i)
    copyRowsBlock(out.data(), view.size * ranks, i * view.size, chunks.data() + i * in.size(),
                  view.size, 0, view.size, view.outer, view.inner);
}

/// reduce-scatter into a dim over `group`: sums the ranks' `in` and keeps block rank() of the
/// dim (out's dim = in's dim / group size).
inline void reduceScatterDim(View out, ConstView in, const Shape& inSizes, size_t dimIndex,
                             meshrt::Communicator& group) {
  DimView view = dimView(inSizes, dimIndex);
  int64_t ranks = group.size(), block = view.size / ranks;
  if (view.outer == 1) {
    group.reduceScatter(in.data(), out.data(), out.size());
    return;
  }
  Buffer chunks(in.size());
  for (int64_t i = 0; i < ranks; ++i)
    copyRowsBlock(chunks.data() + i * int64_t(out.size()), block, 0, in.data(), view.size,
                  i * block, block, view.outer, view.inner);
  group.reduceScatter(chunks.data(), out.data(), out.size());
}

/// all-to-all: `fromDim` (position `fromIndex`) grows by the group size, `toDim` (position
/// `toIndex`) shrinks by it; block i of both belongs to group rank i.
inline void allToAllDims(View out, ConstView in, const Shape& inSizes, size_t fromIndex,
                         size_t toIndex, meshrt::Communicator& group) {
  int64_t ranks = group.size();
  Shape chunkSizes = inSizes;
  chunkSizes[toIndex] /= ranks;
  int64_t chunk = product(chunkSizes);
  Buffer send(in.size()), received(in.size());
  DimView toView = dimView(inSizes, toIndex);
  for (int64_t i = 0; i < ranks; ++i)
    copyRowsBlock(send.data() + i * chunk, chunkSizes[toIndex], 0, in.data(), toView.size,
                  i * chunkSizes[toIndex], chunkSizes[toIndex], toView.outer, toView.inner);
  group.allToAll(send.data(), received.data(), size_t(chunk));
  Shape outSizes = chunkSizes;
  outSizes[fromIndex] *= ranks;
  DimView fromView = dimView(chunkSizes, fromIndex);
  for (int64_t i = 0; i < ranks; ++i)
    copyRowsBlock(out.data(), outSizes[fromIndex], i * fromView.size, received.data() + i * chunk,
                  fromView.size, 0, fromView.size, fromView.outer, fromView.inner);
}

/// Local slice: this rank's block `block` of a dim (out's dim = in's dim / blocks).
inline void sliceDim(View out, ConstView in, const Shape& inSizes, size_t dimIndex, int64_t block,
                     int64_t blocks) {
  DimView view = dimView(inSizes, dimIndex);
  int64_t rows = view.size / blocks;
  copyRowsBlock(out.data(), rows, 0, in.data(), view.size, block * rows, rows, view.outer,
                view.inner);
}

/// OpenMP waits by sleeping unless the user chose otherwise: with OMP_WAIT_POLICY unset, the
/// threads of a parallel region (the GEMMs', the large loops') spin after it, taking the core
/// from the rank threads, the other processes or the other team members they wait for (a step
/// ran 4-18x slower on a loaded 2-core machine, bench/README.md). libgomp reads the variable
/// once, when it is loaded, so the runner sets it and starts itself again (same pid, same
/// arguments); if that fails it carries on with OpenMP's default. Call it first in main().
inline void usePassiveOpenMPWaits(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY")) return;
  ::setenv("OMP_WAIT_POLICY", "passive", 1);
  ::execv("/proc/self/exe", argv);
}

/// How long the runner runs a program before it times it.
constexpr double kWarmUpMilliseconds = 50;

/// Runs `run` until the ranks have spent kWarmUpMilliseconds in it since the first of these
/// runs started (by the slowest rank's clock, so that every rank runs it as often). A process's
/// first tens of milliseconds of steps run slower than its later ones (the MoE train step on 2
/// ranks: its first ~40 steps, 14 ms, 1.15x the later steps, every op; oneDNN's GEMMs more than
/// OpenBLAS's): the runner reports the steady state that training's steps reach, which the planner
/// predicts.
template <typename Run> void warmUp(meshrt::Communicator& world, Run run) {
  using Ms = std::chrono::duration<double, std::milli>;
  auto start = std::chrono::steady_clock::now();
  for (double elapsed = 0; elapsed < kWarmUpMilliseconds;) {
    run();
    elapsed = Ms(std::chrono::steady_clock::now() - start).count();
    world.allReduce(&elapsed, 1, meshrt::ReduceOp::Max);
  }
}

/// How many runs one window of the runner's back-to-back timing holds: about 4 ms of them by
/// the median of `runs` (the slowest rank's times of the runs it timed one by one, the same on
/// every rank), at least 3 and at most 1000. A run of a few microseconds is then timed over
/// enough runs that the ranks' wake-up after the barrier (5-20 us with two or four ranks a core)
/// is a small part of it.
inline int backToBackRuns(std::vector<double> runs) {
  std::sort(runs.begin(), runs.end());
  double median = runs.empty() ? 0 : runs[runs.size() / 2];
  constexpr double kMilliseconds = 4;
  if (!(median > 0)) return 1000;
  return int(std::clamp(std::ceil(kMilliseconds / median), 3.0, 1000.0));
}

/// How many windows of back-to-back runs the runner times; it reports the median window.
constexpr int kBackToBackWindows = 5;

/// What timeBackToBack measured: a run's milliseconds in the median window, the runs a window
/// holds, and the windows.
struct BackToBack {
  double milliseconds = 0;
  int runs = 0;
  int windows = 0;
};

/// Times kBackToBackWindows windows of backToBackRuns(runs) runs of `run`, one after another
/// after one barrier per window, and returns a run's milliseconds in the median window: a
/// window's span over its count where the ranks share one clock (the threads backend: the first
/// rank's start to the last rank's end), else the slowest rank's time over the count. The median
/// leaves out a window that another process's burst on this core slowed (one window of ~10 ms
/// moved short programs by more than 25% between runs on a shared host). Every rank calls it (it
/// meets the others at barriers and all-reduces) and gets the same figures.
template <typename Run>
BackToBack timeBackToBack(meshrt::Communicator& world, const std::vector<double>& runs, Run run) {
  using Ms = std::chrono::duration<double, std::milli>;
  int count = backToBackRuns(runs);
  bool sharedClock = std::string(world.backend()) == "threads";
  std::vector<double> windows;
  for (int window = 0; window < kBackToBackWindows; ++window) {
    world.barrier();
    auto first = std::chrono::steady_clock::now();
    for (int i = 0; i < count; ++i)
      run();
    auto last = std::chrono::steady_clock::now();
    double edges[3] = {-Ms(first.time_since_epoch()).count(), Ms(last.time_since_epoch()).count(),
                       Ms(last - first).count()};
    world.allReduce(edges, 3, meshrt::ReduceOp::Max);
    windows.push_back((sharedClock ? edges[0] + edges[1] : edges[2]) / count);
  }
  std::sort(windows.begin(), windows.end());
  return {windows[windows.size() / 2], count, kBackToBackWindows};
}

/// Ranks that are threads of one process each call BLAS: one BLAS thread per rank avoids
/// oversubscribing the cores (meshrt's GEMMs otherwise split over the BLAS thread count).
inline void useSingleThreadedBlas() {
  meshrt::kernels::setBlasThreads(1);
}

//===------------------------------------------------------------------------------------------===//
// Output files (the runner's and `meshc --emit=run --dump-outputs`'s common format)
//===------------------------------------------------------------------------------------------===//

/// Format: per tensor a text line "tensor <name> <dtype> <rank> <sizes...>\n" followed by
/// product(sizes) little-endian float64 values.
inline void writeTensor(std::FILE* file, const std::string& name, const char* dtype,
                        const Shape& sizes, const Buffer& data) {
  std::string header = "tensor " + name + " " + dtype + " " + std::to_string(sizes.size());
  for (int64_t s : sizes)
    header += " " + std::to_string(s);
  header += "\n";
  std::fwrite(header.data(), 1, header.size(), file);
  std::vector<double> values(data.begin(), data.end());
  std::fwrite(values.data(), sizeof(double), values.size(), file);
}

/// The inputs file readTensors read last ("" if none), so that errors about its tensors name it.
inline std::string& inputsFilePath() {
  static std::string path;
  return path;
}

/// The global input of step `step` from a tensor read from a file: `data` holds k >= 1 batches
/// of `shape` stacked along the first dim, and step s reads batch s mod k. Any other shape
/// (a transposed one with the right count included) is an error naming the file, the tensor and
/// both shapes.
inline Tensor batchOfStep(const std::string& name, const Tensor& data, const Shape& shape,
                          int64_t step) {
  bool fits = data.shape.size() == shape.size();
  for (size_t d = 1; fits && d < shape.size(); ++d)
    fits = data.shape[d] == shape[d];
  if (fits && !shape.empty())
    fits = shape[0] > 0 && data.shape[0] > 0 && data.shape[0] % shape[0] == 0;
  if (!fits)
    throw std::invalid_argument("inputs file '" + inputsFilePath() + "': tensor '" + name +
                                "' has shape " + shapeString(data.shape) +
                                ", but the program's input is " + shapeString(shape) +
                                (shape.empty() ? "" : " (or k of it stacked along the first dim)"));
  size_t batch = 1;
  for (int64_t size : shape)
    batch *= size_t(size);
  size_t first = size_t(step) % (data.data.size() / batch) * batch;
  return Tensor{shape, Buffer(data.data.begin() + ptrdiff_t(first),
                              data.data.begin() + ptrdiff_t(first + batch))};
}

/// Reads every tensor of a file in that format (e.g. the inputs given to `meshc run --data`),
/// by name. Throws std::runtime_error when the file cannot be read or is malformed; a header
/// that declares more values than the rest of the file holds (a huge or corrupt header) is
/// caught before anything is allocated for it, naming the file and the tensor (TensorFile.h).
inline std::map<std::string, Tensor> readTensors(const std::string& path) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (!file) throw std::runtime_error("cannot open '" + path + "'");
  inputsFilePath() = path;
  std::string bytes;
  char chunk[1 << 16];
  for (size_t got; (got = std::fread(chunk, 1, sizeof chunk, file)) > 0;)
    bytes.append(chunk, got);
  bool failed = std::ferror(file) != 0;
  std::fclose(file);
  if (failed) throw std::runtime_error("cannot read '" + path + "'");
  std::map<std::string, Tensor> tensors;
  for (const TensorFileEntry& entry : parseTensorFile(bytes, path)) {
    Tensor& tensor = tensors[entry.name];
    tensor.shape = entry.shape;
    tensor.data.resize(entry.count());
    for (size_t i = 0; i < entry.count(); ++i)
      tensor.data[i] = float(entry.value(i));
  }
  return tensors;
}

/// Pipeline stages (codegen/SplitStages.h): the value `data` that stage `from` computed goes to
/// every stage of the mask `to` on the stage axis's communicator (group rank = stage), point to
/// point; other stages do nothing. Every rank calls it at the same place, so the sends and recvs
/// of a step match in program order. (A template: CUDA's views are device spans.)
template <class Span>
void stageTransfer(meshrt::Communicator& stages, Span data, int64_t from, uint64_t to) {
  int self = stages.rank();
  if (self == int(from)) {
    for (int stage = 0; stage < stages.size(); ++stage)
      if ((to >> stage) & 1) stages.send(data.data(), data.size(), stage);
  } else if ((to >> self) & 1) {
    stages.recv(data.data(), data.size(), int(from));
  }
}

/// A started stage send and the copy of the data it sends (the sender's buffer moves on).
template <class Owned> struct StageSendOf {
  Owned data;
  meshrt::Request request;
};
using StageSend = StageSendOf<Buffer>;

/// The same with the sends started (1F1B: a stage goes on with its next microbatch while its
/// neighbour still computes) from a copy of `data`, kept in `started` until waitStageSends.
template <class Owned, class Span>
void stageTransferStarted(meshrt::Communicator& stages, Span data, int64_t from, uint64_t to,
                          std::deque<StageSendOf<Owned>>& started) {
  int self = stages.rank();
  if (self == int(from)) {
    for (int stage = 0; stage < stages.size(); ++stage)
      if ((to >> stage) & 1) {
        StageSendOf<Owned>& send = started.emplace_back();
        send.data = Owned(data.begin(), data.end());
        send.request = stages.startSend(send.data.data(), send.data.size(), stage);
      }
  } else if ((to >> self) & 1) {
    stages.recv(data.data(), data.size(), int(from));
  }
}
template <class Owned>
void waitStageSends(meshrt::Communicator& stages, std::deque<StageSendOf<Owned>>& started) {
  for (StageSendOf<Owned>& send : started)
    stages.wait(send.request);
  started.clear();
}

} // namespace meshc::gen
