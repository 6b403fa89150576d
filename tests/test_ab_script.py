"""scripts/ab_time_lstm.py, the timing half of an A/B of builds: it times the build it is told
to (--expect) and refuses any other, since timing one build against itself voided a session's
A/B runs. CPU, tiny shapes; never asserts a timing."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "ab_time_lstm.py"
TINY = ["--device", "cpu", "--batch", "2", "--hidden", "8", "--dtype", "float32", "--iters", "20", "--seq-len", "4"]


def run_script(expect: pathlib.Path, *extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, str(SCRIPT), "--tag", "t", "--expect", str(expect), *TINY, *extra],
                          env=env, capture_output=True, text=True, timeout=300)


def test_times_the_expected_build():
    done = run_script(ROOT)
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout)["t"]
    (cell, (graph_ms, eager_ms)), = record.items()
    assert cell == "float32 B=2 H=8 infer"
    assert graph_ms is None  # no CUDA graph on the CPU
    assert eager_ms > 0


def test_refuses_another_build(tmp_path):
    done = run_script(tmp_path)
    assert done.returncode != 0
    assert "was imported from" in done.stderr and str(tmp_path) in done.stderr
    assert done.stdout == ""
