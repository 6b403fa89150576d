"""Times the backward op of an LSTM training call under each CUDA loop, the forward fixed
(`auto`): the choice `auto` makes for the backward, measured where it cannot be read off the
grid of scripts/lstm_backend_grid.py (which forces one loop for both directions).

    python scripts/lstm_backward_choice.py --batch 4 8 --hidden 640 768 1024 --dtype float32

Per cell: median ms (CUDA events, 20 interleaved calls after 3 warm-up, each after an untimed
one: benchmarks/harness.py's measure_interleaved) of `loss.backward()` with
SEQKERNELS_LSTM_BACKEND set to each loop for the backward op only (the variable is read on every
op call); the forward runs untimed under `auto` before every call. float32 rows use PyTorch's
default TF32 switches. Diagnostic only.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

import seqkernels

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
import harness  # noqa: E402

LOOPS = ("persistent", "fused", "cublas")


def backward_times(model, x, device, iters=20, warmup=3) -> dict:
    """Median ms of `loss.backward()` per loop: the forward (under `auto`) runs untimed before
    every call (harness.measure_interleaved's before_each); the candidates are interleaved."""
    state = {}

    def forward():
        for p in (*model.parameters(), x):
            p.grad = None
        y, _ = model(x)
        state["loss"] = y.float().sum()

    def backward_under(loop):
        def run():
            os.environ["SEQKERNELS_LSTM_BACKEND"] = loop
            try:
                state["loss"].backward()
            finally:
                os.environ.pop("SEQKERNELS_LSTM_BACKEND", None)

        return run

    os.environ.pop("SEQKERNELS_LSTM_BACKEND", None)
    times = harness.measure_interleaved({loop: backward_under(loop) for loop in LOOPS}, device, warmup=warmup,
                                        iters=iters, before_each=forward)
    return {loop: t.median_ms for loop, t in times.items()}


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
                by_loop = backward_times(model, x, torch.device("cuda"))
                times = [by_loop[loop] for loop in LOOPS]
                pick = seqkernels._config.lstm_loop_choice(B, H, dtype, 0, "cuda")["backward"][0]
                print(f"{dtype_name:>9} {B:>4} {H:>5} | " + " ".join(f"{t:10.3f}" for t in times) + f" | {pick}")


if __name__ == "__main__":
    main()
