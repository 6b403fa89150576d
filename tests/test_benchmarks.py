"""The benchmark harness's output: the plot of a run (--plot), and a bench script run end to
end on the CPU (tiny shapes). Never asserts a timing: benchmarks are not tests."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

BENCHMARKS = pathlib.Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
import harness  # noqa: E402

if os.environ.get("CI"):
    import matplotlib  # noqa: F401  scripts/test.sh installs it: in CI these tests must run
else:
    pytest.importorskip("matplotlib")  # an optional extra (pip install matplotlib)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def lstm_records() -> list[dict]:
    """Records as bench_lstm.py writes them (only the fields the plot reads, plus a failure)."""
    records = []
    for H in (256, 512):
        for B in (1, 8, 64):
            for mode in ("infer", "train"):
                for dtype, tf32 in (("float32", "on"), ("float32", "off"), ("bfloat16", "n/a")):
                    records.append({
                        "suite": "lstm-small-batch", "B": B, "H": H, "I": H, "T": 256, "dtype": dtype, "mode": mode,
                        "tf32": tf32, "status": "ok",
                        "ms": {"seqkernels": 1.0 + B / 64, "nn.LSTM": 2.0},
                        "us_per_step": {"seqkernels": (1.0 + B / 64) * 1e3 / 256, "nn.LSTM": 2e3 / 256},
                        "speedup": {"seqkernels vs nn.LSTM": 2.0 / (1.0 + B / 64), "seqkernels vs nn.LSTM graph": 1.1},
                    })
    records.append({"suite": "lstm-small-batch", "B": 8, "H": 256, "dtype": "float32", "mode": "infer",
                    "status": "error", "error": "RuntimeError: boom"})
    return records


def test_plot_records_writes_a_png(tmp_path):
    path = tmp_path / "sub" / "lstm.png"
    harness.plot_records(lstm_records(), str(path), series=["H"], title="lstm-small-batch: test", peer="nn.LSTM")
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 10_000


def test_plot_subcommand_replots_a_json(tmp_path):
    document = {"suite": "lstm-small-batch", "environment": {"device": "cpu", "device_name": "test CPU",
                                                             "torch": "2.13.0", "date": "2026-11-21"},
                "records": lstm_records()}
    # A scalar speed-up (as bench_convrnn.py records it) plots as well.
    document["records"][0]["speedup"] = 1.5
    src = tmp_path / "lstm_cpu.json"
    src.write_text(json.dumps(document))
    out = tmp_path / "replot.png"
    assert harness.main(["plot", str(src), str(out)]) == 0
    assert out.read_bytes().startswith(PNG_MAGIC)


def test_plot_without_a_successful_record_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="status 'ok'"):
        harness.plot_records(lstm_records()[-1:], str(tmp_path / "x.png"), series=["H"], title="t")


def test_plot_flag_needs_matplotlib(monkeypatch, capsys):
    """Without matplotlib, --plot fails while parsing the arguments, before any benchmark."""
    monkeypatch.setattr(harness, "have_matplotlib", lambda: False)
    import argparse

    p = argparse.ArgumentParser()
    harness.add_common_args(p, "x.json")
    with pytest.raises(SystemExit) as exc:
        harness.parse_common(p, ["--plot", "out.png"])
    assert exc.value.code == 2
    assert "pip install matplotlib" in capsys.readouterr().err


def test_bench_convlstm_quick_end_to_end(tmp_path):
    """The smoke run of a bench script: table on stdout, records in the JSON, the PNG."""
    js, png, md = tmp_path / "convlstm.json", tmp_path / "convlstm.png", tmp_path / "table.md"
    out = subprocess.run([sys.executable, str(BENCHMARKS / "bench_convlstm.py"), "--quick", "--device", "cpu",
                          "--json", str(js), "--plot", str(png), "--markdown", str(md)],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr  # non-zero only for a cell that failed (a missed target is not)
    document = json.loads(js.read_text())
    assert document["suite"] == "convlstm" and len(document["records"]) == 4
    assert all(r["status"] == "ok" for r in document["records"]), out.stderr
    assert "| B, T, Ci, C, H×W, K |" in out.stdout and "[4/4]" in out.stderr
    assert png.read_bytes().startswith(PNG_MAGIC)
    assert md.read_text().startswith("ConvLSTM suite on")


def test_lstm_table_marks_the_graph_target():
    """bench_lstm.py's CUDA table says per `infer` cell at B <= 16 whether our CUDA graph reached
    3x cuDNN's (issue 4's second target), next to the eager target, and leaves it blank elsewhere."""
    import bench_lstm

    def record(B, mode, graph_speedup):
        r = {"B": B, "H": 1024, "dtype": "bfloat16", "tf32": "n/a", "mode": mode, "status": "ok",
             "ms": {"seqkernels": 1.0, "nn.LSTM": 6.0, "nn.LSTM graph": 2.0, "seqkernels graph": 2.0 / graph_speedup},
             "us_per_step": {"seqkernels": 3.9, "seqkernels graph": 2.6},
             "speedup": {"seqkernels vs nn.LSTM": 6.0, "seqkernels vs nn.LSTM graph": 2.0,
                         "seqkernels graph vs nn.LSTM graph": graph_speedup},
             "target_speedup": bench_lstm.target("cuda", B, mode, "bfloat16", False),
             "target_speedup_vs_graph": bench_lstm.graph_target("cuda", B, mode),
             "peak_mb": {"seqkernels": 1.0, "nn.LSTM": 2.0}}
        r["target_met"] = r["speedup"]["seqkernels vs nn.LSTM"] >= r["target_speedup"]
        gt = r["target_speedup_vs_graph"]
        r["target_met_vs_graph"] = None if gt is None else graph_speedup >= gt
        return r

    cols = bench_lstm.columns("cuda")
    assert cols[-2].header == "target (vs eager)" and cols[-1].header == "target (graph vs graph)"
    assert bench_lstm.graph_target_text(record(8, "infer", 2.71)) == "≥3× **no**"
    assert bench_lstm.graph_target_text(record(16, "infer", 3.7)) == "≥3× yes"
    assert bench_lstm.graph_target_text(record(64, "infer", 3.7)) == ""
    assert bench_lstm.graph_target_text(record(8, "train", 3.7)) == ""
    table = harness.markdown_table([record(8, "infer", 2.71)], cols)
    assert "| ≥5× yes | ≥3× **no** |" in table
    assert bench_lstm.graph_target_text({"status": "error"}) == ""
    assert "graph vs graph" not in " ".join(c.header for c in bench_lstm.columns("cpu"))


def test_bench_lstm_packed_end_to_end(tmp_path):
    """bench_lstm.py --packed gives both modules one PackedSequence (lengths T down to T / 2): each
    cell's correctness check against the float64 reference passes before it is timed, the records
    say packed, and the table's heading names the input."""
    import bench_lstm

    assert bench_lstm.packed_lengths(16, 5).tolist() == [16, 14, 12, 10, 8]
    assert bench_lstm.packed_lengths(16, 1).tolist() == [16]
    js, md = tmp_path / "packed.json", tmp_path / "packed.md"
    out = subprocess.run([sys.executable, str(BENCHMARKS / "bench_lstm.py"), "--packed", "--device", "cpu",
                          "--batch", "1", "5", "--hidden", "16", "--seq-len", "12", "--iters", "20", "--warmup", "1",
                          "--json", str(js), "--markdown", str(md)],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    records = json.loads(js.read_text())["records"]
    assert len(records) == 4 and all(r["status"] == "ok" and r["packed"] for r in records), out.stderr
    assert all(r["target_speedup"] is None for r in records)
    assert "PackedSequence (lengths T down to T/2)" in md.read_text().splitlines()[0]


def test_bench_lstm_proj_size_end_to_end(tmp_path):
    """bench_lstm.py --proj-size P builds both modules with that projection: each cell passes its
    correctness check before it is timed, the records carry P and no target, the heading names it;
    a P not below every H is refused before anything runs."""
    js, md = tmp_path / "proj.json", tmp_path / "proj.md"
    common = [sys.executable, str(BENCHMARKS / "bench_lstm.py"), "--device", "cpu", "--batch", "3",
              "--seq-len", "12", "--iters", "20", "--warmup", "1", "--json", str(js), "--markdown", str(md)]
    out = subprocess.run(common + ["--proj-size", "5", "--hidden", "16"], capture_output=True, text=True,
                         timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    records = json.loads(js.read_text())["records"]
    assert len(records) == 2 and all(r["status"] == "ok" and r["proj_size"] == 5 for r in records), out.stderr
    assert all(r["target_speedup"] is None for r in records)
    assert "proj_size=5" in md.read_text().splitlines()[0]
    out = subprocess.run(common + ["--proj-size", "16", "--hidden", "8", "16"], capture_output=True, text=True,
                         timeout=300, cwd=tmp_path)
    assert out.returncode == 2 and "must be below every hidden size" in out.stderr


def test_git_commit_marks_modified_tracked_files(tmp_path):
    """A record names the commit it measured, and says so where tracked files differ from it."""
    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True,
                       env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                            "GIT_COMMITTER_EMAIL": "t@t"})

    assert harness.git_commit(str(tmp_path)) is None  # not a checkout
    git("init", "-q")
    (tmp_path / "kernel.cu").write_text("// v1\n")
    git("add", "kernel.cu")
    git("commit", "-q", "-m", "v1")
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tmp_path, capture_output=True,
                          text=True).stdout.strip()
    (tmp_path / "notes.txt").write_text("untracked\n")
    assert harness.git_commit(str(tmp_path)) == head
    (tmp_path / "kernel.cu").write_text("// v2\n")
    assert harness.git_commit(str(tmp_path)) == head + "+modified"
