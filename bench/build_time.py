#!/usr/bin/env python3
"""Build time of the generated code: every example's program and train block planned for
[data=2, model=2] (its own layout, or `auto` where it does not fit), emitted with the runner as
`meshc run` builds it (one translation unit), compiled three ways: with -O2 (the CMake function's
default build type), with `-O3 -march=native -fno-math-errno` (`meshc run`'s optimization flags,
parsing every header), and as `meshc run` really compiles it ("run": its exact flags, -fopenmp
included, and its precompiled prelude, made first by `meshc build-prelude` as the target
meshc_prelude makes it; that one-off build's CPU seconds are printed on their own line). Not a
test: it prints the generated lines and the compiler's CPU seconds (user + system of the child,
which a loaded machine inflates far less than wall time), per example and flag set.

Then the user-facing figure, the WALL seconds of the build `meshc run` does (its own "build"
timing, from a fresh cache each time), two ways, alternated: "1 job wall s" (`meshc run -j 1`:
the source and the runner as one translation unit, compiled and linked by one compiler
command) and "N jobs wall s" (`meshc run -j N`, N the cores this process may run on, or
--jobs: the source split into N parts, each part and the runner compiled concurrently, then
linked). Each is the median of --wall-rounds runs (default 1). --no-wall skips them.
On a machine other work keeps busy, parallel jobs find no idle core and the wall columns say
little; the "path" columns give the wall time those builds take when each job has a core of its
own, from CPU seconds (which load inflates far less): "1 job path s", the one-TU compile and the
link; "N jobs path s", every TU of the split build compiled alone (CPU seconds), then scheduled
as meshc run runs them (in order, each on the first free job), plus the link.

usage: bench/build_time.py [--build-dir build] [--examples mlp,transformer,...] (default: every
dsl-examples/*.mesh) [--before REV]

--before REV: also compiles the code generated at git revision REV (its tests/golden-cpp: every
example at [2,2] with its own layout, as this bench plans it) against that revision's support and
runtime headers, alternated with today's per example and flag set, and prints both.

--cmake-prefix PREFIX: instead, builds each example's generated library through the installed
package's meshc_add_program (PREFIX: a `cmake --install` of meshc, e.g. the consumer tests'
build/tests/consumer-prefix; Ninja, -O2, one job) with PRECOMPILE_PRELUDE and without it
(the same, with -DCMAKE_DISABLE_PRECOMPILE_HEADERS=ON), alternated for --rounds rounds: the CPU seconds of a
build from scratch (meshc, the prelude's PCH where used, the generated source) and of the rebuild
after the .mesh file is touched (meshc and the generated source), the median over rounds."""
import argparse
import os
import statistics
import re
import resource
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLAGS = {"-O2": ["-O2"], "-O3 native": ["-O3", "-march=native", "-fno-math-errno"]}


def link_libraries(build_dir):
    """What `meshc run` links generated code with (Toolchain.cpp's order), from
    MeshcBuildConfig.h."""
    path = os.path.join(build_dir, "compiler", "driver", "include", "driver", "MeshcBuildConfig.h")
    text = open(path).read()
    value = lambda name: [v for v in re.search(rf'{name} "([^"]*)"', text).group(1).split(";") if v]
    return (value("MESHC_BUILD_LIBRARIES") + value("MESHC_BLAS_LIBRARY") +
            value("MESHC_DNNL_LIBRARIES") + ["-lpthread"])


def critical_paths(meshc, source, layout, jobs, run_command, libraries, work):
    """The wall seconds of meshc run's builds when each job has a core of its own: (one job: the
    one-TU compile and the link; `jobs` jobs: each TU of the split build timed alone in CPU
    seconds and list-scheduled in meshc run's order, then the link)."""
    directory = os.path.join(work, f"split-{os.path.basename(source)}")
    os.makedirs(directory, exist_ok=True)
    example = os.path.splitext(os.path.basename(source))[0]
    base = os.path.join(directory, example)
    emit = [meshc, source, "--mesh", "data=2,model=2", "--emit=cpp", "--cpp-runner"] + (
        ["--layout", "auto"] if layout == "auto" else [])
    subprocess.run(emit + ["-o", base, "--source-parts", str(jobs)], check=True,
                   capture_output=True)
    parts = [base + ".cpp"] + [f"{base}.part{k}.cpp" for k in range(2, jobs + 1)]
    units = [p for p in parts if "#include" in open(p).read()] + [base + ".main.cpp"]
    include = ["-I", directory, "-I", os.path.join(ROOT, "dsl-examples")]
    seconds = [cpu_seconds(run_command + include + ["-c", unit, "-o", unit + ".o"])
               for unit in units]
    link = cpu_seconds(run_command + [unit + ".o" for unit in units] + ["-o", base + ".bin"] +
                       libraries)
    free = [0.0] * jobs
    for cost in seconds:  # each TU on the first free job, in order
        k = free.index(min(free))
        free[k] += cost
    unity_base = os.path.join(directory, "one", example)
    os.makedirs(os.path.dirname(unity_base), exist_ok=True)
    subprocess.run(emit + ["-o", unity_base], check=True, capture_output=True)
    one = compile_unity(run_command, example, unity_base)
    one_link = cpu_seconds(run_command + [unity_base + ".o", "-o", unity_base + ".bin"] +
                           libraries)
    return one + one_link, max(free) + link


