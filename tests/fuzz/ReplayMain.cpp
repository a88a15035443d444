// Replays files through the fuzz target without libFuzzer, so the crash corpus, the bad-input
// cases and the examples stay regression tests in the ordinary build. Directories after
// "--rejected" hold inputs the target must refuse with a clean error, for targets that say so
// (meshcFuzzLastInputRejected).
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
// Whether the last input was refused with the target's clean error (defined by the file targets).
extern "C" __attribute__((weak)) bool meshcFuzzLastInputRejected();

int main(int argc, char** argv) {
  size_t count = 0, accepted = 0;
  bool mustReject = false;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--rejected") {
      mustReject = true;
      continue;
    }
    for (const auto& entry : std::filesystem::recursive_directory_iterator(argv[i])) {
      if (!entry.is_regular_file()) continue;
      std::ifstream in(entry.path(), std::ios::binary);
      std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
      ++count;
      if (mustReject && !(meshcFuzzLastInputRejected && meshcFuzzLastInputRejected())) {
        std::printf("error: %s was accepted, but it must be rejected\n", entry.path().c_str());
        ++accepted;
      }
    }
  }
  std::printf("replayed %zu inputs without a crash\n", count);
  return count > 0 && accepted == 0 ? 0 : 1;
}
