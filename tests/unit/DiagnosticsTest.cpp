// DiagEngine: message format, source line and caret, error counting; the registry.
#include "diag/Diagnostics.h"

#include <catch2/catch.hpp>
#include <llvm/ADT/StringSet.h>
#include <llvm/Support/MemoryBuffer.h>

using namespace meshc;

TEST_CASE("errors print file:line:col, the source line and a caret", "[diag]") {
  llvm::SourceMgr sources;
  std::string out;
  llvm::raw_string_ostream stream(out);
  DiagEngine diag(sources, stream);
  unsigned id = sources.AddNewSourceBuffer(
      llvm::MemoryBuffer::getMemBufferCopy("dim a = 1\nlet x = $\n", "f.mesh"), {});
  const char* start = sources.getMemoryBuffer(id)->getBufferStart();
  CHECK(diag.errorCount() == 0);
  CHECK_FALSE(diag.hadError());

  diag.report(llvm::SMLoc::getFromPointer(start + 18), Diag::ErrUnexpectedChar, "$");
  stream.flush();
  CHECK(out == "f.mesh:2:9: error: unexpected character '$'\nlet x = $\n        ^\n");
  CHECK(diag.errorCount() == 1);
  CHECK(diag.hadError());

  diag.report(llvm::SMLoc::getFromPointer(start), Diag::ErrExpected, "']'", "identifier 'x'");
  stream.flush();
  CHECK(out.find("f.mesh:1:1: error: expected ']' but found identifier 'x'\ndim a = 1\n^\n") !=
        std::string::npos);
  CHECK(diag.errorCount() == 2);
}

TEST_CASE("notes do not count as errors", "[diag]") {
  llvm::SourceMgr sources;
  std::string out;
  llvm::raw_string_ostream stream(out);
  DiagEngine diag(sources, stream);
  unsigned id =
      sources.AddNewSourceBuffer(llvm::MemoryBuffer::getMemBufferCopy("dim a = 1\n", "g"), {});
  diag.report(llvm::SMLoc::getFromPointer(sources.getMemoryBuffer(id)->getBufferStart() + 4),
              Diag::NotePreviousDefinition, "a");
  stream.flush();
  CHECK(out.find("g:1:5: note: previous definition of 'a' is here") != std::string::npos);
  CHECK(diag.errorCount() == 0);
}

TEST_CASE("a diagnostic without a location prints only the message", "[diag]") {
  llvm::SourceMgr sources;
  std::string out;
  llvm::raw_string_ostream stream(out);
  DiagEngine diag(sources, stream);
  diag.report(llvm::SMLoc(), Diag::ErrCannotOpen, "x.mesh", "No such file or directory");
  stream.flush();
  CHECK(out.find("error: cannot open 'x.mesh': No such file or directory") != std::string::npos);
  CHECK(diag.errorCount() == 1);
}

TEST_CASE("the registry: names unique and non-empty, formats non-empty", "[diag]") {
  llvm::StringSet<> names;
  REQUIRE(!allDiagInfos().empty());
  for (const DiagInfo& info : allDiagInfos()) {
    INFO(info.name);
    CHECK(info.name != nullptr);
    CHECK(std::string(info.name).size() > 0);
    CHECK(std::string(info.format).size() > 0);
    CHECK(names.insert(info.name).second);
  }
  CHECK(std::string(diagInfo(Diag::ErrExpected).name) == "ErrExpected");
  CHECK(diagInfo(Diag::ErrExpected).severity == Severity::Error);
  CHECK(std::string(diagInfo(Diag::ErrUnexpectedChar).format) == "unexpected character '{}'");
}
