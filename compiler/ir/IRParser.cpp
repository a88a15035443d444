#include "ir/IRParser.h"

#include <fmt/format.h>
#include <llvm/ADT/StringExtras.h>

#include <cmath>
#include <map>

namespace meshc::ir {

namespace {

/// A line-oriented reader of the printed IR. Each construct occupies one line; the cursor moves
/// within the current line and reports errors with the IR's own line and column.
class IRReader {
public:
  IRReader(llvm::StringRef text, llvm::StringRef bufferName) : name_(bufferName) {
    text.split(lines_, '\n');
  }

  llvm::Expected<Module> read() {
    Module module;
    for (lineNo_ = 0; lineNo_ < lines_.size(); ++lineNo_) {
      startLine();
      if (rest_.trim().empty()) continue;
      if (acceptWord("mesh"))
        readMesh(module);
      else if (acceptWord("dim"))
        readDim(module);
      else if (acceptWord("layout"))
        readLayout(module);
      else if (acceptWord("program"))
        readFunction(module, Function::Kind::Program);
      else if (acceptWord("train"))
        readFunction(module, Function::Kind::Train);
      else
        fail("expected mesh, dim, layout, program or train");
      if (!ok()) return llvm::createStringError(llvm::inconvertibleErrorCode(), error_);
    }
    return module;
  }

private:
  // ------------------------------------------------------------ lexing within a line
  void startLine() {
    rest_ = lines_[lineNo_];
    comment_ = {};
    size_t slash = rest_.find("//");
    if (slash != llvm::StringRef::npos) {
      comment_ = rest_.substr(slash + 2).trim();
      rest_ = rest_.substr(0, slash);
    }
  }
  void skipSpace() { rest_ = rest_.ltrim(); }
  size_t column() const { return lines_[lineNo_].size() - rest_.size() + 1; }

  /// Records the first error, at `col` or else at the cursor.
  void fail(const std::string& message, size_t col = 0) {
    if (ok())
      error_ = fmt::format("{}:{}:{}: {}", name_.str(), lineNo_ + 1, col ? col : column(), message);
  }
  bool ok() const { return error_.empty(); }

  bool accept(llvm::StringRef token) {
    skipSpace();
    if (!rest_.startswith(token)) return false;
    rest_ = rest_.drop_front(token.size());
    return true;
  }
  bool acceptWord(llvm::StringRef word) {
    skipSpace();
    llvm::StringRef save = rest_;
    if (identifier() == word) return true;
    rest_ = save;
    return false;
  }
  void expect(llvm::StringRef token) {
    if (ok() && !accept(token)) fail(fmt::format("expected '{}'", token.str()));
  }
  static bool isIdentChar(char c) { return llvm::isAlnum(c) || c == '_'; }
  std::string identifier() {
    skipSpace();
    size_t n = 0;
    while (n < rest_.size() && isIdentChar(rest_[n]))
      ++n;
    std::string word = rest_.take_front(n).str();
    rest_ = rest_.drop_front(n);
    return word;
  }
  std::string expectIdentifier() {
    std::string word = identifier();
    if (word.empty() && ok()) fail("expected an identifier");
    return word;
  }
  /// Text up to (not including) `stop`, trimmed; used for param paths, which hold '/', '[', '#'.
  std::string until(char stop) {
    size_t pos = rest_.find(stop);
    if (pos == llvm::StringRef::npos) {
      fail(fmt::format("expected '{}'", stop));
      return {};
    }
    std::string text = rest_.substr(0, pos).trim().str();
    rest_ = rest_.drop_front(pos);
    return text;
  }
  llvm::StringRef numberToken() {
    skipSpace();
    size_t n = 0;
    while (n < rest_.size() &&
           (llvm::isAlnum(rest_[n]) || llvm::StringRef("+-.").contains(rest_[n])))
      ++n;
    llvm::StringRef token = rest_.take_front(n);
    rest_ = rest_.drop_front(n);
    return token;
  }
  int64_t integer() {
    skipSpace();
    size_t col = column();
    llvm::StringRef token = numberToken();
    int64_t value = 0;
    if (token.getAsInteger(10, value) && ok())
      fail(fmt::format("expected an integer, found '{}'", token.str()), col);
    return value;
  }
  static bool parseDouble(llvm::StringRef token, double& value) {
    if (token == "inf" || token == "-inf") {
      value = token.startswith("-") ? -INFINITY : INFINITY;
      return true;
    }
    if (token == "nan" || token == "-nan") {
      value = NAN;
      return true;
    }
    return !token.getAsDouble(value);
  }
  double number() {
    skipSpace();
    size_t col = column();
    llvm::StringRef token = numberToken();
    double value = 0;
    if (!parseDouble(token, value) && ok())
      fail(fmt::format("expected a number, found '{}'", token.str()), col);
    return value;
  }

