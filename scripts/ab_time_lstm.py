"""Times one build of seqkernels.LSTM for an A/B of builds (scripts/ab_builds.sh runs it once per
build and round). Prints one JSON line: {tag: {cell: [graph ms, eager ms]}} (graph: a CUDA-graph
replay of the call, CUDA only, else null; eager: the call itself), medians of --iters calls.

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
import statistics
import sys

import torch

import seqkernels
import seqkernels._C as _C

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}


def inside(path: str, root: str) -> bool:
    path, root = os.path.realpath(path), os.path.realpath(root)
    return os.path.commonpath([path, root]) == root


def time_cell(B: int, H: int, dtype: torch.dtype, mode: str, device: str, iters: int, T: int) -> list:
    torch.manual_seed(0)
    lstm = seqkernels.LSTM(H, H, device=device, dtype=dtype)
    x = torch.randn(T, B, H, device=device, dtype=dtype, requires_grad=mode == "train")

    def call():
        if mode == "train":
            for p in (x, *lstm.parameters()):  # no accumulation into old gradients
                p.grad = None
            y, _ = lstm(x)
            y.sum().backward()
        else:
            with torch.no_grad():
                lstm(x)

    for _ in range(3):
        call()
    cuda = device == "cuda"
    graph = None
    if cuda and mode == "infer":
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            call()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(graph):
            lstm(x)

    def timed(fn) -> float:
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end)
        import time

        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3

    graph_ms, eager_ms = [], []
    for _ in range(iters):  # interleaved, so that a drifting clock affects both alike
        if graph is not None:
            graph_ms.append(timed(graph.replay))
        eager_ms.append(timed(call))
    return [statistics.median(graph_ms) if graph_ms else None, statistics.median(eager_ms)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tag", required=True, help="this build's name in the output")
    p.add_argument("--expect", required=True, help="directory that must hold the imported seqkernels and _C")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8, 16])
    p.add_argument("--hidden", type=int, nargs="+", default=[256, 512, 1024])
    p.add_argument("--dtype", nargs="+", choices=sorted(DTYPES), default=["bfloat16", "float32"])
    p.add_argument("--mode", choices=["infer", "train"], default="infer")
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--seq-len", type=int, default=256)
    args = p.parse_args()

    for what, path in (("seqkernels", seqkernels.__file__), ("seqkernels._C", _C.__file__)):
        if not inside(path, args.expect):
            sys.exit(f"ab_time_lstm: {what} was imported from {path}, not from {args.expect}: "
                     "set PYTHONPATH to the build's tree and run this script by its path")
    print(f"ab_time_lstm: {args.tag}: {_C.__file__}", file=sys.stderr)
    out = {}
    for dn in args.dtype:
        for H in args.hidden:
            for B in args.batch:
                out[f"{dn} B={B} H={H} {args.mode}"] = time_cell(B, H, DTYPES[dn], args.mode, args.device,
                                                               args.iters, args.seq_len)
    print(json.dumps({args.tag: out}))


if __name__ == "__main__":
    main()
