#!/usr/bin/env python3
"""The meshc command line: options, exit codes (0 ok, 1 input errors, 2 internal errors), no
partial output on failure, depfiles. `check_cli.py <meshc> <case>` runs one case; ctest runs each
case as its own test."""
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GOOD = os.path.join(ROOT, "tests", "golden", "import.mesh")
LIB = os.path.join(ROOT, "tests", "golden", "inputs", "lib.mesh")
BAD = os.path.join(ROOT, "tests", "errors", "sema_unknown_name.mesh")


def meshc(*args):
    return subprocess.run([MESHC, *args], capture_output=True, text=True, timeout=600)


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
    # Testing the tests: hidden, but listed by --help-hidden.
    expect("--inject-fault" not in proc.stdout, "--help hides --inject-fault", proc)
    expect("--inject-fault" in meshc("--help-hidden").stdout, "--help-hidden lists it", proc)


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


MLP = os.path.join(ROOT, "dsl-examples", "mlp.mesh")
TRANSFORMER = os.path.join(ROOT, "dsl-examples", "transformer.mesh")
SWISH = os.path.join(ROOT, "dsl-examples", "swish_mlp.mesh")
SWISH_HEADER = os.path.join(ROOT, "dsl-examples", "kernels", "swish.h")


def every_option():
    """Each option of the top-level command changes what meshc does."""
    base = meshc(MLP, "--emit=plan")
    expect(base.returncode == 0, "--emit=plan", base)
    machine = meshc(MLP, "--emit=plan", "--machine", "8xh200")
    expect(machine.returncode == 0 and machine.stdout != base.stdout and "H200" in machine.stdout,
           "--machine names the machine planned for", machine)
    budget = meshc(MLP, "--emit=plan", "--memory-budget", "1KiB")
    expect(budget.returncode == 1 and "error:" in budget.stderr,
           "--memory-budget rejects a plan that does not fit", budget)
    bad_budget = meshc(MLP, "--emit=plan", "--memory-budget", "lots")
    expect(bad_budget.returncode == 1 and "--memory-budget" in bad_budget.stderr,
           "--memory-budget needs a byte size", bad_budget)
    devices = meshc(MLP, "--emit=plan", "--devices", "8")
    expect(devices.returncode == 0 and "8 devices" in devices.stdout, "--devices sizes the mesh",
           devices)
    mesh = meshc(MLP, "--emit=plan", "--mesh", "data=4", "--layout", "batch:data")
    expect(mesh.returncode == 0 and "[data=4]" in mesh.stdout, "--mesh and --layout", mesh)
    dim = meshc(MLP, "--emit=ir", "--dim", "d_ff=512")
    expect(dim.returncode == 0 and "d_ff = 512" in dim.stdout, "--dim sets a dim's size", dim)
    function = meshc(MLP, "--emit=run", "--function", "mlp")
    expect(function.returncode == 0 and "program mlp" in function.stdout and
           "mlp_train" not in function.stdout, "--function selects one function", function)
    seeds = [meshc(MLP, "--emit=run", "--function", "mlp", "--seed", s).stdout for s in "01"]
    expect(seeds[0].split("interpreted")[1] != seeds[1].split("interpreted")[1],
           "--seed changes the values")
    with tempfile.TemporaryDirectory() as tmp:
        dump = os.path.join(tmp, "out.bin")
        proc = meshc(MLP, "--emit=run", "--dump-outputs", dump)
        expect(proc.returncode == 0 and open(dump, "rb").read().startswith(b"tensor mlp.y f32 2"),
               "--dump-outputs writes the outputs", proc)
        base_path = os.path.join(tmp, "gen")
        proc = meshc(MLP, "--emit=cpp", "-o", base_path, "--cpp-runner")
        expect(proc.returncode == 0 and sorted(os.listdir(tmp)) ==
               ["gen.cpp", "gen.h", "gen.main.cpp", "out.bin"], "--cpp-runner adds the runner", proc)
        for emit in ["ast", "ir", "spmd", "dot", "plan-json"]:
            proc = meshc(MLP, f"--emit={emit}")
            expect(proc.returncode == 0 and proc.stdout, f"--emit={emit}", proc)


def recompute():
    """--recompute=DEF recomputes a def's activations in train blocks; the plan says what it costs
    and saves, and the peak of live activations drops. It must name a def that a train block
    calls."""
    # Sizes at which activations, not the optimizer's new values, set the peak.
    sizes = ["--function", "lm_train", "--dim", "layers=4", "--dim", "batch=16", "--dim",
             "seq=128", "--dim", "mem=128"]
    base = meshc(TRANSFORMER, "--emit=plan", *sizes)
    expect(base.returncode == 0 and "recompute" not in base.stdout, "plain plan", base)
    plan = meshc(TRANSFORMER, "--emit=plan", *sizes, "--recompute=decoder_layer")
    expect(plan.returncode == 0 and re.search(r"\n  decoder_layer: 4 calls, activations dropped "
                                              r".* \(\d+ B\), compute added [0-9.e+]+ flops, ",
                                              plan.stdout),
           "--recompute=decoder_layer reports the recomputed def", plan)
    units = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    peak = [float(m.group(1)) * units[m.group(2)] for m in
            (re.search(r"activations +([0-9.]+) (\w+) \(peak live\)", p.stdout) for p in (base, plan))]
    expect(peak[1] < peak[0], f"the peak of live activations drops: {peak}", plan)
    unknown = meshc(MLP, "--emit=plan", "--recompute=nosuch")
    expect(unknown.returncode == 1 and
           "error: --recompute names 'nosuch', which is not a def" in unknown.stderr,
           "--recompute of an unknown def", unknown)
    # Under a budget no layout fits alone, --layout auto's joint search plans the repeated layer
    # recomputed among the other combinations (tests/golden-plans/check_joint_search.py checks
    # the choice).
    fit = meshc(TRANSFORMER, "--emit=plan", *sizes, "--layout", "auto", "--memory-budget", "12MiB")
    expect(fit.returncode == 0 and "no layout of train block 'lm_train' fits the memory budget of "
           "12.0 MiB alone: planned with" in fit.stderr and
           re.search(r"\n  - +decoder_layer +1 +0 .* (over|fits)\n", fit.stdout),
           "a memory budget no layout meets alone: recomputation is among the combinations", fit)
    ir = meshc(MLP, "--emit=train-ir", "--recompute", "ffn")
    expect(ir.returncode == 0 and 'recompute = "ffn"' in ir.stdout, "the copies in the IR", ir)


