#include "frontend/SourceLoader.h"

#include "frontend/Parser.h"

#include <llvm/ADT/SmallString.h>
#include <llvm/ADT/StringSet.h>
#include <llvm/Support/FileSystem.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/Path.h>

#include <vector>

namespace meshc {

namespace {

/// Loads files depth-first: a file's imports are loaded (and appended) before the file itself,
/// so every import precedes its importers. Files are identified by their real path.
class SourceLoader {
public:
  explicit SourceLoader(DiagEngine& diag) : diag_(diag) {}

  /// Loads `path`, whose text is `buffer` (read here when null). `importLoc` is the location of
  /// the import declaration that names the file (invalid for the main file).
  void load(const std::string& path, std::unique_ptr<llvm::MemoryBuffer> buffer,
            const ast::ImportDecl* import);

  SourceSet takeResult() { return std::move(result_); }

private:
  static std::string realPath(const std::string& path) {
    llvm::SmallString<256> real;
    if (llvm::sys::fs::real_path(path, real))
      return path; // not on disk (an in-memory main file): its name identifies it
    return std::string(real);
  }

  struct Active {
    std::string realPath;
    std::string path;
  };

  DiagEngine& diag_;
  llvm::StringSet<> done_;
  std::vector<Active> stack_; // files whose imports are being loaded, outermost first
  SourceSet result_;
};

void SourceLoader::load(const std::string& path, std::unique_ptr<llvm::MemoryBuffer> buffer,
                        const ast::ImportDecl* import) {
  std::string real = realPath(path);
  if (done_.contains(real)) return;
  for (size_t i = 0; i < stack_.size(); ++i) {
    if (stack_[i].realPath != real) continue;
    std::string chain;
    for (size_t j = i; j < stack_.size(); ++j)
      chain += llvm::sys::path::filename(stack_[j].path).str() + " -> ";
    chain += llvm::sys::path::filename(path).str();
    diag_.report(import->loc, Diag::ErrImportCycle, chain);
    return;
  }

  if (!buffer) {
    llvm::ErrorOr<std::unique_ptr<llvm::MemoryBuffer>> file =
        llvm::MemoryBuffer::getFile(path, /*IsText=*/true);
    if (!file) {
      if (import)
        diag_.report(import->pathLoc, Diag::ErrImportNotFound, import->path,
                     file.getError().message());
      else
        diag_.report(llvm::SMLoc(), Diag::ErrCannotOpen, path, file.getError().message());
      return;
    }
    buffer = std::move(*file);
  }
  unsigned bufferId = diag_.sources().AddNewSourceBuffer(std::move(buffer), llvm::SMLoc());
  std::unique_ptr<ast::File> file = parseFile(bufferId, diag_);
  file->path = path;

  stack_.push_back({real, path});
  llvm::StringRef dir = llvm::sys::path::parent_path(path);
  for (const ast::DeclPtr& decl : file->decls) {
    const auto* importDecl = llvm::dyn_cast<ast::ImportDecl>(decl.get());
    if (!importDecl) continue;
    llvm::SmallString<256> importPath;
    if (llvm::sys::path::is_absolute(importDecl->path)) {
      importPath = importDecl->path;
    } else {
      importPath = dir;
      llvm::sys::path::append(importPath, importDecl->path);
    }
    llvm::sys::path::remove_dots(importPath, /*remove_dot_dot=*/true);
    load(std::string(importPath), nullptr, importDecl);
  }
  stack_.pop_back();

  done_.insert(real);
  result_.files.push_back(std::move(file));
}

} // namespace

std::optional<SourceSet> loadSources(const std::string& mainPath, DiagEngine& diag) {
  SourceLoader loader(diag);
  loader.load(mainPath, nullptr, nullptr);
  if (diag.hadError()) return std::nullopt;
  return loader.takeResult();
}

std::optional<SourceSet> loadSourcesFromBuffer(llvm::StringRef text, llvm::StringRef name,
                                               DiagEngine& diag) {
  SourceLoader loader(diag);
  loader.load(name.str(), llvm::MemoryBuffer::getMemBufferCopy(text, name), nullptr);
  if (diag.hadError()) return std::nullopt;
  return loader.takeResult();
}

} // namespace meshc
