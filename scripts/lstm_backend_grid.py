"""The CUDA LSTM time loops side by side: every loop forced in turn (SEQKERNELS_LSTM_BACKEND=
persistent | fused | cublas, read by the ops on every call), against nn.LSTM (cuDNN) and the
default (auto), in one process, calls interleaved. The evidence behind the auto heuristic
(docs/kernels.md).

For each cell (benchmarks/bench_lstm.py's suite: one layer, I = H, T = 256, batch-second):
each loop's results are first checked against a float64 nn.LSTM with the same weights (as
bench_lstm.py does: error <= 2x cuDNN's + a dtype floor), then every candidate is timed
(median of --iters calls, CUDA events, each timed call after an untimed one). A forced loop
that does not apply to a shape runs the cuBLAS loop (its time then equals cublas's).

  python scripts/lstm_backend_grid.py                          # the full grid, both modes
  python scripts/lstm_backend_grid.py --batch 1 16 --hidden 1024 --dtype bfloat16 --mode infer
  python scripts/lstm_backend_grid.py --json $OUT/grid.json     # records for later analysis

Prints one line per cell: ms of each candidate, the best loop and its speed-up over cuDNN.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import warnings

import torch

warnings.filterwarnings("ignore", message="RNN module weights are not part of single contiguous chunk")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "benchmarks"))
import bench_lstm  # noqa: E402
import harness  # noqa: E402

LOOPS = ("persistent", "fused", "cublas")
PEER = "cuDNN"


# Extra candidates (--variants): the general persistent forward kernel where the direct one
# would run (SEQKERNELS_LSTM_PERSISTENT_DIRECT=0), the general persistent backward kernel where
# the split one would run (SEQKERNELS_LSTM_PERSISTENT_SPLIT=0), the split one wherever it can
# run (=1), with clusters (the default where they fit) or without them
# (SEQKERNELS_LSTM_PERSISTENT_CLUSTER=0): diagnostic switches of the persistent loop (csrc/cuda/lstm_persistent*.cu).
VARIANTS = {"persistent-general": {"SEQKERNELS_LSTM_BACKEND": "persistent", "SEQKERNELS_LSTM_PERSISTENT_DIRECT": "0"},
            "persistent-nosplit": {"SEQKERNELS_LSTM_BACKEND": "persistent", "SEQKERNELS_LSTM_PERSISTENT_SPLIT": "0"},
            "persistent-split": {"SEQKERNELS_LSTM_BACKEND": "persistent", "SEQKERNELS_LSTM_PERSISTENT_SPLIT": "1"},
            "persistent-split-nocluster": {"SEQKERNELS_LSTM_BACKEND": "persistent",
                                           "SEQKERNELS_LSTM_PERSISTENT_SPLIT": "1",
                                           "SEQKERNELS_LSTM_PERSISTENT_CLUSTER": "0"}}


def forced(loop: str, fn):
    """fn with SEQKERNELS_LSTM_BACKEND=loop (or a VARIANTS entry's variables) for the duration
    of the call."""
    env = VARIANTS.get(loop, {"SEQKERNELS_LSTM_BACKEND": loop})

    def run():
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            return fn()
        finally:
            for k, v in saved.items():
                if v is None:
                    del os.environ[k]
                else:
                    os.environ[k] = v

    return run


def run_cell(args, device, B: int, H: int, dtype_name: str, mode: str) -> dict:
    dtype = harness.DTYPES[dtype_name]
    harness.set_tf32(False if args.tf32 == "off" else None)
    tf32_active = dtype == torch.float32 and args.tf32 != "off"
    cell = bench_lstm.Cell(device, args.seq_len, B, H, dtype, mode, seed=B * 7919 + H)
    record = {"B": B, "H": H, "dtype": dtype_name, "mode": mode, "T": args.seq_len,
              "tf32": (args.tf32 if dtype == torch.float32 else "n/a"), "device": harness.device_name(device)}
    floor = harness.FLOOR["tf32" if tf32_active else dtype_name]
    ref = cell.reference()
    peer_errs = harness.rel_errors(cell.results(cell.peer), ref)
    failures = []
    for loop in LOOPS + ("auto",) + tuple(args.variants):
        errs = harness.rel_errors(forced(loop, lambda: cell.results(cell.ours))(), ref)
        failures += harness.check(loop, errs, peer_errs, floor, PEER)
    del ref
    if failures:
        record["status"] = "wrong"
        record["error"] = "; ".join(failures)
        return record
    fns = {PEER: cell.fn(cell.peer)}
    timed = LOOPS + (("auto",) if args.with_auto else ()) + tuple(args.variants)
    for loop in timed:
        fns[loop] = forced(loop, cell.fn(cell.ours))
    before = cell.clear_grads if mode == "train" else None
    timings = harness.measure_interleaved(fns, device, warmup=args.warmup, iters=args.iters, before_each=before)
    record["status"] = "ok"
    record["ms"] = {k: t.median_ms for k, t in timings.items()}
    if args.graphs and mode == "infer":
        # Each candidate's call captured in a CUDA graph (the loop is chosen at capture time).
        graphs = harness.capture_graphs(fns, record)
        gt = harness.measure_interleaved(graphs, device, warmup=args.warmup, iters=args.iters)
        record["graph_ms"] = {k: t.median_ms for k, t in gt.items()}
    best = min(LOOPS, key=lambda k: record["ms"][k])
    record["best"] = best
    record["speedup"] = {k: record["ms"][PEER] / record["ms"][k] for k in timed}
    return record


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8, 16, 32, 64, 256])
    p.add_argument("--hidden", type=int, nargs="+", default=[256, 512, 1024])
    p.add_argument("--dtype", nargs="+", default=["bfloat16", "float32"], choices=sorted(harness.DTYPES))
    p.add_argument("--mode", nargs="+", default=["infer", "train"], choices=["infer", "train"])
    p.add_argument("--tf32", choices=["default", "off"], default="default",
                   help="float32: PyTorch's default switches (cuDNN TF32 on) or both off")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--with-auto", action="store_true", help="also time the default choice (auto)")
    p.add_argument("--variants", nargs="*", default=[], choices=sorted(VARIANTS),
                   help="extra candidates: persistent-general = the general persistent forward kernel, "
                        "persistent-nosplit = the general persistent backward kernel, persistent-split = "
                        "the split one wherever it can run, persistent-split-nocluster = that without "
                        "thread-block clusters")
    p.add_argument("--graphs", action="store_true", help="infer: also time each candidate captured in a CUDA graph")
    p.add_argument("--json", default=None, help="write the records here")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("lstm_backend_grid: needs a CUDA device", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    print(f"# {harness.device_name(device)}, torch {torch.__version__}, T = {args.seq_len}, tf32 {args.tf32}")
    cols = [PEER] + list(LOOPS) + (["auto"] if args.with_auto else []) + list(args.variants)
    print(f"{'B':>4} {'H':>5} {'dtype':>9} {'mode':>5} | " + " ".join(f"{c:>10}" for c in cols)
          + " | best       x cuDNN" + (" | auto x cuDNN" if args.with_auto else ""))
    records, bad = [], 0
    for dtype_name in args.dtype:
        for mode in args.mode:
            for H in args.hidden:
                for B in args.batch:
                    r = run_cell(args, device, B, H, dtype_name, mode)
                    records.append(r)
                    head = f"{B:>4} {H:>5} {dtype_name:>9} {mode:>5} | "
                    if r["status"] != "ok":
                        bad += 1
                        print(head + "WRONG: " + r["error"], flush=True)
                        continue
                    print(head + " ".join(f"{r['ms'][c]:>10.3f}" for c in cols)
                          + f" | {r['best']:<10} {r['speedup'][r['best']]:5.2f}x"
                          + (f" | {r['speedup']['auto']:5.2f}x" if args.with_auto else ""), flush=True)
                    if "graph_ms" in r:
                        print(f"{'':>4} {'':>5} {'':>9} {'graph':>5} | "
                              + " ".join(f"{r['graph_ms'][c]:>10.3f}" if c in r["graph_ms"] else f"{'-':>10}"
                                         for c in cols), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"records": records, "torch": torch.__version__}, f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
