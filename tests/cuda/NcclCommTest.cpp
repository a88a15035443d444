// The NCCL backend (meshrt/Nccl.h). Without a GPU (CI) it checks the failure path: runNccl
// reports the missing devices as a CommError instead of crashing or hanging. With GPUs
// (tests/gpu/run.sh) it runs real collectives: all-reduce, subgroup all-gather by
// ncclCommSplit, and a permute, on as many ranks as there are GPUs (up to 8); and the same
// communicator on host buffers (staged through the device), as generated runners and
// checkpoints call it; and point-to-point send / recv around a ring of the GPUs.
#include <catch2/catch.hpp>

#include "meshrt/Nccl.h"

#include <cuda_runtime_api.h>

#include <vector>

using meshrt::CommError;
using meshrt::Mesh;

namespace {

std::vector<float> download(const float* device, size_t count) {
  std::vector<float> host(count);
  REQUIRE(cudaMemcpy(host.data(), device, count * sizeof(float), cudaMemcpyDeviceToHost) ==
          cudaSuccess);
  return host;
}

} // namespace

TEST_CASE("runNccl needs one GPU per rank and says so", "[cuda][nccl]") {
  int devices = meshrt::nccl::deviceCount();
  Mesh tooBig({{"data", devices + 1}});
  try {
    meshrt::nccl::runNccl(tooBig, [](meshrt::Communicator&) { FAIL("ran without a GPU"); });
    FAIL("no error");
  } catch (const CommError& error) {
    std::string message = error.what();
    if (devices == 0)
      REQUIRE(message.find("no CUDA device") != std::string::npos);
    else
      REQUIRE(message.find("needs " + std::to_string(devices + 1) + " GPUs") != std::string::npos);
  }
}

