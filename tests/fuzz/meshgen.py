#!/usr/bin/env python3
"""A generator of random well-typed .mesh programs for differential fuzzing (scripts/difffuzz).

`generate(seed)` returns a Case: the program text and how to run it (function, --steps,
backend, optimization flags) and whether the planner must reject it (a pinned layout that does
not divide a dim: the error path). Every value is kept O(1) (tanh, mean, 1/sqrt(K) scaled
einsums, log(|x| + 1), ...) so that f32 and the interpreter's f64 agree within the tolerance,
and in train blocks every normalization gets a residual path so that no param's gradient is
pure rounding (adamw and adafactor would turn its sign into a whole step).

Each statement is one line with its type in a trailing comment (`// f32[a, b]`): the reducer
(tests/fuzz/reduce.py) removes lines and replaces a statement by one of its operands of the
same type.

Usage: meshgen.py SEED  (prints the program and, on stderr, how to run it)"""
import math
import random
import sys
from dataclasses import dataclass, field

from meshgen_features import FeatureMixin
from meshgen_layout import LayoutMixin

SIZES = [1, 2, 3, 4, 5, 6, 7, 8, 8, 12, 16, 16, 24, 32]
UNARY = ["exp", "log", "sqrt", "rsqrt", "square", "abs", "tanh", "sigmoid", "relu", "gelu",
         "sin", "cos"]
OPTIMIZERS = ["sgd", "sgd_momentum", "sgd_nesterov", "adamw", "adafactor"]
SCHEDULES = ["constant", "linear", "cosine", "rsqrt"]
MAX_ELEMENTS = 4096
# Step state (`state` / `next` in train blocks): on since the compiler has it (5 minutes from
# seed 28 ran 5 such cases, 4 agreeing with the interpreter and 1 a located planner error).
STEP_STATE = True


@dataclass
class Case:
    seed: int
    text: str = ""
    function: str = ""
    steps: int = 0
    backend: str = "threads"
    opt: str = "-O1"
    expect_error: str = ""  # a substring of the planner's located error, when one is expected
    may_reject: str = ""  # a substring of a located error that is a fine outcome too
    ranks: int = 1
    machine: str = "cpu"  # the machine the plan is costed for: it steers `auto` layouts
    run_seed: int = 0
    extra_args: list = field(default_factory=list)  # command-line overrides (--dim, --mesh)
    features: list = field(default_factory=list)

    def run_args(self):
        args = ["--function", self.function, "--backend", self.backend, "--opt", self.opt]
        if self.steps:
            args += ["--steps", str(self.steps)]
        if self.machine != "cpu":
            args += ["--machine", self.machine]
        if self.run_seed:
            args += ["--seed", str(self.run_seed)]
        args += self.extra_args
        return args


@dataclass
class Value:
    name: str
    dtype: str
    dims: tuple
    bound: float = 1.0  # a rough bound of |value|, to keep exp and squares finite


def tensor_type(dtype, dims):
    return f"{dtype}[{', '.join(dims)}]"


