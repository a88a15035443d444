#include "frontend/ASTPrinter.h"

#include <fmt/format.h>
#include <llvm/ADT/StringExtras.h>
#include <llvm/Support/Casting.h>

namespace meshc {

namespace {

using namespace ast;
using llvm::cast;

const char* binaryOpName(BinaryOp op) {
  switch (op) {
  case BinaryOp::Add:
    return "+";
  case BinaryOp::Sub:
    return "-";
  case BinaryOp::Mul:
    return "*";
  case BinaryOp::Div:
    return "/";
  case BinaryOp::Pow:
    return "**";
  case BinaryOp::Lt:
    return "<";
  case BinaryOp::Le:
    return "<=";
  case BinaryOp::Gt:
    return ">";
  case BinaryOp::Ge:
    return ">=";
  case BinaryOp::Eq:
    return "==";
  case BinaryOp::Ne:
    return "!=";
  case BinaryOp::Mod:
    return "%";
  }
  return "?";
}

/// Prints one node per line, `Kind line:col details`, children indented by two spaces.
class ASTPrinter {
public:
  ASTPrinter(const llvm::SourceMgr& sources, llvm::raw_ostream& os) : sources_(sources), os_(os) {}

  void printFile(const File& file) {
    os_ << "File " << file.path << "\n";
    for (const DeclPtr& decl : file.decls)
      printDecl(*decl, 1);
  }

private:
  std::string at(Loc loc) const {
    if (!loc.isValid()) return "?:?";
    auto [line, col] = sources_.getLineAndColumn(loc);
    return fmt::format("{}:{}", line, col);
  }
  llvm::raw_ostream& line(unsigned indent, llvm::StringRef kind, Loc loc) {
    os_.indent(indent * 2) << kind << " " << at(loc);
    return os_;
  }
  static std::string names(const std::vector<Ident>& idents) {
    std::string text;
    for (const Ident& ident : idents)
      text += (text.empty() ? "" : ", ") + ident.name;
    return text;
  }
  static std::string typeText(const TypeSpec& type) {
    std::string text = dtypeName(type.dtype);
    if (type.hasShape) text += "[" + names(type.dims) + "]";
    return text;
  }

  void printTypedNames(llvm::StringRef kind, const std::vector<TypedName>& typedNames,
                       unsigned indent) {
    for (const TypedName& typed : typedNames)
      line(indent, kind, typed.name.loc)
          << " " << typed.name.name << ": " << typeText(typed.type) << "\n";
  }

  void printBody(const std::vector<StmtPtr>& body, unsigned indent) {
    for (const StmtPtr& stmt : body)
      printStmt(*stmt, indent);
  }