def verify_each():
    """--verify-each: the IR verifier after sema, training and planning; a clean program's
    output is unchanged, and IR that breaks a rule is an internal error naming the op."""
    expect("--verify-each" in meshc("--help").stdout, "--help lists --verify-each")
    for emit in ["train-ir", "spmd"]:
        plain = meshc(MLP, f"--emit={emit}")
        checked = meshc(MLP, f"--emit={emit}", "--verify-each")
        expect(checked.returncode == 0 and checked.stdout == plain.stdout and
               checked.stderr == "", f"--verify-each --emit={emit} on a valid program", checked)
    with tempfile.TemporaryDirectory() as tmp:
        good = os.path.join(tmp, "mlp.ir")
        expect(meshc(MLP, "-o", good).returncode == 0, "writes IR")
        text = open(good).read()
        broken_line = "%5 = add %4, %2 : f32[batch, d_ff]"
        expect(broken_line in text, "the IR has the add to break")
        bad = os.path.join(tmp, "bad.ir")
        with open(bad, "w") as f:
            f.write(text.replace(broken_line, "%5 = add %4, %2 : f32[batch]", 1))
        proc = meshc(bad, "--verify-each")
        expect(proc.returncode != 0 and proc.stdout == "" and
               "internal compiler error: IR verifier after reading IR: mlp.mesh:27:47: in 'mlp', "
               "op %5 = add: result dims [batch=32] differ from the union of the operands' "
               "[batch=32, d_ff=256]" in proc.stderr, "--verify-each rejects a wrong result type",
               proc)


def emit_cpp_unwritable():
    proc = meshc(MLP, "--emit=cpp", "-o", "/nonexistent-meshc-dir/gen")
    expect(proc.returncode == 2 and "cannot open" in proc.stderr,
           "--emit=cpp exits 2 when it cannot write its files", proc)


def depfile_user_headers():
    with tempfile.TemporaryDirectory() as tmp:
        base_path = os.path.join(tmp, "gen")
        proc = meshc(SWISH, "--emit=cpp", "-o", base_path, "-MD")
        expect(proc.returncode == 0, "--emit=cpp of a program with user kernels", proc)
        with open(base_path + ".cpp.d") as f:
            text = f.read()
        expect(text.startswith(base_path + ".cpp:"), "the depfile's target is <o>.cpp")
        expect(SWISH in text and os.path.normpath(SWISH_HEADER) in text,
               "the depfile lists the .mesh file and the user header", proc)
        with open(base_path + ".cpp") as f:
            expect('#include "kernels/swish.h"' in f.read() , "the source includes the header")


def run_command(*args, cache):
    return meshc("run", *args, "--cache-dir", cache, "--opt=-O0")


def run_check():
    """`meshc run` compiles, builds, runs on the mesh's thread ranks and checks against the
    interpreter; a second run reuses the cached binary."""
    with tempfile.TemporaryDirectory() as cache:
        proc = run_command(MLP, "--mesh", "data=2,model=2", "--check", "--function", "mlp",
                           cache=cache)
        expect(proc.returncode == 0, "meshc run --check succeeds", proc)
        for text in ["plan of program mlp", "program mlp: 4 ranks", "ok   mlp.y f32[32, 64]",
                     "meshc run: compile", "build", "check"]:
            expect(text in proc.stdout, f"meshc run prints '{text}'", proc)
        expect("mlp_train" not in proc.stdout, "--function builds only mlp", proc)
        stages = ["meshc run: compiling", "meshc run: building the generated code",
                  "meshc run: running on the threads backend",
                  "meshc run: checking against the reference interpreter"]
        positions = [proc.stderr.find(stage) for stage in stages]
        expect(all(p >= 0 for p in positions) and positions == sorted(positions),
               "meshc run announces its stages on stderr, in order", proc)
        again = run_command(MLP, "--mesh", "data=2,model=2", "--check", "--function", "mlp",
                            "--no-plan", cache=cache)
        expect(again.returncode == 0 and "(cached)" in again.stdout and
               "plan of" not in again.stdout, "the second run reuses the binary", again)
        # --steps widens the bound of what trained (1 + steps) only: the program's outputs,
        # computed once from the initial params, keep the one-step rtol.
        steps = run_command(MLP, "--mesh", "data=2,model=2", "--check", "--steps", "3",
                            "--no-plan", cache=cache)
        expect(steps.returncode == 0 and "ok   mlp.y f32[32, 64]: error/tolerance" in steps.stdout
               and re.search(r"ok   mlp\.y .*\(rtol 6\.1e-05,", steps.stdout) and
               re.search(r"ok   mlp_train\.loss .*\(rtol 0\.000244,", steps.stdout),
               "--steps 3: the program at rtol 6.1e-05, the train block at 4 times it", steps)
        other = run_command(MLP, "--mesh", "data=4", "--layout", "batch:data", "--function",
                            "mlp", "--no-plan", "--seed", "3", cache=cache)
        expect(other.returncode == 0 and "4 ranks" in other.stdout and
               "(cached)" not in other.stdout, "another mesh builds anew", other)


def run_installed():
    """An installed meshc (bin/, include/, lib/ under one prefix) builds against its prefix's
    runtime, not the build tree's, and its build cache keys on that runtime: a newer
    libmeshrt.a or header builds anew."""
    build = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(MESHC))))
    with tempfile.TemporaryDirectory(dir=build) as prefix:
        os.makedirs(os.path.join(prefix, "bin"))
        os.makedirs(os.path.join(prefix, "lib"))
        installed = os.path.join(prefix, "bin", "meshc")
        shutil.copy2(MESHC, installed)  # a link would run as the build tree's meshc
        for include in ["runtime/include", "runtime/kernels/include", "compiler/codegen/support"]:
            shutil.copytree(os.path.join(ROOT, include), os.path.join(prefix, "include"),
                            dirs_exist_ok=True)
        for lib in ["runtime/libmeshrt.a", "runtime/libmeshrt_launch.a", "runtime/libmeshrt_mpi.a",
                    "runtime/kernels/libmeshrt_kernels.a"]:
            if os.path.exists(os.path.join(build, lib)):
                shutil.copy2(os.path.join(build, lib), os.path.join(prefix, "lib"))
        cache = os.path.join(prefix, "cache")

        def run_mlp():
            return subprocess.run([installed, "run", MLP, "--function", "mlp", "--no-plan",
                                   "--cache-dir", cache, "--opt=-O0"],
                                  capture_output=True, text=True, timeout=600)

        first = run_mlp()
        expect(first.returncode == 0 and "(cached)" not in first.stdout,
               "the installed meshc builds and runs", first)
        again = run_mlp()
        expect(again.returncode == 0 and "(cached)" in again.stdout, "then reuses it", again)
        for changed in [os.path.join(prefix, "lib", "libmeshrt.a"),
                        os.path.join(prefix, "include", "meshrt", "Comm.h")]:
            later = os.path.getmtime(changed) + 10
            os.utime(changed, (later, later))
            rebuilt = run_mlp()
            expect(rebuilt.returncode == 0 and "(cached)" not in rebuilt.stdout,
                   f"a newer {os.path.basename(changed)} in the prefix builds anew", rebuilt)


