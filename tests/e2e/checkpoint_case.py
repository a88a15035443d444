#!/usr/bin/env python3
"""End-to-end checkpoints of generated code: save on one mesh, load on others (resharding on
load), continue.

Compiles an example with meshc for each configuration (mesh|layout; the first one saves), builds
tests/e2e/CheckpointDriver.cpp against each, and runs them on the threads backend.

Programs (--output NAME): the first configuration, constructed with seed 0, runs and saves; every
configuration, constructed with seed 99 (other parameters) and loading the checkpoint, must then
compute the same output: bit for bit on the saving mesh and layout, within tolerance.py's rule on
the others (against another mesh's run: both_approximate). A control run with seed 99 that loads
nothing must differ (so the load is what makes them equal).

Train blocks (--train): the first configuration trains 2N steps uninterrupted
(losses U, final params P: weights, optimizer and step state), and N steps then saves (its losses
must be U's first N, bit for bit); every configuration, constructed with seed 99 and loading the
checkpoint, trains N more steps: its losses and final params bit for bit U's last N and P on the
saving mesh and layout, within tolerance.py's rule on the others (the k-th resumed loss has been
through k updates on another mesh than U's, the params through N). Each tensor's tolerance dtype is
its path dtype (`meshc --emit=tolerance-dtypes`).

Testing the test: with --inject-fault FAULT the saving configuration is compiled with `meshc
--inject-fault=FAULT` (compiler/planner/InjectFault.h), so its runs carry the bug and the other
configurations' do not (with a dropped gradient all-reduce its data-parallel replicas of a param
drift apart, and a save and load brings them back together, so even its own resumed run differs
from its uninterrupted one); --expect-failure succeeds only when the comparisons fail, and
prints the worst error over its tolerance on the other configurations.

Usage: checkpoint_case.py --meshc M --example X.mesh --class C --function FN (--output NAME |
       --train) --workdir DIR --cxx C++ --include DIR... --lib LIB... --config MESH|LAYOUT[|OPTIONS]... [--steps N]
       [--inject-fault FAULT [--expect-failure]]
       [--cxx-flag=-fsanitize=thread]... (a flag for building the generated code, as run_case.py's)"""
import argparse
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DRIVER = os.path.join(HERE, "CheckpointDriver.cpp")
sys.path.insert(0, HERE)
from checked_run import run  # noqa: E402
from compare_outputs import read_outputs  # noqa: E402
from generated_build import add_build_options, build_generated  # noqa: E402
from tolerance import coarsened_paths, compare_values, path_dtypes_of, typical_scale  # noqa: E402,E501


def overrides_of(config):
    """meshc's options for a configuration `mesh|layout` ("own": the file's layout)."""
    mesh, layout = config.split("|")[:2]
    return ["--mesh", mesh] + ([] if layout == "own" else ["--layout", layout])


def extra_of(config):
    """A configuration's third field, `mesh|layout|EXTRA`: space-separated meshc options for code
    generation only (e.g. --microbatches=batch=4), as run_train_case.py's mesh specs."""
    fields = config.split("|")
    return fields[2].split() if len(fields) > 2 else []


def build(args, index, config):
    stem = os.path.splitext(os.path.basename(args.example))[0]
    workdir = os.path.join(args.workdir, f"config{index}")
    os.makedirs(workdir, exist_ok=True)
    base = os.path.join(workdir, stem)
    fault = [f"--inject-fault={args.inject_fault}"] if args.inject_fault and index == 0 else []
    print(run([args.meshc, args.example, "--emit=cpp", "-o", base] + overrides_of(config) +
              extra_of(config) + fault,
              with_stderr=True), end="")
    unity = base + ".ckpt.cpp"
    with open(unity, "w") as f:
        f.write(f'#include "{stem}.cpp"\n#include "{DRIVER}"\n')
    defines = [f'-DMESHC_CKPT_HEADER="{stem}.h"', f"-DMESHC_CKPT_CLASS={args.cls}"]
    defines += ["-DMESHC_CKPT_TRAIN"] if args.train else [f"-DMESHC_CKPT_OUTPUT={args.output}"]
    binary = base + ".ckpt.bin"
    build_generated(args, unity, binary, args.workdir, [base + ".h", base + ".cpp", DRIVER],
                    extra=["-I", workdir] + defines)
    return binary


def outputs(binary, seed, load, steps, save, path):
    text = run([binary, str(seed), load or "-", str(steps), save or "-", path])
    return read_outputs(path), text


def values(tensors):
    return {name: list(values) for name, (_, _, values) in tensors.items()}