  void printDecl(const Decl& decl, unsigned indent) {
    switch (decl.kind) {
    case Decl::Kind::Import: {
      const auto& import = cast<ImportDecl>(decl);
      line(indent, "ImportDecl", decl.loc) << " \"" << import.path << "\"\n";
      return;
    }
    case Decl::Kind::Mesh: {
      const auto& mesh = cast<MeshDecl>(decl);
      line(indent, "MeshDecl", decl.loc) << " " << mesh.name.name << "\n";
      for (const MeshDecl::Axis& axis : mesh.axes)
        line(indent + 1, "Axis", axis.name.loc)
            << " " << axis.name.name << " = " << axis.size << "\n";
      return;
    }
    case Decl::Kind::Dim: {
      const auto& dim = cast<DimDecl>(decl);
      line(indent, "DimDecl", decl.loc) << " " << dim.name.name << " = " << dim.size << "\n";
      return;
    }
    case Decl::Kind::Layout: {
      const auto& layout = cast<LayoutDecl>(decl);
      line(indent, "LayoutDecl", decl.loc) << "\n";
      for (const LayoutDecl::Entry& entry : layout.entries) {
        line(indent + 1, "Entry", entry.dim.loc) << " " << entry.dim.name << ": ";
        if (entry.isAuto)
          os_ << "auto\n";
        else
          os_ << "[" << names(entry.axes) << "]"
              << (entry.split.empty() ? "" : fmt::format("({})", fmt::join(entry.split, ", ")))
              << "\n";
      }
      if (layout.autoRest) line(indent + 1, "Auto", layout.autoLoc) << "\n";
      return;
    }
    case Decl::Kind::Def: {
      const auto& def = cast<DefDecl>(decl);
      line(indent, "DefDecl", decl.loc) << " " << def.name.name;
      if (!def.dimParams.empty()) os_ << "[" << names(def.dimParams) << "]";
      if (!def.hasSeveralResults()) os_ << " -> " << typeText(def.result);
      if (def.isRecompute()) os_ << " recompute";
      os_ << "\n";
      printTypedNames("Arg", def.args, indent + 1);
      printTypedNames("Result", def.results, indent + 1);
      printBody(def.body, indent + 1);
      return;
    }
    case Decl::Kind::Program: {
      const auto& program = cast<ProgramDecl>(decl);
      line(indent, "ProgramDecl", decl.loc) << " " << program.name.name << "\n";
      printTypedNames("Input", program.inputs, indent + 1);
      printTypedNames("Output", program.outputs, indent + 1);
      printBody(program.body, indent + 1);
      return;
    }
    case Decl::Kind::Train: {
      const auto& train = cast<TrainDecl>(decl);
      line(indent, "TrainDecl", decl.loc) << " " << train.name.name << "\n";
      printTypedNames("Input", train.inputs, indent + 1);
      printTypedNames("Metric", train.metrics, indent + 1);
      printBody(train.body, indent + 1);
      return;
    }
    case Decl::Kind::Extern: {
      const auto& ext = cast<ExternDecl>(decl);
      std::vector<std::string> params;
      for (const ExternDecl::Param& p : ext.params)
        params.push_back(p.name.name + ": " + dtypeName(p.dtype));
      line(indent, "ExternDecl", decl.loc)
          << " " << ext.name.name << "(" << llvm::join(params, ", ") << ") -> "
          << dtypeName(ext.result) << " from \"" << ext.header << "\"\n";
      return;
    }
    }
  }

  void printStmt(const Stmt& stmt, unsigned indent) {
    switch (stmt.kind) {
    case Stmt::Kind::Let: {
      const auto& let = cast<LetStmt>(stmt);
      line(indent, "LetStmt", stmt.loc) << " " << let.name.name;
      if (let.type) os_ << ": " << typeText(*let.type);
      os_ << "\n";
      printExpr(*let.value, indent + 1);
      return;
    }
    case Stmt::Kind::Assign: {
      const auto& assign = cast<AssignStmt>(stmt);
      line(indent, "AssignStmt", stmt.loc) << " " << assign.name.name << "\n";
      printExpr(*assign.value, indent + 1);
      return;
    }
    case Stmt::Kind::Param:
    case Stmt::Kind::Const:
    case Stmt::Kind::State: {
      const auto& param = cast<ParamStmt>(stmt);
      const char* label = param.trainable() ? "ParamStmt"
                          : param.isState() ? "StateStmt"
                                            : "ConstStmt";
      line(indent, label, stmt.loc) << " " << param.name.name << ": " << typeText(param.type);
      if (param.tiedPath) os_ << " as \"" << *param.tiedPath << "\"";
      os_ << "\n";
      printExpr(*param.init, indent + 1);
      return;
    }
    case Stmt::Kind::Next: {
      const auto& next = cast<NextStmt>(stmt);
      line(indent, "NextStmt", stmt.loc) << " " << next.name.name << "\n";
      printExpr(*next.value, indent + 1);
      return;
    }
    case Stmt::Kind::Return:
      line(indent, "ReturnStmt", stmt.loc) << "\n";
      printExpr(*cast<ReturnStmt>(stmt).value, indent + 1);
      for (const ExprPtr& value : cast<ReturnStmt>(stmt).rest)
        printExpr(*value, indent + 1);
      return;
    case Stmt::Kind::Repeat: {
      const auto& repeat = cast<RepeatStmt>(stmt);
      line(indent, "RepeatStmt", stmt.loc) << (repeat.shared ? " shared\n" : "\n");
      printExpr(*repeat.count, indent + 1);
      printBody(repeat.body, indent + 1);
      return;
    }
    case Stmt::Kind::BindResults: {
      const auto& bind = cast<BindResultsStmt>(stmt);
      line(indent, "BindResultsStmt", stmt.loc)
          << (bind.isLet ? " let " : " ") << names(bind.names) << "\n";
      printExpr(*bind.value, indent + 1);
      return;
    }
    case Stmt::Kind::Minimize: {
      const auto& minimize = cast<MinimizeStmt>(stmt);
      line(indent, "MinimizeStmt", stmt.loc) << "\n";
      printExpr(*minimize.loss, indent + 1);
      printExpr(*minimize.optimizer, indent + 1);
      return;
    }
    case Stmt::Kind::Dim: {
      const auto& dim = cast<DimStmt>(stmt);
      line(indent, "DimStmt", stmt.loc) << " " << dim.name.name << "\n";
      printExpr(*dim.size, indent + 1);
      return;
    }
    }
  }

