// The lexer: turns one SourceMgr buffer into tokens. Never fails: bad characters become
// diagnostics and are skipped.
#pragma once

#include "diag/Diagnostics.h"

#include <llvm/ADT/StringRef.h>

#include <optional>
#include <string>

namespace meshc {

enum class Tok {
  Eof,
  Ident,
  Number,
  String,
  // keywords
  KwImport,
  KwMesh,
  KwDim,
  KwLayout,
  KwAuto,
  KwDef,
  KwProgram,
  KwTrain,
  KwExtern,
  KwParam,
  KwConst,
  KwLet,
  KwReturn,
  KwRepeat,
  KwMinimize,
  KwWith,
  KwF32,
  KwBF16,
  KwF16,
  KwI32,
  // punctuation
  LParen,
  RParen,
  LBracket,
  RBracket,
  LBrace,
  RBrace,
  Comma,
  Colon,
  Semicolon,
  Assign,
  Arrow,
  Plus,
  Minus,
  Star,
  Slash,
  Percent,
  StarStar,
  Lt,
  Le,
  Gt,
  Ge,
  EqEq,
  NotEq,
};

/// A human-readable name of a token kind for diagnostics ("identifier", "'('", ...).
const char* tokName(Tok kind);

struct Token {
  Tok kind = Tok::Eof;
  llvm::StringRef text; // points into the SourceMgr buffer
  llvm::SMLoc loc;
  double number = 0;      // Number
  bool isInteger = false; // Number without '.', exponent
  bool malformed = false; // a Number or String the lexer reported (bad number: value 0)
  std::string string;     // String, unescaped
};

class Lexer {
public:
  Lexer(unsigned bufferId, DiagEngine& diag);
  /// The next token; returns Eof forever at the end.
  Token next();

private:
  void skipSpaceAndComments();
  std::optional<Token> lexToken();
  Token lexNumber();
  Token lexString();

  DiagEngine& diag_;
  const char* cur_;
  const char* end_;
};

} // namespace meshc
