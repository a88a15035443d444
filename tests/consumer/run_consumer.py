#!/usr/bin/env python3
"""The installed package as users meet it (ctest runs each step as a test; `install` is the
fixture the others need).

  run_consumer.py install BUILD_DIR PREFIX
      cmake --install BUILD_DIR --prefix PREFIX
  run_consumer.py run PREFIX WORK_DIR GENERATOR [--incremental]
      configures tests/consumer (copied to WORK_DIR) against PREFIX with find_package(meshc
      CONFIG), builds it, runs it, and compares its output with the installed meshc's reference
      interpreter (compare_outputs.py); with --incremental, then the incremental checks in the
      same tree (one build of the project serves both)
  run_consumer.py incremental PREFIX WORK_DIR GENERATOR
      after a build: no change rebuilds nothing; touching the imported .mesh file or the user
      header regenerates the code (meshc runs again) and rebuilds; touching main.cpp does not
      run meshc
  run_consumer.py cuda-run PREFIX WORK_DIR GENERATOR [--incremental]
      the same for tests/consumer/cuda (meshc_add_program BACKEND cuda, compiled by nvcc, run on
      the nccl backend): without a visible GPU the program must fail cleanly (status 1) naming
      the missing CUDA devices; with GPUs its output must match the interpreter's; with
      --incremental, then the incremental checks for the generated model.cu in the same tree
"""
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def run(cmd, cwd=None, check=True):
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=900)
    if check and proc.returncode != 0:
        sys.exit(f"FAIL ({proc.returncode}): {' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}")
    return proc


# The two consumer projects: the CMake project's directory under tests/consumer, the source meshc
# generates, and the --emit flag `make -n` shows when meshc would run.
CPU = {"project": ".", "generated": "model.cpp", "emit": "--emit=cpp"}
CUDA = {"project": "cuda", "generated": "model.cu", "emit": "--emit=cuda"}


def configure(prefix, work, generator, variant=CPU, options=()):
    """A fresh copy of the consumer project (so touching its files leaves the repo alone), then
    configure and build it. Returns the copy's root (model.mesh, main.cpp) and the build dir."""
    if os.path.exists(work):
        shutil.rmtree(work)
    source = os.path.join(work, "src")
    build = os.path.join(work, "build")
    shutil.copytree(HERE, source, ignore=shutil.ignore_patterns("*.py"))
    run(["cmake", "-G", generator, "-S", os.path.join(source, variant["project"]), "-B", build,
         f"-DCMAKE_PREFIX_PATH={prefix}", "-DCMAKE_BUILD_TYPE=Release", *options])
    run(["cmake", "--build", build])
    return source, build


def install(build_dir, prefix):
    if os.path.exists(prefix):
        shutil.rmtree(prefix)
    run(["cmake", "--install", build_dir, "--prefix", prefix])
    for path in ["bin/meshc", "include/meshc/GeneratedSupport.h", "include/meshrt/Comm.h",
                 "include/meshrt/kernels/Kernels.h", "lib/cmake/meshc/meshcConfig.cmake",
                 "lib/cmake/meshc/meshcConfigVersion.cmake", "lib/cmake/meshc/MeshcAddProgram.cmake"]:
        if not os.path.exists(os.path.join(prefix, path)):
            sys.exit(f"FAIL: the install has no {path}")
    print(f"ok: installed into {prefix}")


def compare_with_interpreter(prefix, work, source, mesh):
    """The consumer wrote work/actual; the installed meshc's interpreter must agree."""
    actual = os.path.join(work, "actual")
    expected = os.path.join(work, "expected")
    meshc = os.path.join(prefix, "bin", "meshc")
    run([meshc, os.path.join(source, "model.mesh"), "--emit=run", "--seed", "7", "--mesh", mesh,
         "--layout", "batch:data,d_ff:model", "--dump-outputs", expected])
    result = run([sys.executable, os.path.join(ROOT, "tests", "e2e", "compare_outputs.py"),
                  actual, expected], check=False)
    print(result.stdout, end="")
    if result.returncode != 0:
        sys.exit("FAIL: the consumer's output differs from the interpreter's")


def run_consumer(prefix, work, generator):
    source, build = configure(prefix, work, generator)
    # PRECOMPILE_PRELUDE: the library's precompiled prelude (GCC's .gch, Clang's .pch).
    pch = os.path.join(build, "CMakeFiles", "consumer_model.dir")
    if not any(name.startswith("cmake_pch.hxx.") and name.endswith("ch")
               for _, _, names in os.walk(pch) for name in names):
        sys.exit(f"FAIL: PRECOMPILE_PRELUDE left no precompiled header under {pch}")
    print("ok: the generated code's prelude is precompiled")
    # SOURCE_PARTS 2: both parts of the source and their header are generated and compiled.
    generated = os.path.join(build, "consumer_model.meshc")
    for name in ["model.cpp", "model.part2.cpp", "model.parts.h"]:
        if not os.path.exists(os.path.join(generated, name)):
            sys.exit(f"FAIL: SOURCE_PARTS 2 generated no {name} under {generated}")
    objects = [name for _, _, names in os.walk(pch) for name in names
               if name.startswith("model.") and name.endswith(".o")]
    if sorted(objects) != ["model.cpp.o", "model.part2.cpp.o"]:
        sys.exit(f"FAIL: SOURCE_PARTS 2: the library compiles model.cpp and model.part2.cpp, "
                 f"not {objects}")
    print("ok: the source's two parts are generated and compiled")
    print(run([os.path.join(build, "consumer"), os.path.join(work, "actual")]).stdout, end="")
    compare_with_interpreter(prefix, work, source, "data=2,model=2")
    return source, build


