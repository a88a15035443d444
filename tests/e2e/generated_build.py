"""Builds a generated program's translation unit once per content: the e2e scripts' one way to
compile and link generated code (run_case.py, run_train_case.py, checkpoint_case.py), with the
options they share (add_build_options).

Many cases generate the same code: the MPI and traced runs of a threads case, an example whose
own layout is the one `layout auto` chooses. Compiling it is most of a case's time, so a binary
goes into a cache shared by the cases (`<workdir>/../bincache`), keyed by the sha256 of the
generated sources, the build command with the case's own directory written as `<workdir>`, and
the project's runtime headers, libraries and precompiled prelude by modification time; a case
with the same key links the cached binary instead of building it again."""
import hashlib
import os
import shutil
import tempfile

from checked_run import run

# What `meshc --emit=cpp --cpp-runner -o BASE` writes, after BASE.
GENERATED = (".h", ".cpp", ".main.cpp")


def _runtime_files(includes, inputs):
    """What a binary is built from besides its sources: the project's headers and `inputs` (the
    libraries, the precompiled prelude); system headers do not change between cases."""
    files = [path for path in inputs if os.path.exists(path)]
    for inc in includes:
        if not inc.startswith("/usr"):
            for root, _, names in sorted(os.walk(inc)):
                files += [os.path.join(root, name) for name in sorted(names)]
    return files


def _key(command, workdir, sources, runtime):
    key = hashlib.sha256()
    for path in sources:
        with open(path, "rb") as f:
            key.update(f.read())
    key.update(" ".join(command).replace(workdir, "<workdir>").encode())
    for path in runtime:
        key.update(f"{path}:{os.path.getmtime(path)}".encode())
    return key.hexdigest()


def add_build_options(parser):
    """The options every e2e script builds generated code with."""
    parser.add_argument("--cxx", default="c++")
    parser.add_argument("--include", action="append", default=[])
    parser.add_argument("--lib", action="append", default=[],
                        help="the libraries in link order: meshrt_launch's (and meshrt_mpi's and "
                             "MPI's), then meshrt_kernels, meshrt, OpenBLAS")
    parser.add_argument("--cxx-flag", action="append", default=[],
                        help="an extra flag for building the generated code, e.g. -fsanitize=thread")
    parser.add_argument("--prelude",
                        help="a header included first, precompiled for these flags "
                             "(tests/e2e/generated_prelude.h)")


def build_generated(args, unity, binary, workdir, sources, opt="-O1", extra=(),
                    extra_includes=()):
    """Compiles and links `unity` (which includes `sources`) into `binary` with the options of
    add_build_options, once per content (build_once). Returns True when it was reused."""
    includes = list(args.include) + list(extra_includes)
    prelude = ["-include", args.prelude] if args.prelude and not args.cxx_flag else []
    command = ([args.cxx, opt, *args.cxx_flag, "-std=c++20", "-w", "-I", workdir, *extra]
               + [flag for inc in includes for flag in ("-I", inc)] + prelude
               + [unity, "-o", binary] + args.lib + ["-lpthread"])
    # A prelude precompiled before a runtime header changed is stale until its target rebuilds
    # it: its .gch belongs in the key, or a binary built against it would outlive the rebuild.
    precompiled = [args.prelude, args.prelude + ".gch"] if prelude else []
    return build_once(command, binary, workdir, [unity] + list(sources), includes,
                      list(args.lib) + precompiled)


def build_once(command, binary, workdir, sources, includes, inputs):
    """Runs `command`, the compile and link of `sources` (every file the translation unit reads
    besides the runtime) into `binary`, unless the cache holds a binary of the same key: then
    `binary` is that one. `inputs` are the other files it reads that the key covers by
    modification time (libraries, a precompiled prelude). Returns True when it was reused."""
    cache = os.path.join(os.path.dirname(os.path.abspath(workdir)), "bincache")
    os.makedirs(cache, exist_ok=True)
    runtime = _runtime_files(includes, inputs)
    _forget_stale(cache, runtime)
    cached = os.path.join(cache, _key(command, os.path.abspath(workdir), sources, runtime))
    # The binary may be a link to a cached one: a new build must not write through it.
    if os.path.exists(binary):
        os.remove(binary)
    if os.path.exists(cached):
        os.link(cached, binary)
        return True
    run(command)
    # Another case may finish the same build at the same time: publish by an atomic rename.
    fd, staged = tempfile.mkstemp(dir=cache)
    os.close(fd)
    shutil.copyfile(binary, staged)
    os.chmod(staged, 0o755)
    os.replace(staged, cached)
    return False


def _forget_stale(cache, runtime):
    """Removes the binaries built before the runtime last changed: their keys cannot come again,
    and a developer's tree would otherwise keep every build it ever made."""
    newest = max((os.path.getmtime(path) for path in runtime), default=0)
    for entry in os.scandir(cache):
        try:
            if entry.stat().st_mtime < newest:
                os.remove(entry.path)
        except FileNotFoundError:  # another case removed or published it meanwhile
            pass
