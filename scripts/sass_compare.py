"""Compares the SASS of two CUDA object files kernel by kernel: the check behind a "SASS identical"
claim for a change that should not alter device code (a refactor, a comment, a host-side rule).

    bash scripts/cuda_compile_check.sh csrc/cuda/lstm_one_cluster.cu   # before: note the .o path
    cp /tmp/sk_cuda_obj.XXXX/lstm_one_cluster.o /tmp/before.o
    ... edit, compile again ...
    python scripts/sass_compare.py /tmp/before.o /tmp/sk_cuda_obj.YYYY/lstm_one_cluster.o

Several "after" objects pool their kernels (a source file split into several): compare one build
of the whole file with the parts' objects. `--ignore-namespace NS` (repeatable) matches names
demangled (c++filt) without `(anonymous namespace)::` and `NS::` qualifiers, for a refactor that
moved kernels or their argument types into a named namespace:

    python scripts/sass_compare.py before/lstm_persistent.o after/lstm_persistent*.o --ignore-namespace persistent

Kernels are matched by name without the anonymous namespace's per-build hash. Each kernel's SASS
is compared without instruction addresses and encodings, with branch and call targets as distances
in instructions, and with the offsets into constant bank 4
(global symbols such as printf's format strings, laid out per object) masked. Exit status: 0 when
every kernel is identical, 1 when any differs or a kernel is only in one file.

cuobjdump: $CUOBJDUMP, else on PATH or beside nvcc; it runs nvdisasm, which must be on PATH. Without
a CUDA toolkit's, `pip install --target /tmp/cuobj nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm` (one
command: a second --target install into the same folder adds nothing), then
CUOBJDUMP=/tmp/cuobj/nvidia/cu13/bin/cuobjdump and PATH=/tmp/cuobj/nvidia/cu13/bin:$PATH.
"""
from __future__ import annotations

import argparse
import difflib
import os
import re
import shutil
import subprocess
import sys

# A translation unit's anonymous namespace in a mangled name: <length>_GLOBAL__N_..., the length
# prefix (Itanium source-name) covering the whole per-build identifier.
_ANON = re.compile(r"(\d+)_GLOBAL__N_")
_ADDRESS = re.compile(r"/\*[0-9a-f]{4,}\*/")
_ENCODING = re.compile(r"/\* 0x[0-9a-f]{16} \*/")
_BANK4 = re.compile(r"c\[0x4\]\[0x[0-9a-f]+\]")
_MANGLED = re.compile(r"\b_Z\w+")
# The target operand of a branch, call or convergence-barrier set-up (SASS prints it as an address
# from the kernel's start).
_TARGET = re.compile(r"(\b(?:BRA|BRX|JMP|CALL\.REL(?:\.NOINC)?|CALL\.ABS(?:\.NOINC)?|BSSY|SSY|PBK|PCNT)\b[^;]*?)0x([0-9a-f]+)")


def find_cuobjdump() -> str:
    candidates = [os.environ.get("CUOBJDUMP"), shutil.which("cuobjdump")]
    nvcc = shutil.which(os.environ.get("NVCC", "nvcc"))
    if nvcc:
        candidates.append(os.path.join(os.path.dirname(os.path.realpath(nvcc)), "cuobjdump"))
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    sys.exit("sass_compare: no cuobjdump (set CUOBJDUMP; see the docstring for a pip package)")


def without_anon(text: str) -> str:
    """`text` with every anonymous-namespace identifier of a mangled name replaced by ANON."""
    out, pos = [], 0
    for m in _ANON.finditer(text):
        if m.start() < pos:  # inside the identifier just replaced
            continue
        length = int(m.group(1))
        out += [text[pos:m.start()], "ANON"]
        pos = m.end(1) + length  # the identifier's characters follow its length digits
    return "".join(out) + text[pos:]


def namespace_free(text: str, namespaces: list[str]) -> str:
    """`text` with its mangled names demangled (c++filt) and their anonymous-namespace and
    `namespaces` qualifiers removed."""
    names = sorted(set(_MANGLED.findall(text)))
    if not names:
        return text
    filt = shutil.which("c++filt") or sys.exit("sass_compare: --ignore-namespace needs c++filt (binutils)")
    plain = subprocess.run([filt], input="\n".join(names) + "\n", capture_output=True, text=True,
                           check=True).stdout.splitlines()
    qualifiers = re.compile(r"\(anonymous namespace\)::" + "".join(f"|\\b{re.escape(n)}::" for n in namespaces))
    table = dict(zip(names, (qualifiers.sub("", p) for p in plain)))
    return _MANGLED.sub(lambda m: table[m.group(0)], text)


def kernels(cuobjdump: str, obj: str, namespaces: list[str]) -> dict[str, list[str]]:
    out = subprocess.run([cuobjdump, "-sass", obj], capture_output=True, text=True, check=True).stdout
    out = namespace_free(out, namespaces) if namespaces else without_anon(out)
    result: dict[str, list[str]] = {}
    lines: list[str] | None = None
    for line in out.splitlines():
        m = re.match(r"\s*Function : (.+?)\s*$", line)
        if m:
            lines = result.setdefault(m.group(1), [])
            continue
        if re.match(r"\s*Fatbin \w+ code:", line):  # the end of an ELF's kernels (a PTX listing may follow)
            lines = None
            continue
        if lines is not None:
            line = _BANK4.sub("c[0x4][X]", _ENCODING.sub("", _ADDRESS.sub("", relative_targets(line))))
            if line.strip():
                lines.append(line.strip())
    return result


def relative_targets(line: str) -> str:
    """`line` with a branch's or call's target address written as the distance in instructions
    from the instruction itself (`.+N` / `.-N`): the same code gives the same text either way, but
    an instruction added or removed then changes only the branches that span it, not every branch
    to the code after it."""
    here = _ADDRESS.search(line)
    if here is None:
        return line
    addr = int(here.group(0)[2:-2], 16)

    def rel(m: re.Match) -> str:
        steps = (int(m.group(2), 16) - addr) // 16
        return f"{m.group(1)}.{steps:+d}"

    return _TARGET.sub(rel, line)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("before", help="object file (.o) of the first build")
    p.add_argument("after", nargs="+", help="object file(s) (.o) of the second build, their kernels pooled")
    p.add_argument("--ignore-namespace", action="append", default=[], metavar="NS",
                   help="match demangled names without this namespace's qualifiers (repeatable)")
    p.add_argument("--show", type=int, default=3, metavar="N", help="print a diff of the first N kernels that differ")
    args = p.parse_args(argv)
    tool = find_cuobjdump()
    a = kernels(tool, args.before, args.ignore_namespace)
    b: dict[str, list[str]] = {}
    for obj in args.after:
        for name, body in kernels(tool, obj, args.ignore_namespace).items():
            if name in b:
                print(f"sass_compare: {name} in two of the after objects")
                return 1
            b[name] = body
    only = sorted(set(a) ^ set(b))
    differ = sorted(k for k in set(a) & set(b) if a[k] != b[k])
    print(f"sass_compare: {len(a)} / {len(b)} kernels; {len(differ)} differ; {len(only)} in one file only")
    for k in only:
        print(f"  only in {'before' if k in a else 'after'}: {k}")
    for k in differ[:args.show]:
        print(f"  differs: {k}")
        diff = difflib.unified_diff(a[k], b[k], "before", "after", lineterm="", n=1)
        for line in list(diff)[:40]:
            print("    " + line)
    return 1 if differ or only else 0


if __name__ == "__main__":
    sys.exit(main())
