"""Times the backward op of an LSTM training call under each CUDA loop, the forward fixed
(`auto`): the choice `auto` makes for the backward, measured where it cannot be read off the
grid of scripts/lstm_backend_grid.py (which forces one loop for both directions).

    python scripts/lstm_backward_choice.py --batch 4 8 --hidden 640 768 1024 --dtype float32
    python scripts/lstm_backward_choice.py --batch 1 8 16 --hidden 1024 --dtype bfloat16 float16 \
        --loops persistent persistent-no-row-split fused

Per cell: median ms (CUDA events, 20 interleaved calls after 3 warm-up, each after an untimed
one: benchmarks/harness.py's measure_interleaved) of `loss.backward()` with
SEQKERNELS_LSTM_BACKEND set to each loop (or a --loops variant's switches) for the backward op only
(the variables are read on every op call); the forward runs untimed under `auto` before every call. float32 rows use PyTorch's
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
# Candidates beyond the three loops (--loops): a loop with diagnostic switches set for the backward
# op only, e.g. the persistent loop without its row-split backward kernel (H = 1024, 16-bit), or
# the row split's exchange forced to step flags / polled data.
VARIANTS = {
    "persistent-no-row-split": {"SEQKERNELS_LSTM_BACKEND": "persistent", "SEQKERNELS_LSTM_ROW_SPLIT_BACKWARD": "0"},
    "persistent-flags": {"SEQKERNELS_LSTM_BACKEND": "persistent", "SEQKERNELS_LSTM_CLUSTER_POLL_DATA": "0"},
    "persistent-poll": {"SEQKERNELS_LSTM_BACKEND": "persistent", "SEQKERNELS_LSTM_CLUSTER_POLL_DATA": "1"},
}


def candidate_env(name: str) -> dict:
    """The environment of a candidate: a loop's SEQKERNELS_LSTM_BACKEND, or a VARIANTS entry."""
    if name in LOOPS:
        return {"SEQKERNELS_LSTM_BACKEND": name}
    if name in VARIANTS:
        return VARIANTS[name]
    raise ValueError(f"unknown candidate {name!r}: one of {', '.join(LOOPS + tuple(VARIANTS))}")


def backward_times(model, x, device, iters=20, warmup=3, candidates=LOOPS) -> dict:
    """Median ms of `loss.backward()` per candidate (candidate_env): the forward (under `auto`)
    runs untimed before every call (harness.measure_interleaved's before_each); the candidates
    are interleaved."""
    state = {}

    def forward():
        for p in (*model.parameters(), x):
            p.grad = None
        y, _ = model(x)
        state["loss"] = y.float().sum()

    def backward_under(env):
        def run():
            os.environ.update(env)
            try:
                state["loss"].backward()
            finally:
                for name in env:
                    os.environ.pop(name, None)

        return run

    for name in {k for c in candidates for k in candidate_env(c)}:
        os.environ.pop(name, None)
    times = harness.measure_interleaved({c: backward_under(candidate_env(c)) for c in candidates}, device,
                                        warmup=warmup, iters=iters, before_each=forward)
    return {c: t.median_ms for c, t in times.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--hidden", type=int, nargs="+", default=[640, 768, 1024])
    ap.add_argument("--dtype", nargs="+", default=["float32"])
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--loops", nargs="+", default=list(LOOPS), choices=list(LOOPS) + list(VARIANTS),
                    help="the candidates (default: the three loops)")
    args = ap.parse_args()
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, T = {args.seq_len}; backward op ms")
    width = max(10, *(len(c) for c in args.loops))
    print(f"{'dtype':>9} {'B':>4} {'H':>5} | " + " ".join(f"{c:>{width}}" for c in args.loops) + " | auto picks")
    for dtype_name in args.dtype:
        dtype = getattr(torch, dtype_name)
        for B in args.batch:
            for H in args.hidden:
                torch.manual_seed(0)
                model = seqkernels.LSTM(H, H, device="cuda", dtype=dtype)
                x = torch.randn(args.seq_len, B, H, device="cuda", dtype=dtype, requires_grad=True)
                by_candidate = backward_times(model, x, torch.device("cuda"), candidates=args.loops)
                times = [by_candidate[c] for c in args.loops]
                pick = seqkernels._config.lstm_loop_choice(B, H, dtype, 0, "cuda")["backward"][0]
                print(f"{dtype_name:>9} {B:>4} {H:>5} | " + " ".join(f"{t:{width}.3f}" for t in times) + f" | {pick}")


if __name__ == "__main__":
    main()
