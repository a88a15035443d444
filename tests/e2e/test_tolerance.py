#!/usr/bin/env python3
"""tolerance.py, the test scripts' comparison rule, on the cases of tests/unit/ToleranceTest.cpp
(the C++ copy of the rule): the values per dtype, the elementwise mixed bound, and the cases the
old rule (error over the tensor's largest value) got wrong."""
import io
import math
import os
import struct
import sys
import tempfile
import unittest
from contextlib import redirect_stdout

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_outputs import compare_files  # noqa: E402
from tolerance import coarser, compare_values, rms_of, rtol_of  # noqa: E402

F32 = 1024 * 2.0**-24


class ToleranceTest(unittest.TestCase):
    def test_values_per_dtype(self):
        self.assertEqual(rtol_of("f32"), F32)
        self.assertEqual(rtol_of("bf16"), 8 * 2.0**-8)
        self.assertEqual(rtol_of("f16"), 8 * 2.0**-11)
        self.assertEqual(rtol_of("i32"), 0)
        self.assertEqual(rtol_of("f32", 20), 21 * F32)
        self.assertEqual(coarser("f32", "bf16"), "bf16")
        self.assertEqual(coarser("f32", "f16"), "f16")
        self.assertEqual(coarser("bf16", "f16"), "bf16")
        self.assertEqual(coarser("f32", None), "f32")
        self.assertEqual(coarser("i32", "bf16"), "i32")

    def test_mixed_bound_with_rms_atol(self):
        expected = [4.0, -3.0, 0.0]
        atol = F32 * math.sqrt(25 / 3)
        actual = [4 + 0.99 * (atol + F32 * 4), -3.0, -0.99 * atol]
        verdict = compare_values(actual, expected, "f32")
        self.assertTrue(verdict.ok)
        self.assertAlmostEqual(verdict.ratio, 0.99)
        actual[2] = -1.01 * atol
        verdict = compare_values(actual, expected, "f32")
        self.assertFalse(verdict.ok)
        self.assertEqual(verdict.worst_index, 2)
        self.assertAlmostEqual(verdict.ratio, 1.01)
        self.assertAlmostEqual(verdict.needed, 1.01 * F32)

    def test_small_entry_error_not_hidden(self):
        expected = [1.0] * 1000
        expected[7] = 100.0
        actual = list(expected)
        actual[3] += 1e-3
        verdict = compare_values(actual, expected, "f32")
        self.assertFalse(verdict.ok)
        self.assertEqual(verdict.worst_index, 3)
        actual = list(expected)
        actual[7] *= 1 + 5e-5
        self.assertTrue(compare_values(actual, expected, "f32").ok)

    def test_all_zero_expected(self):
        zeros, residue = [0.0] * 16, [0.0] * 16
        residue[5] = 1e-9
        self.assertTrue(compare_values(zeros, zeros, "f32").ok)
        self.assertFalse(compare_values(residue, zeros, "f32").ok)
        self.assertTrue(compare_values(residue, zeros, "f32", fallback_rms=0.5).ok)
        residue[5] = 1e-3
        self.assertFalse(compare_values(residue, zeros, "f32", fallback_rms=0.5).ok)
        self.assertAlmostEqual(rms_of([3.0, 4.0, math.nan]), math.sqrt(12.5))

    def test_exact_cases(self):
        self.assertTrue(compare_values([1, 2, 3], [1, 2, 3], "i32").ok)
        self.assertFalse(compare_values([1, 2, 4], [1, 2, 3], "i32").ok)
        self.assertTrue(compare_values([math.nan, math.inf, 1], [math.nan, math.inf, 1], "f32").ok)
        self.assertFalse(compare_values([math.nan, 1], [1, 1], "f32").ok)
        self.assertFalse(compare_values([-math.inf, 1], [math.inf, 1], "f32").ok)
        self.assertFalse(compare_values([1e30, 1], [math.inf, 1], "f32").ok)
        self.assertFalse(compare_values([1, 2], [1, 2, 3], "f32").ok)

    def test_bf16_programs_steps_and_two_approximations(self):
        expected, actual = [1.0, -1.0, 1.0, -1.0], [1.02, -1.0, 1.0, -1.0]
        self.assertFalse(compare_values(actual, expected, "f32").ok)
        self.assertTrue(compare_values(actual, expected, "f32", path_dtype="bf16").ok)
        steps = math.ceil(0.02 / (2 * F32)) - 1
        self.assertTrue(compare_values(actual, expected, "f32", steps).ok)
        self.assertFalse(compare_values(actual, expected, "f32", steps - 1).ok)
        # Mesh against mesh: twice the bound.
        half = math.ceil(steps / 2)
        self.assertTrue(compare_values(actual, expected, "f32", half, both_approximate=True).ok)


    def test_per_tensor_path_dtypes(self):
        # The same 2% error in two f32 tensors: the one a bf16 value reaches passes at bf16's
        # tolerance, the other fails at f32's; the whole-file --compute-dtype coarsens both.
        def write(path, tensors):
            with open(path, "wb") as f:
                for name, values in tensors.items():
                    f.write(f"tensor {name} f32 1 {len(values)}\n".encode())
                    f.write(struct.pack(f"<{len(values)}d", *values))

        with tempfile.TemporaryDirectory() as tmp:
            actual, expected = os.path.join(tmp, "a"), os.path.join(tmp, "e")
            write(expected, {"p.fast": [1.0, -1.0], "p.exact": [1.0, -1.0]})
            write(actual, {"p.fast": [1.02, -1.0], "p.exact": [1.02, -1.0]})
            verdicts = []
            with redirect_stdout(io.StringIO()):
                ok = compare_files(actual, expected, path_dtypes={"p.fast": "bf16",
                                                                  "p.exact": "f32"},
                                   verdicts=verdicts)
                self.assertTrue(compare_files(actual, expected, compute_dtype="bf16"))
            self.assertFalse(ok)
            results = {name: verdict.ok for name, verdict in verdicts}
            self.assertEqual(results, {"p.fast": True, "p.exact": False})


if __name__ == "__main__":
    unittest.main()
