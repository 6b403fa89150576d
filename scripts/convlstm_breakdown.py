"""Where the ConvLSTM suite's GPU time goes, seqkernels.ConvLSTM beside the PyTorch loop of
benchmarks/bench_convlstm.py (same weights, same shapes, cuDNN benchmark mode on, PyTorch's
default TF32 switches): per call the wall time, the summed kernel time, and the kernel time
by kind (convolution, our pointwise pass, PyTorch elementwise, copies), then the top kernels.
Also times the per-step convolution alone, [x_t, h_{t-1}] with [w_ih | w_hh] as the loop and
our inference both run it, in NCHW and NHWC memory: the floor any fused loop stands on.

    python scripts/convlstm_breakdown.py [--iters 10] [--dtype float32]

Diagnostic only: the benchmark's tables come from benchmarks/bench_convlstm.py.
"""
from __future__ import annotations

import argparse
import collections
import os
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
import bench_convlstm  # noqa: E402

SHAPES = bench_convlstm.SHAPES  # (B, T, Ci, C, H, W, K)


def kind(name: str) -> str:
    n = name.lower()
    if "seqkernels" in n or "forward_kernel" in n or "backward_kernel" in n:
        return "ours (pointwise)"
    if any(k in n for k in ("conv", "xmma", "implicit", "gemm", "cutlass", "nvjet", "wgrad", "dgrad", "fprop",
                            "winograd", "fft", "sm90", "sm80")):
        return "convolution"
    if any(k in n for k in ("copy", "cat", "transpose", "nchwtonhwc", "nhwctonchw", "memcpy", "memset")):
        return "copy / layout"
    if any(k in n for k in ("reduce", "sum")):
        return "reduction"
    return "elementwise / other"


def profile_calls(fn, iters):
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) / iters * 1e3
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    per_kernel = collections.Counter()
    launches = collections.Counter()
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            per_kernel[e.name] += e.device_time_total / iters
            launches[e.name] += 1 / iters
    return wall, per_kernel, launches


def report(label, wall, per_kernel, launches, top):
    total = sum(per_kernel.values())
    by_kind = collections.Counter()
    for name, us in per_kernel.items():
        by_kind[kind(name)] += us
    print(f"\n### {label}: wall {wall:.3f} ms/call, kernels {total / 1e3:.3f} ms/call, "
          f"{sum(launches.values()):.0f} kernels/call")
    for k, us in by_kind.most_common():
        print(f"  {k:22s} {us / 1e3:8.3f} ms  ({100 * us / max(total, 1e-9):4.1f}%)")
    for name, us in per_kernel.most_common(top):
        print(f"    {us:9.1f} us  x{launches[name]:5.0f}  {name[:110]}")


def conv_alone(shape, dtype, iters):
    B, T, Ci, C, H, W, K = shape
    conv = torch.nn.Conv2d(Ci + C, 4 * C, K, padding=K // 2, device="cuda", dtype=dtype)
    x = torch.randn(B, Ci + C, H, W, device="cuda", dtype=dtype)
    rows = []
    for fmt in (torch.contiguous_format, torch.channels_last):
        c = conv.to(memory_format=fmt)
        xi = x.contiguous(memory_format=fmt)
        with torch.no_grad():
            for _ in range(5):
                c(xi)
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for _ in range(20):
                    c(xi)
            g.replay()
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                g.replay()
            end.record()
            end.synchronize()
        us = start.elapsed_time(end) / iters / 20 * 1e3
        flops = 2 * B * H * W * 4 * C * (Ci + C) * K * K
        rows.append((str(fmt).split(".")[-1], us, flops / us / 1e6))
    return rows


def host_view(shape, dtype, iters, top):
    """seqkernels.ConvLSTM infer at several T: wall ms per call (the slope is the per-step cost,
    the intercept the per-call cost), then the host-side ATen ops of one T = 10 call."""
    B, T, Ci, C, H, W, K = shape
    m = bench_convlstm.seqkernels.ConvLSTM(Ci, C, K, batch_first=True, device="cuda", dtype=dtype)
    h0 = torch.randn(1, B, C, H, W, device="cuda", dtype=dtype)
    c0 = torch.randn(1, B, C, H, W, device="cuda", dtype=dtype)
    row = []
    for steps in (1, 2, 3, 5, 10, 20):
        x = torch.randn(B, steps, Ci, H, W, device="cuda", dtype=dtype)
        with torch.no_grad():
            for _ in range(3):
                m(x, (h0, c0))
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(iters):
                m(x, (h0, c0))
            torch.cuda.synchronize()
        row.append(f"T={steps}: {(time.perf_counter() - t0) / iters * 1e3:.3f}")
    print("  seqkernels infer wall ms/call: " + ", ".join(row))
    x = torch.randn(B, 10, Ci, H, W, device="cuda", dtype=dtype)
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(iters):
            m(x, (h0, c0))
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--top", type=int, default=8)
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    a = p.parse_args()
    dtype = getattr(torch, a.dtype)
    torch.backends.cudnn.benchmark = True
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}, {a.dtype}, "
          f"cudnn.allow_tf32={torch.backends.cudnn.allow_tf32}")
    for shape in SHAPES:
        print(f"\n## shape (B, T, Ci, C, H, W, K) = {shape}")
        for fmt, us, tflops in conv_alone(shape, dtype, a.iters):
            print(f"  per-step convolution [x, h] alone (CUDA graph), {fmt:18s} {us:8.1f} us  {tflops:6.1f} TFLOP/s")
        host_view(shape, dtype, a.iters, 2 * a.top)
        for mode in ("infer", "train"):
            cell = bench_convlstm.Cell(torch.device("cuda"), shape, dtype, mode, seed=0)
            for name, module in (("seqkernels", cell.ours), ("PyTorch loop", cell.peer)):
                fn = cell.fn(module)
                if mode == "train":
                    def fn(run=fn):
                        cell.clear_grads()
                        run()
                wall, per_kernel, launches = profile_calls(fn, a.iters)
                report(f"{name} {mode} (T = {shape[1]})", wall, per_kernel, launches, a.top)


if __name__ == "__main__":
    main()
