"""Times the backward op of an LSTM training call under each CUDA loop, the forward fixed
(`auto`): the choice `auto` makes for the backward, measured where it cannot be read off the
grid of scripts/lstm_backend_grid.py (which forces one loop for both directions).

    python scripts/lstm_backward_choice.py --batch 4 8 --hidden 640 768 1024 --dtype float32

Per cell: median ms (CUDA events, 20 calls after 3 warm-up) of `loss.backward()` with
SEQKERNELS_LSTM_BACKEND set to each loop for the backward op only (the variable is read on every
op call). float32 rows use PyTorch's default TF32 switches. Diagnostic only.
"""
from __future__ import annotations

import argparse
import os

import torch

import seqkernels

LOOPS = ("persistent", "fused", "cublas")


def backward_ms(model, x, loop, iters=20, warmup=3):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for i in range(warmup + iters):
        for p in (*model.parameters(), x):
            p.grad = None
        os.environ.pop("SEQKERNELS_LSTM_BACKEND", None)
        y, _ = model(x)
        loss = y.float().sum()
        os.environ["SEQKERNELS_LSTM_BACKEND"] = loop
        torch.cuda.synchronize()
        start.record()
        loss.backward()
        end.record()
        torch.cuda.synchronize()
        if i >= warmup:
            samples.append(start.elapsed_time(end))
    os.environ.pop("SEQKERNELS_LSTM_BACKEND", None)
    return sorted(samples)[len(samples) // 2]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--hidden", type=int, nargs="+", default=[640, 768, 1024])
    ap.add_argument("--dtype", nargs="+", default=["float32"])
    ap.add_argument("--seq-len", type=int, default=256)
    args = ap.parse_args()
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, T = {args.seq_len}; backward op ms")
    print(f"{'dtype':>9} {'B':>4} {'H':>5} | " + " ".join(f"{loop:>10}" for loop in LOOPS) + " | auto picks")
    for dtype_name in args.dtype:
        dtype = getattr(torch, dtype_name)
        for B in args.batch:
            for H in args.hidden:
                torch.manual_seed(0)
                model = seqkernels.LSTM(H, H, device="cuda", dtype=dtype)
                x = torch.randn(args.seq_len, B, H, device="cuda", dtype=dtype, requires_grad=True)
                times = [backward_ms(model, x, loop) for loop in LOOPS]
                pick = seqkernels._config.lstm_loop_choice(B, H, dtype, 0, "cuda")["backward"][0]
                print(f"{dtype_name:>9} {B:>4} {H:>5} | " + " ".join(f"{t:10.3f}" for t in times) + f" | {pick}")


if __name__ == "__main__":
    main()