def run_precompiled_prelude():
    """A C++ build of `meshc run` at the default --opt includes the prelude this meshc's build
    precompiled (target meshc_prelude, in ALL); it builds without it, with no error, when the
    flags differ (another --opt), when the file is missing, or when the key says it was made with
    other flags ($MESHC_PRELUDE_DIR names another directory)."""
    used = "with the precompiled prelude"
    args = [MLP, "--mesh", "data=2", "--layout", "batch:data", "--function", "mlp", "--no-plan"]
    with tempfile.TemporaryDirectory() as tmp:
        def run(*extra, cache, prelude_dir=None):
            env = dict(os.environ)
            env.pop("MESHC_PRELUDE_DIR", None)
            if prelude_dir is not None:
                env["MESHC_PRELUDE_DIR"] = prelude_dir
            return subprocess.run([MESHC, "run", *args, *extra, "--cache-dir",
                                   os.path.join(tmp, cache)],
                                  capture_output=True, text=True, timeout=600, env=env)

        proc = run(cache="default")
        expect(proc.returncode == 0 and used in proc.stderr,
               "the default flags build with the build tree's precompiled prelude (is the "
               "target meshc_prelude built?)", proc)
        proc = run("--opt=-O0", cache="O0")
        expect(proc.returncode == 0 and "building the generated code" in proc.stderr and
               used not in proc.stderr, "other flags build without it", proc)
        proc = run(cache="missing", prelude_dir=os.path.join(tmp, "no-such-dir"))
        expect(proc.returncode == 0 and used not in proc.stderr,
               "a missing precompiled prelude: a plain build, no error", proc)
        other = os.path.join(tmp, "other")
        os.makedirs(other)
        for name, text in [("prelude.h", '#include "meshc/GeneratedPrelude.h"\n'),
                           ("prelude.h.gch", "not a precompiled header"),
                           ("prelude.key", "c++ -O1 (other flags)\n")]:
            with open(os.path.join(other, name), "w") as f:
                f.write(text)
        proc = run(cache="other", prelude_dir=other)
        expect(proc.returncode == 0 and used not in proc.stderr,
               "a precompiled prelude made with other flags is not used", proc)


def run_omp_wait_policy():
    """OpenMP waits by sleeping in what `meshc run` runs and in the generated runner started by
    hand (it sets OMP_WAIT_POLICY=passive and starts itself again), unless the user set the
    variable. libgomp says what it uses with OMP_DISPLAY_ENV=verbose: a spin count of 0 is
    passive; its default (unset) spins 300000 times, `active` far longer."""
    base = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    base["OMP_DISPLAY_ENV"] = "verbose"
    spins = lambda text: re.findall(r"GOMP_SPINCOUNT = '(\d+)'", text)
    with tempfile.TemporaryDirectory() as cache:
        args = [MESHC, "run", MLP, "--mesh", "data=2", "--layout", "batch:data", "--function",
                "mlp", "--no-plan", "--cache-dir", cache, "--opt=-O0"]
        proc = subprocess.run(args, capture_output=True, text=True, timeout=600, env=base)
        expect(proc.returncode == 0, "meshc run succeeds", proc)
        expect(spins(proc.stderr) == ["0"], "meshc run: the program's OpenMP waits passively",
               proc)
        binary = next(os.path.join(top, name) for top, _, names in os.walk(cache)
                      for name in names if name.endswith(".bin"))
        out = os.path.join(cache, "outputs")
        alone = subprocess.run([binary, out], capture_output=True, text=True, timeout=600,
                               env=base)
        expect(alone.returncode == 0 and spins(alone.stderr)[-1:] == ["0"],
               "the runner started by hand restarts itself with passive waits", alone)
        expect(len(spins(alone.stderr)) == 2 and spins(alone.stderr)[0] != "0",
               "it restarted once, from OpenMP's spinning default", alone)
        active = dict(base, OMP_WAIT_POLICY="active")
        for command in [args, [binary, out]]:
            user = subprocess.run(command, capture_output=True, text=True, timeout=600,
                                  env=active)
            expect(user.returncode == 0 and len(spins(user.stderr)) == 1 and
                   int(spins(user.stderr)[0]) > 300000,
                   f"{os.path.basename(command[0])}: the user's OMP_WAIT_POLICY is kept", user)


def run_check_path_dtypes():
    """`meshc run --check` compares each output at the tolerance of the coarsest float dtype on
    any path into it: mixed_precision.mesh's bf16 branch at bf16's rtol, its f32 one at f32's."""
    mixed = os.path.join(ROOT, "tests", "e2e", "cases", "mixed_precision.mesh")
    dtypes = meshc(mixed, "--emit=tolerance-dtypes")
    expect(dtypes.returncode == 0 and '"mixed_precision.exact": "f32"' in dtypes.stdout and
           '"mixed_precision.fast": "bf16"' in dtypes.stdout, "--emit=tolerance-dtypes", dtypes)
    with tempfile.TemporaryDirectory() as cache:
        proc = run_command(mixed, "--check", "--no-plan", "--function", "mixed_precision",
                           cache=cache)
        expect(proc.returncode == 0, "meshc run --check on a mixed-precision program", proc)
        for line in ["ok   mixed_precision.exact f32[16, 32]: error/tolerance",
                     "ok   mixed_precision.fast f32[16, 32]: error/tolerance"]:
            expect(line in proc.stdout, f"meshc run prints '{line}'", proc)
        rtols = dict(re.findall(r"mixed_precision\.(\w+) f32\S+ \S+: error/tolerance \S+ "
                                r"\(rtol (\S+),", proc.stdout))
        expect(rtols == {"exact": "6.1e-05", "fast": "0.0312"},
               "the f32 branch at f32's rtol, the bf16 one at bf16's", proc)


def run_user_kernels():
    with tempfile.TemporaryDirectory() as cache:
        proc = run_command(SWISH, "--check", "--no-plan", cache=cache)
        expect(proc.returncode == 0 and "ok   swish_mlp.y" in proc.stdout,
               "a program with user kernels runs and matches the interpreter", proc)


