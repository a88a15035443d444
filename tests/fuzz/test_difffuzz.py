#!/usr/bin/env python3
"""Tests of the differential fuzzer's parts that need no C++ build (ctest fuzz.tools): the
generator's programs are valid (or, on the error path, rejected with the located error it
announced) and reproducible from their seed, the outcome classification, and the reducer
shrinking a program while a predicate keeps holding.

Usage: test_difffuzz.py MESHC"""
import os
import re
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import meshgen  # noqa: E402
from reduce import Reducer  # noqa: E402
from runcase import classify  # noqa: E402

MESHC = None


def plan(text, function, args=()):
    with tempfile.NamedTemporaryFile("w", suffix=".mesh", delete=False) as f:
        f.write(text)
    try:
        proc = subprocess.run([MESHC, f.name, "--emit=plan", "--function", function, *args],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    finally:
        os.unlink(f.name)
    return proc.returncode, proc.stdout


class GeneratorTest(unittest.TestCase):
    def test_programs_plan_or_fail_as_announced(self):
        errors = 0
        for seed in range(60):
            case = meshgen.generate(seed)
            rc, output = plan(case.text, case.function, case.extra_args)
            kind, detail = classify(rc, output, case.expect_error, case.may_reject)
            if case.expect_error:
                errors += 1
                self.assertEqual(kind, "rejected-ok", f"seed {seed}: {detail}\n{case.text}")
            else:
                self.assertIn(kind, ("pass", "rejected-ok"), f"seed {seed}: {detail}\n{case.text}")
        self.assertGreater(errors, 0, "no case of the 60 took the error path")

    def test_a_seed_gives_one_program(self):
        self.assertEqual(meshgen.generate(1234).text, meshgen.generate(1234).text)
        self.assertNotEqual(meshgen.generate(1234).text, meshgen.generate(1235).text)


# The issue-13 constructs, by the feature name the generator records and a text they show.
NEW_CONSTRUCTS = {
    "generic_def": "](x: ", "local_dim": "  dim half", "generic_explicit": "[",
    "multi_result": "-> (a: ", "multi_result_discard": "_", "repeat_shared": " shared {",
    "tied_param": ' as "tied/', "train_metrics": "m0 = ", "floor": "floor(", "ceil": "ceil(",
    "round": "round(", "clip": "clip(", "i32_mod": "%", "i32_floordiv": "floordiv(",
    "argmax": "argmax(", "argmin": "argmin(", "top_k_values": "top_k_values(",
    "top_k_indices": "top_k_indices(", "scatter_add": "scatter_add(", "random_int": "random_int(",
    "random_permutation": "random_permutation(", "gather": "gather(", "one_hot": "one_hot(",
    "bf16": "bf16",
}
DISCONTINUOUS = ("floor(", "ceil(", "round(", "argmax(", "argmin(", "top_k_values(",
                 "top_k_indices(")


def first_argument(text, start):
    """The first argument of the call whose `(` is at text[start - 1]."""
    depth, i = 0, start
    while i < len(text):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")" or (text[i] == "," and depth == 0):
            if depth == 0:
                return text[start:i]
            if text[i] == ")":
                depth -= 1
        i += 1
    return text[start:]


class NewConstructsTest(unittest.TestCase):
    SEEDS = range(300)

    def test_each_construct_is_generated_and_plans(self):
        cases = [meshgen.generate(seed) for seed in self.SEEDS]
        for feature, shown in NEW_CONSTRUCTS.items():
            with_it = [c for c in cases if feature in c.features]
            self.assertGreaterEqual(len(with_it), 4, f"{feature}: {len(with_it)} of 300")
            for case in with_it[:3]:
                self.assertIn(shown, case.text, f"{feature}, seed {case.seed}")
                rc, output = plan(case.text, case.function, case.extra_args)
                kind, detail = classify(rc, output, case.expect_error, case.may_reject)
                self.assertIn(kind, ("pass", "rejected-ok"),
                              f"{feature}, seed {case.seed}: {detail}\n{case.text}")

    def test_discontinuous_ops_take_exact_inputs(self):
        # floor/round/argmax/top_k of a computed float could flip on a rounding difference
        # between f32 and f64: their inputs must be integers cast to f32 (from iota, ids,
        # random_int), possibly scaled by a literal, never a float value of the program.
        seen = 0
        for seed in self.SEEDS:
            text = meshgen.generate(seed).text
            for op in DISCONTINUOUS:
                for at in [i for i in range(len(text)) if text.startswith(op, i)]:
                    if at > 0 and (text[at - 1].isalnum() or text[at - 1] == "_"):
                        continue
                    argument = first_argument(text, at + len(op))
                    seen += 1
                    self.assertTrue(argument.startswith("cast("), f"seed {seed}: {argument}")
                    inner = first_argument(argument, len("cast("))
                    self.assertNotRegex(inner, r"\b(x\d|v\d|h\d|g\d|p\d|q\d|w\d)",
                                        f"seed {seed}: {argument}")
        self.assertGreater(seen, 20)


class BatchSeedTest(unittest.TestCase):
    def test_the_ctest_batch_covers_the_language(self):
        # fuzz.difffuzz_batch runs 20 cases of one seed: a change to the generator changes
        # them, and the seed in tests/CMakeLists.txt must still reach what the batch is for.
        with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                               "CMakeLists.txt")) as f:
            seed = int(re.search(r"--cases 20 --seed (\d+)", f.read()).group(1))
        cases = [meshgen.generate(seed * 100000 + i) for i in range(20)]
        features = {f for c in cases for f in c.features}
        self.assertEqual({f for f in features if f.startswith("opt_")},
                         {"opt_" + o for o in meshgen.OPTIMIZERS})
        self.assertTrue(any(c.backend == "mpi" for c in cases))
        self.assertTrue(any("-O3" in c.opt for c in cases))
        self.assertTrue(any(c.expect_error for c in cases))
        missing = set(NEW_CONSTRUCTS) - features
        self.assertLessEqual(len(missing), 2, f"seed {seed} misses {sorted(missing)}")


