#include "kernels/KernelCheck.h"

#include <clang/AST/ASTContext.h>
#include <clang/ASTMatchers/ASTMatchFinder.h>
#include <clang/ASTMatchers/ASTMatchers.h>
#include <clang/Basic/Diagnostic.h>
#include <clang/Frontend/ASTUnit.h>
#include <clang/Tooling/Tooling.h>
#include <llvm/ADT/SmallString.h>
#include <llvm/Support/FileSystem.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/Path.h>

namespace meshc::kernels {

namespace {

/// Keeps the first error Clang reports while parsing the header ("file:line:col: message").
class FirstErrorConsumer : public clang::DiagnosticConsumer {
public:
  void HandleDiagnostic(clang::DiagnosticsEngine::Level level,
                        const clang::Diagnostic& info) override {
    DiagnosticConsumer::HandleDiagnostic(level, info);
    if (level < clang::DiagnosticsEngine::Error || !firstError.empty()) return;
    llvm::SmallString<128> message;
    info.FormatDiagnostic(message);
    firstError = message.str().str();
    if (info.hasSourceManager() && info.getLocation().isValid()) {
      clang::PresumedLoc loc = info.getSourceManager().getPresumedLoc(info.getLocation());
      if (loc.isValid())
        firstError = fmt::format("{}:{}:{}: {}", llvm::sys::path::filename(loc.getFilename()),
                                 loc.getLine(), loc.getColumn(), firstError);
    }
  }
  std::string firstError;
};

/// The location of a C++ declaration as an SMLoc of `diag`'s SourceMgr (the file is added as a
/// buffer the first time), so that notes print its line with a caret.
llvm::SMLoc locationInSourceMgr(DiagEngine& diag, const std::string& file, unsigned line,
                                unsigned col) {
  llvm::SourceMgr& sources = diag.sources();
  unsigned id = 0;
  for (unsigned i = 1; i <= sources.getNumBuffers(); ++i)
    if (sources.getMemoryBuffer(i)->getBufferIdentifier() == file) id = i;
  if (id == 0) {
    llvm::ErrorOr<std::unique_ptr<llvm::MemoryBuffer>> buffer = llvm::MemoryBuffer::getFile(file);
    if (!buffer) return llvm::SMLoc();
    id = sources.AddNewSourceBuffer(std::move(*buffer), llvm::SMLoc());
  }
  return sources.FindLocForLineAndColumn(id, line, col);
}

bool isFloatOrDouble(clang::QualType type) {
  const clang::Type* canonical = type.getCanonicalType().getTypePtr();
  return canonical->isSpecificBuiltinType(clang::BuiltinType::Float) ||
         canonical->isSpecificBuiltinType(clang::BuiltinType::Double);
}

} // namespace

bool checkExternFunction(const ExternFunction& fn, DiagEngine& diag,
                         const KernelCheckOptions& options) {
  if (!llvm::sys::fs::exists(fn.headerPath)) {
    diag.report(fn.headerLoc, Diag::ErrKernelHeaderUnreadable, fn.header,
                std::make_error_code(std::errc::no_such_file_or_directory).message());
    return false;
  }
  llvm::SmallString<256> absolute(fn.headerPath);
  llvm::sys::fs::make_absolute(absolute);

  std::vector<std::string> args = {"-std=c++17", "-fsyntax-only", "-xc++"};
  if (!options.resourceDir.empty()) args.push_back("-resource-dir=" + options.resourceDir);
  args.insert(args.end(), options.extraArgs.begin(), options.extraArgs.end());
  FirstErrorConsumer errors;
  std::string code = fmt::format("#include \"{}\"\n", absolute.str().str());
  std::unique_ptr<clang::ASTUnit> unit = clang::tooling::buildASTFromCodeWithArgs(
      code, args, "meshc-extern-check.cpp", "meshc",
      std::make_shared<clang::PCHContainerOperations>(),
      clang::tooling::getClangStripDependencyFileAdjuster(), clang::tooling::FileContentMappings(),
      &errors);
  if (!unit || !errors.firstError.empty()) {
    diag.report(fn.headerLoc, Diag::ErrKernelHeaderInvalid, fn.header,
                errors.firstError.empty() ? std::string("clang could not parse it")
                                          : errors.firstError);
    return false;
  }

  using namespace clang::ast_matchers;
  // Global scope only: generated code calls `::name(...)`.
  auto matches = match(functionDecl(hasName("::" + fn.name)).bind("fn"), unit->getASTContext());
  std::vector<const clang::FunctionDecl*> candidates;
  for (const BoundNodes& node : matches)
    if (const auto* decl = node.getNodeAs<clang::FunctionDecl>("fn")) candidates.push_back(decl);
  if (candidates.empty()) {
    diag.report(fn.nameLoc, Diag::ErrKernelNotFound, fn.name, fn.header);
    return false;
  }
  // Among overloads, prefer the one with the declared arity.
  const clang::FunctionDecl* decl = candidates.front();
  for (const clang::FunctionDecl* candidate : candidates)
    if (candidate->getNumParams() == fn.arity) decl = candidate;

  const clang::SourceManager& sm = unit->getSourceManager();
  auto note = [&]() {
    clang::PresumedLoc loc = sm.getPresumedLoc(decl->getLocation());
    if (loc.isValid())
      diag.report(locationInSourceMgr(diag, loc.getFilename(), loc.getLine(), loc.getColumn()),
                  Diag::NoteKernelDeclared, fn.name);
    return false;
  };
  if (decl->getNumParams() != fn.arity) {
    diag.report(fn.nameLoc, Diag::ErrKernelArity, fn.name, fn.arity, decl->getNumParams());
    return note();
  }
  for (unsigned i = 0; i < decl->getNumParams(); ++i) {
    clang::QualType type = decl->getParamDecl(i)->getType();
    if (!isFloatOrDouble(type)) {
      diag.report(fn.nameLoc, Diag::ErrKernelParamType, i + 1, fn.name, type.getAsString());
      return note();
    }
  }
  if (!isFloatOrDouble(decl->getReturnType())) {
    diag.report(fn.nameLoc, Diag::ErrKernelResultType, fn.name,
                decl->getReturnType().getAsString());
    return note();
  }
  return true;
}

} // namespace meshc::kernels
