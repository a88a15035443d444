#include "frontend/Lexer.h"

#include <llvm/ADT/StringExtras.h>
#include <llvm/ADT/StringSwitch.h>
#include <llvm/Support/ConvertUTF.h>

#include <cmath>

namespace meshc {

const char* tokName(Tok kind) {
  switch (kind) {
  case Tok::Eof:
    return "end of file";
  case Tok::Ident:
    return "identifier";
  case Tok::Number:
    return "number";
  case Tok::String:
    return "string";
  case Tok::KwImport:
    return "'import'";
  case Tok::KwMesh:
    return "'mesh'";
  case Tok::KwDim:
    return "'dim'";
  case Tok::KwLayout:
    return "'layout'";
  case Tok::KwAuto:
    return "'auto'";
  case Tok::KwDef:
    return "'def'";
  case Tok::KwProgram:
    return "'program'";
  case Tok::KwTrain:
    return "'train'";
  case Tok::KwExtern:
    return "'extern'";
  case Tok::KwParam:
    return "'param'";
  case Tok::KwConst:
    return "'const'";
  case Tok::KwLet:
    return "'let'";
  case Tok::KwReturn:
    return "'return'";
  case Tok::KwRepeat:
    return "'repeat'";
  case Tok::KwMinimize:
    return "'minimize'";
  case Tok::KwWith:
    return "'with'";
  case Tok::KwF32:
    return "'f32'";
  case Tok::KwBF16:
    return "'bf16'";
  case Tok::KwF16:
    return "'f16'";
  case Tok::KwI32:
    return "'i32'";
  case Tok::LParen:
    return "'('";
  case Tok::RParen:
    return "')'";
  case Tok::LBracket:
    return "'['";
  case Tok::RBracket:
    return "']'";
  case Tok::LBrace:
    return "'{'";
  case Tok::RBrace:
    return "'}'";
  case Tok::Comma:
    return "','";
  case Tok::Colon:
    return "':'";
  case Tok::Semicolon:
    return "';'";
  case Tok::Assign:
    return "'='";
  case Tok::Arrow:
    return "'->'";
  case Tok::Plus:
    return "'+'";
  case Tok::Minus:
    return "'-'";
  case Tok::Star:
    return "'*'";
  case Tok::Slash:
    return "'/'";
  case Tok::Percent:
    return "'%'";
  case Tok::StarStar:
    return "'**'";
  case Tok::Lt:
    return "'<'";
  case Tok::Le:
    return "'<='";
  case Tok::Gt:
    return "'>'";
  case Tok::Ge:
    return "'>='";
  case Tok::EqEq:
    return "'=='";
  case Tok::NotEq:
    return "'!='";
  }
  return "token";
}

Lexer::Lexer(unsigned bufferId, DiagEngine& diag) : diag_(diag) {
  const llvm::MemoryBuffer* buffer = diag.sources().getMemoryBuffer(bufferId);
  cur_ = buffer->getBufferStart();
  end_ = buffer->getBufferEnd();
}

static bool isIdentStart(char c) {
  return llvm::isAlpha(c) || c == '_';
}
static bool isIdentChar(char c) {
  return llvm::isAlnum(c) || c == '_';
}

static Tok keywordOrIdent(llvm::StringRef text) {
  return llvm::StringSwitch<Tok>(text)
      .Case("import", Tok::KwImport)
      .Case("mesh", Tok::KwMesh)
      .Case("dim", Tok::KwDim)
      .Case("layout", Tok::KwLayout)
      .Case("auto", Tok::KwAuto)
      .Case("def", Tok::KwDef)
      .Case("program", Tok::KwProgram)
      .Case("train", Tok::KwTrain)
      .Case("extern", Tok::KwExtern)
      .Case("param", Tok::KwParam)
      .Case("const", Tok::KwConst)
      .Case("let", Tok::KwLet)
      .Case("return", Tok::KwReturn)
      .Case("repeat", Tok::KwRepeat)
      .Case("minimize", Tok::KwMinimize)
      .Case("with", Tok::KwWith)
      .Case("f32", Tok::KwF32)
      .Case("bf16", Tok::KwBF16)
      .Case("f16", Tok::KwF16)
      .Case("i32", Tok::KwI32)
      .Default(Tok::Ident);
}

/// The character at `p` as it should appear in a message: itself when printable, a whole valid
/// UTF-8 sequence as is, anything else as `\xNN` (messages must stay valid text).
static std::string displayChar(const char* p, const char* end, unsigned& length) {
  auto byte = static_cast<unsigned char>(*p);
  length = 1;
  if (byte >= 0x20 && byte < 0x7f) return std::string(1, *p);
  if (byte >= 0x80) {
    unsigned n = llvm::getNumBytesForUTF8(byte);
    auto* src = reinterpret_cast<const llvm::UTF8*>(p);
    if (n > 1 && p + n <= end && llvm::isLegalUTF8Sequence(src, src + n)) {
      length = n;
      return std::string(p, n);
    }
  }
  return fmt::format("\\x{:02X}", byte);
}

Token Lexer::next() {
  for (;;) {
    skipSpaceAndComments();
    if (std::optional<Token> tok = lexToken()) return *tok;
  }
}

void Lexer::skipSpaceAndComments() {
  while (cur_ < end_) {
    char c = *cur_;
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v') {
      ++cur_;
    } else if (c == '/' && cur_ + 1 < end_ && cur_[1] == '/') {
      while (cur_ < end_ && *cur_ != '\n')
        ++cur_;
    } else if (c == '/' && cur_ + 1 < end_ && cur_[1] == '*') {
      const char* start = cur_;
      cur_ += 2;
      while (cur_ + 1 < end_ && !(cur_[0] == '*' && cur_[1] == '/'))
        ++cur_;
      if (cur_ + 1 >= end_) {
        diag_.report(llvm::SMLoc::getFromPointer(start), Diag::ErrUnterminatedComment);
        cur_ = end_;
      } else {
        cur_ += 2;
      }
    } else {
      break;
    }
  }
}

