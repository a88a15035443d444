#include "diag/Diagnostics.h"

namespace meshc {

static const DiagInfo kDiagInfos[] = {
#define DIAG(Name, Sev, Format) {#Name, Severity::Sev, Format},
#include "diag/KernelDiagnostics.def"
#include "diag/ParseDiagnostics.def"
#include "diag/PlanDiagnostics.def"
#include "diag/SemaDiagnostics.def"
#include "diag/TrainDiagnostics.def"
#undef DIAG
};

const DiagInfo& diagInfo(Diag kind) {
  return kDiagInfos[static_cast<size_t>(kind)];
}

llvm::ArrayRef<DiagInfo> allDiagInfos() {
  return kDiagInfos;
}

std::recursive_mutex& DiagEngine::sourcesMutex() {
  static std::recursive_mutex mutex;
  return mutex;
}

void DiagEngine::emit(llvm::SMLoc loc, const DiagInfo& info, const std::string& message) {
  std::lock_guard<std::recursive_mutex> lock(sourcesMutex());
  llvm::SourceMgr::DiagKind kind = llvm::SourceMgr::DK_Error;
  switch (info.severity) {
  case Severity::Error:
    kind = llvm::SourceMgr::DK_Error;
    ++errors_;
    break;
  case Severity::Warning:
    kind = llvm::SourceMgr::DK_Warning;
    break;
  case Severity::Note:
    kind = llvm::SourceMgr::DK_Note;
    break;
  }
  if (!loc.isValid()) {
    // No source position (e.g. a file that cannot be opened): "meshc: error: ...".
    llvm::SMDiagnostic("", kind, message).print("meshc", out_);
    return;
  }
  sources_.PrintMessage(out_, loc, kind, message);
}

} // namespace meshc