  // ------------------------------------------------------------ module header
  /// mesh NAME[axis = N, ...]
  void readMesh(Module& module) {
    module.meshName = expectIdentifier();
    expect("[");
    do {
      MeshAxis axis;
      axis.name = expectIdentifier();
      expect("=");
      axis.size = integer();
      module.mesh.push_back(axis);
    } while (ok() && accept(","));
    expect("]");
  }
  /// dim NAME = N
  void readDim(Module& module) {
    std::string name = expectIdentifier();
    expect("=");
    module.dims[name] = integer();
  }
  /// layout item, item, ...   with item: NAME: [a, b] | NAME: [s](3, 1) | NAME: auto | auto
  void readLayout(Module& module) {
    do {
      std::string name = expectIdentifier();
      if (name == "auto" && !accept(":")) {
        module.autoLayout = true;
        continue;
      }
      expect(":");
      DimLayout entry;
      entry.dim = name;
      if (acceptWord("auto"))
        entry.isAuto = true;
      else
        entry.axes = nameList("[", "]");
      if (accept("(")) { // a stage split: the layers of each stage
        do
          entry.split.push_back(integer());
        while (ok() && accept(","));
        expect(")");
      }
      module.layout.push_back(entry);
    } while (ok() && accept(","));
  }
  std::vector<std::string> nameList(llvm::StringRef open, llvm::StringRef close) {
    std::vector<std::string> names;
    expect(open);
    if (accept(close)) return names;
    do
      names.push_back(expectIdentifier());
    while (ok() && accept(","));
    expect(close);
    return names;
  }

  /// dtype[dim, ...] with sizes from the module's dims.
  TensorType type(const Module& module) {
    TensorType t;
    skipSpace();
    size_t col = column();
    std::string dtype = expectIdentifier();
    if (dtype == "f32")
      t.dtype = DType::F32;
    else if (dtype == "bf16")
      t.dtype = DType::BF16;
    else if (dtype == "f16")
      t.dtype = DType::F16;
    else if (dtype == "i32")
      t.dtype = DType::I32;
    else if (ok())
      fail(fmt::format("unknown dtype '{}'", dtype), col);
    for (const std::string& dim : nameList("[", "]")) {
      auto it = module.dims.find(dim);
      if (it == module.dims.end()) {
        if (ok()) fail(fmt::format("undeclared dim '{}'", dim));
        return t;
      }
      t.dims.push_back(Dim{dim, it->second});
    }
    return t;
  }

  /// The trailing `// [name] file:line:col` of a line.
  Location location(std::string* valueName = nullptr) {
    Location loc;
    llvm::StringRef text = comment_;
    auto [first, last] = text.rsplit(' ');
    llvm::StringRef where = last.empty() ? first : last;
    if (valueName && !last.empty()) *valueName = first.trim().str();
    llvm::StringRef file, line, col;
    std::tie(where, col) = where.rsplit(':');
    std::tie(file, line) = where.rsplit(':');
    loc.file = file.str();
    if (line.getAsInteger(10, loc.line) || col.getAsInteger(10, loc.col)) loc.line = loc.col = 0;
    return loc;
  }

