// A readable dump of the AST (`meshc --emit=ast`), with line:col of every node.
#pragma once

#include "frontend/AST.h"

#include <llvm/Support/SourceMgr.h>
#include <llvm/Support/raw_ostream.h>

namespace meshc {

void printAST(const ast::File& file, const llvm::SourceMgr& sources, llvm::raw_ostream& os);

} // namespace meshc