def write_tensor(path, name, shape, values, append=False):
    import struct
    with open(path, "ab" if append else "wb") as f:
        f.write(f"tensor {name} f32 {len(shape)} {' '.join(map(str, shape))}\n".encode())
        f.write(struct.pack(f"<{len(values)}d", *values))


def run_data():
    """--data: inputs read from a file feed both the generated code and (--check) the
    interpreter (`--emit=run --inputs`); a mismatch between the two would fail the check."""
    import math
    import struct
    with tempfile.TemporaryDirectory() as cache:
        data = os.path.join(cache, "inputs.bin")
        write_tensor(data, "mlp.x", [32, 64], [math.sin(0.37 * i) for i in range(2048)])
        synthetic = meshc(MLP, "--emit=run", "--function", "mlp")
        given = meshc(MLP, "--emit=run", "--function", "mlp", "--inputs", data)
        expect(given.returncode == 0 and given.stdout.split("interpreted")[1] !=
               synthetic.stdout.split("interpreted")[1], "--inputs changes the outputs", given)
        proc = run_command(MLP, "--function", "mlp", "--no-plan", "--check", "--data", data,
                           cache=cache)
        expect(proc.returncode == 0 and "ok   mlp.y" in proc.stdout,
               "meshc run --data --check matches the interpreter on the given inputs", proc)
        wrong = os.path.join(cache, "wrong.bin")
        write_tensor(wrong, "mlp.x", [7], [1.0] * 7)
        bad = meshc(MLP, "--emit=run", "--function", "mlp", "--inputs", wrong)
        expect(bad.returncode == 1 and "--inputs" in bad.stderr, "a wrong shape is refused", bad)
        with open(wrong, "w") as f:
            f.write("not a tensor file\n")
        bad = run_command(MLP, "--function", "mlp", "--no-plan", "--data", wrong, cache=cache)
        expect(bad.returncode != 0 and "not a tensor file" in bad.stderr,
               "a malformed data file is reported", bad)
        # The runner checks dims, not only the count: a transposed [64, 32] x is refused, naming
        # the file, the tensor and both shapes.
        transposed = os.path.join(cache, "transposed.bin")
        write_tensor(transposed, "mlp.x", [64, 32], [0.5] * 2048)
        bad = run_command(MLP, "--function", "mlp", "--no-plan", "--data", transposed, cache=cache)
        expect(bad.returncode != 0 and f"inputs file '{transposed}': tensor 'mlp.x' has shape "
               "[64, 32], but the program's input is [32, 64]" in bad.stderr,
               "a transposed input is refused with both shapes", bad)
        # A header declaring 10^11 values is refused before anything is allocated (no bad_alloc).
        huge = os.path.join(cache, "huge.bin")
        with open(huge, "wb") as f:
            f.write(b"tensor mlp.x f32 2 100000 1000000\n")
            f.write(struct.pack("<3d", 1, 2, 3))
        bad = run_command(MLP, "--function", "mlp", "--no-plan", "--data", huge, cache=cache)
        expect(bad.returncode != 0 and f"inputs file '{huge}': tensor 'mlp.x' declares shape "
               "[100000, 1000000] but only 3 values follow" in bad.stderr and
               "bad_alloc" not in bad.stderr, "a huge tensor header is refused", bad)
        missing = run_command(MLP, "--data", os.path.join(cache, "none.bin"), cache=cache)
        expect(missing.returncode == 1 and "--data" in missing.stderr, "a missing data file",
               missing)


def run_train_data():
    """meshc run --steps N --data: a train block trains on batches read from a file (two batches
    of each input stacked along the first dim; step s reads batch s mod 2), in the generated code
    and in the interpreter, which --check compares (losses and final params)."""
    import math
    with tempfile.TemporaryDirectory() as cache:
        data = os.path.join(cache, "batches.bin")
        write_tensor(data, "mlp_train.x", [64, 64], [math.sin(0.37 * i) for i in range(4096)])
        write_tensor(data, "mlp_train.target", [64, 64], [math.cos(0.11 * i) for i in range(4096)],
                     append=True)
        synthetic = meshc(MLP, "--emit=run", "--function", "mlp_train", "--steps", "2")
        given = meshc(MLP, "--emit=run", "--function", "mlp_train", "--steps", "2", "--inputs",
                      data)
        expect(given.returncode == 0 and "step 1 loss" in given.stdout and
               given.stdout != synthetic.stdout, "--inputs feeds the train steps", given)
        proc = run_command(MLP, "--function", "mlp_train", "--no-plan", "--steps", "4", "--check",
                           "--tol", "1e-3", "--data", data, cache=cache)
        expect(proc.returncode == 0 and "step 3 loss" in proc.stdout and
               "ok   mlp_train.loss" in proc.stdout and "ok   mlp_train.param.ffn/w_in" in
               proc.stdout, "meshc run --steps --data trains on the file and matches the "
               "interpreter", proc)
        odd = os.path.join(cache, "odd.bin")
        write_tensor(odd, "mlp_train.x", [48, 64], [0.5] * (48 * 64))
        bad = meshc(MLP, "--emit=run", "--function", "mlp_train", "--steps", "1", "--inputs", odd)
        expect(bad.returncode == 1 and "batches" in bad.stderr,
               "a data tensor that is not whole batches is refused", bad)


def losses_of(text):
    return [float(line.split()[3]) for line in text.splitlines() if line.startswith("step ")]


def run_fixed_batch():
    """--steps says what it trains on: a new synthetic batch per step (the default) or, with
    --batch=fixed, step 0's batch every step, in the interpreter and in the generated code alike;
    SGD on one fixed batch lowers its loss step by step, where fresh batches jump."""
    fresh = meshc(MLP, "--emit=run", "--function", "mlp_train", "--steps", "5")
    fixed = meshc(MLP, "--emit=run", "--function", "mlp_train", "--steps", "5", "--batch=fixed")
    expect(fresh.returncode == 0 and "each on a new batch" in fresh.stdout,
           "the interpreter says it trains on new batches", fresh)
    expect(fixed.returncode == 0 and "each on the same batch" in fixed.stdout,
           "the interpreter says it trains on one batch", fixed)
    fresh_losses, fixed_losses = losses_of(fresh.stdout), losses_of(fixed.stdout)
    expect(len(fixed_losses) == 5 and fixed_losses[0] == fresh_losses[0] and
           all(b < a for a, b in zip(fixed_losses, fixed_losses[1:])),
           f"one fixed batch: step 0 as fresh, then the loss falls every step ({fixed_losses})",
           fixed)
    expect(fresh_losses[1] > fresh_losses[0],
           f"fresh batches: step 1's new batch has a higher loss ({fresh_losses})", fresh)
    with tempfile.TemporaryDirectory() as cache:
        proc = run_command(MLP, "--function", "mlp_train", "--no-plan", "--steps", "5",
                           "--batch=fixed", "--check", cache=cache)
        expect(proc.returncode == 0 and "each on the same batch" in proc.stdout and
               losses_of(proc.stdout) and
               abs(losses_of(proc.stdout)[-1] - fixed_losses[-1]) <= 1e-4 * fixed_losses[-1] and
               "ok   mlp_train.param.ffn/w_in" in proc.stdout,
               "meshc run --batch=fixed: the generated code trains on step 0's batch and "
               "matches the interpreter", proc)
    bad = meshc(MLP, "--emit=run", "--steps", "1", "--batch=bogus")
    expect(bad.returncode == 1 and "--batch" in bad.stderr, "an unknown --batch is refused", bad)


