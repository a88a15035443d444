#include "frontend/Parser.h"

#include "frontend/Lexer.h"

#include <deque>

namespace meshc {

namespace {

using namespace ast;

/// How deep expressions (and, separately, blocks) may nest: bounds the recursion of the parser
/// and of every later pass that walks the AST recursively.
constexpr unsigned kMaxNesting = 256;

/// The recursive-descent parser of one buffer. Parse functions return null / false after
/// reporting a syntax error; the statement and declaration loops then skip to a point where
/// parsing can resume (`syncStmt`, `syncDecl`), so one run reports several errors.
class Parser {
public:
  Parser(unsigned bufferId, DiagEngine& diag) : lexer_(bufferId, diag), diag_(diag) {
    const llvm::MemoryBuffer* buffer = diag.sources().getMemoryBuffer(bufferId);
    prevEnd_ = buffer->getBufferStart();
  }

  std::unique_ptr<File> parseFile();

private:
  // ------------------------------------------------------------ token stream
  const Token& tok() { return peek(0); }
  const Token& peek(size_t n) {
    while (lookahead_.size() <= n)
      lookahead_.push_back(lexer_.next());
    return lookahead_[n];
  }
  bool is(Tok kind) { return tok().kind == kind; }
  Token consume() {
    Token t = peek(0);
    lookahead_.pop_front();
    prevEnd_ = t.text.end();
    ++consumed_;
    return t;
  }
  bool consumeIf(Tok kind) {
    if (!is(kind)) return false;
    consume();
    return true;
  }
  /// Consumes a token of `kind` or reports "expected <what> but found <token>".
  bool expect(Tok kind, const char* what = nullptr) {
    if (consumeIf(kind)) return true;
    return error(what ? what : tokName(kind));
  }
  /// Reports that the current token is not `what`. Always returns false.
  bool error(llvm::StringRef what) {
    diag_.report(tok().loc, Diag::ErrExpected, what, describe(tok()));
    return false;
  }
  static std::string describe(const Token& t) {
    switch (t.kind) {
    case Tok::Ident:
      return fmt::format("identifier '{}'", t.text);
    case Tok::Number:
      return fmt::format("number '{}'", t.text);
    case Tok::String:
      return "string " + t.text.str();
    default:
      return tokName(t.kind);
    }
  }
  /// Whether the current token is the first on its line.
  bool atLineStart() {
    const char* begin = tok().text.begin();
    return llvm::StringRef(prevEnd_, begin - prevEnd_).contains('\n');
  }
  static bool isTopLevelKeyword(Tok kind) {
    switch (kind) {
    case Tok::KwImport:
    case Tok::KwMesh:
    case Tok::KwDim:
    case Tok::KwLayout:
    case Tok::KwDef:
    case Tok::KwProgram:
    case Tok::KwTrain:
    case Tok::KwExtern:
      return true;
    default:
      return false;
    }
  }
  static bool isDType(Tok kind) {
    return kind == Tok::KwF32 || kind == Tok::KwBF16 || kind == Tok::KwF16 || kind == Tok::KwI32;
  }
  /// Left-associative operator chains deepen the AST without recursing here: the chain's
  /// length counts toward the nesting limit too.
  bool chainTooDeep(unsigned length) {
    if (exprDepth_ + length <= kMaxNesting) return false;
    diag_.report(tok().loc, Diag::ErrNestingTooDeep, kMaxNesting);
    return true;
  }
  bool atKeywordArg() { return is(Tok::Ident) && peek(1).kind == Tok::Assign; }
  Ident identFrom(const Token& t) { return Ident{t.text.str(), t.loc}; }
  std::optional<Ident> parseIdent(const char* what) {
    if (!is(Tok::Ident)) {
      error(what);
      return std::nullopt;
    }
    return identFrom(consume());
  }

  // ------------------------------------------------------------ recovery
  void syncDecl(size_t startConsumed);
  void syncStmt(size_t startConsumed);
  void skipBraces();

  // ------------------------------------------------------------ grammar rules
  DeclPtr parseDecl();
  DeclPtr parseImportDecl();
  DeclPtr parseMeshDecl();
  bool parseAxis(MeshDecl& mesh);
  DeclPtr parseDimDecl();
  bool parseSize(const char* what, const Ident& name, int64_t& size, Loc& sizeLoc);
  DeclPtr parseLayoutDecl();
  bool parseLayoutItem(LayoutDecl& layout);
  bool parseAxes(LayoutDecl::Entry& entry);
  DeclPtr parseDefDecl();
  DeclPtr parseRecomputeDefDecl();
  DeclPtr parseProgramDecl();
  DeclPtr parseTrainDecl();
  DeclPtr parseExternDecl();
  bool parseExternParam(ExternDecl& decl);
  bool parseTypedNames(std::vector<TypedName>& names, bool allowEmpty);
  std::optional<TypedName> parseTypedName();
  std::optional<TypeSpec> parseTensorType();
  bool parseDimList(std::vector<Ident>& dims);
  std::optional<DType> parseDType();
  bool parseBlock(std::vector<StmtPtr>& body);
  StmtPtr parseStmt();
  StmtPtr parseLetStmt();
  StmtPtr parseAssignStmt();
  StmtPtr parseParamStmt();
  StmtPtr parseReturnStmt();
  StmtPtr parseRepeatStmt();
  StmtPtr parseMinimizeStmt();
  StmtPtr parseBindResults(Loc loc, bool isLet, Ident first);
  std::optional<std::string> parseTiedPath(ParamStmt& stmt);
  /// `state name:` and `next name =` start step-state statements; `state` and `next` stay
  /// ordinary names elsewhere (`state = x`, `let next = ...`).
  bool atStateDecl() {
    return is(Tok::Ident) && tok().text == "state" && peek(1).kind == Tok::Ident &&
           peek(2).kind == Tok::Colon;
  }
  bool atNextStmt() {
    return is(Tok::Ident) && tok().text == "next" && peek(1).kind == Tok::Ident &&
           peek(2).kind == Tok::Assign;
  }
  StmtPtr parseNextStmt();
  StmtPtr parseDimStmt();
  bool parseDimParams(DefDecl& def);
  ExprPtr parseExpr();
  ExprPtr parseCompare();
  ExprPtr parseAdditive();
  ExprPtr parseTerm();
  ExprPtr parseUnary();
  ExprPtr parsePower();
  ExprPtr parsePrimary();
  std::unique_ptr<CallExpr> parseCall();
  bool parseCallArgs(CallExpr& call);
  bool parseArrowDims(CallExpr& call);
  bool parseKwArg(CallExpr& call);

