// Every golden emitted source (tests/golden-cpp/X.cpp and X.main.cpp, with X.h) passes Clang's
// syntax-only action, run in-process through libtooling, with the include paths the generated code
// is built with.
#include <catch2/catch.hpp>

#include <clang/Frontend/FrontendActions.h>
#include <clang/Tooling/Tooling.h>
#include <llvm/Support/FileSystem.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/Path.h>

#include <algorithm>
#include <string>
#include <vector>

namespace {

std::vector<std::string> goldenSources() {
  std::vector<std::string> files;
  std::error_code ec;
  for (llvm::sys::fs::directory_iterator it(MESHC_GOLDEN_CPP_DIR, ec), end; it != end && !ec;
       it.increment(ec)) {
    // Generated files come in families X.h, X.cpp, X.main.cpp (this test's source has no X.h).
    llvm::StringRef path = it->path();
    llvm::StringRef stem = llvm::sys::path::filename(path).split('.').first;
    std::string header = (llvm::Twine(MESHC_GOLDEN_CPP_DIR) + "/" + stem + ".h").str();
    // Headers are checked through the sources that include them.
    if (path.endswith(".cpp") && llvm::sys::fs::exists(header)) files.push_back(path.str());
  }
  std::sort(files.begin(), files.end());
  return files;
}

std::vector<std::string> compileArgs() {
  std::vector<std::string> args = {"-x",
                                   "c++",
                                   "-std=c++20",
                                   "-fsyntax-only",
                                   "-Wall",
                                   "-Wno-unused",
                                   "-resource-dir",
                                   MESHC_CLANG_RESOURCE_DIR,
                                   "-I",
                                   MESHC_GOLDEN_CPP_DIR};
  for (const char* dir :
       {MESHC_RUNTIME_INCLUDE, MESHC_KERNELS_INCLUDE, MESHC_SUPPORT_INCLUDE, MESHC_CBLAS_INCLUDE,
        MESHC_EXAMPLES_INCLUDE}) { // the examples' directory: their user kernels' headers
    if (std::string(dir).empty()) continue;
    args.push_back("-I");
    args.push_back(dir);
  }
  return args;
}

} // namespace

TEST_CASE("golden emitted C++ passes clang's syntax-only action", "[codegen]") {
  std::vector<std::string> files = goldenSources();
  REQUIRE(files.size() >= 2); // at least one example's source and runner
  for (const std::string& path : files) {
    INFO(path);
    auto buffer = llvm::MemoryBuffer::getFile(path);
    REQUIRE(buffer);
    bool ok = clang::tooling::runToolOnCodeWithArgs(std::make_unique<clang::SyntaxOnlyAction>(),
                                                    (*buffer)->getBuffer(), compileArgs(), path,
                                                    "meshc-syntax-check");
    CHECK(ok);
  }
}

TEST_CASE("the syntax-only check rejects broken code", "[codegen]") {
  // Guards against a check that passes everything (e.g. a missing include path not reported).
  bool ok = clang::tooling::runToolOnCodeWithArgs(
      std::make_unique<clang::SyntaxOnlyAction>(),
      "#include \"meshc/GeneratedSupport.h\"\nint f() { return meshc::gen::noSuchThing(); }\n",
      compileArgs(), "broken.cpp", "meshc-syntax-check");
  CHECK_FALSE(ok);
}
