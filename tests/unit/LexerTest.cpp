// The lexer: token kinds and texts, numbers, strings, comments, and errors with line:col.
#include "frontend/Lexer.h"

#include <catch2/catch.hpp>
#include <llvm/Support/MemoryBuffer.h>

#include <vector>

using namespace meshc;

namespace {

/// Lexes `text` to the end; diagnostics go to `errors`.
struct Lexed {
  llvm::SourceMgr sources;
  std::string errors;
  llvm::raw_string_ostream errorStream{errors};
  DiagEngine diag{sources, errorStream};
  std::vector<Token> tokens;

  explicit Lexed(llvm::StringRef text) {
    unsigned id =
        sources.AddNewSourceBuffer(llvm::MemoryBuffer::getMemBufferCopy(text, "t.mesh"), {});
    Lexer lexer(id, diag);
    for (;;) {
      tokens.push_back(lexer.next());
      if (tokens.back().kind == Tok::Eof) break;
    }
    errorStream.flush();
  }
  std::vector<Tok> kinds() const {
    std::vector<Tok> result;
    for (const Token& tok : tokens)
      result.push_back(tok.kind);
    return result;
  }
  std::string lineCol(const Token& tok) const {
    auto [line, col] = sources.getLineAndColumn(tok.loc);
    return std::to_string(line) + ":" + std::to_string(col);
  }
};

} // namespace

TEST_CASE("keywords, identifiers and punctuation", "[lexer]") {
  Lexed lexed("import mesh dim layout auto def program train param const let return repeat "
              "minimize with f32 bf16 f16 i32 foo _bar9 ( ) [ ] { } , : ; = -> + - * / ** < <= > "
              ">= == !=");
  CHECK(lexed.errors.empty());
  std::vector<Tok> expected = {
      Tok::KwImport,  Tok::KwMesh,     Tok::KwDim,   Tok::KwLayout, Tok::KwAuto, Tok::KwDef,
      Tok::KwProgram, Tok::KwTrain,    Tok::KwParam, Tok::KwConst,  Tok::KwLet,  Tok::KwReturn,
      Tok::KwRepeat,  Tok::KwMinimize, Tok::KwWith,  Tok::KwF32,    Tok::KwBF16, Tok::KwF16,
      Tok::KwI32,     Tok::Ident,      Tok::Ident,   Tok::LParen,   Tok::RParen, Tok::LBracket,
      Tok::RBracket,  Tok::LBrace,     Tok::RBrace,  Tok::Comma,    Tok::Colon,  Tok::Semicolon,
      Tok::Assign,    Tok::Arrow,      Tok::Plus,    Tok::Minus,    Tok::Star,   Tok::Slash,
      Tok::StarStar,  Tok::Lt,         Tok::Le,      Tok::Gt,       Tok::Ge,     Tok::EqEq,
      Tok::NotEq,     Tok::Eof};
  CHECK(lexed.kinds() == expected);
  CHECK(lexed.tokens[19].text == "foo");
  CHECK(lexed.tokens[20].text == "_bar9");
}

TEST_CASE("operators without spaces split greedily", "[lexer]") {
  Lexed lexed("a->b**-c<=d--e");
  CHECK(lexed.kinds() == std::vector<Tok>{Tok::Ident, Tok::Arrow, Tok::Ident, Tok::StarStar,
                                          Tok::Minus, Tok::Ident, Tok::Le, Tok::Ident, Tok::Minus,
                                          Tok::Minus, Tok::Ident, Tok::Eof});
}

TEST_CASE("numbers: integers, decimals and exponents", "[lexer]") {
  Lexed lexed("42 0.02 1e-9 3.5E+2 7e2 0");
  REQUIRE(lexed.errors.empty());
  REQUIRE(lexed.tokens.size() == 7);
  CHECK(lexed.tokens[0].number == 42);
  CHECK(lexed.tokens[0].isInteger);
  CHECK(lexed.tokens[1].number == Approx(0.02));
  CHECK_FALSE(lexed.tokens[1].isInteger);
  CHECK(lexed.tokens[2].number == Approx(1e-9));
  CHECK_FALSE(lexed.tokens[2].isInteger);
  CHECK(lexed.tokens[3].number == 350);
  CHECK_FALSE(lexed.tokens[3].isInteger);
  CHECK(lexed.tokens[4].number == 700);
  CHECK_FALSE(lexed.tokens[4].isInteger);
  CHECK(lexed.tokens[5].number == 0);
  CHECK(lexed.tokens[5].isInteger);
  CHECK(lexed.tokens[3].text == "3.5E+2");
}

TEST_CASE("a number followed by '.' without digits stops before the dot", "[lexer]") {
  Lexed lexed("1.x");
  CHECK(lexed.tokens[0].kind == Tok::Number);
  CHECK(lexed.tokens[0].text == "1");
  CHECK(lexed.errors.find("t.mesh:1:2: error: unexpected character '.'") != std::string::npos);
}

TEST_CASE("malformed numbers are reported once and still become one token", "[lexer]") {
  Lexed lexed("12ab 99999999999999999999 1e999");
  REQUIRE(lexed.tokens.size() == 4);
  for (int i = 0; i < 3; ++i) {
    CHECK(lexed.tokens[i].kind == Tok::Number);
    CHECK(lexed.tokens[i].malformed);
  }
  CHECK(lexed.errors.find("t.mesh:1:1: error: malformed number '12ab'") != std::string::npos);
  CHECK(lexed.errors.find("t.mesh:1:6: error: malformed number '99999999999999999999'") !=
        std::string::npos);
  CHECK(lexed.errors.find("t.mesh:1:27: error: malformed number '1e999'") != std::string::npos);
  CHECK(lexed.diag.errorCount() == 3);
}