def compare_resumed(actual, expected, args, path_dtypes):
    """tolerance.py's rule against the saving mesh's run: a train block's losses one by one (the
    k-th after k updates on the other mesh) and its params after N, a program's outputs after
    none. Returns (ok, the worst verdict's description, its ratio)."""
    verdicts = []
    file_rms = typical_scale(expected)
    for name, (dtype, _, want) in expected.items():
        got = actual[name][2] if name in actual else []
        if len(got) != len(want):
            return False, f"{name}: {len(got)} values, expected {len(want)}", float("inf")
        # The driver's "losses" are the train block's "loss" output; "param.<path>" its params.
        path = path_dtypes.get(f"{args.function}.{'loss' if name == 'losses' else name}")
        if args.train and name == "losses":
            verdicts += [(name, compare_values([g], [w], dtype, k, path, True, file_rms))
                         for k, (g, w) in enumerate(zip(got, want))]
        else:
            steps = args.steps if args.train else 0
            verdicts.append((name, compare_values(got, want, dtype, steps, path, True, file_rms)))
    name, worst = max(verdicts, key=lambda item: item[1].ratio)
    return all(v.ok for _, v in verdicts), f"worst {name}: {worst.describe()}", worst.ratio


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--meshc", required=True)
    parser.add_argument("--example", required=True)
    parser.add_argument("--class", dest="cls", required=True)
    parser.add_argument("--output")
    parser.add_argument("--train", action="store_true")
    parser.add_argument("--workdir", required=True)
    add_build_options(parser)
    parser.add_argument("--config", action="append", required=True)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--function", required=True, help="the program or train block")
    parser.add_argument("--inject-fault", help="meshc --inject-fault=FAULT for the saving config")
    parser.add_argument("--expect-failure", action="store_true",
                        help="succeed only when the comparisons fail (with --inject-fault)")
    args = parser.parse_args()
    if not args.train and not args.output:
        parser.error("give --output NAME (a program) or --train")
    if args.expect_failure and not (args.inject_fault and args.train):
        parser.error("--expect-failure needs --inject-fault and --train")
    os.makedirs(args.workdir, exist_ok=True)
    binaries = [build(args, i, config) for i, config in enumerate(args.config)]
    path_dtypes = path_dtypes_of(args.meshc, args.example, overrides_of(args.config[0]))
    for line in coarsened_paths(path_dtypes):
        print(line)
    checkpoint = os.path.join(args.workdir, "checkpoint")
    shutil.rmtree(checkpoint, ignore_errors=True)
    out = lambda name: os.path.join(args.workdir, name + ".out")  # noqa: E731
    failures = []

    if args.train:
        n = args.steps
        whole, text = outputs(binaries[0], 0, None, 2 * n, None, out("uninterrupted"))
        print(f"{args.config[0]}, {2 * n} steps uninterrupted:\n{text}", end="")
        first, _ = outputs(binaries[0], 0, None, n, checkpoint, out("first"))
        dtype, _, losses = whole["losses"]
        # The resumed run's losses are the uninterrupted run's last N; its params are its final.
        expected_rest = dict(whole)
        expected_rest["losses"] = (dtype, [n], list(losses[n:]))
        if list(first["losses"][2]) != list(losses[:n]):
            failures.append(f"the first {n} steps differ from the uninterrupted run's")
    else:
        reference, _ = outputs(binaries[0], 0, None, 0, checkpoint, out("reference"))
        control, _ = outputs(binaries[0], 99, None, 0, None, out("control"))
        expected_rest = reference
        if values(control) == values(reference):
            failures.append("seed 99 computes the same output as seed 0: the test shows nothing")

    worst = (0.0, "")  # the worst ratio over the configurations loading on another mesh
    elsewhere = 0  # how many of them fail
    for i, (config, binary) in enumerate(zip(args.config, binaries)):
        resumed, text = outputs(binary, 99, checkpoint, args.steps if args.train else 0, None,
                                out(f"resumed{i}"))
        ok, verdict, ratio = compare_resumed(resumed, expected_rest, args, path_dtypes)
        if i > 0:
            worst = max(worst, (ratio, f"{config}: {verdict}"))
        if i == 0:
            identical = values(resumed) == values(expected_rest)
            verdict = "bit-identical" if identical else f"DIFFERS ({verdict})"
            if not identical:
                failures.append(f"{config}: the resumed run is not bit-identical")
        elif not ok:
            failures.append(f"{config}: {verdict}")
            elsewhere += 1
        print(f"loaded on {config}: {verdict}")
        if args.train:
            print(text, end="")
    for failure in failures:
        print("FAILED:", failure)
    if args.inject_fault:
        print(f"injected fault {args.inject_fault} {'caught' if elsewhere else 'NOT caught'}: "
              f"worst error/tolerance {worst[0]:.3g} ({worst[1]})")
        if args.expect_failure:
            return 0 if failures else 1
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