/// One token, or nothing after reporting and skipping a character that starts none.
std::optional<Token> Lexer::lexToken() {
  Token tok;
  const char* start = cur_;
  tok.loc = llvm::SMLoc::getFromPointer(start);
  auto finish = [&](Tok kind, size_t length) -> std::optional<Token> {
    cur_ = start + length;
    tok.kind = kind;
    tok.text = llvm::StringRef(start, length);
    return tok;
  };
  if (cur_ >= end_) return finish(Tok::Eof, 0);

  char c = *cur_;
  char c1 = cur_ + 1 < end_ ? cur_[1] : '\0';

  if (isIdentStart(c)) {
    const char* p = cur_;
    while (p < end_ && isIdentChar(*p))
      ++p;
    size_t length = p - start;
    return finish(keywordOrIdent(llvm::StringRef(start, length)), length);
  }

  if (llvm::isDigit(c)) return lexNumber();

  if (c == '"') return lexString();

  switch (c) {
  case '(':
    return finish(Tok::LParen, 1);
  case ')':
    return finish(Tok::RParen, 1);
  case '[':
    return finish(Tok::LBracket, 1);
  case ']':
    return finish(Tok::RBracket, 1);
  case '{':
    return finish(Tok::LBrace, 1);
  case '}':
    return finish(Tok::RBrace, 1);
  case ',':
    return finish(Tok::Comma, 1);
  case ':':
    return finish(Tok::Colon, 1);
  case ';':
    return finish(Tok::Semicolon, 1);
  case '+':
    return finish(Tok::Plus, 1);
  case '/':
    return finish(Tok::Slash, 1);
  case '%':
    return finish(Tok::Percent, 1);
  case '-':
    return c1 == '>' ? finish(Tok::Arrow, 2) : finish(Tok::Minus, 1);
  case '*':
    return c1 == '*' ? finish(Tok::StarStar, 2) : finish(Tok::Star, 1);
  case '<':
    return c1 == '=' ? finish(Tok::Le, 2) : finish(Tok::Lt, 1);
  case '>':
    return c1 == '=' ? finish(Tok::Ge, 2) : finish(Tok::Gt, 1);
  case '=':
    return c1 == '=' ? finish(Tok::EqEq, 2) : finish(Tok::Assign, 1);
  case '!':
    if (c1 == '=') return finish(Tok::NotEq, 2);
    break;
  default:
    break;
  }

  unsigned length = 1;
  std::string shown = displayChar(cur_, end_, length);
  diag_.report(tok.loc, Diag::ErrUnexpectedChar, shown);
  cur_ += length;
  return std::nullopt;
}

