#!/usr/bin/env python3
"""Runs one golden or bad-input case against meshc.

golden <meshc> <case.mesh>: `meshc case.mesh --emit=ir` must succeed and print exactly
    case.ir (next to the case). With MESHC_UPDATE_GOLDEN=1 the expectation is rewritten.
example <meshc> <example.mesh>: `meshc example.mesh --emit=run` must succeed with finite outputs.
error <meshc> <case.mesh>: meshc must exit with 1, print nothing on stdout and report exactly
    the diagnostics the case declares in comments of the form
        // EXPECT: <line>:<col>: error: <message>
        // EXPECT: inputs/other.mesh:<line>:<col>: note: <message>
    Every error meshc prints must be expected, each must be followed by its source line and a
    caret under the reported column; notes are checked only where expected.
"""
import os
import re
import subprocess
import sys

DIAG = re.compile(r"^(.*?):(\d+):(\d+): (error|warning|note): (.*)$")


def run(meshc, case):
    proc = subprocess.run([meshc, case, "--emit=ir"], capture_output=True, text=True, timeout=60)
    if proc.returncode < 0 or proc.returncode > 2:
        sys.exit(f"FAIL: meshc crashed (exit {proc.returncode})\n{proc.stderr}")
    return proc


def compare_or_update(expected_path, actual, what):
    """Compares `actual` with the file at `expected_path`, or rewrites the file when
    MESHC_UPDATE_GOLDEN=1. Exits with a unified diff on a difference. Returns the expectation."""
    if os.environ.get("MESHC_UPDATE_GOLDEN") == "1":
        with open(expected_path, "w") as f:
            f.write(actual)
        print(f"updated {expected_path}")
        return actual
    if not os.path.exists(expected_path):
        sys.exit(f"FAIL: no expectation {expected_path} (run with MESHC_UPDATE_GOLDEN=1)")
    with open(expected_path) as f:
        expected = f.read()
    if expected != actual:
        import difflib
        diff = difflib.unified_diff(expected.splitlines(), actual.splitlines(),
                                    "expected", "actual", lineterm="")
        sys.exit(f"FAIL: {what} differs\n" + "\n".join(diff))
    return expected


def golden(meshc, case):
    expected_path = os.path.splitext(case)[0] + ".ir"
    proc = run(meshc, case)
    if proc.returncode != 0:
        sys.exit(f"FAIL: meshc exited {proc.returncode}\n{proc.stderr}")
    expected = compare_or_update(expected_path, proc.stdout, "the IR")
    # The printed IR parses back to itself.
    reparsed = subprocess.run([meshc, expected_path, "--emit=ir"], capture_output=True, text=True,
                              timeout=60)
    if reparsed.returncode != 0 or reparsed.stdout != expected:
        sys.exit(f"FAIL: the IR does not parse back to itself\n{reparsed.stderr}")
    print("ok")


def example(meshc, case):
    proc = subprocess.run([meshc, case, "--emit=run"], capture_output=True, text=True,
                          timeout=600)
    if proc.returncode != 0:
        sys.exit(f"FAIL: meshc exited {proc.returncode}\n{proc.stderr}")
    if re.search(r"\b(nan|inf)\b", proc.stdout, re.IGNORECASE):
        sys.exit(f"FAIL: a non-finite output\n{proc.stdout}")
    if "program" not in proc.stdout and "train" not in proc.stdout:
        sys.exit(f"FAIL: nothing was run\n{proc.stdout}")
    print(proc.stdout)


def error(meshc, case):
    case_dir = os.path.dirname(case)
    expected = []
    with open(case) as f:
        for line in f:
            m = re.search(r"//\s*EXPECT:\s*(.*)$", line)
            if not m:
                continue
            text = m.group(1).strip()
            fm = re.match(r"^([\w./-]+\.(?:mesh|h)):(\d+:\d+: .*)$", text)
            file = os.path.normpath(os.path.join(case_dir, fm.group(1))) if fm else case
            expected.append((os.path.realpath(file), fm.group(2) if fm else text))
    if not expected:
        sys.exit("FAIL: the case declares no // EXPECT: lines")
    proc = run(meshc, case)
    if proc.returncode != 1:
        sys.exit(f"FAIL: expected exit code 1, got {proc.returncode}\n{proc.stderr}")
    if proc.stdout:
        sys.exit(f"FAIL: output on stdout for a failing input:\n{proc.stdout}")
    lines = proc.stderr.splitlines()
    reported = []
    for i, line in enumerate(lines):
        m = DIAG.match(line)
        if not m:
            continue
        file, lno, col, sev, msg = m.groups()
        caret_ok = i + 2 < len(lines) and lines[i + 2].rstrip().endswith("^") and \
            lines[i + 2].index("^") == int(col) - 1
        reported.append((os.path.realpath(file), f"{lno}:{col}: {sev}: {msg}", sev, caret_ok))
    failures = []
    for exp in expected:
        if not any((r[0], r[1]) == exp for r in reported):
            failures.append(f"missing: {exp[0]}:{exp[1]}")
    for r in reported:
        if r[2] == "error" and (r[0], r[1]) not in expected:
            failures.append(f"unexpected: {r[0]}:{r[1]}")
        if (r[0], r[1]) in expected and not r[3]:
            failures.append(f"no caret under the column: {r[1]}")
    if failures:
        sys.exit("FAIL:\n" + "\n".join(failures) + "\n--- stderr ---\n" + proc.stderr)
    print(f"ok ({len(expected)} diagnostics)")


if __name__ == "__main__":
    mode, meshc, case = sys.argv[1:4]
    {"golden": golden, "error": error, "example": example}[mode](meshc, os.path.abspath(case))
