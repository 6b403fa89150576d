"""scripts/sass_compare.py, the check behind "SASS identical" claims: kernels matched across two
builds without the anonymous namespace's hash, addresses, encodings and constant-bank-4 offsets,
but any instruction that differs is reported. A stand-in cuobjdump prints canned listings."""
from __future__ import annotations

import os
import pathlib
import shutil
import stat
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "sass_compare.py"


# Per-build identifiers of a translation unit's anonymous namespace as nvcc mangles them (the length
# prefix covers the whole identifier; the digits of the next name's length follow it directly).
ANON = {"persistent": "_GLOBAL__N__{h}_18_lstm_persistent_cu_{h}_19729",
        "one_cluster": "_GLOBAL__N__{h}_19_lstm_one_cluster_cu_{h}"}


def listing(anon: str, kernels: dict[str, list[str]], bank4: str, style: str = "persistent",
            namespace: str = "") -> str:
    ident = ANON[style].format(h=anon)
    named = f"{len(namespace)}{namespace}" if namespace else ""
    out = ["", "Fatbin elf code:", "================", "arch = sm_90", ""]
    for name, body in kernels.items():
        out.append(f"        Function : _ZN10seqkernels4cuda{named}{len(ident)}{ident}{len(name.split('I')[0])}{name}")
        for i, ins in enumerate(body):
            ins = ins.replace("BANK4", bank4)
            out.append(f"        /*{i * 16:04x}*/                   {ins} ;   /* 0x{i:016x} */")
    out += ["", "Fatbin ptx code:", "================", ".visible .entry something()"]
    return "\n".join(out) + "\n"


def run(tmp_path: pathlib.Path, before: str, *after: str, options: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    (tmp_path / "a.o").write_text(before)
    objects = []
    for i, text in enumerate(after):
        objects.append(tmp_path / f"b{i}.o")
        objects[-1].write_text(text)
    fake = tmp_path / "cuobjdump"
    fake.write_text(f"#!{sys.executable}\nimport sys\nprint(open(sys.argv[-1]).read(), end='')\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    env = dict(os.environ, CUOBJDUMP=str(fake))
    return subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "a.o"), *map(str, objects), *options],
                          env=env, capture_output=True, text=True, timeout=60)


KERNELS = {"lstm_persistent_forward_kernelIfEEvv": ["S2R R0, SR_TID.X", "LDC.64 R10, BANK4", "EXIT"],
           "lstm_persistent_backward_kernelIfEEvv": ["LDG.E R2, desc[UR4][R4.64]", "EXIT"]}


@pytest.mark.parametrize("style", sorted(ANON))
def test_identical_code_in_another_build_passes(tmp_path, style):
    done = run(tmp_path, listing("229db69b", KERNELS, "c[0x4][0x118]", style),
               listing("17eeff62", KERNELS, "c[0x4][0xe8]", style))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 / 2 kernels; 0 differ; 0 in one file only" in done.stdout


def test_a_changed_instruction_fails(tmp_path):
    changed = dict(KERNELS, lstm_persistent_backward_kernelIfEEvv=["LD.E R2, desc[UR4][R4.64]", "EXIT"])
    done = run(tmp_path, listing("229db69b", KERNELS, "c[0x4][0x118]"), listing("17eeff62", changed, "c[0x4][0x118]"))
    assert done.returncode == 1
    assert "1 differ" in done.stdout and "-LDG.E R2" in done.stdout and "+LD.E R2" in done.stdout


def test_a_kernel_in_one_build_only_fails(tmp_path):
    fewer = {k: v for k, v in KERNELS.items() if "forward" in k}
    done = run(tmp_path, listing("229db69b", KERNELS, "c[0x4][0x118]"), listing("229db69b", fewer, "c[0x4][0x118]"))
    assert done.returncode == 1
    assert "only in before" in done.stdout and "backward_kernel" in done.stdout


@pytest.mark.skipif(shutil.which("c++filt") is None, reason="needs c++filt (binutils)")
def test_a_file_split_in_two_with_a_named_namespace_passes(tmp_path):
    forward = {k: v for k, v in KERNELS.items() if "forward" in k}
    backward = {k: v for k, v in KERNELS.items() if "backward" in k}
    before = listing("229db69b", KERNELS, "c[0x4][0x118]")
    parts = (listing("17eeff62", forward, "c[0x4][0xe8]", namespace="persistent"),
             listing("5c0ffee5", backward, "c[0x4][0x10]", namespace="persistent"))
    done = run(tmp_path, before, *parts, options=("--ignore-namespace", "persistent"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 / 2 kernels; 0 differ; 0 in one file only" in done.stdout
    # Without the option the namespace tells them apart; a kernel in two parts is an error.
    assert run(tmp_path, before, *parts).returncode == 1
    twice = run(tmp_path, before, parts[0], parts[0], parts[1], options=("--ignore-namespace", "persistent"))
    assert twice.returncode == 1 and "in two of the after objects" in twice.stdout


def test_an_added_instruction_leaves_branches_that_do_not_span_it(tmp_path):
    # The branch at index 2 (3 after the insertion) jumps two instructions ahead in both builds:
    # written as an address from the kernel's start its target moved (0x40 -> 0x50), as a distance not.
    before = {"lstm_persistent_forward_kernelIfEEvv": ["MOV R1, RZ", "EXIT", "@P0 BRA 0x40", "NOP", "EXIT"]}
    after = {"lstm_persistent_forward_kernelIfEEvv": ["MOV R1, RZ", "IADD3 R2, R1, 0x1, RZ", "EXIT",
                                                      "@P0 BRA 0x50", "NOP", "EXIT"]}
    done = run(tmp_path, listing("229db69b", before, "c[0x4][0x0]"), listing("17eeff62", after, "c[0x4][0x0]"))
    assert done.returncode == 1
    assert "+IADD3 R2, R1, 0x1, RZ" in done.stdout
    assert "BRA" not in done.stdout, done.stdout