def run_check_noise():
    """--check tells rounding noise from mismatches. tests/cli/noise_gradient.mesh's `b_k` has a
    gradient that is zero in exact arithmetic (softmax ignores it), so after 5 adamw steps it is
    rounding noise that differs between the run and the interpreter by more than the bound; the
    interpreter in double differs from the rounded one just as much, so it is reported as noise,
    not a mismatch. Under a --tol too tight for the ordinary weight `w`, `w` still fails: the
    probe holds the oracle to the default bound, at which it determines `w`."""
    noise_mesh = os.path.join(ROOT, "tests", "cli", "noise_gradient.mesh")
    ratio = lambda text, name: float(re.search(
        rf"  (?:ok  |FAIL|noise) {re.escape(name)} .*?error/tolerance ([0-9.e+-]+)", text).group(1))
    with tempfile.TemporaryDirectory() as cache:
        proc = run_command(noise_mesh, "--steps", "5", "--check", "--no-plan", cache=cache)
        expect(proc.returncode == 0, "the noise alone is no mismatch", proc)
        for tensor in ["b_k", "b_k@m", "b_k@v"]:
            name = "noise_train.param." + tensor
            expect(f"  noise {name} " in proc.stdout and ratio(proc.stdout, name) > 1,
                   f"{name}: over the bound, reported as noise", proc)
        expect("  ok   noise_train.param.w " in proc.stdout and
               "  ok   noise_train.loss " in proc.stdout and "note: 3 tensor(s) are rounding noise"
               in proc.stdout, "the loss and w are held to the bound and pass", proc)
        tight = run_command(noise_mesh, "--steps", "5", "--check", "--no-plan", "--tol", "1e-9",
                            cache=cache)
        expect(tight.returncode == 2 and "  FAIL noise_train.param.w " in tight.stdout and
               "  noise noise_train.param.b_k " in tight.stdout and
               "the outputs differ from the reference interpreter's" in tight.stderr,
               "a tensor the oracle determines fails a tighter --tol", tight)


def run_runner_checkpoint():
    """meshc run --save / --load (the generated runner's options): a run saved after 2 steps and
    resumed for 2 more prints the losses of steps 2 and 3 of an uninterrupted 4-step run, bit for
    bit, also when the resumed run is given another --seed (load restores the saved seed, which
    keys the synthetic batches as well as the params and random ops). --check cannot check a
    loaded run (the interpreter starts from the initial params): an error."""
    with tempfile.TemporaryDirectory() as cache:
        ckpt = os.path.join(cache, "ckpt")

        def train(*args):
            done = run_command(MLP, "--function", "mlp_train", "--mesh", "data=2", "--layout",
                               "batch:data", "--no-plan", *args, cache=cache)
            expect(done.returncode == 0, f"meshc run {args}", done)
            return losses_of(done.stdout)

        whole = train("--steps", "4")
        first = train("--steps", "2", "--save", ckpt)
        expect(len(whole) == 4 and first == whole[:2], f"the saving run's losses {first} are the "
               f"first two of {whole}")
        expect(os.path.exists(os.path.join(ckpt, "mlp_train", "latest")), "--save wrote it")
        for seed in ["0", "7"]:
            resumed = train("--steps", "2", "--load", ckpt, "--seed", seed)
            expect(resumed == whole[2:], f"resumed with seed {seed}: losses {resumed}, "
                   f"uninterrupted {whole[2:]}")
        checked = run_command(MLP, "--function", "mlp_train", "--steps", "2", "--load", ckpt,
                              "--check", cache=cache)
        expect(checked.returncode == 1 and "cannot check a run that --load starts" in
               checked.stderr, "--load with --check is refused", checked)


def run_codegen_options():
    """`meshc run` takes the code generator's options of `meshc --emit=cpp`
    (--disable-kernel-pass, --recompute, --pipeline-schedule): its generated code is what the
    emit path writes with them, a pass disabled still runs and checks, and an unknown pass is an
    option error naming the passes."""
    with tempfile.TemporaryDirectory() as cache:
        def generated(*args):
            """The C++ `meshc run` wrote with `args` (its build stopped by --cxx false; one job,
            so one source file, as --emit=cpp writes it)."""
            before = set(glob.glob(os.path.join(cache, "run", "*", "*.cpp")))
            proc = run_command(*args, "--no-plan", "--cxx", "false", "-j", "1", cache=cache)
            expect(proc.returncode == 2 and "the C++ compiler failed" in proc.stderr,
                   f"meshc run {args} writes its code, then its build stops", proc)
            new = [path for path in set(glob.glob(os.path.join(cache, "run", "*", "*.cpp"))) - before
                   if not path.endswith((".main.cpp", ".unity.cpp"))]
            expect(len(new) == 1, f"one work directory per set of options: {new}", proc)
            return open(new[0]).read()

        def emitted(example, *args):
            with tempfile.TemporaryDirectory() as out:
                stem = os.path.splitext(os.path.basename(example))[0]
                proc = meshc(example, "--emit=cpp", "--cpp-runner", "-o", os.path.join(out, stem),
                             *args)
                expect(proc.returncode == 0, f"meshc --emit=cpp {args}", proc)
                return open(os.path.join(out, stem + ".cpp")).read()

        plain = generated(MLP, "--function", "mlp")
        for example, args in [(MLP, ["--function", "mlp", "--disable-kernel-pass", "fuse-loops"]),
                              (TRANSFORMER, ["--function", "lm_train", "--recompute",
                                             "decoder_layer"]),
                              (TRANSFORMER, ["--function", "lm_train", "--dim", "batch=8",
                                             "--mesh", "stage=2", "--layout", "layers:stage",
                                             "--microbatches=batch=4", "--pipeline-schedule",
                                             "gpipe"])]:
            code = generated(example, *args)
            expect(code == emitted(example, *args), f"meshc run {args} generates what "
                   "meshc --emit=cpp does with them")
            expect(code != emitted(example, *args[:-2]), f"{args[-2:]} changes the code")
        expect(plain == emitted(MLP, "--function", "mlp"), "without options: the same code")
        checked = run_command(MLP, "--function", "mlp", "--no-plan", "--check",
                              "--disable-kernel-pass", "fuse-loops", "--disable-kernel-pass",
                              "hoist-invariants", cache=cache)
        expect(checked.returncode == 0 and "ok   mlp.y" in checked.stdout,
               "with two passes disabled the program builds, runs and matches", checked)
        unknown = run_command(MLP, "--function", "mlp", "--disable-kernel-pass", "nosuch",
                              cache=cache)
        expect(unknown.returncode == 1 and
               "--disable-kernel-pass: no kernel pass named 'nosuch'" in unknown.stderr and
               "fuse-loops" in unknown.stderr and "compiling" not in unknown.stderr,
               "an unknown pass is an option error listing the passes", unknown)
    # keep-dropout-masks: backward reads the forward's keep bits instead of drawing them again,
    # the same bits, so the train step's outputs are the same, bit for bit.
    actual, code = {}, {}
    for options in ([], ["--disable-kernel-pass", "keep-dropout-masks"]):
        with tempfile.TemporaryDirectory() as cache:
            proc = run_command(TRANSFORMER, "--function", "lm_train", "--mesh", "data=2,model=2",
                               "--check", "--no-plan", *options, cache=cache)
            expect(proc.returncode == 0, f"lm_train {options} matches the interpreter", proc)
            [path] = glob.glob(os.path.join(cache, "run", "*", "transformer.actual"))
            actual[len(options)] = open(path, "rb").read()
            code[len(options)] = "".join(
                open(source).read() for source in
                glob.glob(os.path.join(cache, "run", "*", "transformer*.cpp")))
    expect("uint8_t(m" in code[0] and "uint8_t(m" not in code[2],
           "the forward stores keep bits only with keep-dropout-masks")
    expect(actual[0] == actual[2], "lm_train keeping the dropout masks computes what it does "
           "drawing them again, bit for bit")