  /// Counts a nesting level for as long as it lives; `ok` is false past kMaxNesting (reported
  /// once per statement or declaration).
  struct NestingGuard {
    NestingGuard(Parser& parser, unsigned& counter, Diag kind) : depth(counter) {
      ok = ++depth <= kMaxNesting;
      if (!ok) parser.diag_.report(parser.tok().loc, kind, kMaxNesting);
    }
    ~NestingGuard() { --depth; }
    unsigned& depth;
    bool ok;
  };

  Lexer lexer_;
  DiagEngine& diag_;
  std::deque<Token> lookahead_;
  const char* prevEnd_;
  size_t consumed_ = 0;
  unsigned exprDepth_ = 0;
  unsigned blockDepth_ = 0;
};

// ---------------------------------------------------------------- recovery

/// Skips a balanced `{ ... }` starting at the current '{' (iteratively: input may nest deeply).
void Parser::skipBraces() {
  unsigned depth = 0;
  do {
    if (is(Tok::LBrace))
      ++depth;
    else if (is(Tok::RBrace))
      --depth;
    consume();
  } while (depth > 0 && !is(Tok::Eof));
}

/// After a bad declaration: skip to the next top-level keyword.
void Parser::syncDecl(size_t startConsumed) {
  if (consumed_ == startConsumed && !is(Tok::Eof)) consume();
  while (!is(Tok::Eof) && !isTopLevelKeyword(tok().kind) &&
         !(is(Tok::Ident) && tok().text == "recompute" && peek(1).kind == Tok::KwDef))
    consume();
}

/// After a bad statement: skip to the next statement start (a statement keyword, or an
/// identifier followed by '=' at the start of a line), past a ';', or to the '}' closing the
/// block or the next top-level keyword. Always makes progress.
void Parser::syncStmt(size_t startConsumed) {
  if (consumed_ == startConsumed && !is(Tok::Eof) && !is(Tok::RBrace) &&
      !isTopLevelKeyword(tok().kind)) {
    if (is(Tok::LBrace))
      skipBraces();
    else
      consume();
  }
  for (;;) {
    switch (tok().kind) {
    case Tok::Eof:
    case Tok::RBrace:
    case Tok::KwLet:
    case Tok::KwParam:
    case Tok::KwConst:
    case Tok::KwReturn:
    case Tok::KwRepeat:
    case Tok::KwMinimize:
    case Tok::KwDim:
      return;
    case Tok::Semicolon:
      consume();
      return;
    case Tok::LBrace:
      skipBraces();
      break;
    case Tok::Ident:
      if (atLineStart() && peek(1).kind == Tok::Assign) return;
      consume();
      break;
    default:
      if (isTopLevelKeyword(tok().kind)) return;
      consume();
      break;
    }
  }
}

// ---------------------------------------------------------------- declarations

/// file ::= { decl }
std::unique_ptr<File> Parser::parseFile() {
  auto file = std::make_unique<File>();
  while (!is(Tok::Eof)) {
    size_t start = consumed_;
    if (DeclPtr decl = parseDecl())
      file->decls.push_back(std::move(decl));
    else
      syncDecl(start);
  }
  return file;
}

/// decl ::= importDecl | meshDecl | dimDecl | layoutDecl | defDecl | programDecl | trainDecl
///        | externDecl
DeclPtr Parser::parseDecl() {
  switch (tok().kind) {
  case Tok::Ident:
    if (tok().text == "recompute") return parseRecomputeDefDecl();
    error("a declaration (import, mesh, dim, layout, def, program, train or extern)");
    return nullptr;
  case Tok::KwImport:
    return parseImportDecl();
  case Tok::KwMesh:
    return parseMeshDecl();
  case Tok::KwDim:
    return parseDimDecl();
  case Tok::KwLayout:
    return parseLayoutDecl();
  case Tok::KwDef:
    return parseDefDecl();
  case Tok::KwProgram:
    return parseProgramDecl();
  case Tok::KwTrain:
    return parseTrainDecl();
  case Tok::KwExtern:
    return parseExternDecl();
  default:
    error("a declaration (import, mesh, dim, layout, def, program, train or extern)");
    return nullptr;
  }
}

/// importDecl ::= 'import' STRING
DeclPtr Parser::parseImportDecl() {
  auto decl = std::make_unique<ImportDecl>(consume().loc);
  if (!is(Tok::String)) {
    error("a file name string");
    return nullptr;
  }
  Token path = consume();
  if (path.malformed) // reported by the lexer; do not try to open a mangled path
    return nullptr;
  decl->path = path.string;
  decl->pathLoc = path.loc;
  return decl;
}

/// meshDecl ::= 'mesh' IDENT '[' axis { ',' axis } ']'
DeclPtr Parser::parseMeshDecl() {
  auto decl = std::make_unique<MeshDecl>(consume().loc);
  std::optional<Ident> name = parseIdent("a mesh name");
  if (!name || !expect(Tok::LBracket)) return nullptr;
  decl->name = std::move(*name);
  do {
    if (!parseAxis(*decl)) return nullptr;
  } while (consumeIf(Tok::Comma));
  if (!expect(Tok::RBracket, "',' or ']'")) return nullptr;
  return decl;
}

/// axis ::= IDENT '=' INTEGER
bool Parser::parseAxis(MeshDecl& mesh) {
  MeshDecl::Axis axis;
  std::optional<Ident> name = parseIdent("an axis name");
  if (!name || !expect(Tok::Assign)) return false;
  axis.name = std::move(*name);
  if (!parseSize("axis", axis.name, axis.size, axis.sizeLoc)) return false;
  mesh.axes.push_back(std::move(axis));
  return true;
}

/// dimDecl ::= 'dim' IDENT '=' INTEGER
DeclPtr Parser::parseDimDecl() {
  auto decl = std::make_unique<DimDecl>(consume().loc);
  std::optional<Ident> name = parseIdent("a dim name");
  if (!name || !expect(Tok::Assign)) return nullptr;
  decl->name = std::move(*name);
  if (!parseSize("dim", decl->name, decl->size, decl->sizeLoc)) return nullptr;
  return decl;
}

/// The INTEGER size of a dim or mesh axis: a positive integer (`-4` is read whole to name it).
bool Parser::parseSize(const char* what, const Ident& name, int64_t& size, Loc& sizeLoc) {
  sizeLoc = tok().loc;
  if (is(Tok::Minus) && peek(1).kind == Tok::Number) {
    const char* begin = consume().text.begin();
    Token number = consume();
    if (!number.malformed)
      diag_.report(sizeLoc, Diag::ErrBadSize, what, name.name,
                   llvm::StringRef(begin, number.text.end() - begin));
    return false;
  }
  if (!is(Tok::Number)) return error("an integer size");
  Token number = consume();
  if (number.malformed) // already reported by the lexer
    return false;
  if (!number.isInteger || number.text.getAsInteger(10, size) || size <= 0) {
    diag_.report(number.loc, Diag::ErrBadSize, what, name.name, number.text);
    return false;
  }
  return true;
}

/// layoutDecl ::= 'layout' layoutItem { ',' layoutItem }
DeclPtr Parser::parseLayoutDecl() {
  auto decl = std::make_unique<LayoutDecl>(consume().loc);
  do {
    if (!parseLayoutItem(*decl)) return nullptr;
  } while (consumeIf(Tok::Comma));
  return decl;
}

/// layoutItem ::= 'auto' | IDENT ':' axes
bool Parser::parseLayoutItem(LayoutDecl& layout) {
  if (is(Tok::KwAuto)) {
    layout.autoLoc = consume().loc;
    layout.autoRest = true;
    return true;
  }
  if (!is(Tok::Ident)) return error("a layout item ('dim: axes' or 'auto')");
  LayoutDecl::Entry entry;
  entry.dim = identFrom(consume());
  if (!expect(Tok::Colon) || !parseAxes(entry)) return false;
  layout.entries.push_back(std::move(entry));
  return true;
}

/// axes ::= IDENT [ '(' INTEGER { ',' INTEGER } ')' ] | 'auto' | '[' [ IDENT { ',' IDENT } ] ']'
/// (the counts: a repeat's layers per pipeline stage, pinned)
bool Parser::parseAxes(LayoutDecl::Entry& entry) {
  if (is(Tok::Ident)) {
    entry.axes.push_back(identFrom(consume()));
    if (!is(Tok::LParen)) return true;
    entry.splitLoc = consume().loc;
    do {
      int64_t layers = 0;
      if (is(Tok::Number) && tok().malformed) return false; // already reported by the lexer
      if (!is(Tok::Number) || !tok().isInteger || tok().text.getAsInteger(10, layers))
        return error("a layer count");
      consume();
      entry.split.push_back(layers);
    } while (consumeIf(Tok::Comma));
    return expect(Tok::RParen, "',' or ')'");
  }
  if (consumeIf(Tok::KwAuto)) {
    entry.isAuto = true;
    return true;
  }
  if (!is(Tok::LBracket)) return error("a mesh axis, '[' or 'auto'");
  consume();
  if (consumeIf(Tok::RBracket)) return true;
  do {
    std::optional<Ident> axis = parseIdent("a mesh axis");
    if (!axis) return false;
    entry.axes.push_back(std::move(*axis));
  } while (consumeIf(Tok::Comma));
  return expect(Tok::RBracket, "',' or ']'");
}

/// defDecl ::= 'def' IDENT [ dimParams ] '(' [ typedName { ',' typedName } ] ')' '->' defResults
///             block
/// defResults ::= tensorType | '(' typedName { ',' typedName } ')'
DeclPtr Parser::parseDefDecl() {
  auto decl = std::make_unique<DefDecl>(consume().loc);
  std::optional<Ident> name = parseIdent("a def name");
  if (!name || (is(Tok::LBracket) && !parseDimParams(*decl)) ||
      !parseTypedNames(decl->args, /*allowEmpty=*/true) || !expect(Tok::Arrow))
    return nullptr;
  decl->name = std::move(*name);
  if (is(Tok::LParen)) {
    if (!parseTypedNames(decl->results, /*allowEmpty=*/false)) return nullptr;
    decl->result = decl->results.front().type;
  } else {
    std::optional<TypeSpec> result = parseTensorType();
    if (!result) return nullptr;
    decl->result = std::move(*result);
  }
  if (!parseBlock(decl->body)) return nullptr;
  return decl;
}

/// defDecl ::= 'recompute' 'def' ...
/// `recompute` (an identifier elsewhere) marks a def whose calls in train blocks keep no
/// activations for backward: the backward recomputes them from the call's inputs.
DeclPtr Parser::parseRecomputeDefDecl() {
  Loc annotation = consume().loc;
  if (!is(Tok::KwDef)) {
    error("'def' after 'recompute'");
    return nullptr;
  }
  DeclPtr decl = parseDefDecl();
  if (decl) static_cast<DefDecl&>(*decl).recomputeLoc = annotation;
  return decl;
}

/// dimParams ::= '[' IDENT { ',' IDENT } ']'
/// The dims a generic def is written over; each call binds them to dims of the caller.
bool Parser::parseDimParams(DefDecl& def) {
  consume(); // '['
  do {
    std::optional<Ident> dim = parseIdent("a dim parameter name");
    if (!dim) return false;
    def.dimParams.push_back(std::move(*dim));
  } while (consumeIf(Tok::Comma));
  return expect(Tok::RBracket, "',' or ']'");
}

/// programDecl ::= 'program' IDENT '(' [ typedName { ',' typedName } ] ')'
///                 '->' '(' typedName { ',' typedName } ')' block
DeclPtr Parser::parseProgramDecl() {
  auto decl = std::make_unique<ProgramDecl>(consume().loc);
  std::optional<Ident> name = parseIdent("a program name");
  if (!name || !parseTypedNames(decl->inputs, /*allowEmpty=*/true) || !expect(Tok::Arrow) ||
      !parseTypedNames(decl->outputs, /*allowEmpty=*/false) || !parseBlock(decl->body))
    return nullptr;
  decl->name = std::move(*name);
  return decl;
}

/// trainDecl ::= 'train' IDENT '(' [ typedName { ',' typedName } ] ')'
///                [ '->' '(' typedName { ',' typedName } ')' ] block
DeclPtr Parser::parseTrainDecl() {
  auto decl = std::make_unique<TrainDecl>(consume().loc);
  std::optional<Ident> name = parseIdent("a train block name");
  if (!name || !parseTypedNames(decl->inputs, /*allowEmpty=*/true)) return nullptr;
  if (consumeIf(Tok::Arrow) && !parseTypedNames(decl->metrics, /*allowEmpty=*/false))
    return nullptr;
  if (!parseBlock(decl->body)) return nullptr;
  decl->name = std::move(*name);
  return decl;
}

/// externDecl ::= 'extern' 'def' IDENT '(' [ externParam { ',' externParam } ] ')' '->' dtype
///                'from' STRING
/// (`from` is matched as an identifier, so it stays usable as a name elsewhere.)
DeclPtr Parser::parseExternDecl() {
  auto decl = std::make_unique<ExternDecl>(consume().loc);
  if (!expect(Tok::KwDef)) return nullptr;
  std::optional<Ident> name = parseIdent("an extern function name");
  if (!name || !expect(Tok::LParen)) return nullptr;
  decl->name = std::move(*name);
  if (!consumeIf(Tok::RParen)) {
    do {
      if (!parseExternParam(*decl)) return nullptr;
    } while (consumeIf(Tok::Comma));
    if (!expect(Tok::RParen, "',' or ')'")) return nullptr;
  }
  if (!expect(Tok::Arrow)) return nullptr;
  decl->resultLoc = tok().loc;
  std::optional<DType> result = parseDType();
  if (!result) return nullptr;
  decl->result = *result;
  if (!is(Tok::Ident) || tok().text != "from") {
    error("'from' and the C++ header that implements the function");
    return nullptr;
  }
  consume();
  if (!is(Tok::String)) {
    error("a header file name string");
    return nullptr;
  }
  Token header = consume();
  if (header.malformed) return nullptr; // reported by the lexer
  decl->header = header.string;
  decl->headerLoc = header.loc;
  return decl;
}

/// externParam ::= IDENT ':' dtype
bool Parser::parseExternParam(ExternDecl& decl) {
  std::optional<Ident> name = parseIdent("a parameter name");
  if (!name || !expect(Tok::Colon)) return false;
  Loc dtypeLoc = tok().loc;
  std::optional<DType> dtype = parseDType();
  if (!dtype) return false;
  decl.params.push_back({std::move(*name), *dtype, dtypeLoc});
  return true;
}

/// The parenthesized signature lists of defDecl, programDecl and trainDecl:
///   '(' [ typedName { ',' typedName } ] ')'   (the brackets optional only when `allowEmpty`)
bool Parser::parseTypedNames(std::vector<TypedName>& names, bool allowEmpty) {
  if (!expect(Tok::LParen)) return false;
  if (allowEmpty && consumeIf(Tok::RParen)) return true;
  do {
    std::optional<TypedName> name = parseTypedName();
    if (!name) return false;
    names.push_back(std::move(*name));
  } while (consumeIf(Tok::Comma));
  return expect(Tok::RParen, "',' or ')'");
}

/// typedName ::= IDENT ':' tensorType
std::optional<TypedName> Parser::parseTypedName() {
  std::optional<Ident> name = parseIdent("a name");
  if (!name || !expect(Tok::Colon)) return std::nullopt;
  std::optional<TypeSpec> type = parseTensorType();
  if (!type) return std::nullopt;
  return TypedName{std::move(*name), std::move(*type)};
}

/// tensorType ::= dtype '[' [ IDENT { ',' IDENT } ] ']'
std::optional<TypeSpec> Parser::parseTensorType() {
  TypeSpec type;
  type.loc = tok().loc;
  std::optional<DType> dtype = parseDType();
  if (!dtype) return std::nullopt;
  type.dtype = *dtype;
  type.hasShape = true;
  if (!is(Tok::LBracket)) {
    error("'[' after the dtype");
    return std::nullopt;
  }
  if (!parseDimList(type.dims)) return std::nullopt;
  return type;
}

/// The dim list of tensorType and of a type in expressions: '[' [ IDENT { ',' IDENT } ] ']'
bool Parser::parseDimList(std::vector<Ident>& dims) {
  if (!expect(Tok::LBracket)) return false;
  if (consumeIf(Tok::RBracket)) return true;
  do {
    std::optional<Ident> dim = parseIdent("a dim name");
    if (!dim) return false;
    dims.push_back(std::move(*dim));
  } while (consumeIf(Tok::Comma));
  return expect(Tok::RBracket, "',' or ']'");
}

/// dtype ::= 'f32' | 'bf16' | 'f16' | 'i32'
std::optional<DType> Parser::parseDType() {
  switch (tok().kind) {
  case Tok::KwF32:
    consume();
    return DType::F32;
  case Tok::KwBF16:
    consume();
    return DType::BF16;
  case Tok::KwF16:
    consume();
    return DType::F16;
  case Tok::KwI32:
    consume();
    return DType::I32;
  default:
    error("a dtype (f32, bf16, f16 or i32)");
    return std::nullopt;
  }
}

// ---------------------------------------------------------------- statements

/// block ::= '{' { stmt [ ';' ] } '}'
/// A bad statement is skipped (syncStmt) and the block goes on; returns false only when the
/// block itself is malformed (no '{', no '}' or nested too deeply). `dim` starts a statement
/// inside a block (a local dim), every other top-level keyword ends the block.
bool Parser::parseBlock(std::vector<StmtPtr>& body) {
  NestingGuard guard(*this, blockDepth_, Diag::ErrBlocksTooDeep);
  if (!guard.ok || !expect(Tok::LBrace)) return false;
  bool recovering = false;
  while (!is(Tok::RBrace)) {
    if (is(Tok::Eof) || (isTopLevelKeyword(tok().kind) && !is(Tok::KwDim))) {
      // After a bad statement the missing '}' is most likely a consequence: stay quiet.
      return recovering ? false : error("'}'");
    }
    size_t start = consumed_;
    if (StmtPtr stmt = parseStmt()) {
      body.push_back(std::move(stmt));
      consumeIf(Tok::Semicolon);
      recovering = false;
    } else {
      syncStmt(start);
      recovering = true;
    }
  }
  consume();
  return true;
}

/// stmt ::= letStmt | assignStmt | paramStmt | nextStmt | returnStmt | repeatStmt | minimizeStmt
///        | dimStmt
StmtPtr Parser::parseStmt() {
  switch (tok().kind) {
  case Tok::KwDim:
    return parseDimStmt();
  case Tok::KwLet:
    return parseLetStmt();
  case Tok::KwParam:
  case Tok::KwConst:
    return parseParamStmt();
  case Tok::KwReturn:
    return parseReturnStmt();
  case Tok::KwRepeat:
    return parseRepeatStmt();
  case Tok::KwMinimize:
    return parseMinimizeStmt();
  case Tok::Ident:
    if (atStateDecl()) return parseParamStmt();
    if (atNextStmt()) return parseNextStmt();
    return parseAssignStmt();
  default:
    error("a statement (let, param, const, return, repeat, minimize, dim or 'name = ...')");
    return nullptr;
  }
}

/// letStmt ::= 'let' IDENT [ ':' tensorType ] '=' expr | 'let' bindResults
StmtPtr Parser::parseLetStmt() {
  auto stmt = std::make_unique<LetStmt>(consume().loc);
  std::optional<Ident> name = parseIdent("a name");
  if (!name) return nullptr;
  if (is(Tok::Comma)) return parseBindResults(stmt->loc, /*isLet=*/true, std::move(*name));
  stmt->name = std::move(*name);
  if (consumeIf(Tok::Colon)) {
    stmt->type = parseTensorType();
    if (!stmt->type) return nullptr;
  }
  if (!expect(Tok::Assign, stmt->type ? "'='" : "':' or '='")) return nullptr;
  stmt->value = parseExpr();
  if (!stmt->value) return nullptr;
  return stmt;
}

/// assignStmt ::= IDENT '=' expr | bindResults
StmtPtr Parser::parseAssignStmt() {
  auto stmt = std::make_unique<AssignStmt>(tok().loc);
  stmt->name = identFrom(consume());
  if (is(Tok::Comma)) return parseBindResults(stmt->loc, /*isLet=*/false, std::move(stmt->name));
  if (!expect(Tok::Assign)) return nullptr;
  stmt->value = parseExpr();
  if (!stmt->value) return nullptr;
  return stmt;
}

/// paramStmt ::= ( 'param' | 'const' | 'state' ) IDENT ':' tensorType '=' call
StmtPtr Parser::parseParamStmt() {
  Token keyword = consume();
  Stmt::Kind kind = keyword.kind == Tok::KwParam   ? Stmt::Kind::Param
                    : keyword.kind == Tok::KwConst ? Stmt::Kind::Const
                                                   : Stmt::Kind::State; // `state` (an Ident)
  auto stmt = std::make_unique<ParamStmt>(kind, keyword.loc);
  std::optional<Ident> name = parseIdent("a name");
  if (!name || !expect(Tok::Colon)) return nullptr;
  stmt->name = std::move(*name);
  std::optional<TypeSpec> type = parseTensorType();
  if (!type || !expect(Tok::Assign)) return nullptr;
  stmt->type = std::move(*type);
  if (!is(Tok::Ident) || peek(1).kind != Tok::LParen) {
    error("an initializer call such as 'normal(stddev = 0.02)'");
    return nullptr;
  }
  stmt->init = parseCall();
  if (!stmt->init) return nullptr;
  // `as` starts the next statement when it is a name being assigned (`as = ...`, `as, b = ...`).
  bool tied = is(Tok::Ident) && tok().text == "as" && peek(1).kind != Tok::Assign &&
              peek(1).kind != Tok::Comma;
  if (tied && !parseTiedPath(*stmt)) return nullptr;
  return stmt;
}

/// nextStmt ::= 'next' IDENT '=' expr   (`next` is matched as an identifier)
StmtPtr Parser::parseNextStmt() {
  auto stmt = std::make_unique<NextStmt>(consume().loc);
  stmt->name = identFrom(consume());
  consume(); // '='
  stmt->value = parseExpr();
  if (!stmt->value) return nullptr;
  return stmt;
}

/// bindResults ::= IDENT ',' IDENT { ',' IDENT } '=' expr   (after the first IDENT)
StmtPtr Parser::parseBindResults(Loc loc, bool isLet, Ident first) {
  auto stmt = std::make_unique<BindResultsStmt>(loc);
  stmt->isLet = isLet;
  stmt->names.push_back(std::move(first));
  while (consumeIf(Tok::Comma)) {
    std::optional<Ident> name = parseIdent("a name (or '_')");
    if (!name) return nullptr;
    stmt->names.push_back(std::move(*name));
  }
  if (!expect(Tok::Assign, "',' or '='")) return nullptr;
  stmt->value = parseExpr();
  if (!stmt->value) return nullptr;
  return stmt;
}

/// tiedPath ::= 'as' STRING   (after a param's initializer; `as` is matched as an identifier)
std::optional<std::string> Parser::parseTiedPath(ParamStmt& stmt) {
  consume();
  if (!is(Tok::String)) {
    error("a param path string after 'as'");
    return std::nullopt;
  }
  Token path = consume();
  if (path.malformed) return std::nullopt; // reported by the lexer
  stmt.tiedPath = path.string;
  stmt.tiedPathLoc = path.loc;
  return stmt.tiedPath;
}

/// returnStmt ::= 'return' expr { ',' expr }
StmtPtr Parser::parseReturnStmt() {
  auto stmt = std::make_unique<ReturnStmt>(consume().loc);
  stmt->value = parseExpr();
  if (!stmt->value) return nullptr;
  while (consumeIf(Tok::Comma)) {
    ExprPtr next = parseExpr();
    if (!next) return nullptr;
    stmt->rest.push_back(std::move(next));
  }
  return stmt;
}

/// repeatStmt ::= 'repeat' ( INTEGER | IDENT ) [ 'shared' ] block
/// (`shared` is matched as an identifier, so it stays usable as a name elsewhere.)
StmtPtr Parser::parseRepeatStmt() {
  auto stmt = std::make_unique<RepeatStmt>(consume().loc);
  if (is(Tok::Number) && tok().isInteger && !tok().malformed) {
    Token count = consume();
    stmt->count = std::make_unique<NumberExpr>(count.loc, count.number, true);
  } else if (is(Tok::Ident)) {
    Token count = consume();
    stmt->count = std::make_unique<NameExpr>(count.loc, count.text.str());
  } else {
    if (!tok().malformed) error("a repeat count (an integer or a dim name)");
    return nullptr;
  }
  if (is(Tok::Ident) && tok().text == "shared") {
    consume();
    stmt->shared = true;
  }
  if (!parseBlock(stmt->body)) return nullptr;
  return stmt;
}

/// minimizeStmt ::= 'minimize' expr 'with' call
StmtPtr Parser::parseMinimizeStmt() {
  auto stmt = std::make_unique<MinimizeStmt>(consume().loc);
  stmt->loss = parseExpr();
  if (!stmt->loss || !expect(Tok::KwWith)) return nullptr;
  if (!is(Tok::Ident) || peek(1).kind != Tok::LParen) {
    error("an optimizer call such as 'adamw(lr = 0.001)'");
    return nullptr;
  }
  stmt->optimizer = parseCall();
  if (!stmt->optimizer) return nullptr;
  return stmt;
}

/// dimStmt ::= 'dim' IDENT '=' expr
/// A local dim; sema evaluates the expression as a constant (numbers, size(dim), arithmetic).
StmtPtr Parser::parseDimStmt() {
  auto stmt = std::make_unique<DimStmt>(consume().loc);
  std::optional<Ident> name = parseIdent("a dim name");
  if (!name || !expect(Tok::Assign)) return nullptr;
  stmt->name = std::move(*name);
  stmt->size = parseExpr();
  if (!stmt->size) return nullptr;
  return stmt;
}

// ---------------------------------------------------------------- expressions

/// expr ::= compare
ExprPtr Parser::parseExpr() {
  NestingGuard guard(*this, exprDepth_, Diag::ErrNestingTooDeep);
  if (!guard.ok) return nullptr;
  return parseCompare();
}

static std::optional<BinaryOp> compareOp(Tok kind) {
  switch (kind) {
  case Tok::Lt:
    return BinaryOp::Lt;
  case Tok::Le:
    return BinaryOp::Le;
  case Tok::Gt:
    return BinaryOp::Gt;
  case Tok::Ge:
    return BinaryOp::Ge;
  case Tok::EqEq:
    return BinaryOp::Eq;
  case Tok::NotEq:
    return BinaryOp::Ne;
  default:
    return std::nullopt;
  }
}

static ExprPtr makeBinary(BinaryOp op, Loc opLoc, ExprPtr lhs, ExprPtr rhs) {
  Loc loc = lhs->loc;
  auto binary = std::make_unique<BinaryExpr>(loc, op, std::move(lhs), std::move(rhs));
  binary->opLoc = opLoc;
  return binary;
}

/// compare ::= additive [ ( '<' | '<=' | '>' | '>=' | '==' | '!=' ) additive ]
ExprPtr Parser::parseCompare() {
  ExprPtr lhs = parseAdditive();
  if (!lhs) return nullptr;
  std::optional<BinaryOp> op = compareOp(tok().kind);
  if (!op) return lhs;
  Loc opLoc = consume().loc;
  ExprPtr rhs = parseAdditive();
  if (!rhs) return nullptr;
  return makeBinary(*op, opLoc, std::move(lhs), std::move(rhs));
}

/// additive ::= term { ( '+' | '-' ) term }
ExprPtr Parser::parseAdditive() {
  ExprPtr lhs = parseTerm();
  for (unsigned length = 1; lhs && (is(Tok::Plus) || is(Tok::Minus)); ++length) {
    if (chainTooDeep(length)) return nullptr;
    Token op = consume();
    ExprPtr rhs = parseTerm();
    if (!rhs) return nullptr;
    lhs = makeBinary(op.kind == Tok::Plus ? BinaryOp::Add : BinaryOp::Sub, op.loc, std::move(lhs),
                     std::move(rhs));
  }
  return lhs;
}

/// term ::= unary { ( '*' | '/' | '%' ) unary }
ExprPtr Parser::parseTerm() {
  ExprPtr lhs = parseUnary();
  for (unsigned length = 1; lhs && (is(Tok::Star) || is(Tok::Slash) || is(Tok::Percent));
       ++length) {
    if (chainTooDeep(length)) return nullptr;
    Token op = consume();
    ExprPtr rhs = parseUnary();
    if (!rhs) return nullptr;
    BinaryOp kind = op.kind == Tok::Star    ? BinaryOp::Mul
                    : op.kind == Tok::Slash ? BinaryOp::Div
                                            : BinaryOp::Mod;
    lhs = makeBinary(kind, op.loc, std::move(lhs), std::move(rhs));
  }
  return lhs;
}

/// unary ::= '-' unary | power
ExprPtr Parser::parseUnary() {
  NestingGuard guard(*this, exprDepth_, Diag::ErrNestingTooDeep);
  if (!guard.ok) return nullptr;
  if (!is(Tok::Minus)) return parsePower();
  Loc loc = consume().loc;
  ExprPtr operand = parseUnary();
  if (!operand) return nullptr;
  return std::make_unique<UnaryExpr>(loc, UnaryOp::Neg, std::move(operand));
}

/// power ::= primary [ '**' unary ]
ExprPtr Parser::parsePower() {
  ExprPtr base = parsePrimary();
  if (!base || !is(Tok::StarStar)) return base;
  Loc opLoc = consume().loc;
  ExprPtr exponent = parseUnary();
  if (!exponent) return nullptr;
  return makeBinary(BinaryOp::Pow, opLoc, std::move(base), std::move(exponent));
}

/// primary ::= NUMBER | IDENT | call | '(' expr ')' | '[' [ expr { ',' expr } ] ']'
///           | dtype [ '[' [ IDENT { ',' IDENT } ] ']' ]
ExprPtr Parser::parsePrimary() {
  switch (tok().kind) {
  case Tok::Number: {
    Token number = consume();
    if (number.malformed) // already reported by the lexer
      return nullptr;
    return std::make_unique<NumberExpr>(number.loc, number.number, number.isInteger);
  }
  case Tok::Ident: {
    if (peek(1).kind == Tok::LParen || peek(1).kind == Tok::LBracket) return parseCall();
    Token name = consume();
    return std::make_unique<NameExpr>(name.loc, name.text.str());
  }
  case Tok::LParen: {
    consume();
    ExprPtr inner = parseExpr();
    if (!inner || !expect(Tok::RParen)) return nullptr;
    return inner;
  }
  case Tok::LBracket: {
    auto list = std::make_unique<ListExpr>(consume().loc);
    if (consumeIf(Tok::RBracket)) return list;
    do {
      ExprPtr element = parseExpr();
      if (!element) return nullptr;
      list->elements.push_back(std::move(element));
    } while (consumeIf(Tok::Comma));
    if (!expect(Tok::RBracket, "',' or ']'")) return nullptr;
    return list;
  }
  default:
    if (isDType(tok().kind)) {
      TypeSpec type;
      type.loc = tok().loc;
      type.dtype = *parseDType();
      if (is(Tok::LBracket)) {
        type.hasShape = true;
        if (!parseDimList(type.dims)) return nullptr;
      }
      Loc loc = type.loc;
      return std::make_unique<TypeExpr>(loc, std::move(type));
    }
    error("an expression");
    return nullptr;
  }
}

/// call ::= IDENT [ '[' [ IDENT { ',' IDENT } ] ']' ] '(' [ callArgs ] ')'
/// The bracketed dims bind a generic def's dim parameters explicitly (`attention[dec, enc](x, m)`).
std::unique_ptr<CallExpr> Parser::parseCall() {
  auto call = std::make_unique<CallExpr>(tok().loc, identFrom(tok()));
  consume();
  if (is(Tok::LBracket)) {
    call->hasDimArgs = true;
    if (!parseDimList(call->dimArgs)) return nullptr;
  }
  if (!expect(Tok::LParen)) return nullptr;
  if (consumeIf(Tok::RParen)) return call;
  if (!parseCallArgs(*call) || !expect(Tok::RParen, "',' or ')'")) return nullptr;
  return call;
}

/// callArgs ::= kwArgs
///            | expr { ',' expr } [ '->' IDENT { ',' IDENT } ] [ ',' kwArgs ]
/// kwArgs   ::= IDENT '=' expr { ',' IDENT '=' expr }
/// The arrow list may also follow the keyword arguments, as in the builtin table's
/// `concat(x, y, along = [dx, dy] -> e)`; there is at most one arrow list.
bool Parser::parseCallArgs(CallExpr& call) {
  bool inKwArgs = atKeywordArg();
  if (!inKwArgs) {
    do {
      if (atKeywordArg()) {
        inKwArgs = true;
        break;
      }
      ExprPtr arg = parseExpr();
      if (!arg) return false;
      call.args.push_back(std::move(arg));
    } while (consumeIf(Tok::Comma));
    if (is(Tok::Arrow)) {
      if (!parseArrowDims(call)) return false;
      if (!consumeIf(Tok::Comma)) return true;
      inKwArgs = true;
    }
  }
  if (!inKwArgs) return true;
  do {
    if (!parseKwArg(call)) return false;
  } while (consumeIf(Tok::Comma));
  if (is(Tok::Arrow) && !call.hasArrow) {
    if (!parseArrowDims(call)) return false;
    if (consumeIf(Tok::Comma)) {
      do {
        if (!parseKwArg(call)) return false;
      } while (consumeIf(Tok::Comma));
    }
  }
  return true;
}

/// The output dims of a call: '->' IDENT { ',' IDENT }, ending before ', IDENT =' (kwArgs).
bool Parser::parseArrowDims(CallExpr& call) {
  call.hasArrow = true;
  call.arrowLoc = consume().loc;
  for (;;) {
    std::optional<Ident> dim = parseIdent("an output dim name");
    if (!dim) return false;
    call.arrowDims.push_back(std::move(*dim));
    if (!is(Tok::Comma) || (peek(1).kind == Tok::Ident && peek(2).kind == Tok::Assign)) return true;
    consume();
  }
}

/// One keyword argument of kwArgs: IDENT '=' expr
bool Parser::parseKwArg(CallExpr& call) {
  if (!atKeywordArg()) return error("a keyword argument 'name = value'");
  KeywordArg arg;
  arg.name = identFrom(consume());
  consume(); // '='
  arg.value = parseExpr();
  if (!arg.value) return false;
  call.kwargs.push_back(std::move(arg));
  return true;
}

} // namespace

std::unique_ptr<ast::File> parseFile(unsigned bufferId, DiagEngine& diag) {
  std::unique_ptr<ast::File> file = Parser(bufferId, diag).parseFile();
  file->bufferId = bufferId;
  file->path = diag.sources().getMemoryBuffer(bufferId)->getBufferIdentifier().str();
  return file;
}

} // namespace meshc
