#!/usr/bin/env python3
"""The meshc command line: options, exit codes (0 ok, 1 input errors, 2 internal errors), no
partial output on failure, depfiles. `check_cli.py <meshc> <case>` runs one case; ctest runs each
case as its own test."""
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GOOD = os.path.join(ROOT, "tests", "golden", "import.mesh")
LIB = os.path.join(ROOT, "tests", "golden", "inputs", "lib.mesh")
BAD = os.path.join(ROOT, "tests", "errors", "sema_unknown_name.mesh")


def meshc(*args):
    return subprocess.run([MESHC, *args], capture_output=True, text=True, timeout=120)


def expect(condition, message, proc=None):
    if not condition:
        detail = f"\n--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}" if proc else ""
        sys.exit(f"FAIL: {message}{detail}")


def version():
    proc = meshc("--version")
    expect(proc.returncode == 0 and proc.stdout.startswith("meshc "), "--version", proc)
    expect("LLVM" in proc.stdout, "--version names the LLVM it was built with", proc)


def help_only_meshc_options():
    proc = meshc("--help")
    expect(proc.returncode == 0, "--help exits 0", proc)
    for option in ["--emit", "--mesh", "--layout", "--machine", "--dim", "--MD", "--MF", "-o"]:
        expect(option in proc.stdout, f"--help lists {option}", proc)
    # LLVM's own options (from the linked libraries) stay hidden.
    for foreign in ["--print-after-all", "--debug-pass", "--time-passes", "--color"]:
        expect(foreign not in proc.stdout, f"--help hides LLVM's {foreign}", proc)


def exit_codes():
    expect(meshc(GOOD).returncode == 0, "a valid program exits 0")
    bad = meshc(BAD)
    expect(bad.returncode == 1 and bad.stdout == "" and "error:" in bad.stderr,
           "an input error exits 1 with a diagnostic and no output", bad)
    option = meshc(GOOD, "--mesh", "data=two")
    expect(option.returncode == 1 and "--mesh" in option.stderr, "a bad option value exits 1",
           option)
    unknown = meshc(GOOD, "--no-such-option")
    expect(unknown.returncode != 0 and "no-such-option" in unknown.stderr,
           "an unknown option is rejected", unknown)
    internal = meshc(GOOD, "-o", "/nonexistent-meshc-dir/out.ir")
    expect(internal.returncode == 2 and "cannot open" in internal.stderr,
           "an output that cannot be written exits 2", internal)


def output_file_and_no_partial_output():
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out.ir")
        proc = meshc(GOOD, "-o", out)
        expect(proc.returncode == 0 and proc.stdout == "", "-o writes no stdout", proc)
        with open(out) as f:
            expect(f.read().startswith("dim batch"), "-o holds the IR")
        # A failing run leaves an existing output as it was and creates nothing new.
        with open(out, "w") as f:
            f.write("previous")
        proc = meshc(BAD, "-o", out)
        expect(proc.returncode == 1, "the bad input fails", proc)
        with open(out) as f:
            expect(f.read() == "previous", "a failed run does not touch the output")
        fresh = os.path.join(tmp, "fresh.ir")
        meshc(BAD, "-o", fresh)
        expect(not os.path.exists(fresh), "a failed run leaves no partial output file")
        expect(sorted(os.listdir(tmp)) == ["out.ir"], "no temporary files are left behind")


def depfile():
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out.ir")
        proc = meshc(GOOD, "-o", out, "-MD")
        expect(proc.returncode == 0, "-MD succeeds", proc)
        with open(out + ".d") as f:
            text = f.read()
        expect(text.startswith(out + ":"), "the depfile's target is the output", proc)
        expect(LIB in text and GOOD in text, "the depfile lists the file and its imports")
        custom = os.path.join(tmp, "deps.d")
        proc = meshc(GOOD, "-o", out, "-MD", "-MF", custom)
        expect(proc.returncode == 0 and os.path.exists(custom), "-MF names the depfile", proc)
        bad = meshc(BAD, "-o", os.path.join(tmp, "bad.ir"), "-MD")
        expect(not os.path.exists(os.path.join(tmp, "bad.ir.d")), "no depfile after a failure")
        proc = meshc(GOOD, "-MD")
        expect(proc.returncode == 1 and "-MD needs" in proc.stderr, "-MD needs -o or -MF", proc)


def ir_input_and_stages():
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out.ir")
        expect(meshc(GOOD, "-o", out).returncode == 0, "writes IR")
        proc = meshc(out, "--emit=run")
        expect(proc.returncode == 0 and "use_lib" in proc.stdout, "runs IR text", proc)
    ast = meshc(GOOD, "--emit=ast")
    expect(ast.returncode == 0 and "import" in ast.stdout.lower(), "--emit=ast", ast)
    plan = meshc(GOOD, "--emit=plan-json")
    expect(plan.returncode == 0 and plan.stdout.lstrip().startswith("["), "--emit=plan-json",
           plan)


CASES = {f.__name__: f for f in [version, help_only_meshc_options, exit_codes,
                                 output_file_and_no_partial_output, depfile,
                                 ir_input_and_stages]}

if __name__ == "__main__":
    MESHC = sys.argv[1]
    CASES[sys.argv[2]]()
    print("ok")