/// NUMBER: digits [ '.' digits ] [ ('e' | 'E') [ '+' | '-' ] digits ]. A number running into
/// letters (`12ab`, `1e`) is malformed; it still becomes one Number token so that the parser
/// does not report a second error for the same text.
Token Lexer::lexNumber() {
  const char* start = cur_;
  const char* p = cur_;
  bool isInteger = true;
  while (p < end_ && llvm::isDigit(*p))
    ++p;
  if (p + 1 < end_ && *p == '.' && llvm::isDigit(p[1])) {
    isInteger = false;
    ++p;
    while (p < end_ && llvm::isDigit(*p))
      ++p;
  }
  if (p < end_ && (*p == 'e' || *p == 'E')) {
    const char* q = p + 1;
    if (q < end_ && (*q == '+' || *q == '-')) ++q;
    if (q < end_ && llvm::isDigit(*q)) {
      isInteger = false;
      p = q;
      while (p < end_ && llvm::isDigit(*p))
        ++p;
    }
  }
  bool malformed = false;
  while (p < end_ && (isIdentChar(*p) || (*p == '.' && p + 1 < end_ && llvm::isDigit(p[1])))) {
    malformed = true;
    ++p;
  }

  Token tok;
  tok.kind = Tok::Number;
  tok.loc = llvm::SMLoc::getFromPointer(start);
  tok.text = llvm::StringRef(start, p - start);
  tok.isInteger = isInteger;
  cur_ = p;
  if (!malformed) {
    if (isInteger) {
      int64_t value = 0;
      malformed = tok.text.getAsInteger(10, value);
      tok.number = static_cast<double>(value);
    } else {
      // getAsDouble accepts an overflow to infinity as merely inexact.
      malformed = tok.text.getAsDouble(tok.number) || !std::isfinite(tok.number);
    }
  }
  if (malformed) {
    diag_.report(tok.loc, Diag::ErrBadNumber, tok.text);
    tok.number = 0;
    tok.malformed = true;
  }
  return tok;
}

/// STRING: '"' { char | '\"' | '\\' } '"' on one line.
Token Lexer::lexString() {
  const char* start = cur_;
  Token tok;
  tok.kind = Tok::String;
  tok.loc = llvm::SMLoc::getFromPointer(start);
  const char* p = cur_ + 1;
  bool closed = false;
  while (p < end_ && *p != '\n') {
    if (*p == '"') {
      closed = true;
      ++p;
      break;
    }
    if (*p == '\\' && p + 1 < end_ && (p[1] == '"' || p[1] == '\\')) {
      tok.string += p[1];
      p += 2;
      continue;
    }
    if (*p == '\\') {
      unsigned length = 1;
      std::string shown = p + 1 < end_ ? displayChar(p + 1, end_, length) : std::string();
      diag_.report(llvm::SMLoc::getFromPointer(p), Diag::ErrBadEscape, shown);
      tok.malformed = true;
      p += 1 + (p + 1 < end_ && p[1] != '\n' ? length : 0);
      continue;
    }
    tok.string += *p++;
  }
  if (!closed) {
    diag_.report(tok.loc, Diag::ErrUnterminatedString);
    tok.malformed = true;
  }
  tok.text = llvm::StringRef(start, p - start);
  cur_ = p;
  return tok;
}

} // namespace meshc
