// Semantic analysis of a whole module: the global names (dims, meshes, defs, externs), the
// layout and its checks, then every program and train block lowered by FunctionLowerer
// (FunctionLowerer.cpp), and the checks across functions (params, stage counts, recompute).
#include "sema/Sema.h"
#include "sema/Lowering.h"

#include <llvm/Support/FileSystem.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/Path.h>

#include <algorithm>
#include <cctype>

namespace meshc {

namespace {

using namespace sema;

/// Collects the global names, checks the layout, lowers every program and train block, and
/// checks that no tensor maps two of its dims to one mesh axis.
class ModuleLowerer {
public:
  ModuleLowerer(const SourceSet& sources, DiagEngine& diag, const SemaOptions& options)
      : sources_(sources), options_(options), reporter_(diag), sm_(diag.sources()) {}

  std::optional<ir::Module> run();

private:
  void collect(const ast::Decl& decl);
  void collectExtern(const ast::ExternDecl& ext);
  bool declareCallable(const ast::Ident& name, const char* kind);
  void applyOptions();
  std::unique_ptr<ast::LayoutDecl> parseLayoutOption(const std::string& text);
  void checkLayout();
  void checkAxisSharing(const ir::Function& fn);
  /// `recompute def` and --recompute must name defs that some train block calls.
  void checkRecompute();