class ClassifyTest(unittest.TestCase):
    def test_outcomes(self):
        located = "a.mesh:3:8: error: dim 'd0' of size 3 is not divisible by 2 (axes a0)\n"
        self.assertEqual(classify(0, "", "")[0], "pass")
        self.assertEqual(classify(1, located, "'d0'")[0], "rejected-ok")
        self.assertEqual(classify(1, located, "'d1'")[0], "rejected")
        self.assertEqual(classify(1, located, "")[0], "rejected")
        self.assertEqual(classify(0, "", "'d0'")[0], "missed-error")
        self.assertEqual(classify(1, "error: something\n", "")[0], "unlocated")
        self.assertEqual(classify(-11, "", "")[0], "crash")
        self.assertEqual(classify(None, "", "")[0], "timeout")
        self.assertEqual(classify(2, "meshc run: error: the outputs differ from the reference "
                                     "interpreter's\n", "")[0], "mismatch")
        self.assertEqual(classify(2, "the C++ compiler failed on the generated code", "")[0],
                         "build")
        self.assertEqual(classify(2, "the generated program failed (exit status 1)", "")[0],
                         "runtime")
        self.assertEqual(classify(2, "error: cannot write 'x'", "")[0], "internal")
        shared = "a.mesh:9:3: error: tensor f32[d0, d1] maps both 'd0' and 'd1' to mesh axis 'a0'"
        self.assertEqual(classify(1, shared, "", "to mesh axis 'a0'")[0], "rejected-ok")


class ReplayTest(unittest.TestCase):
    def replay(self, expect):
        text = ("// difffuzz-args: --function p --backend threads --opt -O1\n"
                f"// difffuzz-expect: {expect}\n"
                "mesh grid[a0 = 4]\ndim d0 = 6\nlayout d0: a0\n"
                "program p(x: f32[d0]) -> (y: f32[d0]) {\n  y = x * 2.0\n}\n")
        with tempfile.TemporaryDirectory() as workdir:
            path = os.path.join(workdir, "case.mesh")
            with open(path, "w") as f:
                f.write(text)
            # The planner rejects the layout before any build: no C++ compiler runs.
            return subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__),
                                                                 "replay.py"),
                                   "--meshc", MESHC, "--workdir", workdir, path],
                                  stdout=subprocess.DEVNULL).returncode

    def test_expectations(self):
        self.assertEqual(self.replay("error 'd0'"), 0)
        self.assertEqual(self.replay("known-bug rejected"), 0)
        self.assertEqual(self.replay("error 'd1'"), 1)
        self.assertEqual(self.replay("pass"), 1)


class ReducerTest(unittest.TestCase):
    def test_reduces_while_the_failure_holds(self):
        # A stand-in failure: the program plans and still has a log_softmax.
        case = next(c for c in map(meshgen.generate, range(100, 200))
                    if "log_softmax(" in c.text and not c.expect_error)

        def still_fails(text):
            return "log_softmax(" in text and plan(text, case.function)[0] == 0

        reduced = Reducer(case.text, still_fails, budget_s=120).run()
        self.assertTrue(still_fails(reduced))
        self.assertLess(len(reduced.splitlines()), len(case.text.splitlines()) // 2,
                        f"from:\n{case.text}\nto:\n{reduced}")


if __name__ == "__main__":
    MESHC = sys.argv.pop(1)
    unittest.main()
