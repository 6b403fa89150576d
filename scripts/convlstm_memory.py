"""Where ConvLSTM's GPU memory goes: peak bytes (above what was allocated before) of the
forward in inference, the forward in training and the backward alone, for seqkernels and
for the benchmark's concat-conv loop, with cuDNN benchmark mode on and off (benchmark mode
may pick algorithms with large workspaces). Diagnostic output for scripts/gpu_check.sh.

    python scripts/convlstm_memory.py                      # the benchmark's two shapes
    python scripts/convlstm_memory.py --shape 16 10 16 64 16 16 5
    python scripts/convlstm_memory.py --dtype bfloat16     # the loss is y.float().sum(), as in the benchmark
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
from bench_convlstm import PeerConvLSTM  # noqa: E402
from harness import peak_memory_bytes  # noqa: E402

import seqkernels  # noqa: E402

SHAPES = [(16, 10, 16, 64, 16, 16, 5), (4, 20, 64, 64, 64, 64, 3)]  # B, T, Ci, C, H, W, K
MB = 2**20
DTYPE = torch.float32  # --dtype


def peak_mb(fn) -> float:
    return peak_memory_bytes(fn, torch.device("cuda")) / MB


def measure(shape, benchmark: bool) -> None:
    torch.backends.cudnn.benchmark = benchmark
    B, T, Ci, C, H, W, K = shape
    opts = dict(device="cuda", dtype=DTYPE)
    peer = PeerConvLSTM(Ci, C, K).to(**opts)
    ours = seqkernels.ConvLSTM(Ci, C, K, batch_first=True).to(**opts)
    x = torch.randn(B, T, Ci, H, W, **opts)
    h0, c0 = torch.randn(B, C, H, W, **opts), torch.randn(B, C, H, W, **opts)
    candidates = {
        "seqkernels": lambda inp: ours(inp, (h0[None], c0[None]))[0],
        "loop": lambda inp: peer(inp, (h0, c0))[0],
    }
    state_mb = B * C * H * W * x.element_size() / MB
    print(f"shape (B, T, Ci, C, H, W, K)={shape} {DTYPE} cudnn.benchmark={benchmark}: one state {state_mb:.2f} MB, "
          f"y {T * state_mb:.1f} MB", flush=True)
    for name, run in candidates.items():
        for _ in range(2):  # warm-up: algorithm search, caches
            with torch.no_grad():
                run(x)
            xg = x.clone().requires_grad_()
            run(xg).float().sum().backward()
        with torch.no_grad():
            infer = peak_mb(lambda: run(x))
        xg = x.clone().requires_grad_()
        holder = {}
        fwd = peak_mb(lambda: holder.setdefault("y", run(xg)))
        loss = holder["y"].float().sum()
        bwd = peak_mb(lambda: loss.backward())
        del holder, loss
        print(f"  {name:10s} infer {infer:8.1f} MB | train forward {fwd:8.1f} MB, backward alone {bwd:8.1f} MB",
              flush=True)


def pieces(shape) -> None:
    """The backward's convolution calls alone (what convlstm_loop.h issues), peak above
    their inputs: how much of the backward's peak is cuDNN's own (workspace, layout copies)."""
    B, T, Ci, C, H, W, K = shape
    G, cl = 4 * C, torch.channels_last
    aten = torch.ops.aten.convolution_backward.default
    pad = [K // 2, K // 2]
    w_ih = torch.randn(G, Ci, K, K, device="cuda").contiguous(memory_format=cl)
    w_hh = torch.randn(G, C, K, K, device="cuda").contiguous(memory_format=cl)
    for frames in (T * B, max(B, T * B // 4), B):
        dz = torch.randn(frames, G, H, W, device="cuda").contiguous(memory_format=cl)
        x = torch.randn(frames, Ci, H, W, device="cuda").contiguous(memory_format=cl)
        h = torch.randn(frames, C, H, W, device="cuda").contiguous(memory_format=cl)
        common = ([1, 1], pad, [1, 1], False, [0, 0], 1)
        calls = (lambda: aten(dz, x, w_ih, [G], *common, [True, True, True]),
                 lambda: aten(dz, h, w_hh, None, *common, [False, True, False]),
                 lambda: aten(dz, h, w_hh, None, *common, [True, False, False]))
        for call in calls:  # the first call of a shape runs cuDNN's algorithm search
            call()
        a, b, c = (peak_mb(call) for call in calls)
        print(f"  {frames:4d} frames: dx+dw_ih+db {a:8.1f} MB, dw_hh {b:8.1f} MB, dh (input grad) {c:8.1f} MB "
              f"(dz itself {dz.numel() * 4 / MB:.1f} MB)", flush=True)


def live_at_peak(shape, top: int = 12, deep: int = 0) -> None:
    """The allocations alive at the peak of seqkernels' training backward (allocator
    history), largest first, each with the innermost frames that made it (the `deep` largest
    with their whole native stack)."""
    B, T, Ci, C, H, W, K = shape
    ours = seqkernels.ConvLSTM(Ci, C, K, batch_first=True).to(device="cuda", dtype=DTYPE)
    x = torch.randn(B, T, Ci, H, W, device="cuda", dtype=DTYPE, requires_grad=True)
    for _ in range(2):
        ours(x)[0].float().sum().backward()
    y = ours(x)[0]
    loss = y.float().sum()
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(max_entries=200000, context="all", stacks="all")
    loss.backward()
    torch.cuda.synchronize()
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    live, total, best, best_live = {}, 0, -1, {}
    for event in snapshot["device_traces"][torch.cuda.current_device()]:
        if event["action"] == "alloc":
            live[event["addr"]] = event
            total += event["size"]
            if total > best:
                best, best_live = total, dict(live)
        elif event["action"] in ("free_requested", "free_completed") and event["addr"] in live:
            total -= live.pop(event["addr"])["size"]
    print(f"seqkernels backward {shape} {DTYPE}: {best / MB:.1f} MB allocated by the backward at its peak; largest:")
    for rank, event in enumerate(sorted(best_live.values(), key=lambda e: -e["size"])[:top]):
        names = [f.get("name", "?") for f in event.get("frames", [])]
        ours_frames = [n for n in names if "seqkernels" in n or "convolution" in n or "cudnn" in n.lower()]
        where = " < ".join(n[:70] for n in (ours_frames or names)[:3])
        print(f"    {event['size'] / MB:7.2f} MB  {where}", flush=True)
        if rank < deep:  # the whole native stack of the largest: which call, workspace or copy
            native = [n for n in names if "::" in n and "c10::cuda::CUDACachingAllocator" not in n]
            for name in native[:14]:
                print(f"               {name[:150]}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", type=int, nargs=7, action="append", metavar=("B", "T", "CI", "C", "H", "W", "K"))
    ap.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    ap.add_argument("--deep", type=int, default=0, help="print the native stacks of this many largest allocations")
    args = ap.parse_args()
    global DTYPE
    DTYPE = getattr(torch, args.dtype)
    if not torch.cuda.is_available():
        print("convlstm_memory: needs a CUDA device", file=sys.stderr)
        return 2
    for shape in args.shape or SHAPES:
        for benchmark in (True, False):
            measure(tuple(shape), benchmark)
        torch.backends.cudnn.benchmark = True
        print(f"backward convolutions of {tuple(shape)} alone (cudnn.benchmark=True):", flush=True)
        pieces(tuple(shape))
        live_at_peak(tuple(shape), deep=args.deep)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
