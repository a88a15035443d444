#!/usr/bin/env python3
"""Build time of the generated code: every example's program and train block planned for
[data=2, model=2] (its own layout, or `auto` where it does not fit), emitted with the runner as
`meshc run` builds it (one translation unit), compiled with -O2 (the CMake function's default
build type) and with `-O3 -march=native -fno-math-errno` (`meshc run`). Not a test: it prints
the generated lines and the compiler's CPU seconds (user + system of the child, which a loaded
machine inflates far less than wall time), per example and flag set.

usage: bench/build_time.py [--build-dir build] [--examples mlp,transformer,...] (default: every
dsl-examples/*.mesh) [--before REV]

--before REV: also compiles the code generated at git revision REV (its tests/golden-cpp: every
example at [2,2] with its own layout, as this bench plans it) against that revision's support and
runtime headers, alternated with today's per example and flag set, and prints both."""
import argparse
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLAGS = {"-O2": ["-O2"], "-O3 native": ["-O3", "-march=native", "-fno-math-errno"]}


def build_config(build_dir):
    """The include directories `meshc run` uses, from the build's MeshcBuildConfig.h."""
    path = os.path.join(build_dir, "compiler", "driver", "include", "driver", "MeshcBuildConfig.h")
    text = open(path).read()
    includes = re.search(r'MESHC_BUILD_INCLUDE_DIRS "([^"]*)"', text).group(1).split(";")
    blas = re.search(r'MESHC_BLAS_INCLUDE "([^"]*)"', text).group(1)
    cxx = re.search(r'MESHC_CXX_COMPILER "([^"]*)"', text).group(1)
    return cxx, [d for d in includes + [blas] if d]


def cpu_seconds(command):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(command, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def compile_seconds(cxx, flags, includes, example, base):
    """CPU seconds of compiling base.cpp with its runner as one TU."""
    unity = base + ".unity.cpp"
    with open(unity, "w") as f:
        f.write(f'#include "{example}.cpp"\n#include "{example}.main.cpp"\n')
    command = [cxx, *flags, "-std=c++20", "-w", "-c", "-I", os.path.dirname(base),
               "-I", os.path.join(ROOT, "dsl-examples")]
    for directory in includes:
        command += ["-I", directory]
    return cpu_seconds(command + [unity, "-o", base + ".o"])


def checkout_before(revision, work):
    """REV's goldens (the generated code) and support/runtime headers, under work/before."""
    before = os.path.join(work, "before")
    os.makedirs(before)
    paths = ["tests/golden-cpp", "compiler/codegen/support", "runtime/include",
             "runtime/kernels/include"]
    archive = subprocess.run(["git", "-C", ROOT, "archive", revision, *paths], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", before], input=archive, check=True)
    return before


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build-dir", default=os.path.join(ROOT, "build"))
    every = sorted(os.path.splitext(name)[0]
                   for name in os.listdir(os.path.join(ROOT, "dsl-examples")) if name.endswith(".mesh"))
    parser.add_argument("--examples", default=",".join(every))
    parser.add_argument("--before", help="git revision to compare with (its goldens and headers)")
    args = parser.parse_args()
    meshc = os.path.join(args.build_dir, "compiler", "tools", "meshc")
    cxx, includes = build_config(args.build_dir)
    columns = [name + " s" for name in FLAGS]
    if args.before:
        columns = [f"{column} {when}" for column in columns for when in ("before", "after")]
    print(f"{'example':14} {'layout':6} {'lines':>7} " + " ".join(f"{c:>17}" for c in columns))
    with tempfile.TemporaryDirectory() as work:
        before = checkout_before(args.before, work) if args.before else None
        old_includes = [d.replace(ROOT, before) if before and d.startswith(ROOT) else d
                        for d in includes]
        for example in args.examples.split(","):
            source = os.path.join(ROOT, "dsl-examples", example + ".mesh")
            base = os.path.join(work, example)
            layout = "own"
            command = [meshc, source, "--mesh", "data=2,model=2", "--emit=cpp", "--cpp-runner",
                       "-o", base]
            if subprocess.run(command, capture_output=True).returncode != 0:
                layout = "auto"
                subprocess.run(command + ["--layout", "auto"], check=True, capture_output=True)
            suffixes = (".h", ".cpp", ".main.cpp")
            lines = sum(sum(1 for _ in open(base + suffix)) for suffix in suffixes)
            row = f"{example:14} {layout:6} {lines:7}"
            old_base = None
            if before and layout == "own":
                old_dir = os.path.join(work, "old-" + example)
                os.makedirs(old_dir)
                for suffix in suffixes:
                    shutil.copy(os.path.join(before, "tests", "golden-cpp", example + suffix),
                                old_dir)
                old_base = os.path.join(old_dir, example)
            for flags in FLAGS.values():
                if before:  # alternated: before, then after, per flag set
                    old = (compile_seconds(cxx, flags, old_includes, example, old_base)
                           if old_base else None)
                    row += f" {old:17.1f}" if old is not None else f" {'-':>17}"
                row += f" {compile_seconds(cxx, flags, includes, example, base):17.1f}"
            print(row, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
