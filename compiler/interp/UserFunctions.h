// The user's elementwise C++ functions (`extern def`, the IR's `call` op) for the reference
// interpreter: their headers are compiled by the system C++ compiler into a small shared library
// of `extern "C" double` wrappers (one per function, arguments as an array of doubles) that is
// loaded into the process. Generated code calls the same functions directly.
#pragma once

#include "ir/IR.h"

#include <llvm/Support/Error.h>

#include <map>
#include <string>
#include <vector>

namespace meshc::interp {

/// One user function: converts its double arguments to the C++ parameter types, returns the
/// result as a double.
using UserFunction = double (*)(const double* args);

struct UserFunctions {
  std::map<std::string, UserFunction> byName;
};

struct UserFunctionBuild {
  std::string cxx = "c++"; // the C++ compiler
  std::string headerDir;   // where `call` ops' relative header paths start
  std::string cacheDir;    // the wrapper library is written (and reused) here
};

/// Every `call` op's function and header in `module`: (function, header as the op names it).
std::vector<std::pair<std::string, std::string>> userFunctionsOf(const ir::Module& module);

/// Builds (or reuses from the cache) and loads the wrapper library of every user function of
/// `module`. Fails with the compiler's output when the headers do not compile.
llvm::Expected<UserFunctions> loadUserFunctions(const ir::Module& module,
                                                const UserFunctionBuild& build);

} // namespace meshc::interp
