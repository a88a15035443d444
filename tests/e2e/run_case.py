#!/usr/bin/env python3
"""One end-to-end case: compile a .mesh example to C++ with meshc (--emit=cpp --cpp-runner) for
a mesh and layout, build the generated code (one translation unit, -O1), run it (on the threads
backend, or as MPI processes with --launcher "mpirun -np 4" --backend mpi), and compare its
gathered outputs with the reference interpreter's (`meshc --emit=run --dump-outputs`) through
compare_outputs.py (the rule of tolerance.py).

Usage: run_case.py --meshc M --example X.mesh --workdir DIR --cxx C++ --include DIR... --lib LIB...
       [--mesh data=2,model=2] [--layout auto] [--seed N] [--print-plan] [--meshc-arg=OPT]...
       [--backend threads|mpi] [--expect-backend threads|mpi]
       [--launcher "mpirun --oversubscribe -np 4"] [--trace FILE]
       [--expect-path-dtype NAME=DTYPE]...
       [--cxx-flag=-fsanitize=address]...
   or: run_case.py --build-dir build --example X.mesh [--workdir DIR] [--print-plan] ...
       (meshc, meshrt, meshrt_launch and the include paths taken from the build and source trees;
       OpenBLAS as -lopenblas).
--lib lists the libraries in link order: meshrt_launch's (and meshrt_mpi's and MPI's), then
meshrt_kernels, meshrt, OpenBLAS. --cxx-flag adds a flag to the build of the generated code
(compile and link): a sanitizer build's flags (tests/sanitize), which its instrumented meshrt needs.
Exit status 0 when every output matches within tolerance."""
import argparse
import os
import shlex
import sys
import time

from checked_run import run
from compare_outputs import compare_files
from generated_build import GENERATED, add_build_options, build_generated
from tolerance import coarsened_paths, path_dtypes_of

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--meshc")
    parser.add_argument("--build-dir")
    parser.add_argument("--example", required=True)
    parser.add_argument("--workdir")
    add_build_options(parser)
    parser.add_argument("--mesh")
    parser.add_argument("--layout")
    parser.add_argument("--meshc-arg", action="append", default=[],
                        help="an extra meshc option for every step, e.g. --meshc-arg=--dim=batch=512")
    parser.add_argument("--seed", default="0")
    parser.add_argument("--opt", default="-O1")
    parser.add_argument("--print-plan", action="store_true")
    parser.add_argument("--backend", choices=["threads", "mpi"],
                        help="the generated runner's --backend (default: its own choice)")
    parser.add_argument("--expect-backend", choices=["threads", "mpi"],
                        help="the backend the runner must report (default: --backend)")
    parser.add_argument("--launcher", default="",
                        help="a command line the binary runs under, e.g. 'mpirun -np 4'")
    parser.add_argument("--trace", help="the runner writes a Chrome trace to this file")
    parser.add_argument("--expect-path-dtype", action="append", default=[],
                        help="NAME=DTYPE: the output NAME (`<fn>.<output>`) must be compared at "
                             "DTYPE's tolerance (its path dtype, meshc --emit=tolerance-dtypes)")
    args = parser.parse_args()
    if args.build_dir:
        root = os.path.dirname(os.path.dirname(HERE))
        args.meshc = args.meshc or os.path.join(args.build_dir, "compiler", "tools", "meshc")
        args.include += [os.path.join(root, "runtime", "include"),
                         os.path.join(root, "runtime", "kernels", "include"),
                         os.path.join(root, "compiler", "codegen", "support")]
        with open(os.path.join(args.build_dir, "runtime", "meshrt_launch_libs.txt")) as f:
            args.lib += [line for line in f.read().splitlines() if line]
        args.lib += [os.path.join(args.build_dir, "runtime", "kernels", "libmeshrt_kernels.a"),
                     os.path.join(args.build_dir, "runtime", "libmeshrt.a"), "-lopenblas"]
        stem = os.path.splitext(os.path.basename(args.example))[0]
        args.workdir = args.workdir or os.path.join(args.build_dir, "e2e-" + stem)
    if not args.meshc or not args.workdir:
        parser.error("give --build-dir, or --meshc and --workdir")

    os.makedirs(args.workdir, exist_ok=True)
    stem = os.path.splitext(os.path.basename(args.example))[0]
    base = os.path.join(args.workdir, stem)
    overrides = list(args.meshc_arg)
    if args.mesh:
        overrides += ["--mesh", args.mesh]
    if args.layout:
        overrides += ["--layout", args.layout]

    if args.print_plan:
        print(run([args.meshc, args.example, "--emit=plan"] + overrides))
    start = time.time()
    run([args.meshc, args.example, "--emit=cpp", "--cpp-runner", "-o", base] + overrides)
    compile_s = time.time() - start

    # One translation unit: the program and its runner.
    unity = base + ".unity.cpp"
    with open(unity, "w") as f:
        f.write(f'#include "{stem}.cpp"\n#include "{stem}.main.cpp"\n')
    start = time.time()
    binary = base + ".bin"
    # The example's directory too: the headers of its user kernels (extern def) are relative to it.
    reused = build_generated(args, unity, binary, args.workdir, [base + ext for ext in GENERATED],
                             opt=args.opt,
                             extra_includes=[os.path.dirname(os.path.abspath(args.example))])
    build_s = time.time() - start

    actual, expected = base + ".actual", base + ".expected"
    start = time.time()
    backend = ["--backend", args.backend] if args.backend else []
    trace = ["--trace", args.trace] if args.trace else []
    output = run(shlex.split(args.launcher) + [binary] + backend + trace + [actual, args.seed])
    print(output, end="")
    expect_backend = args.expect_backend or args.backend
    if expect_backend and f"; {expect_backend} backend)" not in output:
        print(f"FAILED: the runner did not report running on the {expect_backend} backend")
        return 1
    run_s = time.time() - start
    print(run([args.meshc, args.example, "--emit=run", "--seed", args.seed, "--dump-outputs",
               expected] + overrides), end="")
    print(f"meshc {compile_s:.2f} s, c++ {build_s:.2f} s{' (reused)' if reused else ''}, "
          f"run {run_s:.2f} s")
    # A bf16/f16 op rounds its result to that dtype (and each rank's partial sums before an
    # all-reduce, where the interpreter rounds the whole sum once): every output it feeds, f32
    # ones included, carries that rounding, and only those (tolerance.py's path dtype).
    path_dtypes = path_dtypes_of(args.meshc, args.example, overrides)
    for line in coarsened_paths(path_dtypes):
        print(line)
    ok = True
    for expectation in args.expect_path_dtype:
        name, dtype = expectation.split("=")
        if path_dtypes.get(name, "missing") != dtype:
            print(f"FAILED: {name} is compared at {path_dtypes.get(name, 'missing')}'s tolerance, "
                  f"expected {dtype}'s")
            ok = False
    return 0 if compare_files(actual, expected, path_dtypes=path_dtypes) and ok else 1


if __name__ == "__main__":
    sys.exit(main())