TEST_CASE("strings unescape \\\" and \\\\", "[lexer]") {
  Lexed lexed(R"("a/b.mesh" "q\"x\\y")");
  REQUIRE(lexed.errors.empty());
  CHECK(lexed.tokens[0].kind == Tok::String);
  CHECK(lexed.tokens[0].string == "a/b.mesh");
  CHECK(lexed.tokens[0].text == "\"a/b.mesh\"");
  CHECK(lexed.tokens[1].string == "q\"x\\y");
}

TEST_CASE("comments are skipped, locations count lines", "[lexer]") {
  Lexed lexed("// line comment\n  a /* block\n comment */ b\n/**/c // end");
  REQUIRE(lexed.errors.empty());
  REQUIRE(lexed.kinds() == std::vector<Tok>{Tok::Ident, Tok::Ident, Tok::Ident, Tok::Eof});
  CHECK(lexed.lineCol(lexed.tokens[0]) == "2:3");
  CHECK(lexed.lineCol(lexed.tokens[1]) == "3:13");
  CHECK(lexed.lineCol(lexed.tokens[2]) == "4:5");
}

TEST_CASE("a lone '/' is division, not a comment", "[lexer]") {
  Lexed lexed("a / b");
  CHECK(lexed.kinds() == std::vector<Tok>{Tok::Ident, Tok::Slash, Tok::Ident, Tok::Eof});
}

TEST_CASE("'%' is the modulo operator", "[lexer]") {
  Lexed lexed("a%b");
  CHECK(lexed.kinds() == std::vector<Tok>{Tok::Ident, Tok::Percent, Tok::Ident, Tok::Eof});
}

TEST_CASE("bad characters are reported with line:col and skipped", "[lexer]") {
  Lexed lexed("a $ b\n  @!c");
  CHECK(lexed.kinds() == std::vector<Tok>{Tok::Ident, Tok::Ident, Tok::Ident, Tok::Eof});
  CHECK(lexed.errors.find("t.mesh:1:3: error: unexpected character '$'") != std::string::npos);
  CHECK(lexed.errors.find("t.mesh:2:3: error: unexpected character '@'") != std::string::npos);
  CHECK(lexed.errors.find("t.mesh:2:4: error: unexpected character '!'") != std::string::npos);
  CHECK(lexed.diag.errorCount() == 3);
}

TEST_CASE("non-printable and non-ASCII characters are shown safely", "[lexer]") {
  Lexed lexed(llvm::StringRef("\x01 \xE2\x80\x9C \xFF", 7));
  CHECK(lexed.kinds() == std::vector<Tok>{Tok::Eof});
  CHECK(lexed.errors.find("unexpected character '\\x01'") != std::string::npos);
  CHECK(lexed.errors.find("unexpected character '\xE2\x80\x9C'") != std::string::npos);
  CHECK(lexed.errors.find("unexpected character '\\xFF'") != std::string::npos);
  CHECK(lexed.diag.errorCount() == 3);
}

TEST_CASE("unterminated strings and comments", "[lexer]") {
  SECTION("string ending at the line end") {
    Lexed lexed("import \"abc\nx");
    CHECK(lexed.errors.find("t.mesh:1:8: error: unterminated string literal") != std::string::npos);
    CHECK(lexed.kinds() == std::vector<Tok>{Tok::KwImport, Tok::String, Tok::Ident, Tok::Eof});
  }
  SECTION("string ending at the end of the file") {
    Lexed lexed("\"abc\\");
    CHECK(lexed.errors.find("t.mesh:1:1: error: unterminated string literal") != std::string::npos);
  }
  SECTION("block comment") {
    Lexed lexed("a\n /* never closed *");
    CHECK(lexed.errors.find("t.mesh:2:2: error: unterminated block comment") != std::string::npos);
    CHECK(lexed.kinds() == std::vector<Tok>{Tok::Ident, Tok::Eof});
  }
}

TEST_CASE("unknown escapes in strings", "[lexer]") {
  Lexed lexed(R"("a\nb")");
  CHECK(lexed.errors.find("t.mesh:1:3: error: unknown escape sequence '\\n'") != std::string::npos);
  CHECK(lexed.tokens[0].kind == Tok::String);
}

TEST_CASE("Eof repeats at the end", "[lexer]") {
  llvm::SourceMgr sources;
  std::string errors;
  llvm::raw_string_ostream stream(errors);
  DiagEngine diag(sources, stream);
  unsigned id = sources.AddNewSourceBuffer(llvm::MemoryBuffer::getMemBufferCopy("x", "t"), {});
  Lexer lexer(id, diag);
  CHECK(lexer.next().kind == Tok::Ident);
  CHECK(lexer.next().kind == Tok::Eof);
  CHECK(lexer.next().kind == Tok::Eof);
}

TEST_CASE("token names for diagnostics", "[lexer]") {
  CHECK(std::string(tokName(Tok::Ident)) == "identifier");
  CHECK(std::string(tokName(Tok::RBracket)) == "']'");
  CHECK(std::string(tokName(Tok::KwLet)) == "'let'");
  CHECK(std::string(tokName(Tok::Eof)) == "end of file");
}

TEST_CASE("strings with errors are marked malformed", "[lexer]") {
  CHECK(Lexed("\"ok\"").tokens[0].malformed == false);
  CHECK(Lexed("\"open").tokens[0].malformed);
  CHECK(Lexed("\"a\\qb\"").tokens[0].malformed);
}