  // ------------------------------------------------------------ functions
  /// (program|train) NAME(in: type [< bound], ...) [-> (out: type, ...)] {
  void readFunction(Module& module, Function::Kind kind) {
    Function fn;
    fn.kind = kind;
    fn.name = expectIdentifier();
    expect("(");
    if (!accept(")")) {
      do {
        InputInfo input;
        input.name = expectIdentifier();
        expect(":");
        input.type = type(module);
        if (accept("<")) input.indexBound = integer();
        fn.inputs.push_back(input);
      } while (ok() && accept(","));
      expect(")");
    }
    std::vector<std::string> outputNames;
    if (accept("->")) {
      expect("(");
      do {
        outputNames.push_back(expectIdentifier());
        expect(":");
        type(module);
      } while (ok() && accept(","));
      expect(")");
    }
    expect("{");
    for (++lineNo_; ok() && lineNo_ < lines_.size(); ++lineNo_) {
      startLine();
      if (accept("}")) {
        if (fn.outputs.size() != outputNames.size() && kind == Function::Kind::Program)
          fail("the outputs returned differ from the signature");
        module.functions.push_back(std::move(fn));
        return;
      }
      if (acceptWord("param"))
        readParam(module, fn, true);
      else if (acceptWord("const"))
        readParam(module, fn, false);
      else if (acceptWord("state"))
        readParam(module, fn, false, ParamRole::OptimizerState);
      else if (acceptWord("step_state"))
        readParam(module, fn, false, ParamRole::StepState);
      else if (acceptWord("update"))
        readUpdate(fn);
      else if (acceptWord("minimize"))
        readMinimize(fn);
      else if (acceptWord("return"))
        readReturn(fn);
      else
        readOp(module, fn);
    }
    fail("missing '}' at the end of the function");
  }

  /// (param|const|state|step_state) PATH: type = kind(key = number, ...)  // loc
  /// `state` declares an optimizer-state slot (`<weight path>@<slot>`), `step_state` a train
  /// block's step state; neither is trainable.
  void readParam(const Module& module, Function& fn, bool trainable,
                 ParamRole role = ParamRole::Weight) {
    ParamInfo param;
    param.trainable = trainable;
    param.role = role;
    param.path = until(':');
    expect(":");
    param.type = type(module);
    expect("=");
    param.init.kind = expectIdentifier();
    expect("(");
    if (!accept(")")) {
      do {
        std::string key = expectIdentifier();
        expect("=");
        param.init.args.emplace_back(key, number());
      } while (ok() && accept(","));
      expect(")");
    }
    param.loc = location();
    fn.params.push_back(param);
  }

  ValueId valueRef(const Function& fn) {
    skipSpace();
    size_t col = column();
    expect("%");
    int64_t id = integer();
    if (ok() && (id < 0 || id >= static_cast<int64_t>(fn.values.size())))
      fail(fmt::format("use of undefined value %{}", id), col);
    return ok() ? static_cast<ValueId>(id) : 0;
  }

  /// {key = value, ...} with value: number, "string" or [names]
  std::vector<std::pair<std::string, AttrValue>> attrs() {
    std::vector<std::pair<std::string, AttrValue>> result;
    if (!accept("{")) return result;
    do {
      std::string key = expectIdentifier();
      expect("=");
      skipSpace();
      if (rest_.startswith("\"")) {
        rest_ = rest_.drop_front();
        std::string text = until('"');
        expect("\"");
        result.emplace_back(key, text);
      } else if (rest_.startswith("[")) {
        result.emplace_back(key, nameList("[", "]"));
      } else {
        llvm::StringRef token = numberToken();
        int64_t i = 0;
        double d = 0;
        if (!token.getAsInteger(10, i))
          result.emplace_back(key, i);
        else if (parseDouble(token, d))
          result.emplace_back(key, d);
        else
          fail(fmt::format("bad attribute value '{}'", token.str()));
      }
    } while (ok() && accept(","));
    expect("}");
    return result;
  }

