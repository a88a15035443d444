#!/usr/bin/env python3
"""Build time of the generated code: every example's program and train block planned for
[data=2, model=2] (its own layout, or `auto` where it does not fit), emitted with the runner as
`meshc run` builds it (one translation unit), compiled with -O2 (the CMake function's default
build type) and with `-O3 -march=native -fno-math-errno` (`meshc run`). Not a test: it prints
the generated lines and the compiler's CPU seconds (user + system of the child, which a loaded
machine inflates far less than wall time), per example and flag set.

usage: bench/build_time.py [--build-dir build] [--examples mlp,transformer,...] (default: every
dsl-examples/*.mesh)"""
import argparse
import os
import re
import resource
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


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build-dir", default=os.path.join(ROOT, "build"))
    every = sorted(os.path.splitext(name)[0]
                   for name in os.listdir(os.path.join(ROOT, "dsl-examples")) if name.endswith(".mesh"))
    parser.add_argument("--examples", default=",".join(every))
    args = parser.parse_args()
    meshc = os.path.join(args.build_dir, "compiler", "tools", "meshc")
    cxx, includes = build_config(args.build_dir)
    print(f"{'example':12} {'layout':6} {'lines':>7} " +
          " ".join(f"{name + ' s':>12}" for name in FLAGS))
    with tempfile.TemporaryDirectory() as work:
        for example in args.examples.split(","):
            source = os.path.join(ROOT, "dsl-examples", example + ".mesh")
            base = os.path.join(work, example)
            layout = "own"
            command = [meshc, source, "--mesh", "data=2,model=2", "--emit=cpp", "--cpp-runner",
                       "-o", base]
            if subprocess.run(command, capture_output=True).returncode != 0:
                layout = "auto"
                subprocess.run(command + ["--layout", "auto"], check=True, capture_output=True)
            unity = base + ".unity.cpp"
            with open(unity, "w") as f:
                f.write(f'#include "{example}.cpp"\n#include "{example}.main.cpp"\n')
            lines = sum(sum(1 for _ in open(base + suffix)) for suffix in (".h", ".cpp", ".main.cpp"))
            row = f"{example:12} {layout:6} {lines:7}"
            for flags in FLAGS.values():
                compile_ = [cxx, *flags, "-std=c++20", "-w", "-c", "-I", work,
                            "-I", os.path.join(ROOT, "dsl-examples")]
                for directory in includes:
                    compile_ += ["-I", directory]
                row += f" {cpu_seconds(compile_ + [unity, '-o', base + '.o']):12.1f}"
            print(row, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
