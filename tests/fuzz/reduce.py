"""Delta-debugging reduction of a failing fuzz case to a small reproducer that fails the same way.

The generator writes one statement a line with its type in a trailing comment, so the passes
work on lines: delete whole blocks (defs, repeats) and chunks of lines (ddmin), replace a `let`
by one of its operands of the same type, shrink repeat counts, dims and the mesh, and drop
layout items. A candidate is kept when `still_fails(text)` says it fails as the original did."""
import re
import time

TYPE_COMMENT = re.compile(r"^\s*let (\w+) = (.*?)\s*//\s*(\w+\[[^\]]*\])\s*$")
DECLARED = re.compile(r"(?:^\s*|[(,]\s*|param |const )(\w+): (\w+\[[^\]]*\])")
IDENT = re.compile(r"\b[A-Za-z_]\w*\b")


class Reducer:
    def __init__(self, text, still_fails, budget_s=600, log=print):
        self.lines = text.splitlines()
        self.still_fails = still_fails
        self.deadline = time.time() + budget_s
        self.log = log
        self.tests = 0

    def out_of_time(self):
        return time.time() > self.deadline

    def attempt(self, lines):
        if self.out_of_time():
            return False
        self.tests += 1
        if self.still_fails("\n".join(lines) + "\n"):
            self.lines = lines
            return True
        return False

    # ---- passes
    def blocks(self):
        """(start, end) line ranges of defs and repeats, end inclusive, innermost last."""
        spans, stack = [], []
        for i, line in enumerate(self.lines):
            stripped = line.strip()
            if re.match(r"^(def |repeat )", stripped) and stripped.endswith("{"):
                stack.append(i)
            elif stripped.endswith("{"):
                stack.append(None)
            elif stripped == "}" and stack:
                start = stack.pop()
                if start is not None:
                    spans.append((start, i))
        return spans

    def delete_blocks(self):
        progress = False
        for start, end in sorted(self.blocks(), key=lambda s: s[0] - s[1]):
            if end >= len(self.lines):
                continue
            candidate = self.lines[:start] + self.lines[end + 1:]
            if self.attempt(candidate):
                progress = True
                return True  # the spans moved: recompute
        return progress

    def removable(self, i):
        stripped = self.lines[i].strip()
        return not (stripped in ("}", "{", ") {", ") -> (") or stripped.startswith(
            ("program ", "train ", "def ", "repeat ", "mesh ", "minimize ")))

    def delete_lines(self):
        """ddmin over the removable lines: chunks of halving size."""
        progress = False
        chunk = max(1, len(self.lines) // 2)
        while chunk >= 1 and not self.out_of_time():
            i = 0
            while i < len(self.lines) and not self.out_of_time():
                span = [j for j in range(i, min(i + chunk, len(self.lines))) if self.removable(j)]
                if span:
                    drop = set(span)
                    candidate = [line for j, line in enumerate(self.lines) if j not in drop]
                    if self.attempt(candidate):
                        progress = True
                        continue
                i += chunk
            chunk //= 2
        return progress

    def delete_first_items(self):
        """The first item of a signature list has no leading comma: delete it with the next
        item's comma."""
        progress = False
        i = 0
        while i + 1 < len(self.lines) and not self.out_of_time():
            line, following = self.lines[i], self.lines[i + 1]
            if re.match(r"^  \w+: ", line) and following.startswith("  , "):
                candidate = self.lines[:i] + ["  " + following[4:]] + self.lines[i + 2:]
                if self.attempt(candidate):
                    progress = True
                    continue
            i += 1
        return progress

    def types(self):
        known = {}
        for line in self.lines:
            m = TYPE_COMMENT.match(line)
            if m:
                known[m.group(1)] = m.group(3).replace(" ", "")
            for name, typ in DECLARED.findall(line.split("//")[0]):
                known[name] = typ.replace(" ", "")
        return known

    def substitute_operands(self):
        progress = False
        i = 0
        while i < len(self.lines) and not self.out_of_time():
            m = TYPE_COMMENT.match(self.lines[i])
            if m:
                name, expr, typ = m.group(1), m.group(2), m.group(3).replace(" ", "")
                known = self.types()
                operands = [w for w in dict.fromkeys(IDENT.findall(expr))
                            if w != name and known.get(w) == typ]
                if expr.strip() not in operands:
                    indent = self.lines[i][:len(self.lines[i]) - len(self.lines[i].lstrip())]
                    for operand in operands:
                        candidate = list(self.lines)
                        candidate[i] = f"{indent}let {name} = {operand}  // {m.group(3)}"
                        if self.attempt(candidate):
                            progress = True
                            break
            i += 1
        return progress

    def inline_aliases(self):
        """`let a = b`: delete it and read b where a was read."""
        progress = False
        i = 0
        while i < len(self.lines) and not self.out_of_time():
            m = TYPE_COMMENT.match(self.lines[i])
            if m and re.fullmatch(r"\w+", m.group(2)):
                alias, source = m.group(1), m.group(2)
                rest = [re.sub(rf"\b{alias}\b", source, line) for line in self.lines[i + 1:]]
                if self.attempt(self.lines[:i] + rest):
                    progress = True
                    continue
            i += 1
        return progress

    def rewrite_numbers(self, pattern, smaller):
        """For each line matching PATTERN (group 1: a number), try the values smaller(n)."""
        progress = False
        for i in range(len(self.lines)):
            m = re.search(pattern, self.lines[i])
            if not m:
                continue
            n = int(m.group(1))
            for value in smaller(n):
                candidate = list(self.lines)
                candidate[i] = self.lines[i][:m.start(1)] + str(value) + self.lines[i][m.end(1):]
                if self.attempt(candidate):
                    progress = True
                    break
        return progress

    def shrink_mesh(self):
        """Drop mesh axes and layout items one at a time."""
        progress = False
        for i in range(len(self.lines)):
            line = self.lines[i]
            for prefix, open_, close in (("mesh ", "[", "]"), ("layout ", " ", "")):
                if not line.startswith(prefix):
                    continue
                head, body = (line[:line.index(open_) + 1], line[line.index(open_) + 1:])
                body = body[:-len(close)] if close else body
                items = self.split_items(body)
                for k in range(len(items)):
                    rest = items[:k] + items[k + 1:]
                    candidate = list(self.lines)
                    if not rest:
                        if prefix == "mesh ":
                            continue
                        candidate[i] = ""
                    else:
                        candidate[i] = head + ", ".join(rest) + close
                    if self.attempt(candidate):
                        return True
        return progress

    @staticmethod
    def split_items(body):
        items, depth, current = [], 0, ""
        for ch in body:
            if ch == "[":
                depth += 1
            elif ch == "]":
                depth -= 1
            if ch == "," and depth == 0:
                items.append(current.strip())
                current = ""
            else:
                current += ch
        if current.strip():
            items.append(current.strip())
        return items

    def run(self):
        rounds = 0
        while not self.out_of_time():
            rounds += 1
            before = len("\n".join(self.lines))
            while self.delete_blocks():
                pass
            self.delete_lines()
            self.delete_first_items()
            self.substitute_operands()
            self.inline_aliases()
            self.rewrite_numbers(r"^\s*repeat (\d+) \{", lambda n: [1, 2][: max(0, n - 1)])
            self.rewrite_numbers(r"^dim \w+ = (\d+)$",
                                 lambda n: sorted({s for s in (1, 2, n // 2) if s < n}))
            self.rewrite_numbers(r"^mesh .*?= (\d+)", lambda n: [s for s in (2,) if s < n])
            self.shrink_mesh()
            self.log(f"reduce: round {rounds}: {len(self.lines)} lines after {self.tests} tests")
            if len("\n".join(self.lines)) >= before:
                break
        return "\n".join(self.lines) + "\n"
