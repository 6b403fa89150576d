"""Where the GPU time of a `train` call goes, the cuBLAS loop forced: its steps replayed from a
kept CUDA graph (equal lengths) against the plain loop (the same batch with one sequence a step
shorter, a ragged PackedSequence, which the replay does not take; B >= 2).

    SEQKERNELS_LSTM_BACKEND=cublas python scripts/lstm_replay_profile.py [--cases bfloat16:16:1024 ...]

--tf32 off profiles float32 with TF32 off (cuDNN's and matmul's switches, as the benchmark's
`--tf32 off`); --no-ragged skips the plain loop's variant.

Per case and variant: the median wall ms of a training call (forward + backward, T = 256,
I = H) and the kernels of one call by their summed GPU time (torch.profiler). Diagnostic only.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
from torch.nn.utils.rnn import pack_padded_sequence
from torch.profiler import ProfilerActivity, profile

import seqkernels

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
from harness import DTYPES, set_tf32  # noqa: E402  the benchmark's dtypes and TF32 switches


def train_call(dtype, B, H, T, ragged):
    torch.manual_seed(0)
    model = seqkernels.LSTM(H, H).to(device="cuda", dtype=dtype)
    x = torch.randn(T, B, H, device="cuda", dtype=dtype)
    lengths = torch.full((B,), T, dtype=torch.int64)
    if ragged:
        lengths[-1] = T - 1

    def run():
        xx = x.clone().requires_grad_(True)
        inp = pack_padded_sequence(xx, lengths) if ragged else xx
        y, _ = model(inp)
        (y.data if ragged else y).float().sum().backward()

    return run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", nargs="+", default=["bfloat16:16:1024", "bfloat16:1:1024", "float32:16:1024",
                                                   "bfloat16:16:512"])
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--top", type=int, default=8)
    ap.add_argument("--tf32", choices=["default", "off"], default="default")
    ap.add_argument("--no-ragged", action="store_true", help="the replayed (equal lengths) variant only")
    args = ap.parse_args()
    if args.tf32 == "off":
        set_tf32(False)
    for case in args.cases:
        name, B, H = case.split(":")
        # B = 1 has no ragged batch (one sequence a step shorter is a shorter uniform one).
        for ragged in (False, True) if int(B) > 1 and not args.no_ragged else (False,):
            run = train_call(DTYPES[name], int(B), int(H), args.seq_len, ragged)
            for _ in range(3):
                run()
            torch.cuda.synchronize()
            times = []
            for _ in range(args.iters):
                t0 = time.perf_counter()
                run()
                torch.cuda.synchronize()
                times.append((time.perf_counter() - t0) * 1e3)
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                run()
                torch.cuda.synchronize()
            label = "plain (ragged)" if ragged else "replayed"
            print(f"{name} B={B} H={H} {label}: {statistics.median(times):.3f} ms per train call", flush=True)
            events = sorted(prof.key_averages(), key=lambda e: -e.device_time_total)
            for e in events[: args.top]:
                print(f"    {e.device_time_total / 1e3:9.3f} ms  {e.count:6d}x  {e.key[:110]}", flush=True)


if __name__ == "__main__":
    main()
