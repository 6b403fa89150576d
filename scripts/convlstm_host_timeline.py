"""The host's share of an eager seqkernels.ConvLSTM call on the GPU: one call's timeline.

    python scripts/convlstm_host_timeline.py [--iters 10] [--shape B T CI C H W K] [--mode infer|train]

An eager call's time is the GPU's time plus what the GPU waits for the host. This traces
``iters`` calls (default: the benchmark's first shape, benchmarks/bench_convlstm.py; float32;
`infer` under no_grad, `train` the forward and backward of sum(y)) with torch.profiler and
prints, for the call of median length, every host event at depth <= 2 under the call (ATen
ops; CUDA runtime calls whatever their depth) with its host offset and duration in us. First
it prints the host time per call without the profiler (perf_counter around a call, the GPU
drained before it) and the call's wall time (synchronised); then the summed GPU kernel time,
and the median call's GPU kernels on the host's clock with the GPU's idle time between them.
Diagnostic only: the benchmark is what the tables come from.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile, record_function

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import seqkernels  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--shape", type=int, nargs=7, default=[16, 10, 16, 64, 16, 16, 5], metavar=("B", "T", "CI", "C",
                                                                                              "H", "W", "K"))
    p.add_argument("--mode", choices=["infer", "train"], default="infer")
    args = p.parse_args()
    B, T, Ci, C, H, W, K = args.shape
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    model = seqkernels.ConvLSTM(Ci, C, K, device="cuda")
    x = torch.randn(T, B, Ci, H, W, device="cuda")

    def call():
        if args.mode == "train":
            y, _ = model(x)
            y.sum().backward()
            return y
        with torch.no_grad():
            return model(x)

    for _ in range(5):
        call()
    torch.cuda.synchronize()

    host, wall = [], []
    for _ in range(30):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        call()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        host.append((t1 - t0) * 1e6)
        wall.append((t2 - t0) * 1e6)
    print(f"shape {args.shape} {args.mode}: host time per call {statistics.median(host):.1f} us (median of 30), "
          f"wall {statistics.median(wall):.1f} us")

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(args.iters):
            with record_function(f"call_{i}"):
                call()
            torch.cuda.synchronize()
    events = list(prof.events())
    calls = sorted((e for e in events if e.name.startswith("call_")), key=lambda e: e.time_range.elapsed_us())
    median = calls[len(calls) // 2]
    start, end = median.time_range.start, median.time_range.end

    def depth(e) -> int:
        d, parent = 0, e.cpu_parent
        while parent is not None and parent.id != median.id:
            d, parent = d + 1, parent.cpu_parent
        return d if parent is not None else -1  # -1: no parent recorded (CUDA runtime calls)

    inside = sorted((e for e in events if e.id != median.id and start <= e.time_range.start <= end
                     and e.device_type == torch.autograd.DeviceType.CPU), key=lambda e: e.time_range.start)
    print(f"median traced call: {median.time_range.elapsed_us():.1f} us host (profiler on)")
    print(f"{'offset':>8} {'dur':>8}  event")
    for e in inside:
        d = depth(e)
        if d <= 2:
            print(f"{e.time_range.start - start:8.1f} {e.time_range.elapsed_us():8.1f}  {'  ' * max(d, 0)}{e.name}")
    gpu = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    print(f"GPU kernel time per call: {sum(e.time_range.elapsed_us() for e in gpu) / args.iters:.1f} us")

    # The median call's GPU work on the same clock (CUPTI's timestamps): when the GPU starts, and
    # how long it idles between kernels (a launch's latency on the GPU side, or a host that lags).
    later = [c.time_range.start for c in calls if c.time_range.start > start]
    stop = min(later) if later else float("inf")
    kernels = sorted({(e.time_range.start, e.time_range.end, e.name) for e in gpu
                      if start <= e.time_range.start < stop and not e.name.startswith("call_")})  # not the GPU-side annotation
    print(f"GPU work of the median call: {len(kernels)} kernels and copies")
    print(f"{'offset':>8} {'dur':>8} {'idle':>8}  kernel")
    previous_end, idle = None, 0.0
    for k_start, k_end, name in kernels:
        gap = 0.0 if previous_end is None else max(0.0, k_start - previous_end)
        idle += gap
        print(f"{k_start - start:8.1f} {k_end - k_start:8.1f} {gap:8.1f}  {name[:90]}")
        previous_end = k_end if previous_end is None else max(previous_end, k_end)
    if kernels:
        print(f"first GPU work at {kernels[0][0] - start:.1f} us, last ends at {previous_end - start:.1f} us; "
              f"GPU idle between them {idle:.1f} us")


if __name__ == "__main__":
    main()
