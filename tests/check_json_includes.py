#!/usr/bin/env python3
"""Every compiler file that includes llvm/Support/JSON.h is one that compiler/CMakeLists.txt
compiles as C++17 under clang < 15 (LLVM 14's JSON.h does not compile as C++20 there: the
sanitizer jobs' clang build would fail while the GCC build passes). Headers must not include it.

Usage: check_json_includes.py <source dir>"""
import pathlib
import re
import sys

root = pathlib.Path(sys.argv[1])
compiler = root / "compiler"
cmake = (compiler / "CMakeLists.txt").read_text()
# set_source_files_properties(<files...> DIRECTORY ... PROPERTIES COMPILE_OPTIONS "${MESHC_LLVM_JSON_OPTIONS}")
allowed = set()
for files in re.findall(r"set_source_files_properties\(([^)]*?)DIRECTORY[^)]*MESHC_LLVM_JSON_OPTIONS",
                        cmake):
    allowed.update(files.split())

problems = []
for path in sorted(compiler.rglob("*")):
    if path.suffix not in (".h", ".cpp") or "llvm/Support/JSON.h" not in path.read_text():
        continue
    rel = path.relative_to(compiler).as_posix()
    if path.suffix == ".h":
        problems.append(f"{rel}: a header includes llvm/Support/JSON.h; include it in the .cpp")
    elif rel not in allowed:
        problems.append(f"{rel}: includes llvm/Support/JSON.h but is not in compiler/CMakeLists.txt's "
                        "MESHC_LLVM_JSON_OPTIONS list (clang 14 cannot compile it as C++20)")
if not allowed:
    problems.append("compiler/CMakeLists.txt: no MESHC_LLVM_JSON_OPTIONS file list found")
for problem in problems:
    print(f"check_json_includes: {problem}", file=sys.stderr)
sys.exit(1 if problems else 0)