def run_causal_blocks_backward():
    """causal-attention-blocks in lm_train's backward (seq = mem = 64, two blocks of 32): d_v
    over the softmax's zeros (checked per row), d_q and d_k over the scores' gradient (known
    zeros) run in blocks, and two training steps end with the interpreter's params and AdamW
    moments (the attention weights' first moments are their gradients' running means)."""
    with tempfile.TemporaryDirectory() as cache:
        proc = run_command(TRANSFORMER, "--function", "lm_train", "--mesh", "data=2,model=2",
                           "--dim", "seq=64", "--dim", "mem=64", "--steps", "2", "--check",
                           "--no-plan", cache=cache)
        expect(proc.returncode == 0, "lm_train with causal blocks in backward matches the "
               "interpreter over 2 steps", proc)
        for weight in ("w_q", "w_k", "w_v"):
            expect(re.search(rf"ok   lm_train\.param\.\S*attention/{weight}@m ", proc.stdout),
                   f"the {weight} moment is compared", proc)
        code = "".join(open(source).read() for source in
                       glob.glob(os.path.join(cache, "run", "*", "transformer*.cpp")))
        blocks = re.findall(r"Blocks::(\w+), (-?\d), support::CausalEinsum::Check::(\w+)", code)
        for kind in [("Keys", "1", "Tails"), ("Queries", "0", "None"), ("Keys", "0", "None")]:
            expect(kind in blocks, f"a causal GEMM {kind} in the generated code: {blocks}")


def run_split_build():
    """--emit=cpp --source-parts N writes the source as N files and the header they share (the
    parts its size does not pay for hold a comment only; a small program stays one file, as
    without the option); `meshc run -j 2` builds such parts in parallel, and its binary computes
    what the one-file build's (-j 1) computes, bit for bit, and what the interpreter does."""
    with tempfile.TemporaryDirectory() as out:
        os.makedirs(os.path.join(out, "split"))
        os.makedirs(os.path.join(out, "one"))
        proc = meshc(TRANSFORMER, "--emit=cpp", "--source-parts", "3", "-o",
                     os.path.join(out, "split", "transformer"))
        expect(proc.returncode == 0, "meshc --emit=cpp --source-parts 3", proc)
        files = sorted(os.listdir(os.path.join(out, "split")))
        expect(files == ["transformer.cpp", "transformer.h", "transformer.part2.cpp",
                         "transformer.part3.cpp", "transformer.parts.h"],
               f"<o>.cpp, <o>.part2.cpp, <o>.part3.cpp, <o>.parts.h beside <o>.h: {files}")
        read = lambda *path: open(os.path.join(out, *path)).read()
        parts = [read("split", name) for name in
                 ("transformer.cpp", "transformer.part2.cpp", "transformer.part3.cpp")]
        expect(all('#include "transformer.parts.h"' in part for part in parts[:2]),
               "the parts with code include the header they share")
        expect("#include" not in parts[2] and "too small" in parts[2],
               "transformer's code pays for two parts: the third is a comment")
        expect("namespace transformer_parts" in read("split", "transformer.parts.h"),
               "the shared constants and loop nests are in a namespace of the model's own")
        proc = meshc(TRANSFORMER, "--emit=cpp", "-o", os.path.join(out, "one", "transformer"))
        expect(proc.returncode == 0 and read("one", "transformer.h") ==
               read("split", "transformer.h"), "the split keeps the header as it is", proc)
        for options in (["--source-parts", "2"], []):
            os.makedirs(os.path.join(out, f"mlp{len(options)}"))
            proc = meshc(MLP, "--emit=cpp", *options, "-o",
                         os.path.join(out, f"mlp{len(options)}", "mlp"))
            expect(proc.returncode == 0, f"meshc --emit=cpp {options} on mlp", proc)
        expect(read("mlp2", "mlp.cpp") == read("mlp0", "mlp.cpp") and
               "#include" not in read("mlp2", "mlp.part2.cpp"),
               "mlp is too small to split: <o>.cpp as without --source-parts, part 2 a comment")
        proc = meshc(TRANSFORMER, "--emit=cuda", "--source-parts", "2", "-o",
                     os.path.join(out, "cuda"))
        expect(proc.returncode == 1 and "--source-parts" in proc.stderr,
               "the CUDA source stays one file", proc)
    with tempfile.TemporaryDirectory() as cache:
        actual = {}
        for jobs in ("2", "1"):
            proc = run_command(TRANSFORMER, "--mesh", "data=2,model=2", "--check", "--no-plan",
                               "-j", jobs, cache=os.path.join(cache, jobs))
            expect(proc.returncode == 0, f"meshc run -j {jobs} --check matches the interpreter",
                   proc)
            expect(("3 files in 2 jobs" in proc.stderr) == (jobs == "2"),
                   "-j 2 builds the two parts and the runner in two jobs; -j 1 one file", proc)
            [path] = glob.glob(os.path.join(cache, jobs, "run", "*", "transformer.actual"))
            actual[jobs] = open(path, "rb").read()
        expect(actual["1"] == actual["2"], "the split build's outputs are the one-file build's, "
               "bit for bit")


