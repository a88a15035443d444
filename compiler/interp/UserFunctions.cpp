#include "interp/UserFunctions.h"

#include <fmt/format.h>
#include <llvm/ADT/SmallString.h>
#include <llvm/Support/DynamicLibrary.h>
#include <llvm/Support/FileSystem.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/Path.h>
#include <llvm/Support/Program.h>
#include <llvm/Support/xxhash.h>

#include <set>

namespace meshc::interp {

std::vector<std::pair<std::string, std::string>> userFunctionsOf(const ir::Module& module) {
  std::set<std::pair<std::string, std::string>> seen;
  std::vector<std::pair<std::string, std::string>> out;
  for (const ir::Function& fn : module.functions)
    for (const ir::Op& op : fn.ops)
      if (op.kind == ir::OpKind::Call) {
        std::pair<std::string, std::string> entry{op.string("function"), op.string("header")};
        if (seen.insert(entry).second) out.push_back(entry);
      }
  return out;
}

namespace {

llvm::Error failure(const std::string& message) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), message);
}

/// The header's absolute path: the wrapper source lives in the cache directory.
std::string headerPath(const UserFunctionBuild& build, const std::string& header) {
  llvm::SmallString<256> path(header);
  if (!llvm::sys::path::is_absolute(header)) {
    path = build.headerDir;
    llvm::sys::path::append(path, header);
  }
  llvm::sys::fs::make_absolute(path);
  return path.str().str();
}

/// The wrapper source: the headers, then one extern "C" function per user function. Arity is
/// the call ops' operand count (sema checked it against the declaration and the header).
std::string wrapperSource(const ir::Module& module, const UserFunctionBuild& build) {
  std::map<std::string, size_t> arity;
  for (const ir::Function& fn : module.functions)
    for (const ir::Op& op : fn.ops)
      if (op.kind == ir::OpKind::Call) arity[op.string("function")] = op.operands.size();
  std::string source;
  std::set<std::string> headers;
  for (const auto& [function, header] : userFunctionsOf(module))
    if (headers.insert(header).second)
      source += fmt::format("#include \"{}\"\n", headerPath(build, header));
  for (const auto& [function, n] : arity) {
    std::vector<std::string> args;
    for (size_t i = 0; i < n; ++i)
      args.push_back(fmt::format("float(args[{}])", i));
    source += fmt::format("extern \"C\" double meshc_user_{0}(const double* args) {{\n  return "
                          "double(::{0}({1}));\n}}\n",
                          function, fmt::join(args, ", "));
  }
  return source;
}

} // namespace

llvm::Expected<UserFunctions> loadUserFunctions(const ir::Module& module,
                                                const UserFunctionBuild& build) {
  UserFunctions functions;
  if (userFunctionsOf(module).empty()) return functions;
  std::string source = wrapperSource(module, build);
  // The cache key covers the wrapper and the headers' text, so an edited header rebuilds.
  std::string key = source;
  for (const auto& [function, header] : userFunctionsOf(module)) {
    auto text = llvm::MemoryBuffer::getFile(headerPath(build, header));
    if (!text) return failure(fmt::format("cannot read '{}'", headerPath(build, header)));
    key += (*text)->getBuffer();
  }
  if (std::error_code ec = llvm::sys::fs::create_directories(build.cacheDir))
    return failure(fmt::format("cannot create '{}': {}", build.cacheDir, ec.message()));
  std::string stem = fmt::format("user-functions-{:016x}", llvm::xxHash64(key));
  llvm::SmallString<256> library(build.cacheDir), cpp(build.cacheDir), log(build.cacheDir);
  llvm::sys::path::append(library, stem + ".so");
  llvm::sys::path::append(cpp, stem + ".cpp");
  llvm::sys::path::append(log, stem + ".log");
  if (!llvm::sys::fs::exists(library)) {
    {
      std::error_code ec;
      llvm::raw_fd_ostream out(cpp, ec);
      if (ec) return failure(fmt::format("cannot write '{}': {}", cpp.str(), ec.message()));
      out << source;
    }
    llvm::ErrorOr<std::string> cxx = llvm::sys::findProgramByName(build.cxx);
    if (!cxx) return failure(fmt::format("C++ compiler '{}' not found", build.cxx));
    std::string partial = library.str().str() + ".tmp";
    std::vector<llvm::StringRef> args = {*cxx, "-std=c++17", "-O1", "-shared", "-fPIC",
                                         "-w", cpp.str(),    "-o",  partial};
    llvm::Optional<llvm::StringRef> redirects[] = {llvm::None, llvm::StringRef(log),
                                                   llvm::StringRef(log)};
    std::string error;
    int rc = llvm::sys::ExecuteAndWait(*cxx, args, llvm::None, redirects, 0, 0, &error);
    if (rc != 0) {
      auto output = llvm::MemoryBuffer::getFile(log);
      return failure(fmt::format("compiling the user functions' headers ({}) failed{}:\n{}",
                                 cpp.str(), error.empty() ? "" : ": " + error,
                                 output ? (*output)->getBuffer().str() : std::string()));
    }
    if (std::error_code ec = llvm::sys::fs::rename(partial, library))
      return failure(fmt::format("cannot write '{}': {}", library.str(), ec.message()));
  }
  std::string error;
  llvm::sys::DynamicLibrary lib =
      llvm::sys::DynamicLibrary::getPermanentLibrary(library.c_str(), &error);
  if (!lib.isValid()) return failure(fmt::format("cannot load '{}': {}", library.str(), error));
  for (const auto& [function, header] : userFunctionsOf(module)) {
    void* symbol = lib.getAddressOfSymbol(("meshc_user_" + function).c_str());
    if (!symbol)
      return failure(fmt::format("'{}' has no wrapper of '{}'", library.str(), function));
    functions.byName[function] = reinterpret_cast<UserFunction>(symbol);
  }
  return functions;
}

} // namespace meshc::interp