TEST_CASE("NCCL collectives on device buffers", "[cuda][nccl]") {
  int devices = std::min(meshrt::nccl::deviceCount(), 8);
  if (devices == 0) {
    WARN("no GPU: only the failure path above runs here (tests/gpu/run.sh runs this one)");
    return;
  }
  int data = devices % 2 == 0 ? 2 : 1;
  Mesh mesh({{"data", data}, {"model", devices / data}});
  meshrt::nccl::runNccl(mesh, [&](meshrt::Communicator& world) {
    auto& nccl = dynamic_cast<meshrt::nccl::NcclCommunicator&>(world);
    const size_t count = 1000;
    float* buffer = nullptr;
    float* gathered = nullptr;
    REQUIRE(cudaMalloc(&buffer, count * sizeof(float)) == cudaSuccess);
    REQUIRE(cudaMalloc(&gathered, count * sizeof(float) * size_t(world.size())) == cudaSuccess);
    std::vector<float> mine(count, float(world.rank() + 1));
    REQUIRE(cudaMemcpy(buffer, mine.data(), count * sizeof(float), cudaMemcpyHostToDevice) ==
            cudaSuccess);
    world.allReduce(buffer, count);
    nccl.synchronize("test");
    float expected = float(world.size() * (world.size() + 1) / 2);
    for (float x : download(buffer, count))
      REQUIRE(x == expected);

    meshrt::Communicator& model = world.subgroup({"model"});
    REQUIRE(model.size() == mesh.axisSize("model"));
    REQUIRE(model.rank() == world.coord("model"));
    float value = float(world.rank());
    REQUIRE(cudaMemcpy(buffer, &value, sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
    model.allGather(buffer, gathered, 1);
    nccl.synchronize("test");
    std::vector<float> got = download(gathered, size_t(model.size()));
    for (int g = 0; g < model.size(); ++g)
      REQUIRE(got[size_t(g)] == float(model.worldRankOf(g)));

    // shift by one with zeros: rank r receives rank r-1's value.
    model.shift(buffer, gathered, 1, 1, meshrt::Boundary::Zero);
    nccl.synchronize("test");
    float received = download(gathered, 1)[0];
    REQUIRE(received == (model.rank() == 0 ? 0.0f : float(model.worldRankOf(model.rank() - 1))));
    world.barrier();
    cudaFree(buffer);
    cudaFree(gathered);
  });
}

TEST_CASE("NCCL started collectives: in flight together, a bucket, host buffers", "[cuda][nccl]") {
  int devices = std::min(meshrt::nccl::deviceCount(), 8);
  if (devices == 0) {
    WARN("no GPU: started collectives are compiled here, run by tests/gpu/run.sh");
    return;
  }
  int data = devices % 2 == 0 ? 2 : 1;
  Mesh mesh({{"data", data}, {"model", devices / data}});
  meshrt::nccl::runNccl(mesh, [&](meshrt::Communicator& world) {
    auto& nccl = dynamic_cast<meshrt::nccl::NcclCommunicator&>(world);
    meshrt::Communicator& model = world.subgroup({"model"});
    const size_t count = 4096;
    int p = world.size();
    float *grads = nullptr, *bucketA = nullptr, *bucketB = nullptr, *gathered = nullptr,
          *scattered = nullptr;
    for (float** buffer : {&grads, &bucketA, &bucketB, &scattered})
      REQUIRE(cudaMalloc(buffer, count * sizeof(float) * size_t(p)) == cudaSuccess);
    REQUIRE(cudaMalloc(&gathered, count * sizeof(float) * size_t(p)) == cudaSuccess);
    std::vector<float> mine(count * size_t(p), float(world.rank() + 1));
    for (float* buffer : {grads, bucketA, bucketB, scattered})
      REQUIRE(cudaMemcpyAsync(buffer, mine.data(), mine.size() * sizeof(float),
                              cudaMemcpyHostToDevice, nccl.stream()) == cudaSuccess);
    // Started after the copies on stream(): they must see them (the start orders after them).
    meshrt::Request sum = world.startAllReduce(grads, count);
    meshrt::Request bucket = world.startAllReduce<float>({{bucketA, 100}, {bucketB, count}});
    meshrt::Request scatter = world.startReduceScatter(scattered, gathered, count);
    meshrt::Request gather = model.startAllGather(grads + count, gathered + count, 1);
    world.wait(scatter); // completes sum and bucket too (start order)
    REQUIRE_FALSE(sum.pending());
    REQUIRE_FALSE(bucket.pending());
    model.wait(gather);
    nccl.synchronize("test");
    float total = float(p * (p + 1) / 2);
    for (float x : download(grads, count))
      REQUIRE(x == total);
    std::vector<float> a = download(bucketA, 101), b = download(bucketB, count);
    REQUIRE(a[0] == total);
    REQUIRE(a[99] == total);
    REQUIRE(a[100] == float(world.rank() + 1)); // past the bucket's first buffer
    for (float x : b)
      REQUIRE(x == total);
    for (float x : download(gathered, count))
      REQUIRE(x == total);
    std::vector<float> row = download(gathered + count, size_t(model.size()));
    for (int g = 0; g < model.size(); ++g)
      REQUIRE(row[size_t(g)] == float(model.worldRankOf(g) + 1));
    // test() until done, and host buffers (staged: done at the start).
    meshrt::Request again = world.startAllReduce(grads, count, meshrt::ReduceOp::Max);
    while (!again.test()) {
    }
    std::vector<double> host(3, double(world.rank()));
    meshrt::Request staged = world.startAllReduce(host.data(), host.size(), meshrt::ReduceOp::Max);
    REQUIRE_FALSE(staged.pending());
    REQUIRE(host == std::vector<double>(3, double(p - 1)));
    world.barrier();
    for (float* buffer : {grads, bucketA, bucketB, scattered, gathered})
      cudaFree(buffer);
  });
}

TEST_CASE("Host buffers are staged in place when they overlap", "[cuda][nccl]") {
  using meshrt::nccl::kStagingAlignment;
  using meshrt::nccl::stagingLayout;
  std::vector<float> buffer(64);
  const size_t chunk = 16 * sizeof(float);
  // allReduce / broadcast in place: in == out, one region.
  auto same = stagingLayout(buffer.data(), chunk, true, buffer.data(), chunk, true);
  REQUIRE((same.inOffset == 0 && same.outOffset == 0 && same.bytes == chunk));
  // allGather in place on rank 2 of 4: in is out's chunk 2.
  auto gather = stagingLayout(buffer.data() + 32, chunk, true, buffer.data(), 4 * chunk, true);
  REQUIRE((gather.inOffset == 2 * chunk && gather.outOffset == 0 && gather.bytes == 4 * chunk));
  // reduceScatter in place on rank 1 of 4: out is in's chunk 1.
  auto scatter = stagingLayout(buffer.data(), 4 * chunk, true, buffer.data() + 16, chunk, true);
  REQUIRE((scatter.inOffset == 0 && scatter.outOffset == chunk && scatter.bytes == 4 * chunk));
  // Separate buffers: in first, out at the next aligned offset.
  std::vector<float> other(3);
  auto apart =
      stagingLayout(buffer.data(), 3 * sizeof(float), true, other.data(), 3 * sizeof(float), true);
  REQUIRE((apart.inOffset == 0 && apart.outOffset == kStagingAlignment &&
           apart.bytes == kStagingAlignment + 3 * sizeof(float)));
  // Only one side on the host (the other on the device): only it is staged.
  auto onlyOut = stagingLayout(buffer.data(), chunk, false, other.data(), 12, true);
  REQUIRE((onlyOut.outOffset == 0 && onlyOut.bytes == 12));
  auto onlyIn = stagingLayout(buffer.data(), chunk, true, buffer.data(), chunk, false);
  REQUIRE((onlyIn.inOffset == 0 && onlyIn.bytes == kStagingAlignment));
}

TEST_CASE("NCCL collectives on host buffers", "[cuda][nccl]") {
  int devices = std::min(meshrt::nccl::deviceCount(), 8);
  if (devices == 0) {
    WARN("no GPU: host staging is not exercised here (tests/gpu/run.sh runs this one)");
    return;
  }
  int data = devices % 2 == 0 ? 2 : 1;
  Mesh mesh({{"data", data}, {"model", devices / data}});
  meshrt::nccl::runNccl(mesh, [&](meshrt::Communicator& world) {
    // The runner's timings: an in-place max over pageable host memory, ready on return.
    std::vector<double> runs = {double(world.rank()), -double(world.rank()), 1.5};
    world.allReduce(runs.data(), runs.size(), meshrt::ReduceOp::Max);
    REQUIRE(runs == std::vector<double>{double(world.size() - 1), 0.0, 1.5});
    // Out of place, host in and host out.
    std::vector<float> mine(5, float(world.rank() + 1)), sum(5, -1.0f);
    world.allReduce(mine.data(), sum.data(), mine.size());
    for (float x : sum)
      REQUIRE(x == float(world.size() * (world.size() + 1) / 2));

    // The checkpoint's sequence number: a broadcast from rank 0 of a host int.
    int32_t sequence = world.rank() == 0 ? 42 : -1;
    world.broadcast(&sequence, 1, 0);
    REQUIRE(sequence == 42);
    // From another root, several values, on a subgroup.
    meshrt::Communicator& model = world.subgroup({"model"});
    int root = model.size() - 1;
    std::vector<int32_t> values(3, model.rank() == root ? world.rank() : -1);
    model.broadcast(values.data(), values.size(), root);
    for (int32_t v : values)
      REQUIRE(v == model.worldRankOf(root));

    // The checkpoint's string lengths: a host all-gather on the subgroup.
    int32_t length = 10 + world.rank();
    std::vector<int32_t> lengths(size_t(model.size()), -1);
    model.allGather(&length, lengths.data(), 1);
    for (int g = 0; g < model.size(); ++g)
      REQUIRE(lengths[size_t(g)] == 10 + model.worldRankOf(g));

    // Mixed: a host input reduced into a device output.
    float* device = nullptr;
    REQUIRE(cudaMalloc(&device, sizeof(float)) == cudaSuccess);
    float one = 1.0f;
    world.allReduce(&one, device, 1);
    dynamic_cast<meshrt::nccl::NcclCommunicator&>(world).synchronize("test");
    REQUIRE(download(device, 1)[0] == float(world.size()));
    cudaFree(device);
  });
}

TEST_CASE("NCCL send / recv: a ring both ways, started, sendRecv, host buffers", "[cuda][nccl]") {
  int devices = std::min(meshrt::nccl::deviceCount(), 8);
  if (devices < 2) {
    WARN("fewer than 2 GPUs: send / recv are compiled here, run by tests/gpu/run.sh");
    return;
  }
  Mesh mesh({{"stage", devices}});
  meshrt::nccl::runNccl(mesh, [&](meshrt::Communicator& world) {
    auto& nccl = dynamic_cast<meshrt::nccl::NcclCommunicator&>(world);
    int p = world.size(), r = world.rank(), next = (r + 1) % p, previous = (r + p - 1) % p;
    const size_t count = 5000;
    float *mine = nullptr, *fromPrevious = nullptr, *fromNext = nullptr;
    for (float** buffer : {&mine, &fromPrevious, &fromNext})
      REQUIRE(cudaMalloc(buffer, count * sizeof(float)) == cudaSuccess);
    std::vector<float> values(count);
    for (size_t i = 0; i < count; ++i)
      values[i] = float(r * 100000 + int(i));
    REQUIRE(cudaMemcpyAsync(mine, values.data(), count * sizeof(float), cudaMemcpyHostToDevice,
                            nccl.stream()) == cudaSuccess);
    auto expectFrom = [&](const float* device, int from) {
      std::vector<float> got = download(device, count);
      for (size_t i = 0; i < count; i += 997)
        REQUIRE(got[i] == float(from * 100000 + int(i)));
    };
    // Forward (even ranks send first, odd receive first), then backward with sendRecv.
    if (r % 2 == 0) {
      world.send(mine, count, next);
      world.recv(fromPrevious, count, previous);
    } else {
      world.recv(fromPrevious, count, previous);
      world.send(mine, count, next);
    }
    world.sendRecv(mine, count, previous, fromNext, count, next);
    nccl.synchronize("test");
    expectFrom(fromPrevious, previous);
    expectFrom(fromNext, next);
    // Started: both in flight, then waited. They run in start order on commStream(), so the
    // ring alternates which one each rank starts first (as the blocking calls above).
    REQUIRE(cudaMemset(fromPrevious, 0, count * sizeof(float)) == cudaSuccess);
    meshrt::Request first, second;
    if (r % 2 == 0) {
      first = world.startSend(mine, count, next);
      second = world.startRecv(fromPrevious, count, previous);
    } else {
      first = world.startRecv(fromPrevious, count, previous);
      second = world.startSend(mine, count, next);
    }
    world.wait(second);
    REQUIRE_FALSE(first.pending());
    nccl.synchronize("test");
    expectFrom(fromPrevious, previous);
    // Host buffers: staged, complete on return.
    std::vector<double> hostOut(7, double(r)), hostIn(7, -1);
    world.sendRecv(hostOut.data(), hostOut.size(), next, hostIn.data(), hostIn.size(), previous);
    REQUIRE(hostIn == std::vector<double>(7, double(previous)));
    world.barrier();
    for (float* buffer : {mine, fromPrevious, fromNext})
      cudaFree(buffer);
  });
}