class Generator(FeatureMixin, LayoutMixin):
    def __init__(self, seed, train=None, error_path=None):
        self.rng = random.Random(seed)
        self.case = Case(seed=seed)
        self.dims = {}  # name -> size, in declaration order
        # The count dims of `repeat d { ... }`: laid over an axis they ask for pipeline stages,
        # which only the plan reports take (docs/planner.md), so generated layouts leave them out.
        self.repeat_dims = set()
        self.defs = []  # text of defs
        self.counter = 0
        self.train = self.rng.random() < 0.4 if train is None else train
        self.error_path = self.rng.random() < 0.08 if error_path is None else error_path
        self.bf16 = self.rng.random() < 0.2
        self.def_count = 0
        self.constrained = set()  # dims whose sizes others follow

    def value(self, name, dtype, dims, bound=1.0):
        return Value(name, dtype, tuple(dims), bound)

    # ---- names and dims
    def fresh(self, prefix="v"):
        self.counter += 1
        return f"{prefix}{self.counter}"

    def new_dim(self, size, prefix="e"):
        name = f"{prefix}{len(self.dims)}"
        self.dims[name] = size
        return name

    def size(self, dims):
        return math.prod(self.dims[d] for d in dims)

    def feature(self, name):
        if name not in self.case.features:
            self.case.features.append(name)

    def pick_dims(self, base, low=1, high=3):
        count = self.rng.randint(low, min(high, len(base)))
        dims = self.rng.sample(base, count)
        while self.size(dims) > MAX_ELEMENTS and len(dims) > 1:
            dims.pop()
        return tuple(dims)

    # ---- expressions: each returns (text, dims, bound) for an f32 result
    def arg(self, name, bound):
        """NAME as the argument of a saturating function (tanh, sigmoid, softmax). In train
        blocks it is scaled into [-2, 2]: past that, the derivative (1 - t^2 for tanh) is a
        difference of nearly equal numbers, f32 keeps only a few of its digits, and every
        gradient behind it differs from the interpreter's by more than any tolerance (a false
        failure found by the fuzzer: a tanh of a sum of 80 squares)."""
        if self.train and bound > 2:
            return f"({name}) * {2.0 / bound:.4g}"
        return name

    def unary(self, v):
        op = self.rng.choice(UNARY + ["neg", "pow2"])
        if op == "neg":
            self.feature("neg")
            return f"-{v.name}", v.dims, v.bound
        if op == "pow2":
            self.feature("pow")
            return f"tanh({self.arg(v.name, v.bound)}) ** 2.0", v.dims, 1.0
        self.feature("unary")
        x = v.name
        if op == "exp":
            return f"exp(tanh({self.arg(x, v.bound)}))", v.dims, 3.0
        if op == "log":
            return f"log(abs({x}) + 1.0)", v.dims, math.log(v.bound + 1) + 0.1
        if op == "sqrt":
            return f"sqrt(abs({x}) + 0.5)", v.dims, math.sqrt(v.bound + 0.5)
        if op == "rsqrt":
            return f"rsqrt(abs({x}) + 0.5)", v.dims, 1.5
        if op == "square":
            if v.bound > 4:
                return f"square(tanh({self.arg(x, v.bound)}))", v.dims, 1.0
            return f"square({x})", v.dims, v.bound * v.bound
        if op in ("tanh", "sigmoid"):
            return f"{op}({self.arg(x, v.bound)})", v.dims, 1.0
        if op in ("sin", "cos"):
            return f"{op}({x})", v.dims, 1.0
        return f"{op}({x})", v.dims, v.bound

    def operand(self, scope, dims_hint):
        """Another value to combine with: broadcast partners share some dims."""
        candidates = [w for w in scope if w.dtype == "f32"]
        return self.rng.choice(candidates)

    def binary(self, v, scope):
        w = self.operand(scope, v.dims)
        dims = v.dims + tuple(d for d in w.dims if d not in v.dims)
        if self.size(dims) > MAX_ELEMENTS:
            return self.unary(v)
        self.feature("broadcast" if set(w.dims) != set(v.dims) else "binary")
        op = self.rng.choice(["+", "-", "*", "/", "maximum", "minimum", "pow", "where", "lit"])
        a, b = v.name, w.name
        if op in ("+", "-"):
            return f"{a} {op} {b}", dims, v.bound + w.bound
        if op == "*":
            return f"{a} * {b}", dims, v.bound * w.bound
        if op == "/":
            return f"{a} / (abs({b}) + 1.0)", dims, v.bound
        if op in ("maximum", "minimum"):
            return f"{op}({a}, {b})", dims, max(v.bound, w.bound)
        if op == "pow":
            self.feature("pow")
            return f"pow(abs({a}) + 0.5, 1.5)", v.dims, (v.bound + 0.5) ** 1.5
        if op == "where":
            self.feature("where")
            # Compare with a constant, not a computed value: f32 and f64 agree on the sign far
            # more often than on which of two computed values is larger.
            return f"where({a} > 0.25, {a}, {b} * 0.5)", dims, max(v.bound, w.bound)
        lit = self.rng.choice(["0.5", "2.0", "1.5", "0.25"])
        return f"{a} * {lit} + {b}", dims, v.bound * float(lit) + w.bound

    def einsum(self, v, scope):
        w = self.operand(scope, v.dims)
        operands = [v, w]
        if self.rng.random() < 0.2:
            third = self.operand(scope, v.dims)
            if self.size(list(dict.fromkeys(v.dims + w.dims + third.dims))) <= MAX_ELEMENTS * 4:
                operands.append(third)
                self.feature("einsum3")
        union = list(dict.fromkeys(d for u in operands for d in u.dims))
        out = self.pick_dims(union, 1, min(4, len(union)))
        contracted = [d for d in union if d not in out]
        k = self.size(contracted) if contracted else 1
        self.feature("einsum")
        scale = 1.0 / math.sqrt(k)
        names = ", ".join(u.name for u in operands)
        text = f"einsum({names} -> {', '.join(out)})"
        if k > 1:
            text += f" * {scale:.6g}"
        bound = math.prod(u.bound for u in operands) * math.sqrt(k)
        return text, out, bound

    def reduce(self, v):
        if len(v.dims) < 2:
            return self.unary(v)
        over = self.pick_dims(list(v.dims), 1, len(v.dims) - 1)
        rest = tuple(d for d in v.dims if d not in over)
        op = self.rng.choice(["sum", "mean", "max", "min", "logsumexp"])
        self.feature("reduce_" + op)
        args = ", ".join(over)
        if op == "sum":
            return f"sum({v.name}, {args}) * {1.0 / self.size(over):.6g}", rest, v.bound
        if op == "logsumexp":
            return f"logsumexp(tanh({self.arg(v.name, v.bound)}), {args})", rest, 1 + math.log(self.size(over))
        return f"{op}({v.name}, {args})", rest, v.bound

    def normalize(self, v):
        op = self.rng.choice(["softmax", "log_softmax", "layer_norm", "cumsum"])
        d = self.rng.choice(v.dims)
        self.feature(op)
        if op == "softmax":
            text, bound = f"softmax({self.arg(v.name, v.bound)}, {d})", 1.0
        elif op == "log_softmax":
            text = f"log_softmax(tanh({self.arg(v.name, v.bound)}), {d})"
            bound = 2 + math.log(self.dims[d])
        elif op == "layer_norm":
            over = self.pick_dims(list(v.dims), 1, min(2, len(v.dims)))
            text, bound = f"layer_norm({v.name}, {', '.join(over)})", 4.0
        else:
            excl = self.rng.randint(0, 1)
            text = f"cumsum({v.name}, {d}, exclusive = {excl}) * {1.0 / self.dims[d]:.6g}"
            bound = v.bound
        if self.train and op != "cumsum":
            # A residual path: softmax and layer_norm are invariant to some input directions, and
            # a param reaching the loss only through them has a gradient of pure rounding.
            text = f"{text} + {v.name} * 0.25"
            bound += v.bound * 0.25
        return text, v.dims, bound

    def movement(self, v, scope):
        op = self.rng.choice(["shift", "slice", "pad", "concat", "reshape", "rename", "transpose"])
        d = self.rng.choice(v.dims)
        size = self.dims[d]
        pos = v.dims.index(d)

        if op in ("slice", "pad", "concat", "reshape"):
            self.constrained.update(v.dims)

        def replaced(e):
            return v.dims[:pos] + (e,) + v.dims[pos + 1:]

        if op in ("shift", "rename", "transpose"):
            self.feature(op)
        if op == "shift":
            by = self.rng.randint(-size, size)
            return f"shift({v.name}, {d}, by = {by})", v.dims, v.bound
        if op == "slice" and size > 1:
            length = self.rng.randint(1, size - 1)
            e = self.new_dim(length)
            self.feature(op)
            start = self.rng.randint(0, size - length)
            return f"slice({v.name}, {d} -> {e}, start = {start})", replaced(e), v.bound
        if op == "pad" and self.size(v.dims) * 2 <= MAX_ELEMENTS:
            extra = self.rng.randint(1, size)
            e = self.new_dim(size + extra)
            self.feature(op)
            before = self.rng.randint(0, extra)
            return f"pad({v.name}, {d} -> {e}, before = {before})", replaced(e), v.bound
        if op == "concat" and self.size(v.dims) * 2 <= MAX_ELEMENTS:
            self.feature(op)
            partners = [w for w in scope if w.dtype == "f32" and len(w.dims) == len(v.dims)
                        and w.name != v.name]
            other_dims = [x for x in v.dims if x != d]
            for w in partners:
                extra = [x for x in w.dims if x not in other_dims]
                if len(extra) == 1 and set(other_dims) <= set(w.dims):
                    self.constrained.add(extra[0])
                    e = self.new_dim(size + self.dims[extra[0]])
                    return (f"concat({v.name}, {w.name}, along = [{d}, {extra[0]}] -> {e})",
                            replaced(e), max(v.bound, w.bound))
            e = self.new_dim(2 * size)
            return (f"concat({v.name}, tanh({self.arg(v.name, v.bound)}), along = [{d}, {d}] -> {e})",
                    replaced(e),
                    v.bound)
        if op == "reshape":
            self.feature(op)
            if len(v.dims) >= 2 and self.rng.random() < 0.5:
                a, b = v.dims[pos], v.dims[(pos + 1) % len(v.dims)]
                e = self.new_dim(self.dims[a] * self.dims[b])
                first = min(v.dims.index(a), v.dims.index(b))
                rest = [x for x in v.dims if x not in (a, b)]
                dims = tuple(rest[:first]) + (e,) + tuple(rest[first:])
                return f"reshape({v.name}, {a}, {b} -> {e})", dims, v.bound
            factors = [f for f in range(2, size) if size % f == 0]
            if factors:
                f = self.rng.choice(factors)
                a, b = self.new_dim(f), self.new_dim(size // f)
                dims = v.dims[:pos] + (a, b) + v.dims[pos + 1:]
                return f"reshape({v.name}, {d} -> {a}, {b})", dims, v.bound
        if op == "rename":
            e = self.new_dim(size)
            return f"rename({v.name}, {d} -> {e})", replaced(e), v.bound
        dims = list(v.dims)
        self.rng.shuffle(dims)
        return f"transpose({v.name} -> {', '.join(dims)})", tuple(dims), v.bound

    def misc(self, v, scope):
        if self.bf16 and self.rng.random() < 0.3:
            return self.low_precision(v)
        if self.rng.random() < 0.4:
            made = self.new_builtin(v, scope)
            if made:
                return made
        op = self.rng.choice(["one_hot", "gather", "one_hot", "gather", "cast", "iota",
                              "random", "dropout", "stop"])
        ids = [w for w in scope if w.dtype == "i32"]
        if op in ("one_hot", "gather") and ids:
            idv = self.rng.choice(ids)
            target = idv.index_dim
            if op == "one_hot" and self.size(idv.dims) * self.dims[target] <= MAX_ELEMENTS:
                self.feature("one_hot")
                oh = f"one_hot({idv.name}, {target})"
                if target in v.dims:
                    return f"{v.name} * {oh}", v.dims + tuple(d for d in idv.dims
                                                              if d not in v.dims), v.bound
                return oh, idv.dims + (target,), 1.0
            if op == "gather" and target in v.dims:
                pos = v.dims.index(target)
                out = v.dims[:pos] + tuple(d for d in idv.dims) + v.dims[pos + 1:]
                if len(set(out)) == len(out) and self.size(out) <= MAX_ELEMENTS:
                    self.feature("gather")
                    return f"gather({v.name}, {idv.name}, {target})", out, v.bound
        if op == "cast":
            kind = self.rng.choice(["bf16", "bf16", "i32cmp", "i32trunc"])
            if kind == "bf16" and self.bf16:
                return self.low_precision(v)
            if kind == "i32trunc" and ids:
                self.feature("cast_i32")
                idv = self.rng.choice(ids)
                return (f"{v.name} * cast(cast(cast({idv.name}, f32) * 2.0, i32) + 1, f32)",
                        v.dims + tuple(d for d in idv.dims if d not in v.dims), v.bound * 40)
            self.feature("cast_cmp")
            return f"{v.name} * cast({v.name} > 0.0, f32)", v.dims, v.bound
        if op == "iota":
            d = self.rng.choice(v.dims)
            self.feature("iota")
            return (f"{v.name} * cast(iota({d}) + 1, f32) * {1.0 / self.dims[d]:.6g}", v.dims,
                    v.bound)
        if op == "random":
            self.feature("random_tensor")
            if self.rng.random() < 0.5:
                return (f"{v.name} + normal({tensor_type('f32', v.dims)}, stddev = 0.1)", v.dims,
                        v.bound + 1)
            return (f"{v.name} * uniform({tensor_type('f32', v.dims)}, min = 0.5, max = 1.5)",
                    v.dims, v.bound * 1.5)
        if op == "dropout":
            self.feature("dropout")
            rate = self.rng.choice([0.1, 0.25, 0.5])
            return f"dropout({v.name}, rate = {rate})", v.dims, v.bound / (1 - rate)
        self.feature("stop_gradient")
        return f"{v.name} + stop_gradient({v.name}) * 0.5", v.dims, v.bound * 1.5

    def low_precision(self, v):
        low = self.rng.choice(["bf16", "f16"])
        self.feature(low)
        return f"cast(cast({v.name}, {low}) * 2.0, f32)", v.dims, v.bound * 2

    def expression(self, scope):
        f32 = [w for w in scope if w.dtype == "f32"]
        v = self.rng.choice(f32[-4:] if self.rng.random() < 0.7 else f32)
        kind = self.rng.choices(
            ["unary", "binary", "einsum", "reduce", "normalize", "movement", "misc"],
            weights=[2, 3, 3, 2, 2, 3, 4])[0]
        if kind == "unary":
            text, dims, bound = self.unary(v)
        elif kind == "binary":
            text, dims, bound = self.binary(v, scope)
        elif kind == "einsum":
            text, dims, bound = self.einsum(v, scope)
        elif kind == "reduce":
            text, dims, bound = self.reduce(v)
        elif kind == "normalize":
            text, dims, bound = self.normalize(v)
        elif kind == "movement":
            text, dims, bound = self.movement(v, scope)
        else:
            text, dims, bound = self.misc(v, scope)
        if not dims:
            dims = v.dims
            text = f"{v.name} + ({text})"
        if bound > 8:
            text, bound = f"tanh({self.arg(text, bound)})", 1.0
        return text, tuple(dims), bound

    def statements(self, scope, count, indent="  "):
        lines = []
        for _ in range(count):
            text, dims, bound = self.expression(scope)
            name = self.fresh()
            if len(dims) >= 2 and self.rng.random() < 0.1:
                # A stated type in another dim order: a transpose inserted by sema.
                order = list(dims)
                self.rng.shuffle(order)
                self.feature("typed_let")
                dims = tuple(order)
                lines.append(f"{indent}let {name}: {tensor_type('f32', dims)} = {text}")
            else:
                lines.append(f"{indent}let {name} = {text}  // {tensor_type('f32', dims)}")
            scope.append(Value(name, "f32", dims, bound))
        return lines

    def project(self, v, dims, scope_params, indent):
        """An expression of type f32[dims] from v: an einsum with a param that brings the
        missing dims (and sums v's others), or v itself."""
        missing = [d for d in dims if d not in v.dims]
        extra = [d for d in v.dims if d not in dims]
        if not missing and not extra:
            return v.name
        if missing:
            p = self.fresh("w")
            std = 1.0 / math.sqrt(max(1, self.size(extra)))
            init = self.rng.choice([f"normal(stddev = {std:.4g})",
                                    f"truncated_normal(stddev = {std:.4g})",
                                    f"uniform(min = {-std:.4g}, max = {std:.4g})"])
            scope_params.append(f"{indent}param {p}: {tensor_type('f32', missing)} = {init}")
            k = self.size(extra) if extra else 1
            scale = 1.0 / math.sqrt(k) * (2.0 / v.bound if self.train and v.bound > 2 else 1.0)
            return f"tanh(einsum({v.name}, {p} -> {', '.join(dims)}) * {scale:.6g})"
        return f"mean({v.name}, {', '.join(extra)})"

    # ---- defs and repeat blocks
    def layer_def(self, dims, base, extra=None):
        """A def f32[dims] -> f32[dims] with its own params: a residual block, repeatable.
        EXTRA, a value of the caller, becomes a second argument `m` (a mask, shared weights)."""
        self.def_count += 1
        name = f"layer{self.def_count}"
        args = f"x: {tensor_type('f32', dims)}"
        scope = [Value("x", "f32", dims)]
        if extra is not None:
            args += f", m: {tensor_type('f32', extra.dims)}"
            scope.append(Value("m", "f32", extra.dims, extra.bound))
        lines = [f"def {name}({args}) -> {tensor_type('f32', dims)} {{"]
        params = []
        inner = self.pick_dims(base, 1, 2)
        w = self.fresh("w")
        init = self.rng.choice(["normal(stddev = 0.5)", "uniform(min = -0.5, max = 0.5)",
                                "ones()", "constant(value = 0.5)", "truncated_normal(stddev = 0.5)"])
        if init in ("ones()", "constant(value = 0.5)") and self.train:
            init = "normal(mean = 0.5, stddev = 0.2)"
        params.append(f"  param {w}: {tensor_type('f32', inner)} = {init}")
        scope.append(Value(w, "f32", inner))
        if self.rng.random() < 0.3 and not self.train:
            c = self.fresh("c")
            params.append(f"  const {c}: {tensor_type('f32', inner)} = normal(stddev = 0.5)")
            scope.append(Value(c, "f32", inner))
        body = self.statements(scope, self.rng.randint(1, 4))
        result = self.project(scope[-1], dims, params, "  ")
        gate = self.rng.choice(["0.5", "0.25"])
        # A scale param on the way out: the result always depends on a param (whatever the
        # random body computed), so a train block always has something to minimize.
        s = self.fresh("s")
        params.append(f"  param {s}: {tensor_type('f32', dims[-1:])} = "
                      "normal(mean = 1, stddev = 0.1)" + self.tied_path(dims))
        squashed = f"tanh({self.arg(result, scope[-1].bound)})"
        lines += params + body + [f"  return x + {squashed} * {s} * {gate}", "}"]
        self.defs.append("\n".join(lines))
        self.feature("def")
        return name

    def repeat_block(self, v, scope, base):
        dims = v.dims
        style = self.rng.choice(["plain", "two", "let", "nested", "dim", "arg", "indef", "shared"])
        self.feature("repeat_" + style)
        extra = None
        if style == "arg":
            extra = self.rng.choice([w for w in scope if w.dtype == "f32"])
        layer = self.layer_def(dims, base, extra)
        count = self.rng.choice([1, 2, 3, 4, 6, 8])
        h = self.fresh("h")
        lines = [f"  let {h} = {v.name}  // {tensor_type('f32', dims)}"]
        if style == "indef":
            # A def whose body is the repeat: layers outlined inside an inlined call.
            self.def_count += 1
            stack = f"stack{self.def_count}"
            t = tensor_type("f32", dims)
            self.defs.append("\n".join([f"def {stack}(x: {t}) -> {t} {{", "  let h = x",
                                         f"  repeat {count} {{", f"    h = {layer}(h)", "  }",
                                         "  return h", "}"]))
            lines.append(f"  {h} = {stack}({h})")
            if self.rng.random() < 0.5:
                lines.append(f"  {h} = {stack}({h})")
            scope.append(Value(h, "f32", dims, 1.0 + v.bound))
            return lines
        if style == "dim":
            rd = self.new_dim(count, "r")
            self.repeat_dims.add(rd)
            lines.append(f"  repeat {rd} {{")
        elif style == "shared":
            lines.append(f"  repeat {count} shared {{")
        else:
            lines.append(f"  repeat {count} {{")
        if style == "two":
            other = self.layer_def(dims, base)
            lines += [f"    {h} = {layer}({h})", f"    {h} = {other}({h})",
                      f"    {h} = {layer}({h})"]
        elif style == "let":
            t = self.fresh("t")
            lines += [f"    let {t} = {layer}({h}) * 0.5", f"    {h} = {h} * 0.5 + {t}"]
        elif style == "nested":
            lines += ["    repeat 2 {", f"      {h} = {layer}({h})", "    }"]
        elif style == "arg":
            lines.append(f"    {h} = {layer}({h}, {extra.name})")
        else:
            lines.append(f"    {h} = {layer}({h})")
        lines.append("  }")
        scope.append(Value(h, "f32", dims, 1.0 + v.bound))
        return lines

    # ---- the whole file
    def generate(self):
        rng = self.rng
        for _ in range(rng.randint(2, 5)):
            self.new_dim(rng.choice(SIZES), "d")
        base = list(self.dims)
        inputs = []
        for i in range(rng.randint(1, 3)):
            # normal(0, 1) inputs: |x| < 3 but for one value in 370.
            inputs.append(Value(f"x{i}", "f32", self.pick_dims(base, 1, 3), 3.0))
        ids = None
        if rng.random() < 0.6:
            target = rng.choice(base)
            ids = Value("ids", "i32", self.pick_dims([d for d in base if d != target], 1, 2))
            ids.index_dim = target
        self.inputs = inputs
        scope = list(inputs) + ([ids] if ids else [])
        body = []
        params = []
        n = rng.randint(3, 10)
        for _ in range(n):
            if rng.random() < 0.25:
                v = rng.choice([w for w in scope if w.dtype == "f32"][-3:])
                body += self.repeat_block(v, scope, base)
            elif rng.random() < 0.12:
                v = rng.choice([w for w in scope if w.dtype == "f32"][-3:])
                body += self.generic_def(v, scope)
            elif rng.random() < 0.1:
                v = rng.choice([w for w in scope if w.dtype == "f32"][-3:])
                body += self.multi_result_def(v, scope)
            else:
                body += self.statements(scope, 1)
        # A train block ends with a repeat of layers, whose params the loss then depends on.
        if self.train or (not any("repeat" in line for line in body) and rng.random() < 0.5):
            body += self.repeat_block(scope[-1], scope, base)
        name = f"case{self.case.seed}"
        self.case.function = name
        sig_inputs = [f"{w.name}: {tensor_type(w.dtype, w.dims)}" for w in inputs]
        if ids:
            sig_inputs.append(f"ids: {tensor_type('i32', ids.dims)}")
        if self.train:
            last = scope[-1]
            if STEP_STATE and rng.random() < 0.3:
                body += self.step_state(last, scope)
                last = scope[-1]
            tdims = self.pick_dims(base, 1, 3)
            body.append(f"  let pred = {self.project(last, tdims, params, '  ')}"
                        f"  // {tensor_type('f32', tdims)}")
            sig_inputs.append(f"target: {tensor_type('f32', tdims)}")
            loss = rng.choice(["mean(square(pred - target))", "mean(abs(pred - target) + square(pred))",
                               "mean(square(pred - target)) + mean(square(pred)) * 0.1"])
            metrics = []
            if rng.random() < 0.3:
                # Train-block metrics: forward values of the step's params before the update.
                self.feature("train_metrics")
                metrics.append("m0: f32[]")
                body.append("  m0 = mean(abs(pred))")
                if rng.random() < 0.5:
                    metrics.append("m1: f32[]")
                    body.append(f"  m1 = max(square(pred - target))")
            body.append(f"  let loss = {loss}  // f32[]")
            body.append(f"  minimize loss with {self.optimizer()}")
            if metrics:
                header = [f"train {name}(", *self.item_lines(sig_inputs), ") -> (",
                          *self.item_lines(metrics), ") {"]
            else:
                header = [f"train {name}(", *self.item_lines(sig_inputs), ") {"]
            self.case.steps = rng.randint(1, 3)
        else:
            outs = []
            candidates = [w for w in scope if w.dtype == "f32" and w not in inputs]
            chosen = [candidates[-1]] + rng.sample(candidates[:-1], min(len(candidates) - 1,
                                                                         rng.randint(0, 2)))
            for i, w in enumerate(chosen):
                outs.append(f"y{i}: {tensor_type('f32', w.dims)}")
                body.append(f"  y{i} = {w.name}")
            if rng.random() < 0.15:
                # Two outputs of one value, and an input passed through: aliasing for codegen.
                self.feature("aliased_outputs")
                outs.append(f"ya: {tensor_type('f32', chosen[0].dims)}")
                body.append(f"  ya = {chosen[0].name}")
                x = rng.choice(inputs)
                outs.append(f"yx: {tensor_type('f32', x.dims)}")
                body.append(f"  yx = {x.name}")
            if ids and rng.random() < 0.4:
                # An i32 output: integer arithmetic, iota and a comparison, compared exactly.
                d = rng.choice(base)
                dims = ids.dims + ((d,) if d not in ids.dims else ())
                self.feature("i32_output")
                outs.append(f"yi: {tensor_type('i32', dims)}")
                yi = rng.choice([f"ids * 3 - iota({d}) + cast(ids >= 1, i32)",
                                 f"(ids * 3 - iota({d})) % {rng.choice([4, -3, 7])}",
                                 f"floordiv(ids - iota({d}) * 2, {rng.choice([2, -3, 5])})",
                                 f"mod(iota({d}) - ids, 3) + clip(ids, 1, 2)"])
                body.append(f"  yi = {yi}")
            if rng.random() < 0.25:
                # i32 positions of an exact source: compared exactly.
                d = rng.choice(base)
                dims = self.pick_dims(base, 1, 3)
                dims = dims + ((d,) if d not in dims else ())
                src = self.exact_source(dims, scope)
                if rng.random() < 0.5:
                    op = rng.choice(["argmax", "argmin"])
                    self.feature(op)
                    rest = tuple(x for x in dims if x != d)
                    if rest:
                        outs.append(f"yk: {tensor_type('i32', rest)}")
                        body.append(f"  yk = {op}({src}, {d})")
                else:
                    self.feature("top_k_indices")
                    k = self.new_dim(rng.randint(1, self.dims[d]), "k")
                    out = tuple(k if x == d else x for x in dims)
                    outs.append(f"yk: {tensor_type('i32', out)}")
                    body.append(f"  yk = top_k_indices({src}, {d} -> {k})")
            header = [f"program {name}(", *self.item_lines(sig_inputs), ") -> (",
                      *self.item_lines(outs), ") {"]
        # Params of the entry block's projections live in a def: programs may not declare
        # params at top level in every mode, and a def keeps one call path for them.
        if params:
            body = self.wrap_params(params, body)
        mesh, layout = self.layout_with_override(base)
        parts = ["// generated by tests/fuzz/meshgen.py"]
        if mesh:
            parts.append(mesh)
        parts += [f"dim {d} = {s}" for d, s in self.dims.items()]
        if layout:
            parts.append(layout)
        parts += self.defs
        parts += header + body + ["}"]
        self.case.text = "\n".join(parts) + "\n"
        if self.case.ranks > 1 and rng.random() < 0.15:
            self.case.backend = "mpi"
        if "auto" in layout and rng.random() < 0.5:
            self.case.machine = rng.choice(["8xh100", "tpuv2-pod", "h100-cluster"])
            self.feature("machine_" + self.case.machine)
        self.case.run_seed = rng.choice([0, 0, 1, 7, 12345])
        # meshc run's own default (-O3 -march=native) now and then: vectorized loops.
        self.case.opt = rng.choice(["-O1", "-O1", "-O1", "-O2", "-O3 -march=native"])
        return self.case

    def wrap_params(self, params, body):
        return params + body

    @staticmethod
    def item_lines(items):
        # One item a line, the comma leading, so that the reducer can delete any but the first.
        return [f"  {item}" if i == 0 else f"  , {item}" for i, item in enumerate(items)]

    def optimizer(self):
        rng = self.rng
        kind = rng.choice(OPTIMIZERS)
        self.feature("opt_" + kind)
        if kind.startswith("sgd"):
            args = [f"lr = {rng.choice([0.01, 0.05, 0.1])}"]
            if kind != "sgd":
                args.append("momentum = 0.9")
            if kind == "sgd_nesterov":
                args.append("nesterov = 1")
            kind = "sgd"
        elif kind == "adamw":
            args = [f"lr = {rng.choice([1e-3, 3e-4])}"]
            if rng.random() < 0.5:
                args += ["beta2 = 0.95", f"weight_decay = {rng.choice([0.0, 0.1])}"]
        else:
            args = [f"lr = {rng.choice([1e-2, 1e-3])}"]
            if rng.random() < 0.5:
                args += ["decay_rate = 0.8", "beta1 = 0.9"]
        if rng.random() < 0.5:
            schedule = rng.choice(SCHEDULES)
            self.feature("schedule_" + schedule)
            args += ["warmup_steps = 2", "decay_steps = 10", f"schedule = {schedule}"]
        if rng.random() < 0.4:
            self.feature("clip_norm")
            args.append(f"clip_norm = {rng.choice([0.5, 1, 10])}")
        return f"{kind}({', '.join(args)})"


def generate(seed, **kwargs):
    return Generator(seed, **kwargs).generate()


if __name__ == "__main__":
    case = generate(int(sys.argv[1]))
    sys.stdout.write(case.text)
    print(" ".join(case.run_args()), "expect_error=" + case.expect_error, case.features,
          file=sys.stderr)
