"""Where an eager seqkernels.LSTM `infer` call's time beyond its CUDA-graph replay goes (GPU).

    python scripts/lstm_eager_gap.py [--iters 30] [--sleep-cycles 600000] [--cases bf16:64:1024 ...]

For each case (T = 256, I = H, random initial states, PyTorch's default TF32 switches, or both
off with --tf32 off) it times, interleaved (benchmarks/harness.py's measure_interleaved): the
eager call, its graph replay, and the eager call behind a device sleep (torch.cuda._sleep) that
its launches queue behind, for seqkernels and for nn.LSTM (cuDNN). (sleep + call) - sleep is the
eager call's device time with the host's launch latency hidden: eager minus that is what the host
adds. Then the profiler's device time per kernel, eager against replayed. Diagnostic only: the
benchmark is what the tables come from (docs/benchmarks.md, eighth session).
"""
import argparse
import os
import statistics
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
import harness  # noqa: E402
import seqkernels  # noqa: E402

dev = torch.device("cuda")
parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--iters", type=int, default=30, help="timed calls per candidate (>= 20)")
parser.add_argument("--sleep-cycles", type=int, default=600000, help="the sleep's GPU cycles (~0.3 ms on an H200)")
parser.add_argument("--cases", nargs="+", metavar="DTYPE:B:H",
                    default=["bf16:16:1024", "bf16:8:1024", "fp32:8:1024", "fp32:16:1024", "fp32:1:1024",
                             "bf16:16:256"],
                    help="cases as dtype (bf16, fp16, fp32):batch:hidden")
parser.add_argument("--tf32", choices=["default", "off"], default="default",
                    help="off: TF32 off for cuDNN and matmuls, both sides (the benchmark's --tf32 off)")
args = parser.parse_args()
harness.set_tf32(False if args.tf32 == "off" else None)
SLEEP = args.sleep_cycles


def parse_case(text):
    try:
        return harness.parse_case(text)
    except ValueError as e:
        parser.error(f"--cases: {e}")


CASES = [parse_case(c) for c in args.cases]


def kernel_times(fn, n=12):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    per = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            per.setdefault(e.name[:70], []).append(e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total)
    return {k: (len(v) / n, statistics.median(v)) for k, v in per.items()}


def device_span(fn):
    """One call's kernels (profiler): first start to last end, the union of their intervals, and
    the three largest idle gaps between them with the kernels on either side."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    spans = sorted((e.time_range.start, e.time_range.end, e.name[:40]) for e in prof.events()
                   if e.device_type == torch.autograd.DeviceType.CUDA)
    if not spans:
        return 0.0, 0.0, []
    busy, gaps, end, last = 0.0, [], spans[0][0], spans[0][2]
    for start, stop, name in spans:
        if start > end:
            gaps.append((start - end, last, name))
        busy += max(0.0, stop - max(start, end))
        if stop > end:
            end, last = stop, name
    return end - spans[0][0], busy, sorted(gaps, reverse=True)[:3]


for dtype, B, H in CASES:
    g = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(256, B, H, generator=g, device=dev, dtype=dtype)
    h0 = torch.randn(1, B, H, generator=g, device=dev, dtype=dtype)
    c0 = torch.randn(1, B, H, generator=g, device=dev, dtype=dtype)
    ours = seqkernels.LSTM(H, H, device=dev, dtype=dtype)
    ref = torch.nn.LSTM(H, H, device=dev, dtype=dtype)
    ref.load_state_dict(ours.state_dict())
    ref.flatten_parameters()  # else cuDNN compacts its weights in every call

    def mk(m):
        def run():
            with torch.no_grad():
                return m(x, (h0, c0))
        return run

    fo, fr = mk(ours), mk(ref)
    go, gr = harness.capture_cuda_graph(fo), harness.capture_cuda_graph(fr)

    def sleep():
        torch.cuda._sleep(SLEEP)

    def behind(fn):
        def run():
            torch.cuda._sleep(SLEEP)
            return fn()
        return run

    fns = {"ours": fo, "ours_graph": go, "ours_behind": behind(fo), "cudnn": fr, "cudnn_graph": gr,
           "cudnn_behind": behind(fr), "sleep": sleep}
    t = harness.measure_interleaved(fns, dev, warmup=3, iters=args.iters)
    ms = {k: v.median_ms for k, v in t.items()}
    print(f"\n== {dtype} B={B} H={H}  ({torch.cuda.get_device_name()})")
    print("  " + "  ".join(f"{k} {v:.3f}" for k, v in ms.items()))
    print(f"  ours: eager {ms['ours']:.3f}  device(eager) {ms['ours_behind'] - ms['sleep']:.3f}  graph {ms['ours_graph']:.3f}")
    print(f"  cudnn: eager {ms['cudnn']:.3f}  device(eager) {ms['cudnn_behind'] - ms['sleep']:.3f}  graph {ms['cudnn_graph']:.3f}")
    for name, fn in (("eager", fo), ("graph", go)):
        span, busy, gaps = device_span(fn)
        print(f"  device span of one {name} call {span:.1f}us, kernels busy {busy:.1f}us, idle {span - busy:.1f}us;"
              " largest gaps: " + "; ".join(f"{g:.1f}us after {a} before {b}" for g, a, b in gaps))
        kt = kernel_times(fn)
        print(f"  kernels, ours {name}: " + "; ".join(f"{k} x{c:g} {us:.1f}us" for k, (c, us) in sorted(kt.items(), key=lambda kv: -kv[1][1])[:5]))
