// The textual form of the named-dim IR (`meshc --emit=ir`), compared by the golden tests.
#pragma once

#include "ir/IR.h"

#include <llvm/Support/raw_ostream.h>

namespace meshc::ir {

void printModule(const Module& module, llvm::raw_ostream& os);
void printType(const TensorType& type, llvm::raw_ostream& os);

} // namespace meshc::ir
