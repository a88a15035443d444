// Diagnostics: every user-facing error is declared once in ParseDiagnostics.def,
// KernelDiagnostics.def, SemaDiagnostics.def, PlanDiagnostics.def or TrainDiagnostics.def and
// reported through DiagEngine, which prints `file:line:col: error: message` with the source line
// and a caret (llvm::SourceMgr).
#pragma once

#include <fmt/format.h>
#include <llvm/Support/SMLoc.h>
#include <llvm/Support/SourceMgr.h>
#include <llvm/Support/raw_ostream.h>

#include <mutex>
#include <string>

namespace meshc {

/// One enumerator per diagnostic kind, declared in the registry files.
enum class Diag {
#define DIAG(Name, Severity, Format) Name,
#include "diag/KernelDiagnostics.def"
#include "diag/ParseDiagnostics.def"
#include "diag/PlanDiagnostics.def"
#include "diag/SemaDiagnostics.def"
#include "diag/TrainDiagnostics.def"
#undef DIAG
};

enum class Severity { Error, Warning, Note };

struct DiagInfo {
  const char* name; // the enumerator's spelling, used by tests
  Severity severity;
  const char* format; // fmt format string
};

/// The registry entry of a diagnostic kind.
const DiagInfo& diagInfo(Diag kind);
/// All kinds, in declaration order (tests iterate this to check every kind is exercised).
llvm::ArrayRef<DiagInfo> allDiagInfos();

/// Reports diagnostics against the buffers of one SourceMgr. Never aborts.
class DiagEngine {
public:
  explicit DiagEngine(llvm::SourceMgr& sources, llvm::raw_ostream& out = llvm::errs())
      : sources_(sources), out_(out) {}

  template <typename... Args> void report(llvm::SMLoc loc, Diag kind, Args&&... args) {
    const DiagInfo& info = diagInfo(kind);
    std::string message;
    try {
      message = fmt::vformat(info.format, fmt::make_format_args(args...));
    } catch (const fmt::format_error&) {
      // A registry entry used with the wrong arguments: a meshc bug, reported, not a crash.
      message =
          fmt::format("internal error: diagnostic {} reported with wrong arguments", info.name);
    }
    emit(loc, info, message);
  }

  unsigned errorCount() const { return errors_; }
  bool hadError() const { return errors_ != 0; }
  llvm::SourceMgr& sources() { return sources_; }

  /// The lock of the SourceMgrs and streams that a compilation's threads share (the joint search
  /// plans its stage splits on worker threads, driver/JointSearch.h): loading a module adds
  /// buffers and reads them, and printing a diagnostic reads them (a buffer's line table is built
  /// on first use) and writes to a stream the threads may share (llvm::nulls(), llvm::errs()).
  /// emit holds it; so does whatever else reads or writes a shared SourceMgr. Recursive: a load
  /// reports through emit while it holds it.
  static std::recursive_mutex& sourcesMutex();

private:
  void emit(llvm::SMLoc loc, const DiagInfo& info, const std::string& message);

  llvm::SourceMgr& sources_;
  llvm::raw_ostream& out_;
  unsigned errors_ = 0;
};

} // namespace meshc