def run_errors():
    with tempfile.TemporaryDirectory() as cache:
        missing = run_command("/nonexistent/x.mesh", cache=cache)
        expect(missing.returncode == 1 and "cannot open" in missing.stderr, "a missing input",
               missing)
        bad = run_command(BAD, cache=cache)
        expect(bad.returncode == 1 and "unknown name" in bad.stderr and "meshc run:" not in
               bad.stdout, "an input error exits 1 with the diagnostic", bad)
        option = run_command(MLP, "--mesh", "data=two", cache=cache)
        expect(option.returncode == 1 and "--mesh" in option.stderr, "a bad --mesh", option)
        # A misspelt --function (or a def's name) selected nothing and succeeded, having run
        # and checked nothing.
        typo = run_command(MLP, "--function", "mlp_trian", "--check", cache=cache)
        expect(typo.returncode == 1 and "--function names 'mlp_trian', which is not a program or "
               "train block (the file has mlp, mlp_train)" in typo.stderr and
               "running" not in typo.stderr, "an unknown --function exits 1 naming the choices",
               typo)
        nocxx = run_command(MLP, "--function", "mlp", "--no-plan", "--cxx",
                            "/nonexistent/c++", cache=cache)
        expect(nocxx.returncode == 2 and "/nonexistent/c++" in nocxx.stderr,
               "a missing C++ compiler exits 2 and names it", nocxx)
        failing = run_command(MLP, "--function", "mlp", "--no-plan", "--cxx", "false",
                              cache=cache)
        expect(failing.returncode == 2 and "the C++ compiler failed" in failing.stderr and
               "command:" in failing.stderr, "a failing C++ build exits 2 with its command",
               failing)
        unknown = run_command(MLP, "--backend", "gpu", cache=cache)
        expect(unknown.returncode != 0 and "gpu" in unknown.stderr, "an unknown backend", unknown)
        mpi = run_command(MLP, "--function", "mlp", "--no-plan", "--backend", "mpi", "--check",
                          cache=cache)
        # The runner launches through meshrt::launch: 4 MPI processes, checked like threads.
        expect(mpi.returncode == 0 and "ok   mlp.y" in mpi.stdout and "mpi backend" in mpi.stdout,
               "--backend mpi runs the ranks as MPI processes under mpirun", mpi)


def run_nccl():
    """--backend nccl: the program compiled to CUDA (--emit=cuda) and built with nvcc against
    meshrt_cuda and meshrt_nccl. Without a GPU the run must stop with the nccl backend's clear
    error (exit 2, no hang); with enough GPUs it must match the interpreter."""
    with tempfile.TemporaryDirectory() as cache:
        proc = run_command(MLP, "--function", "mlp", "--no-plan", "--backend", "nccl", "--check",
                           cache=cache)
        expect("compiler failed" not in proc.stderr, "the generated CUDA builds with nvcc", proc)
        if "no CUDA device is visible" in proc.stderr:
            expect(proc.returncode == 2 and "the generated program failed" in proc.stderr,
                   "without a GPU the run exits 2 naming the missing devices", proc)
        else:
            expect(proc.returncode == 0 and "ok   mlp.y" in proc.stdout and
                   "nccl backend" in proc.stdout, "on GPUs the run matches the interpreter", proc)
        # --processes: the same binary, one process per GPU under mpirun (NCCL over MPI).
        procs = run_command(MLP, "--function", "mlp", "--no-plan", "--backend", "nccl",
                            "--mesh", "data=2", "--layout", "auto", "--processes", "--check",
                            cache=cache)
        expect("one process per GPU (mpirun)" in procs.stderr,
               "--processes runs the CUDA runner under mpirun", procs)
        if re.search(r"no CUDA device (on this host|is visible)", procs.stderr):
            expect(procs.returncode == 2 and
                   re.search(r"error: nccl backend, process [01] of 2 \(mpirun\): "
                             r".*no CUDA device on this host", procs.stderr),
                   "without a GPU each MPI process stops naming itself and the missing device",
                   procs)
        else:
            expect(procs.returncode == 0 and "ok   mlp.y" in procs.stdout,
                   "on GPUs the per-process run matches the interpreter", procs)
        wrong = run_command(MLP, "--function", "mlp", "--no-plan", "--processes", cache=cache)
        expect(wrong.returncode == 1 and "--processes is an option of --backend nccl" in
               wrong.stderr, "--processes needs --backend nccl", wrong)
        math = run_command(MLP, "--function", "mlp", "--no-plan", "--backend", "nccl",
                           "--cuda-math", "fp8", cache=cache)
        expect(math.returncode == 1 and "--cuda-math" in math.stderr and "fp8" in math.stderr,
               "an unknown --cuda-math is an input error", math)


def run_help():
    top = meshc("--help")
    expect("run" in top.stdout and "SUBCOMMANDS" in top.stdout, "--help lists `run`", top)
    proc = meshc("run", "--help")
    expect(proc.returncode == 0, "meshc run --help", proc)
    for option in ["--mesh", "--layout", "--machine", "--backend", "--check", "--function",
                   "--seed", "--cxx", "--opt", "--cache-dir", "--tol", "--dim", "--no-plan",
                   "--data", "--steps", "--cuda-math", "--processes", "--disable-kernel-pass",
                   "--recompute", "--pipeline-schedule"]:
        expect(option in proc.stdout, f"meshc run --help lists {option}", proc)
    expect("--emit" not in proc.stdout and "--print-after-all" not in proc.stdout,
           "meshc run --help shows only its own options", proc)