  /// %N = spelling [%a, %b] [{attrs}] : type  // [name] loc
  void readOp(const Module& module, Function& fn) {
    expect("%");
    if (ok() && integer() != static_cast<int64_t>(fn.values.size()))
      fail(fmt::format("expected the next value %{}", fn.values.size()));
    expect("=");
    skipSpace();
    size_t col = column();
    std::string spelling = expectIdentifier();
    auto kind = opKinds().find(spelling);
    if (kind == opKinds().end()) {
      if (ok()) fail(fmt::format("unknown op '{}'", spelling), col);
      return;
    }
    Op op{kind->second, {}, 0, {}, {}};
    skipSpace();
    if (rest_.startswith("%")) {
      do
        op.operands.push_back(valueRef(fn));
      while (ok() && accept(","));
    }
    op.attrs = attrs();
    expect(":");
    TensorType t = type(module);
    std::string valueName;
    op.loc = location(&valueName);
    if (!ok()) return;
    ValueId id = fn.addOp(std::move(op), t, valueName);
    const Op& added = fn.ops.back();
    if (added.kind == OpKind::Input) {
      int64_t index = added.integer("index", -1);
      if (index < 0 || index >= static_cast<int64_t>(fn.inputs.size()))
        return fail("input index out of range");
      fn.inputs[index].value = id;
      fn.inputs[index].loc = added.loc;
    } else if (added.kind == OpKind::Param) {
      for (ParamInfo& p : fn.params)
        if (p.path == added.string("path")) p.value = id;
    }
  }

  /// minimize %N with optimizer [{options}]  // loc
  void readMinimize(Function& fn) {
    TrainInfo train;
    train.loss = valueRef(fn);
    if (!acceptWord("with")) return fail("expected 'with'");
    train.optimizer = expectIdentifier();
    train.options = attrs();
    train.loc = location();
    fn.train = train;
  }

  /// update PATH = %N     (after the step, param PATH takes the value %N)
  void readUpdate(Function& fn) {
    skipSpace();
    size_t col = column();
    std::string path = until('=');
    expect("=");
    ValueId value = valueRef(fn);
    if (!ok()) return;
    for (size_t i = 0; i < fn.params.size(); ++i)
      if (fn.params[i].path == path) {
        if (!(fn.params[i].type == fn.typeOf(value)))
          return fail(fmt::format("update of '{}' has a different type than the param", path), col);
        fn.updates.push_back(ParamUpdate{i, value});
        return;
      }
    fail(fmt::format("update of unknown param '{}'", path), col);
  }

  /// return NAME = %N
  void readReturn(Function& fn) {
    OutputInfo out;
    out.name = expectIdentifier();
    expect("=");
    out.value = valueRef(fn);
    fn.outputs.push_back(out);
  }

  static const std::map<std::string, OpKind>& opKinds() {
    static const std::map<std::string, OpKind> kinds = [] {
      std::map<std::string, OpKind> m;
      for (int k = 0; k <= static_cast<int>(OpKind::Dropout); ++k)
        m[opSpelling(static_cast<OpKind>(k))] = static_cast<OpKind>(k);
      return m;
    }();
    return kinds;
  }

  llvm::StringRef name_;
  llvm::SmallVector<llvm::StringRef, 0> lines_;
  size_t lineNo_ = 0;
  llvm::StringRef rest_, comment_;
  std::string error_; // the first error; empty while all is well
};

} // namespace

llvm::Expected<Module> parseModule(llvm::StringRef text, llvm::StringRef bufferName) {
  return IRReader(text, bufferName).read();
}

} // namespace meshc::ir
