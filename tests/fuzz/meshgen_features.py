"""The generator's newer constructs (issue 13), mixed into meshgen.Generator: generic defs over
dims with local dims and size(), defs with several results, weight sharing (`repeat N shared`),
tied params (`as "path"`), train-block metrics, and the builtins floor/ceil/round, clip, i32
`%`/floordiv/mod, argmax/argmin, top_k_values/top_k_indices, scatter_add, random_int and
random_permutation.

Soundness of the comparison: floor/ceil/round, argmax/argmin and top_k are discontinuous, so a
rounding difference between f32 code and the f64 interpreter could flip them. Their inputs are
therefore always *exact* values: small integers (from iota, ids, random_int, i32 arithmetic) cast
to f32 and scaled by powers of two, which f32 and f64 hold exactly and combine exactly. The
discontinuous op then sees identical inputs in both, so its output is exact (integer outputs are
compared exactly; a tie is broken by position, the same rule in both). Continuous values only
enter afterwards (multiplied by, or gathered with, the exact result)."""


class FeatureMixin:
    # ---- exact (integer-valued) sources
    def exact_source(self, dims, scope):
        """An f32[dims] expression whose values are small integers, computed exactly in f32 and
        f64: an i32 expression over iota, ids and random_int, cast to f32. Its bound is < 16."""
        rng = self.rng
        parts = []
        for d in dims:
            parts.append(f"iota({d}) * {rng.randint(1, 7)}")
        ids = [w for w in scope if w.dtype == "i32" and set(w.dims) <= set(dims)]
        if ids and rng.random() < 0.5:
            parts.append(f"{rng.choice(ids).name} * {rng.randint(1, 5)}")
        if rng.random() < 0.4:
            self.feature("random_int")
            parts.append(f"random_int(i32[{', '.join(dims)}], max = {rng.randint(1, 9)})")
        text = " + ".join(parts)
        m = rng.randint(2, 11)
        kind = rng.choice(["%", "mod", "floordiv"])
        self.feature("i32_" + ("mod" if kind != "floordiv" else "floordiv"))
        if kind == "%":
            # Negative operands too: the sign follows the divisor, as in Python.
            text = f"({text} - {rng.randint(0, 9)}) % {rng.choice([m, -m])}"
        elif kind == "mod":
            text = f"mod({text}, {m})"
        else:
            text = f"floordiv({text} - {rng.randint(0, 20)}, {m}) % 16"
        return f"cast({text}, f32)"

    def discontinuous(self, v, scope):
        """floor/ceil/round, argmax/argmin or top_k over an exact source shaped like v, its
        result brought back to v's dims and mixed with v."""
        rng = self.rng
        q = self.exact_source(v.dims, scope)
        op = rng.choice(["floor", "ceil", "round", "argmax", "argmin", "top_k_values",
                         "top_k_indices", "clip"])
        self.feature(op)
        if op in ("floor", "ceil", "round"):
            # Quarters and halves of integers: exact, and round() meets exact halves (to even).
            scale = rng.choice(["0.5", "0.25", "1.5"])
            return f"{v.name} * {op}({q} * {scale}) * 0.125", v.dims, v.bound * 2
        if op == "clip":
            if rng.random() < 0.5:
                return f"clip({v.name}, -0.75, 1.25)", v.dims, min(v.bound, 1.25)
            return f"clip({v.name}, -1.0, {q} * 0.25)", v.dims, max(v.bound, 4.0)
        d = rng.choice(v.dims)
        if op in ("argmax", "argmin"):
            pos = f"{op}({q}, {d})"
            if rng.random() < 0.5:
                # The positions picked out by one_hot: v's elements at the extremes of q.
                self.feature("one_hot")
                return f"{v.name} * one_hot({pos}, {d})", v.dims, v.bound
            return (f"{v.name} * cast({pos} + 1, f32) * {1.0 / self.dims[d]:.6g}", v.dims,
                    v.bound)
        k = self.new_dim(rng.randint(1, self.dims[d]), "k")
        self.constrained.add(d)
        if op == "top_k_values":
            out = tuple(k if x == d else x for x in v.dims)
            return f"top_k_values({q}, {d} -> {k}) * 0.0625", out, 1.0
        out = tuple(k if x == d else x for x in v.dims)
        return (f"cast(top_k_indices({q}, {d} -> {k}), f32) * {1.0 / self.dims[d]:.6g}", out,
                1.0)

    def scatter(self, v, scope):
        ids = [w for w in scope if w.dtype == "i32" and hasattr(w, "index_dim")]
        if not ids:
            return None
        idv = self.rng.choice(ids)
        target = idv.index_dim
        # The updates: v without the target dim, broadcast over the ids' dims (an id's value
        # added in so that rows differ).
        src = f"mean({v.name}, {target})" if target in v.dims else v.name
        kept = tuple(x for x in v.dims if x != target)
        updates = f"({src} + cast({idv.name}, f32) * 0.125)"
        rest = tuple(x for x in kept if x not in idv.dims)
        out = (target,) + rest
        if self.size(out) > 4096 or self.size(kept + idv.dims) > 4096 * 4:
            return None
        self.feature("scatter_add")
        return (f"scatter_add({updates}, {idv.name}, {target}) * "
                f"{1.0 / self.size(idv.dims):.6g}", out, v.bound + 2)

    def permutation(self, v):
        d = self.rng.choice(v.dims)
        self.feature("random_permutation")
        self.feature("gather")
        e = self.new_dim(self.dims[d])
        self.constrained.add(d)
        out = tuple(e if x == d else x for x in v.dims)
        return (f"gather({v.name}, rename(random_permutation({d}), {d} -> {e}), {d})", out,
                v.bound)

    def new_builtin(self, v, scope):
        """One of the newer builtins applied to v: (text, dims, bound), or None."""
        kind = self.rng.choice(["discontinuous", "discontinuous", "scatter", "permutation"])
        if kind == "scatter":
            return self.scatter(v, scope)
        if kind == "permutation":
            return self.permutation(v)
        return self.discontinuous(v, scope)

    # ---- defs
    def generic_def(self, v, scope):
        """A def over a dim parameter S (one of v's dims), with size(S) in constant keyword
        arguments and, for even sizes, a local dim of half the size. Returns the call lines."""
        rng = self.rng
        self.def_count += 1
        name = f"generic{self.def_count}"
        d = rng.choice(v.dims)
        sig = tuple("S" if x == d else x for x in v.dims)
        t = f"f32[{', '.join(sig)}]"
        self.feature("generic_def")
        body = [f"def {name}[S](x: {t}) -> {t} {{",
                "  param g: f32[S] = normal(mean = 1, stddev = rsqrt(size(S)) * 0.1)"]
        y = "x * g"
        if self.dims[d] >= 2 and self.dims[d] % 2 == 0:
            self.feature("local_dim")
            half = f"half{self.def_count}"
            body += [f"  dim {half} = size(S) / 2",
                     f"  let a = slice(x, S -> {half}, start = 0)",
                     f"  let b = slice(x, S -> {half}, start = size({half}))",
                     f"  let c = pad(tanh(a * b), {half} -> S, before = size({half}))"]
            y = f"{y} + c * 0.5"
        else:
            body.append(f"  let c = shift(x, S, by = size(S) - 1) * (1.0 / size(S))")
            y = f"{y} + c"
        body += [f"  return tanh({y}) * 0.5 + x * 0.5", "}"]
        self.defs.append("\n".join(body))
        h = self.fresh("g")
        lines = [f"  let {h} = {name}({v.name})  // f32[{', '.join(v.dims)}]"]
        if rng.random() < 0.3:
            self.feature("generic_explicit")
            lines.append(f"  {h} = {name}[{d}]({h})")
        scope.append(self.value(h, "f32", v.dims, 1.0 + v.bound * 0.5))
        return lines

    def multi_result_def(self, v, scope):
        """A def with two results, bound by `let a, b = f(x)` (or one discarded with `_`)."""
        rng = self.rng
        self.def_count += 1
        name = f"pair{self.def_count}"
        t = f"f32[{', '.join(v.dims)}]"
        self.feature("multi_result")
        if len(v.dims) >= 2:
            d = rng.choice(v.dims)
            rest = tuple(x for x in v.dims if x != d)
            second, second_t, sdims = f"mean(x, {d})", f"f32[{', '.join(rest)}]", rest
        else:
            second, second_t, sdims = "x * 0.5", t, v.dims
        self.defs.append("\n".join([
            f"def {name}(x: {t}) -> (a: {t}, b: {second_t}) {{",
            f"  param s: f32[{v.dims[-1]}] = normal(mean = 1, stddev = 0.1)",
            "  return tanh(x) * s, " + second, "}"]))
        a, b = self.fresh("p"), self.fresh("q")
        style = rng.choice(["both", "both", "discard_a", "discard_b"])
        if style == "discard_a":
            self.feature("multi_result_discard")
            lines = [f"  let _, {b} = {name}({v.name})"]
            scope.append(self.value(b, "f32", sdims, v.bound))
        elif style == "discard_b":
            self.feature("multi_result_discard")
            lines = [f"  let {a}, _ = {name}({v.name})"]
            scope.append(self.value(a, "f32", v.dims, 1.5))
        else:
            lines = [f"  let {a}, {b} = {name}({v.name})"]
            scope.append(self.value(b, "f32", sdims, v.bound))
            scope.append(self.value(a, "f32", v.dims, 1.5))
        return lines

    def tied_path(self, dims):
        """Now and then an `as "path"` for a layer's scale param: every layer (and iteration)
        with the same last dim then shares one param."""
        if self.rng.random() < 0.3:
            self.feature("tied_param")
            return f' as "tied/scale_{dims[-1]}"'
        return ""

    def step_state(self, v, scope):
        """A step state over v's dims in a train block: read (its value at the start of the
        step) into the loss's path and written with a bounded value for the next step."""
        self.feature("step_state")
        st, h = self.fresh("st"), self.fresh("hs")
        t = f"f32[{', '.join(v.dims)}]"
        init = self.rng.choice(["zeros()", "constant(value = 0.5)", "normal(stddev = 0.5)"])
        lines = [f"  state {st}: {t} = {init}",
                 f"  let {h} = {v.name} + {st} * 0.5  // {t}"]
        if len(v.dims) >= 2 and self.rng.random() < 0.3:
            # Written in another dim order: a transpose inserted by sema.
            order = list(reversed(v.dims))
            lines.append(f"  next {st} = transpose(tanh({self.arg(h, v.bound + 0.5)}) -> "
                         f"{', '.join(order)})")
        else:
            lines.append(f"  next {st} = tanh({self.arg(h, v.bound + 0.5)})")
        scope.append(self.value(h, "f32", v.dims, v.bound + 0.5))
        return lines