  const SourceSet& sources_;
  const SemaOptions& options_;
  std::unique_ptr<ast::LayoutDecl> layoutOption_;
  Reporter reporter_;
  llvm::SourceMgr& sm_;
  Globals globals_;
  std::map<std::string, llvm::SMLoc> callables_;
  std::vector<const ast::LayoutDecl*> layouts_;
  std::vector<const ast::Decl*> functions_;
  std::set<std::pair<std::string, std::string>> reportedPairs_;
  /// Layout entries that only a repeat's count may have (checkStageCounts): a stage split, or
  /// one axis that does not divide the dim (uneven stages).
  struct StageCount {
    std::string dim;
    llvm::SMLoc loc;
    bool split = false;
    int64_t size = 0, product = 0;
    std::string axes;
  };
  std::vector<StageCount> stageCounts_;
  void checkStageCounts();
  const ast::File* currentFile_ = nullptr; // the file collect() is reading
  ir::Module module_;
};

bool ModuleLowerer::declareCallable(const ast::Ident& name, const char* kind) {
  auto [it, inserted] = callables_.emplace(name.name, name.loc);
  if (!inserted) {
    if (reporter_.report(name.loc, Diag::ErrRedefinition, kind, name.name))
      reporter_.report(it->second, Diag::NotePreviousDefinition, name.name);
  }
  return inserted;
}

void ModuleLowerer::collect(const ast::Decl& decl) {
  switch (decl.kind) {
  case ast::Decl::Kind::Import:
    break;
  case ast::Decl::Kind::Mesh: {
    auto& mesh = static_cast<const ast::MeshDecl&>(decl);
    if (globals_.mesh) {
      if (reporter_.report(mesh.name.loc, Diag::ErrSecondMesh, mesh.name.name))
        reporter_.report(globals_.mesh->name.loc, Diag::NoteFirstMesh, globals_.mesh->name.name);
      break;
    }
    globals_.mesh = &mesh;
    globals_.hasMesh = true;
    globals_.meshName = mesh.name.name;
    globals_.meshLoc = mesh.name.loc;
    module_.meshName = mesh.name.name;
    std::map<std::string, llvm::SMLoc> seen;
    int64_t devices = 1;
    for (const ast::MeshDecl::Axis& axis : mesh.axes) {
      if (auto [it, inserted] = seen.emplace(axis.name.name, axis.name.loc); !inserted) {
        if (reporter_.report(axis.name.loc, Diag::ErrRedefinition, "mesh axis", axis.name.name))
          reporter_.report(it->second, Diag::NotePreviousDefinition, axis.name.name);
        continue;
      }
      int64_t size = std::max<int64_t>(axis.size, 1); // the parser reported sizes < 1
      if (__builtin_mul_overflow(devices, size, &devices) || devices > (int64_t(1) << 31)) {
        reporter_.report(mesh.name.loc, Diag::ErrMeshTooLarge, mesh.name.name);
        devices = 1;
      }
      globals_.axes[axis.name.name] = size;
      module_.mesh.push_back({axis.name.name, size});
    }
    break;
  }
  case ast::Decl::Kind::Dim: {
    auto& dim = static_cast<const ast::DimDecl&>(decl);
    auto it = globals_.dims.find(dim.name.name);
    if (it != globals_.dims.end()) {
      if (reporter_.report(dim.name.loc, Diag::ErrRedefinition, "dim", dim.name.name))
        reporter_.report(it->second.loc, Diag::NotePreviousDefinition, dim.name.name);
      break;
    }
    int64_t size = std::max<int64_t>(dim.size, 1); // the parser reported sizes < 1
    if (auto given = options_.dimSizes.find(dim.name.name); given != options_.dimSizes.end())
      size = std::max<int64_t>(given->second, 1);
    globals_.dims[dim.name.name] = {.size = size, .loc = dim.name.loc};
    module_.dims[dim.name.name] = size;
    break;
  }
  case ast::Decl::Kind::Layout:
    if (!options_.layout) layouts_.push_back(static_cast<const ast::LayoutDecl*>(&decl));
    break;
  case ast::Decl::Kind::Def: {
    auto& def = static_cast<const ast::DefDecl&>(decl);
    if (declareCallable(def.name, "def")) globals_.defs[def.name.name] = &def;
    break;
  }
  case ast::Decl::Kind::Program: {
    auto& program = static_cast<const ast::ProgramDecl&>(decl);
    if (declareCallable(program.name, "program")) functions_.push_back(&decl);
    break;
  }
  case ast::Decl::Kind::Train: {
    auto& train = static_cast<const ast::TrainDecl&>(decl);
    if (declareCallable(train.name, "train")) functions_.push_back(&decl);
    break;
  }
  case ast::Decl::Kind::Extern:
    collectExtern(static_cast<const ast::ExternDecl&>(decl));
    break;
  }
}

/// An `extern def`: f32 scalars in and out, its header resolved like an import (against the
/// declaring file) and checked by the driver's checker. Calls name the header relative to the
/// main file's directory, so that generated code includes it with `-I <that directory>`.
void ModuleLowerer::collectExtern(const ast::ExternDecl& ext) {
  if (!declareCallable(ext.name, "extern def")) return;
  bool ok = true;
  for (const ast::ExternDecl::Param& param : ext.params)
    if (param.dtype != ast::DType::F32) {
      reporter_.report(param.dtypeLoc, Diag::ErrExternDType, ast::dtypeName(param.dtype));
      ok = false;
    }
  if (ext.result != ast::DType::F32) {
    reporter_.report(ext.resultLoc, Diag::ErrExternDType, ast::dtypeName(ext.result));
    ok = false;
  }
  llvm::SmallString<256> resolved(ext.header);
  if (!llvm::sys::path::is_absolute(resolved) && currentFile_) {
    resolved = llvm::sys::path::parent_path(currentFile_->path);
    llvm::sys::path::append(resolved, ext.header);
  }
  llvm::sys::path::remove_dots(resolved, /*remove_dot_dot=*/true);
  std::string header = resolved.str().str();
  llvm::SmallString<256> mainDir(llvm::sys::path::parent_path(sources_.mainFile().path));
  llvm::sys::path::remove_dots(mainDir, /*remove_dot_dot=*/true);
  bool relative = !llvm::sys::path::is_absolute(header);
  if (mainDir.empty() && relative && !llvm::StringRef(header).startswith("..")) {
    // Both relative to the working directory, which is the main file's directory.
  } else if (!mainDir.empty() && llvm::StringRef(header).startswith((mainDir + "/").str())) {
    header = header.substr(mainDir.size() + 1);
  } else {
    llvm::SmallString<256> absolute(header);
    llvm::sys::fs::make_absolute(absolute);
    header = absolute.str().str();
  }
  if (ok && options_.checkExtern)
    options_.checkExtern(ExternFunction{ext.name.name, ext.params.size(), ext.header,
                                        resolved.str().str(), ext.name.loc, ext.headerLoc},
                         reporter_.engine());
  globals_.externs[ext.name.name] = ExternInfo{&ext, header};
}

void ModuleLowerer::applyOptions() {
  for (const auto& [name, size] : options_.dimSizes)
    if (!globals_.dims.count(name))
      reporter_.report(llvm::SMLoc(), Diag::ErrUnknownDimOption, name);
  for (const std::string& name : options_.recompute) {
    if (globals_.defs.count(name))
      globals_.recomputeOption.insert(name);
    else
      reporter_.report(llvm::SMLoc(), Diag::ErrRecomputeUnknownDef, name);
  }
  if (options_.mesh) {
    globals_.hasMesh = true;
    if (globals_.meshName.empty()) globals_.meshName = "mesh";
    module_.meshName = globals_.meshName;
    module_.mesh.clear();
    globals_.axes.clear();
    int64_t devices = 1;
    for (const ir::MeshAxis& axis : *options_.mesh) {
      if (globals_.axes.count(axis.name)) {
        reporter_.report(llvm::SMLoc(), Diag::ErrDuplicateAxisOption, axis.name);
        continue;
      }
      int64_t size = std::max<int64_t>(axis.size, 1);
      if (__builtin_mul_overflow(devices, size, &devices) || devices > (int64_t(1) << 31)) {
        reporter_.report(llvm::SMLoc(), Diag::ErrMeshTooLarge, globals_.meshName);
        devices = 1;
      }
      globals_.axes[axis.name] = size;
      module_.mesh.push_back({axis.name, size});
    }
  }
  if (options_.layout) {
    layoutOption_ = parseLayoutOption(*options_.layout);
    if (layoutOption_) layouts_.push_back(layoutOption_.get());
  }
}

/// The --layout text: layout items separated by ',' or ';'. It becomes a buffer of the
/// SourceMgr so that its errors show the text and a caret like any other.
std::unique_ptr<ast::LayoutDecl> ModuleLowerer::parseLayoutOption(const std::string& text) {
  unsigned id =
      sm_.AddNewSourceBuffer(llvm::MemoryBuffer::getMemBufferCopy(text, "--layout"), llvm::SMLoc());
  const char* cur = sm_.getMemoryBuffer(id)->getBufferStart();
  const char* end = sm_.getMemoryBuffer(id)->getBufferEnd();
  struct Token {
    std::string text; // "" at the end
    llvm::SMLoc loc;
  };
  auto identStart = [](char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; };
  auto identChar = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  auto next = [&]() {
    while (cur != end && std::isspace(static_cast<unsigned char>(*cur)))
      ++cur;
    Token token{"", llvm::SMLoc::getFromPointer(cur)};
    if (cur == end) return token;
    const char* start = cur++;
    if (identStart(*start))
      while (cur != end && identChar(*cur))
        ++cur;
    else if (std::isdigit(static_cast<unsigned char>(*start)))
      while (cur != end && std::isdigit(static_cast<unsigned char>(*cur)))
        ++cur;
    token.text.assign(start, cur);
    return token;
  };
  auto isIdent = [&](const Token& t) { return !t.text.empty() && identStart(t.text[0]); };
  auto fail = [&](const Token& t, const char* expected) {
    reporter_.report(t.loc, Diag::ErrExpected, expected,
                     t.text.empty() ? std::string("end of input") : fmt::format("'{}'", t.text));
    return std::unique_ptr<ast::LayoutDecl>();
  };
  auto decl = std::make_unique<ast::LayoutDecl>(llvm::SMLoc::getFromPointer(cur));
  Token token = next();
  while (!token.text.empty()) {
    if (token.text == "," || token.text == ";") {
      token = next();
      continue;
    }
    if (!isIdent(token)) return fail(token, "a dim name or 'auto'");
    Token name = token;
    token = next();
    if (name.text == "auto" && token.text != ":") {
      decl->autoRest = true;
      decl->autoLoc = name.loc;
      continue;
    }
    if (token.text != ":") return fail(token, "':'");
    ast::LayoutDecl::Entry entry;
    entry.dim = {name.text, name.loc};
    token = next();
    if (token.text == "[") {
      token = next();
      while (token.text != "]") {
        if (!isIdent(token)) return fail(token, "a mesh axis name");
        entry.axes.push_back({token.text, token.loc});
        token = next();
        if (token.text == ",")
          token = next();
        else if (token.text != "]")
          return fail(token, "',' or ']'");
      }
    } else if (token.text == "auto") {
      entry.isAuto = true;
    } else if (isIdent(token)) {
      entry.axes.push_back({token.text, token.loc});
      if (cur != end && *cur == '(') { // a stage split, `stage(3, 1)`
        token = next();
        entry.splitLoc = token.loc;
        do {
          token = next();
          int64_t layers = 0;
          if (token.text.empty() || !std::isdigit(static_cast<unsigned char>(token.text[0])) ||
              llvm::StringRef(token.text).getAsInteger(10, layers))
            return fail(token, "a layer count");
          entry.split.push_back(layers);
          token = next();
        } while (token.text == ",");
        if (token.text != ")") return fail(token, "',' or ')'");
      }
    } else {
      return fail(token, "a mesh axis, '[' or 'auto'");
    }
    decl->entries.push_back(std::move(entry));
    token = next();
    if (!token.text.empty() && token.text != "," && token.text != ";")
      return fail(token, "',' or ';'");
  }
  return decl;
}

void ModuleLowerer::checkLayout() {
  for (const ast::LayoutDecl* layout : layouts_) {
    if (layout->autoRest) module_.autoLayout = true;
    for (const ast::LayoutDecl::Entry& entry : layout->entries) {
      auto dim = globals_.dims.find(entry.dim.name);
      if (dim == globals_.dims.end()) {
        reporter_.report(entry.dim.loc, Diag::ErrUnknownDim, entry.dim.name);
        continue;
      }
      if (auto previous = globals_.layout.find(entry.dim.name); previous != globals_.layout.end()) {
        if (reporter_.report(entry.dim.loc, Diag::ErrLayoutDimTwice, entry.dim.name))
          reporter_.report(previous->second.loc, Diag::NotePreviousLayout, entry.dim.name);
        continue;
      }
      LayoutInfo info;
      info.isAuto = entry.isAuto;
      info.loc = entry.dim.loc;
      bool ok = true;
      if (!entry.axes.empty() && !globals_.hasMesh) {
        reporter_.report(entry.dim.loc, Diag::ErrLayoutNoMesh, entry.dim.name);
        ok = false;
      }
      int64_t product = 1;
      for (const ast::Ident& axis : entry.axes) {
        if (!ok) break;
        auto known = globals_.axes.find(axis.name);
        if (known == globals_.axes.end()) {
          reporter_.report(axis.loc, Diag::ErrUnknownAxis, axis.name);
          ok = false;
          continue;
        }
        if (std::find(info.axes.begin(), info.axes.end(), axis.name) != info.axes.end()) {
          reporter_.report(axis.loc, Diag::ErrAxisTwiceForDim, axis.name, entry.dim.name);
          ok = false;
          continue;
        }
        info.axes.push_back(axis.name);
        if (__builtin_mul_overflow(product, known->second, &product)) {
          reporter_.report(globals_.meshLoc, Diag::ErrMeshTooLarge, globals_.meshName);
          ok = false;
        }
      }
      if (!ok) continue;
      int64_t size = dim->second.size;
      if (!entry.split.empty()) { // `layers: stage(3, 1)`: the layers of each stage
        int64_t sum = 0;
        for (size_t s = 0; s < entry.split.size(); ++s)
          sum += entry.split[s];
        auto empty = llvm::find_if(entry.split, [](int64_t layers) { return layers <= 0; });
        if (empty != entry.split.end()) {
          reporter_.report(entry.splitLoc, Diag::ErrStageSplitEmpty, entry.dim.name,
                           empty - entry.split.begin());
          continue;
        }
        if (int64_t(entry.split.size()) != product) {
          reporter_.report(entry.splitLoc, Diag::ErrStageSplitCount, entry.dim.name,
                           entry.split.size(), info.axes.front(), product);
          continue;
        }
        if (sum != size) {
          reporter_.report(entry.splitLoc, Diag::ErrStageSplitSum, entry.dim.name, sum,
                           entry.dim.name, size);
          continue;
        }
        stageCounts_.push_back({entry.dim.name, entry.splitLoc, true, size, product, ""});
      } else if (size % product != 0 && info.axes.size() == 1) {
        // Uneven stages when only a repeat counts over it (checkStageCounts), else an error.
        stageCounts_.push_back(
            {entry.dim.name, entry.dim.loc, false, size, product, info.axes.front()});
      } else if (size % product != 0) {
        std::string axes = joinNames(info.axes, " x ");
        if (info.axes.size() > 1) axes += fmt::format(" = {}", product);
        reporter_.report(entry.dim.loc, Diag::ErrNotDivisible, entry.dim.name, size, product, axes);
        continue;
      }
      ir::DimLayout out;
      out.dim = entry.dim.name;
      out.axes = info.axes;
      out.isAuto = info.isAuto;
      out.split = entry.split;
      ir::Location location;
      location.loc = entry.dim.loc;
      if (unsigned buffer = sm_.FindBufferContainingLoc(entry.dim.loc)) {
        location.file =
            llvm::sys::path::filename(sm_.getMemoryBuffer(buffer)->getBufferIdentifier()).str();
        std::tie(location.line, location.col) = sm_.getLineAndColumn(entry.dim.loc, buffer);
      }
      out.loc = location;
      module_.layout.push_back(std::move(out));
      globals_.layout.emplace(entry.dim.name, std::move(info));
    }
  }
}

void ModuleLowerer::checkStageCounts() {
  for (const StageCount& count : stageCounts_) {
    bool repeated = false, tensor = false;
    for (const ir::Function& fn : module_.functions) {
      repeated = repeated || llvm::any_of(fn.repeats, [&](const ir::RepeatInfo& repeat) {
                   return repeat.dim == count.dim;
                 });
      for (const ir::Value& value : fn.values)
        tensor = tensor || value.type.hasDim(count.dim);
    }
    if (repeated && !tensor) continue;
    if (count.split)
      reporter_.report(count.loc, Diag::ErrStageSplitNotRepeat, count.dim);
    else
      reporter_.report(count.loc, Diag::ErrNotDivisible, count.dim, count.size, count.product,
                       count.axes);
  }
}

void ModuleLowerer::checkAxisSharing(const ir::Function& fn) {
  for (const ir::Value& value : fn.values) {
    const ir::TensorType& type = value.type;
    for (size_t i = 0; i < type.dims.size(); ++i) {
      auto a = globals_.layout.find(type.dims[i].name);
      if (a == globals_.layout.end() || a->second.isAuto) continue;
      for (size_t j = i + 1; j < type.dims.size(); ++j) {
        auto b = globals_.layout.find(type.dims[j].name);
        if (b == globals_.layout.end() || b->second.isAuto) continue;
        for (const std::string& axis : a->second.axes) {
          if (std::find(b->second.axes.begin(), b->second.axes.end(), axis) == b->second.axes.end())
            continue;
          std::pair<std::string, std::string> key{std::min(a->first, b->first),
                                                  std::max(a->first, b->first)};
          if (!reportedPairs_.insert(key).second) break;
          const ir::Op& op = fn.ops[value.definingOp];
          if (reporter_.report(op.loc.loc, Diag::ErrAxisSharedByTensor, typeString(type),
                               type.dims[i].name, type.dims[j].name, axis)) {
            reporter_.report(a->second.loc, Diag::NoteLayoutEntry, a->first, axis);
            reporter_.report(b->second.loc, Diag::NoteLayoutEntry, b->first, axis);
          }
          break;
        }
      }
    }
  }
}

void ModuleLowerer::checkRecompute() {
  std::set<std::string> trained; // defs called (at any depth) by a train block
  for (const ir::Function& fn : module_.functions)
    if (fn.kind == ir::Function::Kind::Train)
      for (const ir::DefCall& call : fn.calls)
        trained.insert(call.def);
  if (reporter_.engine().hadError()) return; // a train block with errors lists no calls
  // A def no train block calls has no activations kept for a backward pass: the annotation would
  // silently do nothing, which is the mistake (a misspelt def, a def only programs call).
  for (const auto& [name, def] : globals_.defs)
    if (!trained.count(name)) {
      if (def->isRecompute())
        reporter_.report(def->recomputeLoc, Diag::ErrRecomputeNotTrained, name,
                         "is marked 'recompute'");
      if (globals_.recomputeOption.count(name))
        reporter_.report(llvm::SMLoc(), Diag::ErrRecomputeNotTrained, name,
                         "is named by --recompute");
    }
}

std::optional<ir::Module> ModuleLowerer::run() {
  for (const auto& file : sources_.files) {
    currentFile_ = file.get();
    for (const ast::DeclPtr& decl : file->decls)
      if (decl) collect(*decl);
  }
  applyOptions();
  checkLayout();

  FunctionLowerer lowerer(globals_, reporter_, sm_);
  for (const ast::Decl* decl : functions_) {
    std::optional<ir::Function> fn;
    if (decl->kind == ast::Decl::Kind::Program)
      fn = lowerer.lowerProgram(static_cast<const ast::ProgramDecl&>(*decl));
    else
      fn = lowerer.lowerTrain(static_cast<const ast::TrainDecl&>(*decl));
    if (fn) {
      checkAxisSharing(*fn);
      module_.functions.push_back(std::move(*fn));
    }
  }
  // Local dims of the inlined defs join the module's dims (not those of the defs checked
  // alone below: no function of the module uses them).
  for (const auto& [name, info] : globals_.dims)
    if (info.local) module_.dims[name] = info.size;
  checkParamsAcrossFunctions(module_.functions, reporter_);
  checkStageCounts();
  checkRecompute();
  // Defs that no program or train block inlined are checked on their own (their arguments as
  // inputs), so that their errors are found too.
  for (const auto& file : sources_.files)
    for (const ast::DeclPtr& decl : file->decls)
      if (decl && decl->kind == ast::Decl::Kind::Def)
        if (auto* def = static_cast<const ast::DefDecl*>(decl.get());
            globals_.defs.count(def->name.name) && globals_.defs[def->name.name] == def &&
            !lowerer.wasInlined(*def))
          lowerer.checkDef(*def);
  if (reporter_.engine().hadError()) return std::nullopt;
  return std::move(module_);
}

} // namespace

std::optional<ir::Module> analyze(const SourceSet& sources, DiagEngine& diag,
                                  const SemaOptions& options) {
  return ModuleLowerer(sources, diag, options).run();
}

} // namespace meshc
