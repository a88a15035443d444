// Reads the textual IR printed by printModule back into a Module, so tests and later phases can
// start from IR text (`meshc file.ir`). printModule(parseModule(text)) == text for printed IR.
#pragma once

#include "ir/IR.h"

#include <llvm/ADT/StringRef.h>
#include <llvm/Support/Error.h>

namespace meshc::ir {

/// Parses IR text; errors name the line and column of the IR text.
llvm::Expected<Module> parseModule(llvm::StringRef text, llvm::StringRef bufferName = "<ir>");

} // namespace meshc::ir