def build_config(build_dir):
    """The include directories `meshc run` uses, from the build's MeshcBuildConfig.h."""
    path = os.path.join(build_dir, "compiler", "driver", "include", "driver", "MeshcBuildConfig.h")
    text = open(path).read()
    includes = re.search(r'MESHC_BUILD_INCLUDE_DIRS "([^"]*)"', text).group(1).split(";")
    blas = re.search(r'MESHC_BLAS_INCLUDE "([^"]*)"', text).group(1)
    cxx = re.search(r'MESHC_CXX_COMPILER "([^"]*)"', text).group(1)
    return cxx, [d for d in includes + [blas] if d]


def cpu_seconds(command, quiet=False):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL if quiet else None)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def compile_seconds(cxx, flags, includes, example, base):
    """CPU seconds of compiling base.cpp with its runner as one TU."""
    command = [cxx, *flags, "-std=c++20", "-w"]
    for directory in includes:
        command += ["-I", directory]
    return compile_unity(command, example, base)


def compile_unity(command, example, base):
    """CPU seconds of `command` (the compiler and its flags) on base.cpp with its runner as one
    TU, as `meshc run` writes it."""
    unity = base + ".unity.cpp"
    with open(unity, "w") as f:
        f.write(f'#include "{example}.cpp"\n#include "{example}.main.cpp"\n')
    return cpu_seconds(command + ["-I", os.path.dirname(base), "-I",
                                  os.path.join(ROOT, "dsl-examples"), "-c", unity,
                                  "-o", base + ".o"])


def build_prelude(meshc, work):
    """`meshc build-prelude` into work/prelude, as the target meshc_prelude builds it: its CPU
    seconds, and the command of a build as `meshc run` compiles (its flags, from the key file,
    and -include of the precompiled prelude)."""
    directory = os.path.join(work, "prelude")
    seconds = cpu_seconds([meshc, "build-prelude", directory])
    with open(os.path.join(directory, "prelude.key")) as f:
        flags = f.readline().split()
    return seconds, flags + ["-include", os.path.join(directory, "prelude.h")]


def cmake_build_seconds(prefix, example, work, precompiled, layout):
    """CPU seconds of building `example`'s meshc_add_program library from scratch, then of the
    rebuild after its .mesh file is touched."""
    project = os.path.join(work, "project")
    if not os.path.exists(project):
        shutil.copytree(os.path.join(ROOT, "dsl-examples"), project)
    layout_option = ' LAYOUT "auto"' if layout == "auto" else ""
    with open(os.path.join(project, "CMakeLists.txt"), "w") as f:
        f.write("cmake_minimum_required(VERSION 3.20)\nproject(build_time LANGUAGES CXX)\n"
                "find_package(meshc CONFIG REQUIRED)\n"
                f'meshc_add_program(model SOURCES {example}.mesh MESH "data=2,model=2"'
                f"{layout_option} PRECOMPILE_PRELUDE)\n")
    build = os.path.join(work, "build-pch" if precompiled else "build-plain")
    shutil.rmtree(build, ignore_errors=True)
    disable = "OFF" if precompiled else "ON"
    subprocess.run(["cmake", "-G", "Ninja", "-S", project, "-B", build,
                    f"-DCMAKE_PREFIX_PATH={prefix}", "-DCMAKE_CXX_FLAGS=-O2", "-Wno-dev",
                    f"-DCMAKE_DISABLE_PRECOMPILE_HEADERS={disable}"],
                   check=True, capture_output=True)
    target = ["cmake", "--build", build, "--target", "model", "--", "-j1"]
    scratch = cpu_seconds(target, quiet=True)
    os.utime(os.path.join(project, example + ".mesh"))
    rebuild = cpu_seconds(target, quiet=True)
    return scratch, rebuild