def visible_gpus():
    """The GPUs a CUDA program here would see (nvidia-smi, narrowed by CUDA_VISIBLE_DEVICES)."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return 0
    listed = subprocess.run([smi, "-L"], capture_output=True, text=True)
    count = sum(line.startswith("GPU ") for line in listed.stdout.splitlines())
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        count = min(count, len([device for device in visible.split(",") if device.strip()]))
    return count


def run_cuda_consumer(prefix, work, generator):
    for path in ["include/meshrt/Nccl.h", "include/meshrt/cuda/Cuda.h", "include/meshc/CudaSupport.h",
                 "lib/libmeshrt_cuda.a", "lib/libmeshrt_nccl.a", "lib/cmake/meshc/MeshcFindNccl.cmake"]:
        if not os.path.exists(os.path.join(prefix, path)):
            sys.exit(f"FAIL: the install has no {path}")
    gpus = visible_gpus()
    # A mesh that fits the GPUs (one per rank); without GPUs the full 2x2 mesh is compiled.
    mesh = {0: "data=2,model=2", 1: "data=1,model=1", 2: "data=2,model=1",
            3: "data=2,model=1"}.get(gpus, "data=2,model=2")
    source, build = configure(prefix, work, generator, CUDA, [f"-DCONSUMER_MESH={mesh}"])
    print(f"ok: BACKEND cuda built with nvcc (mesh {mesh}, {gpus} GPUs visible)")
    run_built_cuda_consumer(prefix, work, source, build, mesh, gpus)
    return source, build


def run_built_cuda_consumer(prefix, work, source, build, mesh, gpus):
    try:
        proc = subprocess.run([os.path.join(build, "consumer"), os.path.join(work, "actual")],
                              capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        sys.exit("FAIL: the CUDA consumer did not finish within 300 s (a hang)")
    if proc.returncode == 0:
        print(proc.stdout, end="")
        compare_with_interpreter(prefix, work, source, mesh)
        return
    message = proc.stdout + proc.stderr
    if gpus == 0 and proc.returncode == 1 and "no CUDA device is visible" in message:
        print(f"ok: without a GPU the consumer fails cleanly: {proc.stderr.strip()}")
        return
    sys.exit(f"FAIL: the CUDA consumer exited with {proc.returncode} ({gpus} GPUs visible; "
             f"expected 0, or 1 naming the missing CUDA devices without a GPU):\n{message}")


def build_log(build, generator):
    """What a build would do now (dry run), as text."""
    if generator == "Ninja":
        proc = run(["ninja", "-C", build, "-n", "-d", "explain"])
        return proc.stdout + proc.stderr
    return run(["make", "-C", build, "-n"]).stdout


def incremental(source, build, generator, variant=CPU):
    """The incremental checks in a configured and built tree. A touched input only regenerates
    the code (the generated file is built as a target of its own) until the last full build,
    which compiles it once: what is checked is whether meshc runs, and a recompile of the
    generated code after each touch would check nothing more at a minute's cost each."""
    generated = os.path.join(build, "consumer_model.meshc", variant["generated"])

    built = {"whole tree": True}  # False while only the generated file was brought up to date

    def rebuild_after(what, touched, expect_meshc, whole_tree):
        if touched:
            time.sleep(1.1)  # a newer mtime than the outputs, on filesystems with 1 s resolution
            os.utime(os.path.join(source, touched))
        before = os.path.getmtime(generated)
        plan = build_log(build, generator)
        # Ninja prints the custom command's COMMENT, make -n its command line.
        runs_meshc = "meshc: compiling" in plan or variant["emit"] in plan
        if generator == "Ninja" and not touched and built["whole tree"] and "no work to do" not in plan:
            sys.exit(f"FAIL: {what}: ninja has work to do after a build:\n{plan}")
        if expect_meshc != runs_meshc:
            sys.exit(f"FAIL: {what}: meshc {'does not run' if expect_meshc else 'runs'}:\n{plan}")
        built["whole tree"] = whole_tree
        if whole_tree:
            run(["cmake", "--build", build])
        elif generator == "Ninja":
            run(["ninja", "-C", build, os.path.relpath(generated, build)])
        else:  # the rule of the generated file in the library's own makefile, as CMake runs it
            run(["make", "-C", build, "-f", "CMakeFiles/consumer_model.dir/build.make",
                 os.path.relpath(generated, build)])
        regenerated = os.path.getmtime(generated) != before
        if regenerated != expect_meshc:
            sys.exit(f"FAIL: {what}: {variant['generated']} "
                     f"{'not ' if expect_meshc else ''}regenerated")
        print(f"ok: {what}")

    rebuild_after("no change rebuilds nothing", None, False, True)
    rebuild_after("touching the imported lib/layers.mesh regenerates", "lib/layers.mesh", True, False)
    rebuild_after("then meshc does not run again", None, False, False)
    rebuild_after("touching the user header kernels/act.h regenerates", "kernels/act.h", True, False)
    rebuild_after("touching model.mesh regenerates", "model.mesh", True, False)
    rebuild_after("touching main.cpp does not run meshc (the whole tree builds)", "main.cpp", False,
                  True)
    rebuild_after("and finally nothing", None, False, True)


def main():
    mode = sys.argv[1]
    if mode == "install":
        install(sys.argv[2], sys.argv[3])
    elif mode == "run":
        source, build = run_consumer(*sys.argv[2:5])
        if "--incremental" in sys.argv[5:]:
            incremental(source, build, sys.argv[4])
    elif mode == "incremental":
        generator = sys.argv[4]
        incremental(*configure(sys.argv[2], sys.argv[3], generator), generator)
    elif mode == "cuda-run":
        source, build = run_cuda_consumer(*sys.argv[2:5])
        if "--incremental" in sys.argv[5:]:
            incremental(source, build, sys.argv[4], CUDA)
    else:
        sys.exit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