  void printExpr(const Expr& expr, unsigned indent) {
    switch (expr.kind) {
    case Expr::Kind::Number: {
      const auto& number = cast<NumberExpr>(expr);
      line(indent, "NumberExpr", expr.loc) << " ";
      if (number.isInteger)
        os_ << static_cast<int64_t>(number.value) << "\n";
      else
        os_ << fmt::format("{}", number.value) << "\n";
      return;
    }
    case Expr::Kind::Name:
      line(indent, "NameExpr", expr.loc) << " " << cast<NameExpr>(expr).name << "\n";
      return;
    case Expr::Kind::Unary:
      line(indent, "UnaryExpr", expr.loc) << " -\n";
      printExpr(*cast<UnaryExpr>(expr).operand, indent + 1);
      return;
    case Expr::Kind::Binary: {
      const auto& binary = cast<BinaryExpr>(expr);
      line(indent, "BinaryExpr", expr.loc)
          << " " << binaryOpName(binary.op) << " (op at " << at(binary.opLoc) << ")\n";
      printExpr(*binary.lhs, indent + 1);
      printExpr(*binary.rhs, indent + 1);
      return;
    }
    case Expr::Kind::Call: {
      const auto& call = cast<CallExpr>(expr);
      line(indent, "CallExpr", expr.loc) << " " << call.callee.name;
      if (call.hasDimArgs) os_ << "[" << names(call.dimArgs) << "]";
      if (call.hasArrow)
        os_ << " -> [" << names(call.arrowDims) << "] (arrow at " << at(call.arrowLoc) << ")";
      os_ << "\n";
      for (const ExprPtr& arg : call.args)
        printExpr(*arg, indent + 1);
      for (const KeywordArg& kwarg : call.kwargs) {
        line(indent + 1, "KeywordArg", kwarg.name.loc) << " " << kwarg.name.name << "\n";
        printExpr(*kwarg.value, indent + 2);
      }
      return;
    }
    case Expr::Kind::List:
      line(indent, "ListExpr", expr.loc) << "\n";
      for (const ExprPtr& element : cast<ListExpr>(expr).elements)
        printExpr(*element, indent + 1);
      return;
    case Expr::Kind::Type:
      line(indent, "TypeExpr", expr.loc) << " " << typeText(cast<TypeExpr>(expr).type) << "\n";
      return;
    }
  }

  const llvm::SourceMgr& sources_;
  llvm::raw_ostream& os_;
};

} // namespace

void printAST(const ast::File& file, const llvm::SourceMgr& sources, llvm::raw_ostream& os) {
  ASTPrinter(sources, os).printFile(file);
}

} // namespace meshc
