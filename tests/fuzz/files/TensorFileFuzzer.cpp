// Fuzz target over a generated runner's inputs file (meshc/TensorFile.h, the format of `--data`
// and of the outputs): any bytes must parse into tensors or fail with std::runtime_error naming
// the file, never crash or allocate for values the file does not hold. Each tensor read is then
// taken as the program's inputs are (batchOfStep: the header checked against the program's
// shape by dims), which must return one batch or throw std::invalid_argument.
#include "meshc/GeneratedSupport.h"

#include <cstddef>
#include <cstdint>

namespace {
bool lastRejected = false;
} // namespace

extern "C" bool meshcFuzzLastInputRejected() {
  return lastRejected;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  lastRejected = false;
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  std::vector<meshc::gen::TensorFileEntry> entries;
  try {
    entries = meshc::gen::parseTensorFile(bytes, "fuzz-inputs.bin");
  } catch (const std::runtime_error&) {
    lastRejected = true; // the clean rejection
    return 0;
  }
  // The program's input shapes the tensors are checked against: a scalar, a vector, a matrix.
  static const std::vector<meshc::gen::Shape> programShapes = {{}, {4}, {2, 3}};
  for (const meshc::gen::TensorFileEntry& entry : entries) {
    meshc::gen::Tensor tensor{entry.shape, meshc::gen::Buffer(entry.count())};
    for (size_t i = 0; i < entry.count(); ++i)
      tensor.data[i] = float(entry.value(i));
    for (const meshc::gen::Shape& shape : programShapes) {
      try {
        meshc::gen::Tensor batch =
            meshc::gen::batchOfStep(entry.name, tensor, shape, int64_t(entry.count()));
        if (int64_t(batch.data.size()) != meshc::gen::product(shape)) __builtin_trap();
      } catch (const std::invalid_argument&) {
      }
    }
  }
  return 0;
}