def cmake_table(prefix, examples, rounds):
    """--cmake-prefix: the CMake function's builds with and without the precompiled prelude."""
    print(f"{'example':14} {'scratch s pch':>14} {'scratch s plain':>16} {'rebuild s pch':>14} "
          f"{'rebuild s plain':>16}   (CPU seconds, median of {rounds} rounds)")
    meshc = os.path.join(prefix, "bin", "meshc")
    for example in examples:
        source = os.path.join(ROOT, "dsl-examples", example + ".mesh")
        own = subprocess.run([meshc, source, "--mesh", "data=2,model=2", "--emit=plan"],
                             capture_output=True).returncode == 0
        times = {True: [], False: []}
        with tempfile.TemporaryDirectory() as work:
            for r in range(rounds):
                for precompiled in ((True, False) if r % 2 == 0 else (False, True)):
                    times[precompiled].append(cmake_build_seconds(
                        prefix, example, work, precompiled, "own" if own else "auto"))
        median = lambda precompiled, i: statistics.median(t[i] for t in times[precompiled])
        print(f"{example:14} {median(True, 0):14.1f} {median(False, 0):16.1f} "
              f"{median(True, 1):14.1f} {median(False, 1):16.1f}", flush=True)


def run_build_wall(meshc, source, layout, jobs):
    """The wall seconds of the build `meshc run -j jobs` does from a fresh cache (its printed
    "build" timing: the compiles and the link)."""
    with tempfile.TemporaryDirectory() as cache:
        command = [meshc, "run", source, "--mesh", "data=2,model=2", "--no-plan", "-j",
                   str(jobs), "--cache-dir", cache]
        if layout == "auto":
            command += ["--layout", "auto"]
        proc = subprocess.run(command, capture_output=True, text=True, check=True)
    return float(re.search(r"meshc run: compile [0-9.]+ s, build ([0-9.]+) s", proc.stdout)
                 .group(1))


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
    parser.add_argument("--cmake-prefix", help="an installed meshc: time its CMake function")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of --cmake-prefix")
    parser.add_argument("--jobs", type=int, default=len(os.sched_getaffinity(0)),
                        help="meshc run -j N of the split build's wall column (default: cores)")
    parser.add_argument("--wall-rounds", type=int, default=1,
                        help="rounds of the wall columns (median; alternated)")
    parser.add_argument("--no-wall", action="store_true", help="skip the wall columns")
    args = parser.parse_args()
    if args.cmake_prefix:
        cmake_table(os.path.abspath(args.cmake_prefix), args.examples.split(","), args.rounds)
        return 0
    meshc = os.path.join(args.build_dir, "compiler", "tools", "meshc")
    cxx, includes = build_config(args.build_dir)
    columns = [name + " s" for name in FLAGS]
    if args.before:
        columns = [f"{column} {when}" for column in columns for when in ("before", "after")]
    columns.append("run s")
    if not args.no_wall:
        columns += ["1 job wall s", f"{args.jobs} jobs wall s", "1 job path s",
                    f"{args.jobs} jobs path s"]
    with tempfile.TemporaryDirectory() as work:
        prelude_seconds, run_command = build_prelude(meshc, work)
        print(f"meshc build-prelude (once per meshc build): {prelude_seconds:.1f} s")
        print(f"{'example':14} {'layout':6} {'lines':>7} " + " ".join(f"{c:>17}" for c in columns))
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
            row += f" {compile_unity(run_command, example, base):17.1f}"
            if not args.no_wall:
                walls = {1: [], args.jobs: []}
                for r in range(args.wall_rounds):
                    for jobs in ((1, args.jobs) if r % 2 == 0 else (args.jobs, 1)):
                        walls[jobs].append(run_build_wall(meshc, source, layout, jobs))
                row += "".join(f" {statistics.median(walls[jobs]):17.1f}" for jobs in walls)
                paths = critical_paths(meshc, source, layout, args.jobs, run_command,
                                       link_libraries(args.build_dir), work)
                row += "".join(f" {path:17.1f}" for path in paths)
            print(row, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
