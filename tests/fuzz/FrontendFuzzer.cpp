// Fuzz target over the lexer, parser, import loader and sema: any byte string must produce
// diagnostics or IR, never a crash, hang or sanitizer report.
#include "frontend/SourceLoader.h"
#include "sema/Sema.h"

#include <cstddef>
#include <cstdint>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  llvm::SourceMgr sources;
  meshc::DiagEngine diag(sources, llvm::nulls());
  llvm::StringRef text(reinterpret_cast<const char*>(data), size);
  // Imports resolve against a directory that does not exist, so the fuzzer reads no files.
  if (auto files = meshc::loadSourcesFromBuffer(text, "/nonexistent-meshc-fuzz/input.mesh", diag))
    (void)meshc::analyze(*files, diag);
  return 0;
}
