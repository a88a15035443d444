// The recursive-descent parser. Each parse function documents its grammar rule; together they
// are the EBNF of docs/language.md.
#pragma once

#include "diag/Diagnostics.h"
#include "frontend/AST.h"

#include <memory>

namespace meshc {

/// Parses buffer `bufferId` of diag.sources(). Syntax errors are reported and the parser
/// recovers at the next declaration or statement, so one run reports several errors; the
/// returned file holds what parsed. Never null.
std::unique_ptr<ast::File> parseFile(unsigned bufferId, DiagEngine& diag);

} // namespace meshc
