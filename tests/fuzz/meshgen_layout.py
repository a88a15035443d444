"""Meshes and layouts for meshgen.Generator: pinned, `auto`, mixed and blindly drawn layouts,
and the error path (a dim pinned to axes that do not divide it, two dims of a tensor on one
axis, a `--dim` or `--mesh` override that makes a valid layout non-divisible)."""
import re


class LayoutMixin:
    def layout_with_override(self, base):
        """The mesh and layout lines; on the error path, now and then a valid pinned layout that
        a command-line `--dim` or `--mesh` override makes non-divisible: the error must still be
        located at the layout line of the file."""
        if not self.error_path or self.rng.random() < 0.7:
            return self.mesh_and_layout(base)
        self.error_path = False
        mesh, layout = self.mesh_and_layout(base, style="pinned")
        self.error_path = True
        axis_sizes = dict(re.findall(r"(\w+) = (\d+)", mesh))
        # A dim whose size other dims follow (slice, pad, concat, reshape) would fail sema
        # first, with another error.
        single = [item.split(": ") for item in layout[len("layout "):].split(", ")
                  if re.fullmatch(r"\w+: \w+", item)] if layout else []
        single = [(d, a) for d, a in single
                  if int(axis_sizes[a]) > 1 and d not in self.constrained]
        if not single:
            self.case.extra_args = []
            return self.mesh_and_layout(base)
        d, a = self.rng.choice(single)
        if self.rng.random() < 0.5:
            size = self.dims[d] + 1
            self.case.extra_args = ["--dim", f"{d}={size}"]
            self.feature("error_dim_override")
        else:
            sizes = axis_sizes
            k = next(k for k in (3, 5, 7, 9, 11) if self.dims[d] % k)
            sizes[a] = str(k)
            self.case.extra_args = ["--mesh", ",".join(f"{x}={n}" for x, n in sizes.items())]
            self.feature("error_mesh_override")
        self.case.expect_error = "is not divisible by"
        return mesh, layout

    def random_layout(self, axes):
        """Layout items drawn blindly (unknown dims and axes, an axis twice, empty lists,
        `auto`): any located error is a fine outcome, and a layout the planner accepts must
        run and match like any other."""
        rng = self.rng
        names = list(self.dims) + ["nodim"]
        axis_names = [a for a, _ in axes] + ["noaxis"]
        items = []
        for _ in range(rng.randint(1, 4)):
            d, k = rng.choice(names), rng.random()
            if k < 0.5:
                items.append(f"{d}: {rng.choice(axis_names)}")
            elif k < 0.7:
                chosen = rng.sample(axis_names, min(len(axis_names), rng.randint(0, 3)))
                items.append(f"{d}: [{', '.join(chosen)}]")
            elif k < 0.8:
                items.append(f"{d}: auto")
            elif k < 0.9:
                items.append("auto")
            else:
                items.append(f"{d}: [{rng.choice(axis_names)}, {rng.choice(axis_names)}]")
        self.case.may_reject = ": error: "
        self.feature("layout_random")
        return "layout " + ", ".join(items)

    def mesh_and_layout(self, base, style=None):
        rng = self.rng
        if rng.random() < 0.1 and not self.error_path:
            return "", ""
        # The rank count first (up to 8), then its split into one to three axes; an axis of
        # size 1 now and then (a degenerate split every layout must still handle).
        total = rng.choice([2, 2, 4, 4, 4, 8, 8]) if not self.error_path else rng.choice([2, 4, 8])
        sizes = []
        left = total
        while left > 1:
            size = rng.choice([f for f in (2, 4, 8) if left % f == 0])
            if len(sizes) == 2:
                size = left
            sizes.append(size)
            left //= size
        if rng.random() < 0.1 and not self.error_path:
            sizes.insert(rng.randint(0, len(sizes)), 1)
            self.feature("axis_of_size_1")
        axes = [(f"a{i}", size) for i, size in enumerate(sizes)]
        self.case.ranks = total
        mesh = "mesh grid[" + ", ".join(f"{a} = {s}" for a, s in axes) + "]"
        self.feature(f"ranks{total}")
        style = style or rng.choice(["pinned", "pinned", "auto", "mixed", "none"])
        items = []
        used = set()
        if not self.error_path and style != "pinned" and rng.random() < 0.1:
            return mesh, self.random_layout(axes)
        if self.error_path and rng.random() < 0.3:
            # Two dims of one input on one axis: a located error naming the axis.
            for w in self.inputs:
                a, s = rng.choice(axes)
                both = [d for d in w.dims if self.dims[d] % s == 0]
                if len(both) >= 2:
                    self.case.expect_error = f"'{a}'"
                    self.feature("error_axis_twice")
                    tail = ", auto" if rng.random() < 0.5 else ""
                    return mesh, f"layout {both[0]}: {a}, {both[1]}: {a}{tail}"
        if self.error_path:
            # Pin a dim to an axis that does not divide it: the planner's located error. Not a
            # repeat's count: its layers split unevenly over the axis's stages (docs/language.md).
            for d in rng.sample(list(self.dims), len(self.dims)):
                bad = [(a, s) for a, s in axes if self.dims[d] % s]
                if bad and d not in self.repeat_dims:
                    a, s = rng.choice(bad)
                    items.append(f"{d}: {a}")
                    if rng.random() < 0.3:
                        items.append("auto")
                    self.case.expect_error = f"'{d}'"
                    self.feature("error_nondivisible")
                    return mesh, "layout " + ", ".join(items)
            # Every dim divides: add one that does not.
            a, s = axes[0]
            d = self.new_dim(s + 1, "bad")
            self.case.expect_error = f"'{d}'"
            self.feature("error_nondivisible")
            return mesh, f"layout {d}: {a}"
        if style == "none":
            return mesh, ""
        if style == "auto":
            self.feature("layout_auto")
            return mesh, "layout auto"
        # One axis per dim at most, each axis for one dim: no tensor can hold an axis twice.
        for d in rng.sample(list(self.dims), len(self.dims)):
            if d in self.repeat_dims:
                continue
            free = [(a, s) for a, s in axes if a not in used]
            if not free or rng.random() < 0.4:
                continue
            if len(free) >= 2 and rng.random() < 0.2:
                (a, s), (b, t) = rng.sample(free, 2)
                if self.dims[d] % (s * t) == 0:
                    items.append(f"{d}: [{a}, {b}]")
                    used |= {a, b}
                    self.feature("layout_two_axes")
                    continue
            a, s = rng.choice(free)
            if self.dims[d] % s == 0:
                items.append(f"{d}: {a}")
                used.add(a)
        if used and rng.random() < 0.2:
            # Megatron-style: one more dim on an axis already used. Valid when no tensor holds
            # both dims; otherwise the planner must say so with a located error naming the axis.
            a = rng.choice(sorted(used))
            s = dict(axes)[a]
            pinned = {item.split(":")[0] for item in items}
            spare = [d for d in self.dims
                     if d not in pinned and d not in self.repeat_dims and self.dims[d] % s == 0]
            if spare:
                items.append(f"{rng.choice(spare)}: {a}")
                self.case.may_reject = f"to mesh axis '{a}'"
                self.feature("layout_shared_axis")
        if style == "mixed":
            items.append("auto")
            self.feature("layout_mixed_auto")
        if not items:
            return mesh, ""
        self.feature("layout_pinned")
        return mesh, "layout " + ", ".join(items)

