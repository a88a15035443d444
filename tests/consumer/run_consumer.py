#!/usr/bin/env python3
"""The installed package as users meet it (ctest runs each step as a test; `install` is the
fixture the others need).

  run_consumer.py install BUILD_DIR PREFIX
      cmake --install BUILD_DIR --prefix PREFIX
  run_consumer.py run PREFIX WORK_DIR GENERATOR
      configures tests/consumer (copied to WORK_DIR) against PREFIX with find_package(meshc
      CONFIG), builds it, runs it, and compares its output with the installed meshc's reference
      interpreter (compare_outputs.py)
  run_consumer.py incremental PREFIX WORK_DIR GENERATOR
      after a build: no change rebuilds nothing; touching the imported .mesh file or the user
      header regenerates the code (meshc runs again) and rebuilds; touching main.cpp does not
      run meshc
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


def configure(prefix, work, generator):
    """A fresh copy of the consumer project (so touching its files leaves the repo alone), then
    configure and build it."""
    if os.path.exists(work):
        shutil.rmtree(work)
    source = os.path.join(work, "src")
    build = os.path.join(work, "build")
    shutil.copytree(HERE, source, ignore=shutil.ignore_patterns("*.py"))
    run(["cmake", "-G", generator, "-S", source, "-B", build, f"-DCMAKE_PREFIX_PATH={prefix}",
         "-DCMAKE_BUILD_TYPE=Release"])
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


def run_consumer(prefix, work, generator):
    source, build = configure(prefix, work, generator)
    actual = os.path.join(work, "actual")
    expected = os.path.join(work, "expected")
    print(run([os.path.join(build, "consumer"), actual]).stdout, end="")
    meshc = os.path.join(prefix, "bin", "meshc")
    run([meshc, os.path.join(source, "model.mesh"), "--emit=run", "--seed", "7", "--mesh",
         "data=2,model=2", "--layout", "batch:data,d_ff:model", "--dump-outputs", expected])
    result = run([sys.executable, os.path.join(ROOT, "tests", "e2e", "compare_outputs.py"),
                  actual, expected], check=False)
    print(result.stdout, end="")
    if result.returncode != 0:
        sys.exit("FAIL: the consumer's output differs from the interpreter's")


def build_log(build, generator):
    """What a build would do now (dry run), as text."""
    if generator == "Ninja":
        proc = run(["ninja", "-C", build, "-n", "-d", "explain"])
        return proc.stdout + proc.stderr
    return run(["make", "-C", build, "-n"]).stdout


def incremental(prefix, work, generator):
    source, build = configure(prefix, work, generator)
    generated = os.path.join(build, "consumer_model.meshc", "model.cpp")

    def rebuild_after(what, touched, expect_meshc):
        if touched:
            time.sleep(1.1)  # a newer mtime than the outputs, on filesystems with 1 s resolution
            os.utime(os.path.join(source, touched))
        before = os.path.getmtime(generated)
        plan = build_log(build, generator)
        # Ninja prints the custom command's COMMENT, make -n its command line.
        runs_meshc = "meshc: compiling" in plan or "--emit=cpp" in plan
        if generator == "Ninja" and not touched and "no work to do" not in plan:
            sys.exit(f"FAIL: {what}: ninja has work to do after a build:\n{plan}")
        if expect_meshc != runs_meshc:
            sys.exit(f"FAIL: {what}: meshc {'does not run' if expect_meshc else 'runs'}:\n{plan}")
        run(["cmake", "--build", build])
        regenerated = os.path.getmtime(generated) != before
        if regenerated != expect_meshc:
            sys.exit(f"FAIL: {what}: model.cpp {'not ' if expect_meshc else ''}regenerated")
        print(f"ok: {what}")

    rebuild_after("no change rebuilds nothing", None, False)
    rebuild_after("touching the imported lib/layers.mesh regenerates", "lib/layers.mesh", True)
    rebuild_after("then nothing", None, False)
    rebuild_after("touching the user header kernels/act.h regenerates", "kernels/act.h", True)
    rebuild_after("touching model.mesh regenerates", "model.mesh", True)
    rebuild_after("touching main.cpp does not run meshc", "main.cpp", False)
    rebuild_after("and finally nothing", None, False)


def main():
    mode = sys.argv[1]
    if mode == "install":
        install(sys.argv[2], sys.argv[3])
    elif mode == "run":
        run_consumer(*sys.argv[2:5])
    elif mode == "incremental":
        incremental(*sys.argv[2:5])
    else:
        sys.exit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
