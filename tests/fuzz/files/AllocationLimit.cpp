// Linked into the replays of the file fuzz targets: one allocation over 256 MiB aborts, so a
// regression input that makes a reader allocate for a huge header fails the test even on a
// machine where the allocation would succeed (while fuzzing, libFuzzer's -malloc_limit_mb does
// the same).
#include <cstdio>
#include <cstdlib>
#include <new>

namespace {

constexpr std::size_t kLimit = std::size_t(256) << 20;

void* allocate(std::size_t size) {
  if (size > kLimit) {
    std::fprintf(stderr, "error: an allocation of %zu bytes exceeds the replay's limit of %zu\n",
                 size, kLimit);
    std::abort();
  }
  if (void* memory = std::malloc(size ? size : 1)) return memory;
  throw std::bad_alloc();
}

} // namespace

void* operator new(std::size_t size) {
  return allocate(size);
}
void* operator new[](std::size_t size) {
  return allocate(size);
}
void operator delete(void* memory) noexcept {
  std::free(memory);
}
void operator delete[](void* memory) noexcept {
  std::free(memory);
}
void operator delete(void* memory, std::size_t) noexcept {
  std::free(memory);
}
void operator delete[](void* memory, std::size_t) noexcept {
  std::free(memory);
}
