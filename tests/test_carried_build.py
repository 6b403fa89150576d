"""scripts/carried_build.sh, which carries a GPU machine's build of _C to a later device call: a
build saved from one tree loads into a tree with the same key, byte for byte, and is refused
(nothing written) once a source changed. Runs on a scratch tree with a stand-in ELF file for _C
(the script strips it), never on this checkout's build."""
from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys
import sysconfig

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
ELF = pathlib.Path("/bin/true")

pytestmark = pytest.mark.skipif(
    not ELF.exists() or shutil.which("strip") is None or shutil.which("split") is None,
    reason="needs strip, split and an ELF file",
)


def scratch_tree(path: pathlib.Path) -> pathlib.Path:
    (path / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "carried_build.sh", path / "scripts")
    (path / "csrc").mkdir()
    (path / "csrc" / "op.cpp").write_text("int op() { return 1; }\n")
    (path / "setup.py").write_text("# stand-in\n")
    (path / "seqkernels").mkdir()
    (path / "seqkernels" / "_build_config.py").write_text("CUDA = True\n")
    return path


def run(tree: pathlib.Path, *args: str) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "PYTHON": sys.executable}
    return subprocess.run(["bash", str(tree / "scripts" / "carried_build.sh"), *args], env=env,
                          capture_output=True, text=True, timeout=120)


def test_a_saved_build_loads_where_the_key_matches_and_nowhere_else(tmp_path):
    extension = "seqkernels/_C" + sysconfig.get_config_var("EXT_SUFFIX")
    built = scratch_tree(tmp_path / "built")
    shutil.copy(ELF, built / extension)
    saved = tmp_path / "carried"
    done = run(built, "save", str(saved))
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in saved.iterdir()) == ["_C.part_aa", "_build_config.py", "key"]

    fresh = scratch_tree(tmp_path / "fresh")
    assert run(fresh, "key").stdout == run(built, "key").stdout
    done = run(fresh, "load", str(saved))
    assert done.returncode == 0, done.stderr
    stripped = subprocess.run(["strip", "-S", "-o", str(tmp_path / "expected"), str(ELF)], check=True)
    assert stripped.returncode == 0
    assert (fresh / extension).read_bytes() == (tmp_path / "expected").read_bytes()
    assert (fresh / "seqkernels" / "_build_config.py").read_text() == "CUDA = True\n"

    changed = scratch_tree(tmp_path / "changed")
    (changed / "csrc" / "op.cpp").write_text("int op() { return 2; }\n")
    done = run(changed, "load", str(saved))
    assert done.returncode == 1 and "other sources" in done.stderr
    assert not (changed / extension).exists()
    assert run(changed, "load", str(tmp_path / "nothing")).returncode == 1
