"""Times one build of seqkernels.LSTM for an A/B of builds (scripts/ab_builds.sh runs it once per
build and round). Prints one JSON line: {tag: {cell: [graph ms, eager ms]}} (graph: a CUDA-graph
replay of the call, CUDA only, else null; eager: the call itself), medians of --iters calls timed
as benchmarks/bench_lstm.py times them (harness.measure_interleaved, harness.capture_cuda_graph).

It refuses to time a build other than the one named: `--expect DIR` must contain the imported
seqkernels package and its _C extension. (Why: a script or `python -c` run from the repository
root imports the root's seqkernels ahead of PYTHONPATH, since Python puts the script's directory,
or the working directory, first on sys.path; every A/B of the 2026-11-26 session timed one build
against itself that way.)

  PYTHONPATH=/path/to/tree python scripts/ab_time_lstm.py --tag new --expect /path/to/tree \\
      --batch 1 8 16 --hidden 256 512 1024 --dtype bfloat16 float32 --mode infer
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

import seqkernels
import seqkernels._C as _C

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
import harness  # noqa: E402  the benchmark's timing and graph capture (measure_interleaved, capture_cuda_graph)


def inside(path: str, root: str) -> bool:
    path, root = os.path.realpath(path), os.path.realpath(root)
    return os.path.commonpath([path, root]) == root


def time_cell(B: int, H: int, dtype: torch.dtype, mode: str, device: torch.device, iters: int, T: int) -> list:
    torch.manual_seed(0)
    lstm = seqkernels.LSTM(H, H, device=device, dtype=dtype)
    x = torch.randn(T, B, H, device=device, dtype=dtype, requires_grad=mode == "train")
    if mode == "train":
        def call():
            y, _ = lstm(x)
            y.sum().backward()

        def clear_grads():  # untimed, before every call, as bench_lstm.py's
            for p in (x, *lstm.parameters()):
                p.grad = None
    else:
        def call():
            with torch.no_grad():
                lstm(x)

        clear_grads = None
    fns = {"eager": call}
    if device.type == "cuda" and mode == "infer":
        fns["graph"] = harness.capture_cuda_graph(lambda: lstm(x))
    timings = harness.measure_interleaved(fns, device, iters=iters, before_each=clear_grads)
    return [timings["graph"].median_ms if "graph" in timings else None, timings["eager"].median_ms]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tag", required=True, help="this build's name in the output")
    p.add_argument("--expect", required=True, help="directory that must hold the imported seqkernels and _C")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8, 16])
    p.add_argument("--hidden", type=int, nargs="+", default=[256, 512, 1024])
    p.add_argument("--dtype", nargs="+", choices=sorted(harness.DTYPES), default=["bfloat16", "float32"])
    p.add_argument("--mode", choices=["infer", "train"], default="infer")
    p.add_argument("--iters", type=int, default=30, help=f"timed calls (at least {harness.MIN_TIMED_CALLS})")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--tf32", choices=["default", "on", "off"], default="default",
                   help="float32's TF32 switches (harness.set_tf32): PyTorch's defaults, both on, both off")
    args = p.parse_args()
    harness.set_tf32({"default": None, "on": True, "off": False}[args.tf32])
    if args.iters < harness.MIN_TIMED_CALLS:
        p.error(f"--iters must be at least {harness.MIN_TIMED_CALLS}")

    for what, path in (("seqkernels", seqkernels.__file__), ("seqkernels._C", _C.__file__)):
        if not inside(path, args.expect):
            sys.exit(f"ab_time_lstm: {what} was imported from {path}, not from {args.expect}: "
                     "set PYTHONPATH to the build's tree and run this script by its path")
    print(f"ab_time_lstm: {args.tag}: {_C.__file__}", file=sys.stderr)
    out = {}
    for dn in args.dtype:
        for H in args.hidden:
            for B in args.batch:
                out[f"{dn} B={B} H={H} {args.mode}"] = time_cell(B, H, harness.DTYPES[dn], args.mode,
                                                               torch.device(args.device), args.iters, args.seq_len)
    print(json.dumps({args.tag: out}))


if __name__ == "__main__":
    main()