def calibrate():
    """`meshc calibrate` measures this machine and writes a description `--machine` takes."""
    with tempfile.TemporaryDirectory() as work:
        env = dict(os.environ, MESHC_CACHE_DIR=os.path.join(work, "cache"))
        out = os.path.join(work, "mine.json")
        proc = subprocess.run([MESHC, "calibrate", "--quick", "--name", "mine", "-o", out],
                              capture_output=True, text=True, timeout=600, env=env)
        expect(proc.returncode == 0, "meshc calibrate --quick succeeds", proc)
        for stage in ["building the probe", "measuring", "peak"]:
            expect(f"meshc calibrate: {stage}" in proc.stderr, f"calibrate announces '{stage}'",
                   proc)
        with open(out) as f:
            machine = json.load(f)
        expect(machine["name"] == "mine", "the description carries --name")
        expect(machine["peak_flops"] > 1e9 and machine["memory_bandwidth"] > 1e8,
               f"GEMM and bandwidth measured: {machine}")
        expect(machine["intra"]["alpha_seconds"] > 0 and machine["intra"]["bandwidth"] > 0,
               f"the link fitted: {machine['intra']}")
        expect(machine["devices"] >= 1 and "meshc calibrate --name mine" in machine["notes"],
               "the notes state the command")
        # The cores the ranks share (the cost model's oversubscription): those this process may
        # run on (its affinity mask, as the threads backend pins ranks), as many as the devices
        # of a CPU description.
        usable = len(os.sched_getaffinity(0))
        expect(machine.get("cores") == usable == machine["devices"],
               f"the cores are recorded: {machine.get('cores')} (affinity mask {usable})")
        # The refinements (docs/planner.md): a cache level faster than memory or none, a GEMM's
        # fixed cost and the oversubscribed syncs (groups spanning cores, groups on one), all
        # measured (>= 0) and announced.
        expect(all(machine[key] >= 0 for key in ["cache_bytes", "cache_bandwidth",
                                                  "gemm_latency_seconds",
                                                  "gemm_batch_seconds",
                                                  "oversubscribed_sync_seconds",
                                                  "shared_core_sync_seconds",
                                                  "oversubscribed_sync_rank_seconds"]),
               f"the refinements are written: {machine}")
        expect(machine["cache_bandwidth"] == 0 or
               (machine["cache_bandwidth"] > machine["memory_bandwidth"] and
                machine["cache_bytes"] > 0), f"a cache level is faster than memory: {machine}")
        expect("meshc calibrate: cache" in proc.stderr, "calibrate announces the refinements",
               proc)
        # The sync's growth per rank a core holds: the probe ran at 4 ranks per core as well.
        expect("more per rank a core holds" in proc.stderr and
               f"with {4 * usable} thread ranks (four per core)" in machine["notes"],
               "calibrate measures the sync at 4 ranks per core", proc)
        # Loops and kernels (docs/planner.md, "Loops and kernels"): measured rates, all > 0.
        expect(all(machine[key] > 0 for key in ["vector_flops", "transcendental_flops",
                                                 "loop_latency_seconds",
                                                 "softmax_element_seconds",
                                                 "layer_norm_element_seconds",
                                                 "reduce_element_seconds"])
               and machine["gemm_shape_dim"] >= 0, f"the loop and kernel rates: {machine}")
        expect("meshc calibrate: loops" in proc.stderr, "calibrate announces the loop rates",
               proc)
        plan = meshc(MLP, "--machine", out, "--emit=plan", "--function", "mlp")
        expect(plan.returncode == 0 and "machine  mine" in plan.stdout,
               "--machine takes the calibrated description", plan)
        # Under `taskset -c 0` one core, though the host has more.
        pinned = subprocess.run(["taskset", "-c", "0", MESHC, "calibrate", "--quick", "--name",
                                 "one", "-o", out + ".one"], capture_output=True, text=True,
                                timeout=600, env=env)
        expect(pinned.returncode == 0, "meshc calibrate --quick under taskset -c 0", pinned)
        with open(out + ".one") as f:
            one = json.load(f)
        expect(one["cores"] == 1 and one["devices"] == 1 and "1 cores" in one["description"],
               f"under taskset -c 0 the description has one core: {one}")
        for bad, text in [(["--backend", "tpu"], "--backend"), (["--ranks", "1"], "--ranks")]:
            wrong = subprocess.run([MESHC, "calibrate", *bad, "-o", out + ".bad"],
                                   capture_output=True, text=True, timeout=60, env=env)
            expect(wrong.returncode == 1 and text in wrong.stderr and
                   not os.path.exists(out + ".bad"), f"calibrate {bad} is an input error", wrong)


def calibrate_nccl():
    """`meshc calibrate --backend nccl`: the GPU probe (meshrt/cuda/Calibrate.h) builds with nvcc
    as generated CUDA does. With fewer GPUs than ranks it stops with a clear error and writes no
    description; with enough it writes one whose figures are all measured."""
    with tempfile.TemporaryDirectory() as work:
        env = dict(os.environ, MESHC_CACHE_DIR=os.path.join(work, "cache"))
        out = os.path.join(work, "gpus.json")
        proc = subprocess.run([MESHC, "calibrate", "--backend", "nccl", "--quick", "--name", "gpus",
                               "-o", out], capture_output=True, text=True, timeout=900, env=env)
        expect("meshc calibrate: building the probe" in proc.stderr and
               "building the probe failed" not in proc.stderr, "the GPU probe builds with nvcc",
               proc)
        missing = re.search(r"probe: 2 ranks need 2 CUDA devices; [01] visible", proc.stderr)
        if missing:
            expect(proc.returncode == 2 and "the probe failed" in proc.stderr and
                   not os.path.exists(out), "too few GPUs: a clear error and no description",
                   proc)
            return
        expect(proc.returncode == 0, "meshc calibrate --backend nccl succeeds on GPUs", proc)
        with open(out) as f:
            machine = json.load(f)
        expect(machine["peak_flops"] > 1e9 and machine["peak_flops_bf16"] > 1e9 and
               machine["memory_bandwidth"] > 1e9 and machine["devices"] == 2 and
               machine["intra"]["name"] == "nccl" and machine["intra"]["bandwidth"] > 0,
               f"GEMMs, bandwidth and NCCL link measured: {machine}")
        expect("cores" not in machine, "GPU descriptions record no cores (one rank per device)")


CASES = {f.__name__: f for f in [run_precompiled_prelude, calibrate, calibrate_nccl, version, help_only_meshc_options, exit_codes,
                                 output_file_and_no_partial_output, depfile,
                                 ir_input_and_stages, every_option, emit_cpp_unwritable,
                                 depfile_user_headers, run_check, run_installed, run_omp_wait_policy, run_check_path_dtypes,
                                 run_user_kernels, run_data,
                                 run_train_data, run_fixed_batch, run_check_noise, run_runner_checkpoint, run_errors, run_codegen_options, run_causal_blocks_backward, run_split_build, run_nccl, run_help, verify_each, recompute]}

if __name__ == "__main__":
    MESHC = sys.argv[1]
    CASES[sys.argv[2]]()
    print("ok")
